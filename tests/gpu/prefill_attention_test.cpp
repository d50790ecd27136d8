// Prefill attention on the GPU (backend/cuda/prefill_attention.h) against the CPU reference
// cpu::prefill_attention_cpu on the same inputs, and (two tests) against the exact
// double-precision attention of tests/attention/reference.h.
//
// Inputs: K, V and q uniform in [-1, 1) from a fresh seed per test, stored in the pool's dtype;
// the references read the same rounded values (q converted to fp32). Every chunk is a sequence
// of its own whose blocks are shuffled over the pool (block 0 somewhere), with 3 blocks nobody
// lists. Pool slots past a sequence's last key stay NaN (0xff bytes), so a kernel that reads one
// shows as non-finite output.
// Tolerance: the kernel rounds P = exp(s - max), in [0, 1], to the KV dtype for the tensor-core
// product O = P V, and rounds the output to the KV dtype: each costs at most one unit roundoff u
// (2^-11 f16, 2^-8 bf16) relative to values below 1 in magnitude, so |out - ref| <= 2u plus fp32
// noise: 2e-3 for f16 (2u = 9.8e-4) and 1e-2 for bf16 (2u = 7.8e-3), as the decode test.
// out is poisoned with NaN first; the rows between chunks (no chunk owns them) must stay so.
#include "gpu_test.h"
#include "pagoda/backend/cuda/prefill_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "../attention/reference.h"
#include "attention_inputs.h"
#include "pagoda/backend/cpu/prefill_attention.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda {
namespace {

namespace ref = ::pagoda::attention::testing;
using attention::AttentionShape;

using testing::Config;
using testing::from_bits;
using testing::out_tolerance;
using testing::to_bits;

constexpr int32_t kGapRows = 2;  // rows before, between and after the chunks that no chunk owns

struct ChunkSpec {
  int32_t start_pos;
  int32_t num_new;
};

// One step's inputs on the host.
struct Inputs {
  Config config;
  AttentionShape shape;
  ref::HostPool pool;
  std::vector<PrefillChunk> chunks;
  std::vector<int32_t> block_ids;
  int32_t num_rows = 0;
  std::vector<uint16_t> q;   // [num_rows, num_q_heads, head_dim] in config.dtype
  std::vector<float> q_f32;  // the same values in fp32, for the references

  size_t row_elements() const { return size_t(shape.num_q_heads) * size_t(shape.head_dim); }
  int32_t blocks_of(const PrefillChunk& c) const {
    return (c.start_pos + c.num_new + shape.block_size - 1) / shape.block_size;
  }
};

Inputs make_inputs(const Config& c, const std::vector<ChunkSpec>& specs, uint64_t seed) {
  int32_t needed = 0;
  for (const ChunkSpec& s : specs) needed += (s.start_pos + s.num_new + c.block_size - 1) / c.block_size;
  const int32_t num_blocks = needed + 3;
  Inputs in{c, c.shape(),
            ref::HostPool(c.dtype, c.layout, num_blocks, c.block_size, c.num_kv_heads, c.head_dim),
            {}, {}, 0, {}, {}};
  ref::Random rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.next(i + 1)]);

  int32_t row = kGapRows;
  for (const ChunkSpec& s : specs) {
    const PrefillChunk chunk{.row_begin = row, .start_pos = s.start_pos, .num_new = s.num_new,
                             .block_begin = int32_t(in.block_ids.size())};
    const int32_t n = in.blocks_of(chunk);
    const long next = long(in.block_ids.size());
    in.block_ids.insert(in.block_ids.end(), ids.begin() + next, ids.begin() + next + n);
    ref::HostSequence seq;
    seq.blocks.assign(in.block_ids.begin() + chunk.block_begin, in.block_ids.end());
    ref::fill_tokens(in.pool, seq, 0, s.start_pos + s.num_new, rng);
    in.chunks.push_back(chunk);
    row += s.num_new + kGapRows;
  }
  in.num_rows = row;
  in.q.resize(size_t(in.num_rows) * in.row_elements());
  in.q_f32.resize(in.q.size());
  for (size_t i = 0; i < in.q.size(); ++i) {
    in.q[i] = to_bits(c.dtype, rng.uniform(-1, 1));
    in.q_f32[i] = from_bits(c.dtype, in.q[i]);
  }
  return in;
}

