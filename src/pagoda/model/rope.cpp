#include "pagoda/model/rope.h"

#include <cmath>
#include <numbers>

#include "pagoda/core/error.h"

namespace pagoda {

std::vector<float> rope_inv_freq(const ModelConfig& config, std::span<const float> freq_divisors) {
  const int half = config.head_dim / 2;
  if (!freq_divisors.empty() && int(freq_divisors.size()) != half)
    fail(ErrorKind::kCorrupt, "rope_freqs has {} entries, expected head_dim / 2 = {}",
         freq_divisors.size(), half);
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) {
    // As transformers computes it: theta ** (arange(0, d, 2) / d) in f32, then its reciprocal.
    inv_freq[i] = 1.f / std::pow(config.rope_theta, float(2 * i) / float(config.head_dim));
  }
  if (!freq_divisors.empty()) {
    for (int i = 0; i < half; ++i) inv_freq[i] /= freq_divisors[i];
    return inv_freq;
  }
  const Llama3RopeScaling& s = config.rope_scaling;
  if (!s.enabled) return inv_freq;
  // Llama 3.1: high frequencies (short wavelengths) keep their value, low frequencies are divided
  // by `factor`, and the band between blends the two linearly in 1 / wavelength.
  const float low_freq_wavelen = float(s.original_max_position) / s.low_freq_factor;
  const float high_freq_wavelen = float(s.original_max_position) / s.high_freq_factor;
  for (float& f : inv_freq) {
    const float wavelen = 2.f * std::numbers::pi_v<float> / f;
    if (wavelen < high_freq_wavelen) continue;
    if (wavelen > low_freq_wavelen) {
      f /= s.factor;
    } else {
      const float smooth = (float(s.original_max_position) / wavelen - s.low_freq_factor) /
                           (s.high_freq_factor - s.low_freq_factor);
      f = (1.f - smooth) * f / s.factor + smooth * f;
    }
  }
  return inv_freq;
}

}  // namespace pagoda
