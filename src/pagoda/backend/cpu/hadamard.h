// A randomized Hadamard rotation of head vectors, x -> H D x / sqrt(n) (D a fixed diagonal of
// signs, H the Sylvester Hadamard matrix): orthogonal, so applied to both q and k it leaves every
// score q . k unchanged, while it spreads a key's few outlier channels over all of them, so that
// a min and a scale per partition fit the rotated key far better (the trick of "QuaRot:
// Outlier-Free 4-Bit Inference in Rotated LLMs", arXiv:2404.00456, applied to int2 keys).
#pragma once

#include <cstdint>

namespace pagoda::cpu {

// Rotates `count` contiguous vectors of n floats in place; n must be a power of two.
void hadamard_rotate(float* x, int64_t count, int32_t n);

}  // namespace pagoda::cpu