// Which rows some chunk owns.
std::vector<bool> owned_rows(const Inputs& in) {
  std::vector<bool> owned(size_t(in.num_rows), false);
  for (const PrefillChunk& c : in.chunks) {
    std::fill_n(owned.begin() + c.row_begin, c.num_new, true);
  }
  return owned;
}

// The GPU's out as raw bits (NaN-poisoned first).
struct GpuOut {
  std::vector<uint16_t> bits;  // [num_rows, num_q_heads, head_dim]
};

struct DeviceInputs {
  DeviceArray<uint8_t> k, v;
  DeviceArray<uint16_t> q;
  PagedKv kv;

  explicit DeviceInputs(const Inputs& in) {
    k.upload(in.pool.k_bytes);
    v.upload(in.pool.v_bytes);
    q.upload(in.q);
    const Config& c = in.config;
    kv = make_paged_kv(k.data(), v.data(), c.dtype, c.layout, in.pool.num_blocks, c.block_size,
                       c.num_kv_heads, c.head_dim, Device::kCuda);
  }
};

GpuOut run_gpu(const Inputs& in, const DeviceInputs& dev) {
  PrefillWorkspace ws;
  ws.upload(in.chunks, in.block_ids, in.shape);
  DeviceArray<uint16_t> out(in.q.size());
  check_cuda(cudaMemset(out.data(), 0xff, out.bytes()), "cudaMemset out");  // NaN in both dtypes
  prefill_attention(ws, in.shape, dev.kv, dev.q.data(), out.data());
  check_cuda(cudaDeviceSynchronize(), "prefill_attention");
  return {out.download()};
}

std::vector<float> run_cpu(Inputs& in) {
  std::vector<float> out(in.q.size(), std::nanf(""));
  const size_t row = in.row_elements();
  for (const PrefillChunk& c : in.chunks) {
    cpu::prefill_attention_cpu(
        in.shape, in.pool.view(),
        std::span<const int32_t>(in.block_ids).subspan(size_t(c.block_begin), size_t(in.blocks_of(c))),
        c.start_pos, c.num_new, &in.q_f32[size_t(c.row_begin) * row], &out[size_t(c.row_begin) * row]);
  }
  return out;
}

// The exact attention, in double, of the given rows (all q heads of each), NaN elsewhere.
std::vector<float> run_exact(const Inputs& in, const std::vector<int32_t>& rows) {
  const ref::HostPool& pool = in.pool;
  const size_t head_dim = size_t(in.shape.head_dim), kv_row = size_t(pool.num_kv_heads) * head_dim;
  std::vector<float> out(in.q.size(), std::nanf(""));
  for (const PrefillChunk& c : in.chunks) {
    const int32_t num_keys = c.start_pos + c.num_new;
    ref::HostSequence seq;
    seq.blocks.assign(in.block_ids.begin() + c.block_begin, in.block_ids.begin() + c.block_begin + in.blocks_of(c));
    seq.length = num_keys;
    seq.k.resize(size_t(num_keys) * kv_row);
    seq.v.resize(seq.k.size());
    for (int32_t t = 0; t < num_keys; ++t) {
      for (int32_t h = 0; h < pool.num_kv_heads; ++h) {
        for (int32_t d = 0; d < pool.head_dim; ++d) {
          const size_t at = pool.offset(seq.blocks[size_t(t / pool.block_size)], h, t % pool.block_size, d) * 2;
          uint16_t k_bits, v_bits;
          std::memcpy(&k_bits, pool.k_bytes.data() + at, 2);
          std::memcpy(&v_bits, pool.v_bytes.data() + at, 2);
          const size_t i = size_t(t) * kv_row + size_t(h) * head_dim + size_t(d);
          seq.k[i] = from_bits(pool.dtype, k_bits);
          seq.v[i] = from_bits(pool.dtype, v_bits);
        }
      }
    }
    for (const int32_t row : rows) {
      if (row < c.row_begin || row >= c.row_begin + c.num_new) continue;
      const int32_t pos = c.start_pos + (row - c.row_begin);
      for (int32_t h = 0; h < in.shape.num_q_heads; ++h) {
        const size_t at = (size_t(row) * size_t(in.shape.num_q_heads) + size_t(h)) * head_dim;
        const ref::ReferenceState state = ref::reference_attention(
            &in.q_f32[at], seq, h / in.shape.group_size(), pool.num_kv_heads, pool.head_dim,
            double(in.shape.softmax_scale), 0, pos + 1);
        for (size_t d = 0; d < head_dim; ++d) out[at + d] = float(state.o[d]);
      }
    }
  }
  return out;
}

