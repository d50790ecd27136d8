// Decode attention on the GPU (backend/cuda/decode_attention.h) against the CPU executor
// (cpu::run_decode_cpu) running the same plan over the same inputs; two tests also check
// both against the exact double-precision attention of tests/attention/reference.h, so that the
// reference itself is checked. GPU tests skip without a GPU (CI); they run on the device machine
// via `make gpu-test`.
//
// Inputs: K, V and q are uniform in [-1, 1) from a fresh seed per test, stored in the pool's dtype
// (f16 or bf16); the CPU executor reads the same rounded values (q converted to fp32), so the two
// sides differ only by what the GPU kernels round and by summation order.
// Tolerances:
//   out: the kernels round P = exp(s - max), in [0, 1], to the KV dtype for the tensor-core
//        product O = V^T P, and round the output to the KV dtype. Each rounding costs at most one
//        unit roundoff u (2^-11 for f16, 2^-8 for bf16) relative to values below 1 in magnitude,
//        so |out - cpu| <= 2u plus fp32 noise: we allow 2e-3 for f16 (2u = 9.8e-4) and 1e-2 for
//        bf16 (2u = 7.8e-3).
//   lse: fp32 on both sides, from the same q and K: |lse - cpu| <= 1e-3 * max(1, |cpu|).
// Every run first poisons out and lse with NaN bytes (0xff), so an element the kernel does not
// write shows as non-finite. A sequence with no KV must give exactly o = 0 and lse = -inf.
#include "gpu_test.h"
#include "pagoda/backend/cuda/decode_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "attention_inputs.h"
#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/attention/plan.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/bench/per_head_decode.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {
namespace {

using namespace ::pagoda::cuda::testing;
using attention::DecodePlan;
using attention::DeviceInfo;
using attention::PlanOptions;

// The kernels that run a plan's work items: the backend's group-tiled kernel and the per-head
// decode kernel the benchmarks compare it with.
enum class DecodeKernel : uint8_t { kGroupTiled, kPerHead };
constexpr DecodeKernel kKernels[] = {DecodeKernel::kGroupTiled, DecodeKernel::kPerHead};

DecodeLauncher launcher(DecodeKernel kernel) {
  return kernel == DecodeKernel::kGroupTiled ? launch_decode_tiled : bench::launch_per_head_decode;
}

const char* kernel_name(DecodeKernel kernel) {
  return kernel == DecodeKernel::kGroupTiled ? "GroupTiled" : "PerHead";
}

// The L2 hints a run uses: none, the engine's default (evict_first, no prefetch), or both.
enum class Hints { kNone, kEvictFirst, kPrefetch };
constexpr Hints kAllHints[] = {Hints::kNone, Hints::kEvictFirst, Hints::kPrefetch};

DecodeOptions options_of(DecodeKernel kernel, Hints hints) {
  return {.launch = launcher(kernel), .l2_prefetch = hints == Hints::kPrefetch, .evict_first = hints != Hints::kNone};
}

const char* hints_name(Hints hints) {
  return hints == Hints::kNone ? "NoHints" : hints == Hints::kEvictFirst ? "EvictFirst" : "Prefetch";
}

std::string options_name(const DecodeOptions& options) {
  return std::string(options.launch == launch_decode_tiled ? "GroupTiled" : "PerHead") + (options.l2_prefetch ? " prefetch" : " no prefetch") +
         (options.evict_first ? " evict_first" : "") +
         (options.prefetch_distance > 0 ? " distance " + std::to_string(options.prefetch_distance) : "");
}

DecodePlan make_plan(const Inputs& in, const PlanOptions& options,
                     const DeviceInfo& device = DeviceInfo{}) {
  return attention::plan_decode(in.batch, in.shape, device, options);
}

PlanOptions no_split() { return {.allow_split = false}; }
PlanOptions forced_split(int32_t tokens) { return {.max_kv_tokens_per_item = tokens}; }

Outputs run_cpu(Inputs& in, const DecodePlan& plan) {
  Outputs r{std::vector<float>(in.q.size(), std::nanf("")), std::vector<float>(in.rows(), std::nanf(""))};
  cpu::run_decode_cpu(plan, in.batch, in.shape, in.pool.view(), in.q_f32.data(),
                            r.out.data(), r.lse.data());
  return r;
}

Outputs run_gpu(const Inputs& in, const DeviceInputs& dev, const DecodePlan& plan,
                const DecodeOptions& options, bool with_lse = true) {
  DecodeWorkspace workspace;
  workspace.upload(plan, in.batch, in.shape);
  DeviceArray<uint16_t> out(in.q.size());
  DeviceArray<float> lse(in.rows());
  check_cuda(cudaMemset(out.data(), 0xff, out.bytes()), "cudaMemset out");  // NaN in every dtype
  check_cuda(cudaMemset(lse.data(), 0xff, lse.bytes()), "cudaMemset lse");
  decode_attention(workspace, in.shape, dev.kv, dev.q.data(), out.data(),
                   with_lse ? lse.data() : nullptr, options);
  check_cuda(cudaGetLastError(), "decode_attention launch");
  check_cuda(cudaDeviceSynchronize(), "decode_attention");
  Outputs r;
  const std::vector<uint16_t> bits = out.download();
  r.out.resize(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) r.out[i] = from_bits(in.config.dtype, bits[i]);
  if (with_lse) r.lse = lse.download();
  return r;
}

// The exact attention of every row in double (rounded to float at the end), over the pool's
// rounded values gathered into contiguous K and V.
// match the CPU executor.
void expect_gpu_matches_cpu(Inputs& in, const DecodePlan& plan, bool with_lse = true) {
  const DeviceInputs dev(in);
  ASSERT_EQ(decode_unsupported_reason(in.shape, dev.kv), nullptr);
  const Outputs want = run_cpu(in, plan);
  for (DecodeKernel kernel : kKernels) {
    for (const Hints hints : kAllHints) {
      const DecodeOptions options = options_of(kernel, hints);
      SCOPED_TRACE(options_name(options));
      expect_matches(in, run_gpu(in, dev, plan, options, with_lse), want);
    }
  }
}

// ---- The grid: dtype x head_dim x block_size x group x split x hints x kernel. ----

using GridParam = std::tuple<DType, int32_t /*head_dim*/, int32_t /*block_size*/,
                             int32_t /*group*/, bool /*split*/, Hints, DecodeKernel>;

class GpuDecodeGrid : public GpuTestWithParam<GridParam> {};

// Forced splits: items of 2-3 blocks (so a 1000-token sequence has 8 to 21 partial states).
int32_t forced_chunk(int32_t block_size) { return (block_size == 64 ? 2 : 3) * block_size; }

TEST_P(GpuDecodeGrid, MatchesCpuExecutor) {
  const auto [dtype, head_dim, block_size, group, split, hints, kernel] = GetParam();
  uint64_t seed = 1;
  for (int64_t x : {int64_t(dtype), int64_t(head_dim), int64_t(block_size), int64_t(group),
                    int64_t(split), int64_t(hints), int64_t(kernel)}) {
    seed = seed * 1000003 + uint64_t(x);
  }
  const Config c{.dtype = dtype, .head_dim = head_dim, .block_size = block_size, .group = group};
  Inputs in = make_batch_inputs(c, {1, 17, 3 * block_size + 5, 300, 1000}, seed);
  const DeviceInputs dev(in);
  const char* reason = decode_unsupported_reason(in.shape, dev.kv);
  ASSERT_EQ(reason, nullptr) << reason;
  const DecodePlan plan = make_plan(in, split ? forced_split(forced_chunk(block_size)) : no_split());
  ASSERT_EQ(plan.merges.empty(), !split);
  expect_matches(in, run_gpu(in, dev, plan, options_of(kernel, hints)), run_cpu(in, plan));
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [dtype, head_dim, block_size, group, split, hints, kernel] = info.param;
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(head_dim) + "_Bs" +
         std::to_string(block_size) + "_G" + std::to_string(group) +
         (split ? "_Split_" : "_NoSplit_") + hints_name(hints) + "_" + kernel_name(kernel);
}

// 2 x 3 x 3 x 6 x 2 x 3 x 2 = 1296 cases, 2 kv heads each (q heads = 2 x group).
INSTANTIATE_TEST_SUITE_P(
    Grid, GpuDecodeGrid,
    ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16), ::testing::Values(64, 128, 256),
                       ::testing::Values(16, 32, 64), ::testing::Values(1, 2, 4, 5, 7, 8),
                       ::testing::Bool(), ::testing::ValuesIn(kAllHints),
                       ::testing::Values(DecodeKernel::kGroupTiled, DecodeKernel::kPerHead)),
    grid_name);

