// GPU tests skip when no GPU is present (CI); they run on the device machine via `make gpu-test`.
#include "pagoda/backend/cuda/merge_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/check.h"

namespace pagoda::cuda {
namespace {

// Reference: the exact softmax-weighted combination computed on the host in double.
TEST(GpuMergeStates, MatchesHostMerge) {
  if (!device_available()) GTEST_SKIP() << "no CUDA device";
  const int splits = 5, rows = 37, dim = 128;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> o(size_t(splits) * rows * dim), lse(size_t(splits) * rows);
  for (auto& x : o) x = normal(rng);
  for (auto& x : lse) x = 4.f * normal(rng);
  for (int s = 0; s < splits; ++s) lse[size_t(s) * rows + 3] = -INFINITY;  // an all-empty row
  lse[size_t(2) * rows + 5] = -INFINITY;                                     // one empty split

  float *d_o, *d_lse, *d_out, *d_out_lse;
  check_cuda(cudaMalloc(&d_o, o.size() * 4), "malloc");
  check_cuda(cudaMalloc(&d_lse, lse.size() * 4), "malloc");
  check_cuda(cudaMalloc(&d_out, size_t(rows) * dim * 4), "malloc");
  check_cuda(cudaMalloc(&d_out_lse, size_t(rows) * 4), "malloc");
  cudaMemcpy(d_o, o.data(), o.size() * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(d_lse, lse.data(), lse.size() * 4, cudaMemcpyHostToDevice);
  merge_states(d_o, d_lse, splits, rows, dim, d_out, d_out_lse, nullptr);
  std::vector<float> out(size_t(rows) * dim), out_lse(rows);
  cudaMemcpy(out.data(), d_out, out.size() * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(out_lse.data(), d_out_lse, out_lse.size() * 4, cudaMemcpyDeviceToHost);

  for (int r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int s = 0; s < splits; ++s) m = std::max(m, double(lse[size_t(s) * rows + r]));
    if (std::isinf(m)) {
      EXPECT_TRUE(std::isinf(out_lse[r]) && out_lse[r] < 0);
      for (int d = 0; d < dim; ++d) EXPECT_EQ(out[size_t(r) * dim + d], 0.f);
      continue;
    }
    double sum = 0;
    for (int s = 0; s < splits; ++s) sum += std::exp(lse[size_t(s) * rows + r] - m);
    EXPECT_NEAR(out_lse[r], m + std::log(sum), 1e-4);
    for (int d = 0; d < dim; ++d) {
      double acc = 0;
      for (int s = 0; s < splits; ++s)
        acc += std::exp(lse[size_t(s) * rows + r] - m) * o[(size_t(s) * rows + r) * dim + d];
      EXPECT_NEAR(out[size_t(r) * dim + d], acc / sum, 1e-4);
    }
  }
  cudaFree(d_o); cudaFree(d_lse); cudaFree(d_out); cudaFree(d_out_lse);
}

}  // namespace
}  // namespace pagoda::cuda