// Expects got to match want on every element of the rows `checked` (all owned rows when empty)
// within tolerance, and every element of the rows no chunk owns to be untouched (0xffff).
void expect_matches(const Inputs& in, const GpuOut& got, const std::vector<float>& want,
                    std::vector<int32_t> checked = {}) {
  const std::vector<bool> owned = owned_rows(in);
  if (checked.empty()) {
    for (int32_t row = 0; row < in.num_rows; ++row) {
      if (owned[size_t(row)]) checked.push_back(row);
    }
  }
  ASSERT_EQ(got.bits.size(), want.size());
  const size_t row_elements = in.row_elements(), head_dim = size_t(in.shape.head_dim);
  auto where = [&](size_t i) {
    const size_t row = i / row_elements;
    return "row " + std::to_string(row) + " q head " + std::to_string(i % row_elements / head_dim) +
           " d " + std::to_string(i % head_dim);
  };
  size_t bad = 0, written_gaps = 0;
  std::string first_bad, first_gap, worst;
  double max_error = 0;
  for (int32_t row = 0; row < in.num_rows; ++row) {
    if (owned[size_t(row)]) continue;
    for (size_t i = size_t(row) * row_elements; i < size_t(row + 1) * row_elements; ++i) {
      if (got.bits[i] != 0xffff && written_gaps++ == 0) first_gap = where(i);
    }
  }
  for (const int32_t row : checked) {
    for (size_t i = size_t(row) * row_elements; i < size_t(row + 1) * row_elements; ++i) {
      const float g = from_bits(in.config.dtype, got.bits[i]);
      if (!std::isfinite(g)) {
        if (bad++ == 0) first_bad = where(i) + " = " + std::to_string(g);
        continue;
      }
      const double error = std::abs(double(g) - double(want[i]));
      if (!(error <= max_error)) {  // also catches a NaN reference
        max_error = error;
        worst = where(i) + ": " + std::to_string(g) + " vs " + std::to_string(want[i]);
      }
    }
  }
  EXPECT_EQ(bad, 0u) << "non-finite outputs; first at " << first_bad;
  EXPECT_EQ(written_gaps, 0u) << "rows no chunk owns were written; first at " << first_gap;
  EXPECT_LE(max_error, out_tolerance(in.config.dtype)) << "worst at " << worst;
}

// ---- The grid: dtype x head_dim x block_size x group x layout. ----

using GridParam = std::tuple<DType, int32_t /*head_dim*/, int32_t /*block_size*/, int32_t /*group*/, KvLayout>;

class GpuPrefillGrid : public GpuTestWithParam<GridParam> {};

// From the start; after a block-unaligned prefix; a single token and a few after a long prefix;
// a long chunk after a short unaligned prefix (partial query tiles in every case but 64 / group).
const std::vector<ChunkSpec> kGridChunks = {{0, 17}, {0, 1}, {37, 64}, {3000, 1}, {3000, 17}, {5, 513}};

TEST_P(GpuPrefillGrid, MatchesCpuReference) {
  const auto [dtype, head_dim, block_size, group, layout] = GetParam();
  uint64_t seed = 7;
  for (int64_t x : {int64_t(dtype), int64_t(head_dim), int64_t(block_size), int64_t(group), int64_t(layout)}) {
    seed = seed * 1000003 + uint64_t(x);
  }
  const Config c{.dtype = dtype, .head_dim = head_dim, .block_size = block_size, .group = group, .layout = layout};
  Inputs in = make_inputs(c, kGridChunks, seed);
  const DeviceInputs dev(in);
  expect_matches(in, run_gpu(in, dev), run_cpu(in));
}