// ---- Edge cases. ----

class GpuDecode : public GpuTest {};

// Sequences of one token (alone and three of them): o is that token's V row.
TEST_F(GpuDecode, LengthOne) {
  uint64_t seed = 100;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    for (const int32_t head_dim : {64, 128, 256}) {
      for (const int32_t group : {1, 8}) {
        for (const std::vector<int32_t>& lengths : {std::vector<int32_t>{1}, std::vector<int32_t>{1, 1, 1}}) {
          SCOPED_TRACE(std::string(dtype_name(dtype)) + " head_dim " + std::to_string(head_dim) +
                       " group " + std::to_string(group) + " batch " + std::to_string(lengths.size()));
          Inputs in = make_batch_inputs(
              {.dtype = dtype, .head_dim = head_dim, .group = group, .num_kv_heads = 1}, lengths, ++seed);
          expect_gpu_matches_cpu(in, make_plan(in, no_split()));
        }
      }
    }
  }
}

// Lengths that end inside a block, every block size, splits of one and two blocks, and prefetch
// distances that reach past the end of short sequences.
TEST_F(GpuDecode, LengthsNotAMultipleOfTheBlockSize) {
  uint64_t seed = 200;
  for (const int32_t bs : {16, 32, 64}) {
    Inputs in = make_batch_inputs({.block_size = bs, .group = 4}, {bs - 1, bs + 1, 2 * bs - 1, 5 * bs + 3, 7}, ++seed);
    const DeviceInputs dev(in);
    for (const PlanOptions& options : {no_split(), forced_split(bs), forced_split(2 * bs)}) {
      const DecodePlan plan = make_plan(in, options);
      const Outputs want = run_cpu(in, plan);
      for (const DecodeKernel kernel : kKernels) {
        for (const int32_t distance : {0, 1, 8}) {
          const DecodeOptions decode{.launch = launcher(kernel), .l2_prefetch = true, .prefetch_distance = distance};
          SCOPED_TRACE("block size " + std::to_string(bs) + " split " +
                       std::to_string(plan.kv_tokens_per_item) + " " + options_name(decode));
          expect_matches(in, run_gpu(in, dev, plan, decode), want);
        }
      }
    }
  }
}

