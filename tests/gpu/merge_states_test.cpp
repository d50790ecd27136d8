// GPU tests skip when no GPU is present (CI); they run on the device machine via `make gpu-test`.
#include "gpu_test.h"
#include "pagoda/backend/cuda/merge_states.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::cuda {
namespace {

// Reference: the exact softmax-weighted combination of each task's slots, on the host in double.
// Split decode never produces an empty partial, so the empty cases are only reachable here.
// A warp covers 4, 2 or 1 rows at head_dim 64, 128 and 256; with a group of 3, one warp's rows
// belong to different tasks, with different numbers of partials.
class GpuMergeStates : public GpuTestWithParam<int> {};

TEST_P(GpuMergeStates, MatchesHostMerge) {
  const int group = 3, num_q_heads = 6, dim = GetParam(), num_seqs = 2;
  // Tasks with 1, 9 and 2 partials; every partial of (seq 1, kv head 0) is empty, and one slot of
  // (seq 0, kv head 1) is.
  const std::vector<attention::MergeTask> tasks = {
      {.seq = 0, .kv_head = 0, .partial_begin = 0, .num_partials = 1},
      {.seq = 0, .kv_head = 1, .partial_begin = 1, .num_partials = 9},
      {.seq = 1, .kv_head = 0, .partial_begin = 10, .num_partials = 2},
  };
  const int slots = 12;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> o(size_t(slots) * group * dim), lse(size_t(slots) * group);
  // o travels in f16 (the merge reads partials in the output dtype): the reference uses the
  // rounded values.
  std::vector<uint16_t> o_f16(o.size());
  for (size_t i = 0; i < o.size(); ++i) {
    o_f16[i] = f32_to_f16(normal(rng));
    o[i] = f16_to_f32(o_f16[i]);
  }
  for (auto& x : lse) x = 4.f * normal(rng);
  for (int s = 10; s < 12; ++s) {
    for (int r = 0; r < group; ++r) lse[size_t(s) * group + r] = -INFINITY;
  }
  for (int r = 0; r < group; ++r) lse[size_t(3) * group + r] = -INFINITY;

  auto expect_merged = [&](const std::vector<uint16_t>& out, const std::vector<float>& out_lse) {
    for (const attention::MergeTask& task : tasks) {
      for (int r = 0; r < group; ++r) {
        const size_t row = size_t(task.seq) * num_q_heads + size_t(task.kv_head) * group + size_t(r);
        double m = -INFINITY;
        for (int s = task.partial_begin; s < task.partial_begin + task.num_partials; ++s) {
          m = std::max(m, double(lse[size_t(s) * group + r]));
        }
        if (std::isinf(m)) {
          EXPECT_TRUE(std::isinf(out_lse[row]) && out_lse[row] < 0);
          for (int d = 0; d < dim; ++d) EXPECT_EQ(f16_to_f32(out[row * dim + d]), 0.f);
          continue;
        }
        double sum = 0;
        for (int s = task.partial_begin; s < task.partial_begin + task.num_partials; ++s) {
          sum += std::exp(lse[size_t(s) * group + r] - m);
        }
        EXPECT_NEAR(out_lse[row], m + std::log(sum), 1e-4);
        for (int d = 0; d < dim; ++d) {
          double acc = 0;
          for (int s = task.partial_begin; s < task.partial_begin + task.num_partials; ++s) {
            const size_t slot = size_t(s) * group + r;
            acc += std::exp(lse[slot] - m) * o[slot * dim + d];
          }
          // fp16 output: half an ulp at |x| < 4 is under 2e-3.
          EXPECT_NEAR(f16_to_f32(out[row * dim + d]), acc / sum, 2e-3) << "row " << row << " d " << d;
        }
      }
    }
  };

  DeviceArray<attention::MergeTask> d_tasks;
  DeviceArray<float> d_lse, d_out_lse(size_t(num_seqs) * num_q_heads);
  DeviceArray<uint16_t> d_o, d_out(size_t(num_seqs) * num_q_heads * dim);
  d_tasks.upload(tasks);
  d_o.upload(o_f16);
  d_lse.upload(lse);
  // max_partials sets how many warps share a row (1, 2 and 8 here); each must merge the same.
  for (const int max_partials : {1, attention::max_partials(tasks), 64}) {
    SCOPED_TRACE(max_partials);
    check_cuda(cudaMemset(d_out.data(), 0xff, d_out.bytes()), "memset");
    merge_partial_states(d_tasks.data(), int(tasks.size()), max_partials, 1, 0, group, num_q_heads, dim, d_o.data(),
                         d_lse.data(), DType::kF16, d_out.data(), d_out_lse.data(), nullptr);
    check_cuda(cudaDeviceSynchronize(), "sync");
    const std::vector<uint16_t> out = d_out.download();
    const std::vector<float> out_lse = d_out_lse.download();
    expect_merged(out, out_lse);
  }
  // Padded with tasks of sequence -1 (a CUDA graph's fixed count), among and after the real ones:
  // the same rows, and the rows of no task (sequence 1, kv head 1) untouched.
  std::vector<attention::MergeTask> padded = tasks;
  padded.insert(padded.begin() + 1, {.seq = -1, .kv_head = 0, .partial_begin = 0, .num_partials = 1});
  padded.resize(8, {.seq = -1, .kv_head = 0, .partial_begin = 0, .num_partials = 0});
  d_tasks.upload(padded);
  check_cuda(cudaMemset(d_out.data(), 0xff, d_out.bytes()), "memset");
  check_cuda(cudaMemset(d_out_lse.data(), 0xff, d_out_lse.bytes()), "memset");
  merge_partial_states(d_tasks.data(), int(padded.size()), attention::max_partials(padded), 1, 0, group, num_q_heads,
                       dim, d_o.data(), d_lse.data(), DType::kF16, d_out.data(), d_out_lse.data(), nullptr);
  check_cuda(cudaDeviceSynchronize(), "sync");
  const std::vector<uint16_t> out = d_out.download();
  const std::vector<float> out_lse = d_out_lse.download();
  expect_merged(out, out_lse);
  const size_t untouched = size_t(num_q_heads + group);  // the first row of sequence 1, kv head 1
  for (size_t i = untouched * dim; i < out.size(); ++i) ASSERT_EQ(out[i], 0xffff) << i;
  for (size_t row = untouched; row < out_lse.size(); ++row) ASSERT_TRUE(std::isnan(out_lse[row])) << row;
  d_tasks.upload(tasks);

  // A head_dim the merge has no instantiation for, or an fp32 output, is refused, not launched.
  EXPECT_THROW(merge_partial_states(d_tasks.data(), int(tasks.size()), 1, 1, 0, group, num_q_heads, 96, d_o.data(),
                                    d_lse.data(), DType::kF16, d_out.data(), nullptr, nullptr),
               Error);
  EXPECT_THROW(merge_partial_states(d_tasks.data(), int(tasks.size()), 1, 1, 0, group, num_q_heads, dim, d_o.data(),
                                    d_lse.data(), DType::kF32, d_out.data(), nullptr, nullptr),
               Error);
}

INSTANTIATE_TEST_SUITE_P(HeadDims, GpuMergeStates, ::testing::Values(64, 128, 256));

}  // namespace
}  // namespace pagoda::cuda