std::string grid_name(const ::testing::TestParamInfo<GridParam>& info) {
  const auto [dtype, head_dim, block_size, group, layout] = info.param;
  return std::string(dtype_name(dtype)) + "_D" + std::to_string(head_dim) + "_Bs" +
         std::to_string(block_size) + "_G" + std::to_string(group) +
         (layout == KvLayout::kHnd ? "_HND" : "_NHD");
}

// 2 x 2 x 3 x 6 x 2 = 144 cases, 2 kv heads each (q heads = 2 x group); 7 is Qwen2.5-7B's 28 / 4.
INSTANTIATE_TEST_SUITE_P(
    Grid, GpuPrefillGrid,
    ::testing::Combine(::testing::Values(DType::kF16, DType::kBF16), ::testing::Values(64, 128),
                       ::testing::Values(16, 32, 64), ::testing::Values(1, 2, 4, 5, 7, 8),
                       ::testing::Values(KvLayout::kHnd, KvLayout::kNhd)),
    grid_name);

// ---- Edge cases. ----

class GpuPrefill : public GpuTest {};

// A 513-token chunk after a 3000-token prefix, with Llama-3-8B's group of 4 and 8 kv heads.
TEST_F(GpuPrefill, LongChunkAfterLongPrefix) {
  for (const DType dtype : {DType::kF16, DType::kBF16}) {
    const Config c{.dtype = dtype, .head_dim = 128, .block_size = 16, .group = 4, .num_kv_heads = 8};
    SCOPED_TRACE(c.name());
    Inputs in = make_inputs(c, {{3000, 513}, {1, 1}}, 11 + uint64_t(dtype));
    const DeviceInputs dev(in);
    expect_matches(in, run_gpu(in, dev), run_cpu(in));
  }
}

// The GPU against the exact double attention directly, so that the CPU reference is not the only
// judge: every row of a few chunks, both head dims.
TEST_F(GpuPrefill, MatchesExactReference) {
  for (const int32_t head_dim : {64, 128}) {
    for (const DType dtype : {DType::kF16, DType::kBF16}) {
      const Config c{.dtype = dtype, .head_dim = head_dim, .block_size = 32, .group = 5, .layout = KvLayout::kNhd};
      SCOPED_TRACE(c.name());
      Inputs in = make_inputs(c, {{0, 70}, {45, 33}, {300, 9}}, 21 + uint64_t(head_dim));
      std::vector<int32_t> rows;
      for (int32_t row = 0; row < in.num_rows; ++row) rows.push_back(row);
      const DeviceInputs dev(in);
      expect_matches(in, run_gpu(in, dev), run_exact(in, rows));
    }
  }
}

// Chunks with no new tokens produce nothing (and the step may have no work at all).
TEST_F(GpuPrefill, EmptyChunksWriteNothing) {
  const Config c{.dtype = DType::kBF16, .head_dim = 64, .block_size = 16, .group = 2};
  Inputs only_empty = make_inputs(c, {{0, 0}, {40, 0}}, 31);
  const DeviceInputs dev_empty(only_empty);
  expect_matches(only_empty, run_gpu(only_empty, dev_empty), run_cpu(only_empty));
  Inputs mixed = make_inputs(c, {{40, 0}, {3, 20}, {0, 0}}, 32);
  const DeviceInputs dev_mixed(mixed);
  expect_matches(mixed, run_gpu(mixed, dev_mixed), run_cpu(mixed));
}

