// Shared by the GPU attention tests: the output tolerances (derived in decode_attention_test.cpp's
// header), dtype conversions and the test shape, Config (prefill_attention_test.cpp too); and for
// the decode and prefix tests one decode step's inputs on the host and the device, the exact
// reference, and the comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "../attention/reference.h"
#include "pagoda/attention/decode_batch.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/half.h"
#include "pagoda/core/paged_kv.h"

namespace pagoda::cuda::testing {

namespace ref = ::pagoda::attention::testing;
using attention::AttentionShape;
using attention::DecodeBatch;

constexpr double kOutToleranceF16 = 2e-3;
constexpr double kOutToleranceBf16 = 1e-2;
constexpr double kLseTolerance = 1e-3;  // times max(1, |lse|)
// The CPU executor against the exact reference: fp32 accumulation only (as tests/attention).
constexpr double kCpuExactTolerance = 2e-5;
constexpr float kInf = std::numeric_limits<float>::infinity();

inline double out_tolerance(DType dtype) {
  return dtype == DType::kF16 ? kOutToleranceF16 : kOutToleranceBf16;
}

inline uint16_t to_bits(DType dtype, float x) {
  return dtype == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x);
}

inline float from_bits(DType dtype, uint16_t bits) {
  return dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

struct Config {
  DType dtype = DType::kF16;
  int32_t head_dim = 128;
  int32_t block_size = 16;
  int32_t group = 1;  // q heads per kv head
  int32_t num_kv_heads = 2;
  KvLayout layout = KvLayout::kHnd;

  AttentionShape shape() const {
    return {.num_q_heads = group * num_kv_heads, .num_kv_heads = num_kv_heads,
            .head_dim = head_dim, .block_size = block_size,
            .softmax_scale = 1.f / std::sqrt(float(head_dim))};
  }
  std::string name() const {
    return std::string(dtype_name(dtype)) + " head_dim " + std::to_string(head_dim) + " block " +
           std::to_string(block_size) + " group " + std::to_string(group) +
           (layout == KvLayout::kHnd ? " HND" : " NHD");
  }
};

// One decode step's inputs on the host.
struct Inputs {
  Config config;
  AttentionShape shape;
  ref::HostPool pool;         // NaN in every slot the inputs did not fill
  DecodeBatch batch;
  std::vector<uint16_t> q;    // [num_seqs, num_q_heads, head_dim] in config.dtype
  std::vector<float> q_f32;   // the same values in fp32, for the CPU executor

  size_t rows() const { return size_t(batch.num_seqs()) * size_t(shape.num_q_heads); }
};

// Inputs for sequences with explicit block lists (ids may repeat and be shared). Every slot a
// sequence covers gets random values; with fill_tails so does the rest of each listed block (as
// stale KV would), else those slots keep NaN. Blocks no sequence lists keep NaN, so a kernel that
// reads a slot it should not shows as non-finite output.
inline Inputs make_inputs(const Config& c, int32_t num_blocks,
                   const std::vector<std::vector<int32_t>>& blocks,
                   const std::vector<int32_t>& lengths, uint64_t seed, bool fill_tails = true) {
  Inputs in{c, c.shape(),
            ref::HostPool(c.dtype, c.layout, num_blocks, c.block_size, c.num_kv_heads, c.head_dim),
            {}, {}, {}};
  std::vector<int32_t> slots_to_fill(static_cast<size_t>(num_blocks), 0);
  for (size_t s = 0; s < lengths.size(); ++s) {
    in.batch.add_sequence(blocks[s], lengths[s]);
    for (size_t i = 0; i < blocks[s].size(); ++i) {
      const int32_t covered = std::clamp(lengths[s] - int32_t(i) * c.block_size, 0, c.block_size);
      int32_t& n = slots_to_fill[size_t(blocks[s][i])];
      n = std::max(n, fill_tails ? c.block_size : covered);
    }
  }
  ref::Random rng(seed);
  std::vector<float> row(size_t(c.head_dim)), stored(size_t(c.head_dim));
  for (int32_t b = 0; b < num_blocks; ++b) {
    for (int32_t h = 0; h < c.num_kv_heads; ++h) {
      for (int32_t slot = 0; slot < slots_to_fill[size_t(b)]; ++slot) {
        for (const bool is_v : {false, true}) {
          for (float& x : row) x = rng.uniform(-1, 1);
          in.pool.store_row(is_v, b, h, slot, row.data(), stored.data());
        }
      }
    }
  }
  in.q.resize(in.rows() * size_t(c.head_dim));
  in.q_f32.resize(in.q.size());
  for (size_t i = 0; i < in.q.size(); ++i) {
    in.q[i] = to_bits(c.dtype, rng.uniform(-1, 1));
    in.q_f32[i] = from_bits(c.dtype, in.q[i]);
  }
  return in;
}

// Inputs for sequences of `lengths`, each in blocks of its own: the pool's ids shuffled (block 0
// somewhere), plus 3 blocks nobody lists.
inline Inputs make_batch_inputs(const Config& c, const std::vector<int32_t>& lengths, uint64_t seed,
                         bool fill_tails = true) {
  int32_t needed = 0;
  for (int32_t length : lengths) needed += (length + c.block_size - 1) / c.block_size;
  const int32_t num_blocks = needed + 3;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  ref::Random rng(seed ^ 0x5eed);
  for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.next(i + 1)]);
  std::vector<std::vector<int32_t>> blocks;
  size_t next = 0;
  for (int32_t length : lengths) {
    const size_t n = size_t((length + c.block_size - 1) / c.block_size);
    blocks.emplace_back(ids.begin() + long(next), ids.begin() + long(next + n));
    next += n;
  }
  return make_inputs(c, num_blocks, blocks, lengths, seed, fill_tails);
}

