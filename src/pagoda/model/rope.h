// RoPE inverse frequencies, with Llama 3.1's frequency-dependent scaling when configured.
#pragma once

#include <span>
#include <vector>

#include "pagoda/model/config.h"

namespace pagoda {

// inv_freq[i] = 1 / theta^(2i / head_dim), i < head_dim / 2, adjusted by config.rope_scaling.
// A GGUF Llama 3.1 file instead stores per-frequency divisors (rope_freqs.weight): pass them as
// `freq_divisors` and they replace the scaling rule.
std::vector<float> rope_inv_freq(const ModelConfig& config, std::span<const float> freq_divisors = {});

}  // namespace pagoda