// One hot key dominates: K is zero everywhere but at key `hot`, whose K is q's direction at a
// large scale (score 32 against 0). A query at position >= hot must return exactly hot's V row,
// and a query before it (which must not see it) the plain mean of the V rows [0, pos] it sees.
// The expected rows are computed here from the pool, with no reference attention involved. The
// hot key is put at both ends of 64-key tiles, inside the query tiles' diagonal, and at the end.
TEST_F(GpuPrefill, CausalMaskAtEveryBoundary) {
  const Config c{.dtype = DType::kF16, .head_dim = 64, .block_size = 16, .group = 1, .num_kv_heads = 1};
  for (const int32_t hot : {0, 63, 64, 100, 124, 127, 128, 139}) {
    SCOPED_TRACE("hot key " + std::to_string(hot));
    Inputs in = make_inputs(c, {{60, 80}}, 41);  // query tiles: positions [60, 124), [124, 140)
    const PrefillChunk& chunk = in.chunks[0];
    const int32_t num_keys = chunk.start_pos + chunk.num_new;
    auto slot_of = [&](int32_t t) { return std::pair{in.block_ids[size_t(t / c.block_size)], t % c.block_size}; };
    std::vector<float> q_row(64), k_row(64), stored(64);
    for (int32_t t = 0; t < num_keys; ++t) {
      for (int32_t d = 0; d < 64; ++d) k_row[size_t(d)] = t == hot ? (d % 2 == 0 ? 4.f : -4.f) : 0.f;
      const auto [block, slot] = slot_of(t);
      in.pool.store_row(false, block, 0, slot, k_row.data(), stored.data());
    }
    for (int32_t d = 0; d < 64; ++d) q_row[size_t(d)] = d % 2 == 0 ? 1.f : -1.f;
    for (int32_t row = 0; row < in.num_rows; ++row) {
      for (int32_t d = 0; d < 64; ++d) {
        in.q[size_t(row) * 64 + size_t(d)] = to_bits(c.dtype, q_row[size_t(d)]);
        in.q_f32[size_t(row) * 64 + size_t(d)] = q_row[size_t(d)];
      }
    }
    auto v_at = [&](int32_t t, int32_t d) {
      const auto [block, slot] = slot_of(t);
      uint16_t bits;
      std::memcpy(&bits, in.pool.v_bytes.data() + in.pool.offset(block, 0, slot, d) * 2, 2);
      return from_bits(c.dtype, bits);
    };
    // Score 64 * 4 / sqrt(64) = 32: the other keys, at most 140 of weight exp(-32), weigh < 2e-12.
    std::vector<float> want(in.q.size(), std::nanf(""));
    for (int32_t i = 0; i < chunk.num_new; ++i) {
      const int32_t pos = chunk.start_pos + i;
      for (int32_t d = 0; d < 64; ++d) {
        double mean = 0;
        for (int32_t t = 0; t <= pos; ++t) mean += v_at(t, d);
        want[size_t(chunk.row_begin + i) * 64 + size_t(d)] = pos >= hot ? v_at(hot, d) : float(mean / (pos + 1));
      }
    }
    const DeviceInputs dev(in);
    expect_matches(in, run_gpu(in, dev), want);
  }
}

