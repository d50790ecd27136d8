// The CPU backend's row-wise operations: embedding lookup, RMSNorm, RoPE, SwiGLU, residual add.
// All compute in f32, in the same operation order as Hugging Face transformers, so golden
// comparisons differ only by summation order. Rows are spread over the shared ThreadPool: one
// decode row runs on the calling thread, with no fork or barrier at all.
#pragma once

#include <span>

#include "pagoda/core/tensor.h"

namespace pagoda::cpu {

void embed(const Tensor& table, std::span<const int32_t> ids, Tensor out);
void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out);
void rope(Tensor x, std::span<const int32_t> positions, std::span<const float> inv_freq);
void silu_mul(const Tensor& gate_up, Tensor out);
void add(Tensor x, const Tensor& y);

}  // namespace pagoda::cpu