// The inputs copied to the device.
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

struct Outputs {
  std::vector<float> out;  // [rows, head_dim]
  std::vector<float> lse;  // [rows]; empty when not asked for
};

inline Outputs run_exact(const Inputs& in) {
  const ref::HostPool& pool = in.pool;
  const size_t head_dim = size_t(in.shape.head_dim), heads = size_t(in.shape.num_q_heads);
  const size_t kv_row = size_t(pool.num_kv_heads) * head_dim;
  Outputs r{std::vector<float>(in.q.size()), std::vector<float>(in.rows())};
  for (int32_t s = 0; s < in.batch.num_seqs(); ++s) {
    ref::HostSequence seq;
    const auto blocks = in.batch.blocks_of(s);
    seq.blocks.assign(blocks.begin(), blocks.end());
    seq.length = in.batch.kv_lengths[size_t(s)];
    seq.k.resize(size_t(seq.length) * kv_row);
    seq.v.resize(seq.k.size());
    for (int32_t t = 0; t < seq.length; ++t) {
      for (int32_t h = 0; h < pool.num_kv_heads; ++h) {
        for (int32_t d = 0; d < pool.head_dim; ++d) {
          const size_t at = pool.offset(blocks[size_t(t / pool.block_size)], h, t % pool.block_size, d) * 2;
          uint16_t k_bits, v_bits;
          std::memcpy(&k_bits, pool.k_bytes.data() + at, 2);
          std::memcpy(&v_bits, pool.v_bytes.data() + at, 2);
          const size_t i = size_t(t) * kv_row + size_t(h) * head_dim + size_t(d);
          seq.k[i] = from_bits(pool.dtype, k_bits);
          seq.v[i] = from_bits(pool.dtype, v_bits);
        }
      }
    }
    for (size_t h = 0; h < heads; ++h) {
      const size_t row = size_t(s) * heads + h;
      const ref::ReferenceState state = ref::reference_attention(
          &in.q_f32[row * head_dim], seq, int32_t(h) / in.shape.group_size(), pool.num_kv_heads,
          pool.head_dim, double(in.shape.softmax_scale), 0, seq.length);
      for (size_t d = 0; d < head_dim; ++d) r.out[row * head_dim + d] = float(state.o[d]);
      r.lse[row] = float(state.lse);
    }
  }
  return r;
}

// Expects `got` to match `want` (which has lse): every element written and finite, within the
// tolerances; rows of an empty sequence (want lse = -inf) exactly o = 0 and lse = -inf. One
// message per kind of failure, naming the first or worst element.
inline void expect_matches(const Inputs& in, const Outputs& got, const Outputs& want, double out_tol,
                    double lse_tol) {
  const size_t head_dim = size_t(in.shape.head_dim), heads = size_t(in.shape.num_q_heads);
  ASSERT_EQ(got.out.size(), want.out.size());
  ASSERT_TRUE(got.lse.empty() || got.lse.size() == want.lse.size());
  auto where = [&](size_t row) {
    return "seq " + std::to_string(row / heads) + " (length " +
           std::to_string(in.batch.kv_lengths[row / heads]) + ") q head " + std::to_string(row % heads);
  };
  size_t bad = 0;
  std::string first_bad, worst_out, worst_lse;
  double out_error = 0, lse_error = 0;
  for (size_t row = 0; row < in.rows(); ++row) {
    const bool empty = want.lse[row] == -kInf;
    for (size_t d = 0; d < head_dim; ++d) {
      const float g = got.out[row * head_dim + d];
      if (!std::isfinite(g) || (empty && g != 0.f)) {
        if (bad++ == 0) first_bad = where(row) + " out[" + std::to_string(d) + "] = " + std::to_string(g);
        continue;
      }
      const double error = std::abs(double(g) - double(want.out[row * head_dim + d]));
      if (error > out_error) {
        out_error = error;
        worst_out = where(row) + " d " + std::to_string(d);
      }
    }
    if (got.lse.empty()) continue;
    const float g = got.lse[row];
    if (empty ? g != -kInf : !std::isfinite(g)) {
      if (bad++ == 0) first_bad = where(row) + " lse = " + std::to_string(g);
      continue;
    }
    if (empty) continue;
    const double error = std::abs(double(g) - double(want.lse[row])) /
                         std::max(1.0, std::abs(double(want.lse[row])));
    if (error > lse_error) {
      lse_error = error;
      worst_lse = where(row);
    }
  }
  EXPECT_EQ(bad, 0u) << "unwritten or non-finite elements, or an empty sequence without o = 0, "
                        "lse = -inf; the first: " << first_bad;
  EXPECT_LE(out_error, out_tol) << "out, worst at " << worst_out;
  EXPECT_LE(lse_error, lse_tol) << "lse, worst at " << worst_lse;
}

inline void expect_matches(const Inputs& in, const Outputs& got, const Outputs& want) {
  expect_matches(in, got, want, out_tolerance(in.config.dtype), kLseTolerance);
}

// Runs `plan` on the GPU with both kernels and every kind of hint (and lse or not); each must

}  // namespace pagoda::cuda::testing