// One batch mixing a 1-token and a 32768-token sequence (f16, head_dim 128, block 16, group 4):
// the planner's own split for this device, and no split. Also against the exact reference.
TEST_F(GpuDecode, LongAndShortSequence) {
  const Config c{.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = 4};
  Inputs in = make_batch_inputs(c, {1, 32768}, 300);
  const DeviceInputs dev(in);
  const Outputs exact = run_exact(in);
  const DecodePlan split = make_plan(in, PlanOptions{}, decode_device_info(in.shape, c.dtype));
  EXPECT_FALSE(split.merges.empty()) << "2 sequences x 2 kv heads should not fill a GPU unsplit";
  for (const DecodePlan& plan : {split, make_plan(in, no_split())}) {
    SCOPED_TRACE(plan.merges.empty() ? "no split" : "split " + std::to_string(plan.kv_tokens_per_item));
    const Outputs cpu = run_cpu(in, plan);
    {
      SCOPED_TRACE("CPU executor against the exact reference");
      expect_matches(in, cpu, exact, kCpuExactTolerance, kCpuExactTolerance);
    }
    for (const DecodeKernel kernel : kKernels) {
      SCOPED_TRACE(kernel_name(kernel));
      const Outputs gpu = run_gpu(in, dev, plan, {.launch = launcher(kernel)});
      expect_matches(in, gpu, cpu);
      SCOPED_TRACE("against the exact reference");
      expect_matches(in, gpu, exact);
    }
  }
}