// Llama-3-8B shapes (32 q / 8 kv heads, head_dim 128, blocks of 16): 64 chunks of 512 new tokens,
// half of them after a 1024-token cached prefix. Checks three tokens of every chunk against the
// exact reference, and prints the kernel's median time (not asserted: tests do not time).
TEST_F(GpuPrefill, Llama3ShapesManyChunks) {
  const Config c{.dtype = DType::kBF16, .head_dim = 128, .block_size = 16, .group = 4, .num_kv_heads = 8};
  std::vector<ChunkSpec> specs;
  for (int32_t i = 0; i < 64; ++i) specs.push_back({i % 2 == 0 ? 0 : 1024, 512});
  Inputs in = make_inputs(c, specs, 51);
  const DeviceInputs dev(in);
  std::vector<int32_t> rows;
  for (const PrefillChunk& chunk : in.chunks) {
    for (const int32_t i : {0, 255, 511}) rows.push_back(chunk.row_begin + i);
  }
  expect_matches(in, run_gpu(in, dev), run_exact(in, rows), rows);

  PrefillWorkspace ws;
  ws.upload(in.chunks, in.block_ids, in.shape);
  DeviceArray<uint16_t> out(in.q.size());
  cudaEvent_t start, stop;
  check_cuda(cudaEventCreate(&start), "cudaEventCreate");
  check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
  std::vector<float> ms;
  for (int run = 0; run < 23; ++run) {
    check_cuda(cudaEventRecord(start), "cudaEventRecord");
    prefill_attention(ws, in.shape, dev.kv, dev.q.data(), out.data());
    check_cuda(cudaEventRecord(stop), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime");
    if (run >= 3) ms.push_back(t);  // the first runs warm up
  }
  std::ranges::sort(ms);
  // Causal FLOPs: 4 * head_dim per (query head, visible key) pair.
  double pairs = 0;
  for (const ChunkSpec& s : specs) {
    pairs += double(s.num_new) * s.start_pos + double(s.num_new) * (s.num_new + 1) / 2;
  }
  const double flops = 4.0 * c.head_dim * pairs * in.shape.num_q_heads;
  std::printf("prefill 64 x 512 tokens, Llama-3-8B heads: median %.3f ms, %.1f TFLOP/s\n", ms[ms.size() / 2],
              flops / (ms[ms.size() / 2] * 1e-3) / 1e12);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

TEST(PrefillSupport, RejectsUnsupportedInput) {
  const AttentionShape good{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16, .softmax_scale = 0.1f};
  EXPECT_EQ(prefill_unsupported_reason(good, DType::kF16), nullptr);
  EXPECT_EQ(prefill_unsupported_reason(good, DType::kBF16), nullptr);
  EXPECT_NE(prefill_unsupported_reason(good, DType::kF32), nullptr);
  AttentionShape bad = good;
  bad.head_dim = 256;
  EXPECT_NE(prefill_unsupported_reason(bad, DType::kF16), nullptr);
  bad = good;
  bad.block_size = 8;
  EXPECT_NE(prefill_unsupported_reason(bad, DType::kF16), nullptr);
  bad = good;
  bad.num_q_heads = 18;  // group 9
  EXPECT_NE(prefill_unsupported_reason(bad, DType::kF16), nullptr);
  bad.num_q_heads = 7;  // not a multiple of the kv heads
  EXPECT_NE(prefill_unsupported_reason(bad, DType::kF16), nullptr);

  PrefillWorkspace ws;
  const PagedKv f32_pool = make_paged_kv(nullptr, nullptr, DType::kF32, KvLayout::kHnd, 4, 16, 2, 128, Device::kCuda);
  try {
    prefill_attention(ws, good, f32_pool, nullptr, nullptr);
    ADD_FAILURE() << "an f32 pool was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported) << e.what();
  }
  // A chunk whose block table does not cover its keys.
  const std::vector<PrefillChunk> chunks = {{.row_begin = 0, .start_pos = 30, .num_new = 3, .block_begin = 1}};
  const std::vector<int32_t> ids = {0, 1, 2};
  try {
    ws.upload(chunks, ids, good);
    ADD_FAILURE() << "a short block table was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
  }
}

// A workspace for another shape, or block ids past the pool, are refused before any launch.
TEST_F(GpuPrefill, RejectsMismatchedWorkspace) {
  const Config c{.dtype = DType::kF16, .head_dim = 64, .block_size = 16, .group = 2};
  Inputs in = make_inputs(c, {{0, 20}}, 61);
  const DeviceInputs dev(in);
  PrefillWorkspace ws;
  AttentionShape other = in.shape;
  other.num_q_heads = 8;  // group 4
  ws.upload(in.chunks, in.block_ids, other);
  DeviceArray<uint16_t> out(in.q.size());
  EXPECT_THROW(prefill_attention(ws, in.shape, dev.kv, dev.q.data(), out.data()), Error);
  std::vector<int32_t> ids = in.block_ids;
  ids[0] = in.pool.num_blocks;  // one past the pool
  ws.upload(in.chunks, ids, in.shape);
  EXPECT_THROW(prefill_attention(ws, in.shape, dev.kv, dev.q.data(), out.data()), Error);
}

}  // namespace
}  // namespace pagoda::cuda