// Both dtypes and both kernels against the exact reference as well as the CPU executor.
TEST_F(GpuDecode, MatchesExactReference) {
  uint64_t seed = 400;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    Inputs in = make_batch_inputs({.dtype = dtype, .head_dim = 128, .block_size = 32, .group = 4},
                                  {1, 17, 300, 1000, 4096}, ++seed);
    const DeviceInputs dev(in);
    const Outputs exact = run_exact(in);
    for (const PlanOptions& options : {no_split(), forced_split(96)}) {
      const DecodePlan plan = make_plan(in, options);
      const Outputs cpu = run_cpu(in, plan);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " split " + std::to_string(plan.kv_tokens_per_item));
      {
        SCOPED_TRACE("CPU executor against the exact reference");
        expect_matches(in, cpu, exact, kCpuExactTolerance, kCpuExactTolerance);
      }
      for (const DecodeKernel kernel : kKernels) {
        SCOPED_TRACE(kernel_name(kernel));
        expect_matches(in, run_gpu(in, dev, plan, {.launch = launcher(kernel)}), exact);
      }
    }
  }
}

// Non-contiguous, shuffled and repeated block ids: sequences sharing blocks (a common prefix, the
// same blocks in reverse order, one block listed three times), block 0 among them.
TEST_F(GpuDecode, SharedShuffledAndRepeatedBlocks) {
  const int32_t bs = 16;
  const std::vector<std::vector<int32_t>> blocks = {
      {9, 0, 4, 11, 2}, {9, 0, 4}, {2, 11, 4, 0, 9}, {4, 4, 4}, {7}};
  const std::vector<int32_t> lengths = {5 * bs - 3, 3 * bs - 8, 5 * bs, 3 * bs, bs};
  uint64_t seed = 500;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    Inputs in = make_inputs({.dtype = dtype, .head_dim = 64, .block_size = bs, .group = 2}, 12,
                            blocks, lengths, ++seed);
    for (const PlanOptions& options : {no_split(), forced_split(bs), forced_split(2 * bs)}) {
      const DecodePlan plan = make_plan(in, options);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " split " + std::to_string(plan.kv_tokens_per_item));
      expect_gpu_matches_cpu(in, plan);
    }
  }
}

// Block id 0 as a sequence's only block, as its last block, and as its first.
TEST_F(GpuDecode, BlockZero) {
  const int32_t bs = 16;
  Inputs in = make_inputs({.head_dim = 128, .block_size = bs, .group = 4}, 4,
                          {{0}, {3, 0}, {0, 1, 2, 3}}, {5, bs + 9, 4 * bs}, 600);
  for (const PlanOptions& options : {no_split(), forced_split(bs)}) {
    const DecodePlan plan = make_plan(in, options);
    SCOPED_TRACE("split " + std::to_string(plan.kv_tokens_per_item));
    expect_gpu_matches_cpu(in, plan);
  }
}

// A sequence with no KV gets o = 0 and lse = -inf (as the CPU executor), beside others, or alone.
TEST_F(GpuDecode, EmptySequence) {
  uint64_t seed = 700;
  for (const std::vector<int32_t>& lengths :
       {std::vector<int32_t>{0, 20, 0}, std::vector<int32_t>{0}, std::vector<int32_t>{0, 0}}) {
    Inputs in = make_batch_inputs({.head_dim = 64, .block_size = 16, .group = 4}, lengths, ++seed);
    for (const PlanOptions& options : {no_split(), forced_split(16)}) {
      const DecodePlan plan = make_plan(in, options);
      SCOPED_TRACE("batch of " + std::to_string(lengths.size()) + " split " +
                   std::to_string(plan.kv_tokens_per_item));
      expect_gpu_matches_cpu(in, plan);
    }
  }
}

// The NHD layout ([block][token][kv head][head_dim]), in SmolLM2-135M's shape: 9 q heads over 3
// kv heads, head_dim 64, 16-token blocks.
TEST_F(GpuDecode, NhdLayout) {
  uint64_t seed = 800;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    Inputs in = make_batch_inputs({.dtype = dtype, .head_dim = 64, .block_size = 16, .group = 3,
                                   .num_kv_heads = 3, .layout = KvLayout::kNhd},
                                  {1, 16, 17, 300, 45, 1000}, ++seed);
    for (const PlanOptions& options : {no_split(), forced_split(40)}) {
      const DecodePlan plan = make_plan(in, options);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " split " + std::to_string(plan.kv_tokens_per_item));
      expect_gpu_matches_cpu(in, plan);
    }
  }
}

// lse = nullptr: the output alone, split (the merges must not need it) or not.
TEST_F(GpuDecode, NullLse) {
  Inputs in = make_batch_inputs({.head_dim = 128, .block_size = 16, .group = 4}, {1, 17, 300, 1000, 0}, 900);
  for (const PlanOptions& options : {no_split(), forced_split(48)}) {
    const DecodePlan plan = make_plan(in, options);
    SCOPED_TRACE("split " + std::to_string(plan.kv_tokens_per_item));
    expect_gpu_matches_cpu(in, plan, /*with_lse=*/false);
  }
}

// Slots past a sequence's length in its last block hold NaN (never-written pool memory): the
// kernels must not let them into the result (e.g. as 0 * NaN in P V).
TEST_F(GpuDecode, SlotsPastTheLengthAreNeverRead) {
  uint64_t seed = 1000;
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    Inputs in = make_batch_inputs({.dtype = dtype, .head_dim = 128, .block_size = 32, .group = 4},
                                  {1, 5, 33, 70, 300}, ++seed, /*fill_tails=*/false);
    for (const PlanOptions& options : {no_split(), forced_split(64)}) {
      const DecodePlan plan = make_plan(in, options);
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " split " + std::to_string(plan.kv_tokens_per_item));
      expect_gpu_matches_cpu(in, plan);
    }
  }
}

// One token that dominates its row's softmax (K row = 4 x the row's q: a score near 15 against
// scores near 0), at the first and last token of tiles (64), blocks (16), split items (48 and
// 128) and the sequence: out must be that token's V row, so a kernel that drops, repeats or
// shifts a single token at such a boundary is off by O(1), far past any tolerance. (With
// uniform inputs alone the softmax is nearly flat and one token moves out by about 1/length.)
TEST_F(GpuDecode, DominantTokenAtEveryBoundary) {
  const Config c{.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = 4};
  const std::vector<int32_t> positions = {0, 15, 16, 47, 48, 63, 64, 127, 128, 383, 384, 998, 999};
  Inputs in = make_batch_inputs(c, std::vector<int32_t>(positions.size(), 1000), 1100);
  const int32_t d = c.head_dim, q_heads = in.shape.num_q_heads;
  std::vector<float> row(static_cast<size_t>(d)), stored(static_cast<size_t>(d));
  for (size_t s = 0; s < positions.size(); ++s) {
    const int32_t p = positions[s];
    const int32_t block = in.batch.blocks_of(int32_t(s))[size_t(p / c.block_size)];
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {  // dominant for the group's first q head
      const float* q = &in.q_f32[(s * size_t(q_heads) + size_t(h * c.group)) * size_t(d)];
      for (int32_t i = 0; i < d; ++i) row[size_t(i)] = 4.f * q[i];
      in.pool.store_row(false, block, h, p % c.block_size, row.data(), stored.data());
    }
  }
  for (const PlanOptions& options : {no_split(), forced_split(48), forced_split(128)}) {
    const DecodePlan plan = make_plan(in, options);
    SCOPED_TRACE("split " + std::to_string(plan.kv_tokens_per_item));
    // The test is only as strong as the domination: the CPU result must be the V row itself.
    const Outputs cpu = run_cpu(in, plan);
    for (size_t s = 0; s < positions.size(); ++s) {
      const int32_t p = positions[s];
      const int32_t block = in.batch.blocks_of(int32_t(s))[size_t(p / c.block_size)];
      const size_t out_row = s * size_t(q_heads);  // kv head 0's first q head
      double error = 0;
      for (int32_t i = 0; i < d; ++i) {
        uint16_t bits;
        std::memcpy(&bits, in.pool.v_bytes.data() + in.pool.offset(block, 0, p % c.block_size, i) * 2, 2);
        error = std::max(error, std::abs(double(cpu.out[out_row * size_t(d) + size_t(i)]) -
                                         double(from_bits(c.dtype, bits))));
      }
      ASSERT_LT(error, 0.05) << "token " << p << " does not dominate its row";
    }
    expect_gpu_matches_cpu(in, plan);
  }
}

// A block id outside the pool, or a workspace uploaded for another shape: Error(kInvalidArgument),
// nothing launched.
TEST_F(GpuDecode, RejectsBadBlockIdsAndMismatchedWorkspace) {
  const Config c{.head_dim = 128, .block_size = 16, .group = 4};
  Inputs in = make_batch_inputs(c, {40, 20}, 1200);
  const DeviceInputs dev(in);
  DeviceArray<uint16_t> out(in.q.size());
  auto expect_invalid = [&](DecodeWorkspace& workspace, const AttentionShape& shape) {
    try {
      decode_attention(workspace, shape, dev.kv, dev.q.data(), out.data(), nullptr);
      ADD_FAILURE() << "decode_attention accepted it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  };
  for (const int32_t bad_id : {in.pool.num_blocks, -1}) {
    SCOPED_TRACE("block id " + std::to_string(bad_id));
    DecodeBatch batch = in.batch;
    batch.block_ids.back() = bad_id;
    DecodeWorkspace workspace;
    workspace.upload(attention::plan_decode(batch, in.shape, DeviceInfo{}, no_split()), batch, in.shape);
    expect_invalid(workspace, in.shape);
  }
  {
    SCOPED_TRACE("workspace uploaded for group 2");
    AttentionShape other = in.shape;
    other.num_q_heads = 2 * other.num_kv_heads;
    DecodeWorkspace workspace;
    workspace.upload(attention::plan_decode(in.batch, other, DeviceInfo{}, forced_split(16)), in.batch, other);
    expect_invalid(workspace, in.shape);
  }
  check_cuda(cudaDeviceSynchronize(), "after the rejected calls");
}

// A pool of more than 2^31 elements per K or V (4.3 GB each in f16), the batch's blocks at its
// far end: every offset into it needs 64 bits. The blocks hold the same values as a small pool
// that the CPU executor reads.
TEST_F(GpuDecode, PoolLargerThanInt32Offsets) {
  const Config c{.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = 4, .num_kv_heads = 1};
  Inputs in = make_batch_inputs(c, {300, 1000}, 1300);
  const int64_t page_elements = int64_t(c.block_size) * c.num_kv_heads * c.head_dim;
  const int32_t base = int32_t((int64_t(1) << 31) / page_elements) - 8;  // straddles 2^31 elements
  const int32_t num_blocks = base + in.pool.num_blocks;
  const size_t page_bytes = size_t(page_elements) * 2;
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (free_bytes < 2 * size_t(num_blocks) * page_bytes + (size_t(1) << 30)) {
    GTEST_SKIP() << "needs " << 2 * size_t(num_blocks) * page_bytes / 1e9 << " GB of device memory";
  }
  DeviceArray<uint8_t> k(size_t(num_blocks) * page_bytes), v(k.size());
  check_cuda(cudaMemcpy(k.data() + size_t(base) * page_bytes, in.pool.k_bytes.data(), in.pool.k_bytes.size(),
                        cudaMemcpyHostToDevice), "cudaMemcpy");
  check_cuda(cudaMemcpy(v.data() + size_t(base) * page_bytes, in.pool.v_bytes.data(), in.pool.v_bytes.size(),
                        cudaMemcpyHostToDevice), "cudaMemcpy");
  DeviceInputs dev(in);
  dev.kv = make_paged_kv(k.data(), v.data(), c.dtype, c.layout, num_blocks, c.block_size, c.num_kv_heads,
                         c.head_dim, Device::kCuda);
  DecodeBatch far = in.batch;  // the same blocks, base blocks further on
  for (int32_t& id : far.block_ids) id += base;
  for (const PlanOptions& options : {no_split(), forced_split(128)}) {
    const DecodePlan plan = make_plan(in, options);
    SCOPED_TRACE("split " + std::to_string(plan.kv_tokens_per_item));
    const Outputs want = run_cpu(in, plan);
    Inputs far_in{in.config, in.shape, ref::HostPool(c.dtype, c.layout, 1, c.block_size, 1, c.head_dim), far,
                  in.q, in.q_f32};
    for (const DecodeKernel kernel : kKernels) {
      SCOPED_TRACE(kernel_name(kernel));
      expect_matches(in, run_gpu(far_in, dev, plan, options_of(kernel, Hints::kPrefetch)), want);
    }
  }
}

// ---- Unsupported input: a reason, and decode_attention throws Error(kUnsupported). ----

TEST_F(GpuDecode, RejectsUnsupportedInput) {
  struct Case {
    const char* what;
    Config config;
    Device device = Device::kCuda;
  };
  const Case cases[] = {
      {"head_dim 96", {.head_dim = 96}},
      {"block size 8", {.block_size = 8}},
      {"group size 16", {.group = 16, .num_kv_heads = 1}},
      {"f32 pool", {.dtype = DType::kF32}},
      {"pool in host memory", {}, Device::kCpu},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const AttentionShape shape = c.config.shape();
    const size_t element = dtype_size(c.config.dtype);
    const int32_t num_blocks = 3, length = 20;  // 3 blocks of >= 8 tokens
    const size_t pool_bytes = size_t(num_blocks) * size_t(shape.block_size) *
                              size_t(shape.num_kv_heads) * size_t(shape.head_dim) * element;
    const size_t q_bytes = size_t(shape.num_q_heads) * size_t(shape.head_dim) * element;
    DeviceArray<uint8_t> k(pool_bytes), v(pool_bytes), q(q_bytes), out(q_bytes);
    DeviceArray<float> lse(size_t(shape.num_q_heads));
    std::vector<uint8_t> host_k(pool_bytes), host_v(pool_bytes);
    const bool on_device = c.device == Device::kCuda;
    const PagedKv kv = make_paged_kv(on_device ? static_cast<void*>(k.data()) : host_k.data(),
                                     on_device ? static_cast<void*>(v.data()) : host_v.data(),
                                     c.config.dtype, KvLayout::kHnd, num_blocks, shape.block_size,
                                     shape.num_kv_heads, shape.head_dim, c.device);
    const char* reason = decode_unsupported_reason(shape, kv);
    EXPECT_NE(reason, nullptr);
    if (reason == nullptr) continue;  // do not launch on input the kernels do not expect

    DecodeBatch batch;
    batch.add_sequence(std::vector<int32_t>{2, 0, 1}, length);
    const DecodePlan plan = attention::plan_decode(batch, shape, DeviceInfo{}, no_split());
    DecodeWorkspace workspace;
    workspace.upload(plan, batch, shape);
    try {
      decode_attention(workspace, shape, kv, q.data(), out.data(), lse.data());
      ADD_FAILURE() << "decode_attention accepted it";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(reason), std::string::npos)
          << "the error \"" << e.what() << "\" should give the reason \"" << reason << "\"";
    }
  }
  check_cuda(cudaDeviceSynchronize(), "after the rejected calls");

  // And a supported shape has no reason.
  const Config supported{.group = 8};
  DeviceArray<uint8_t> k(size_t(1) * 16 * 2 * 128 * 2), v(k.size());
  const PagedKv kv = make_paged_kv(k.data(), v.data(), DType::kF16, KvLayout::kHnd, 1, 16, 2, 128,
                                   Device::kCuda);
  const char* reason = decode_unsupported_reason(supported.shape(), kv);
  EXPECT_EQ(reason, nullptr) << reason;
}

}  // namespace
}  // namespace pagoda::cuda
