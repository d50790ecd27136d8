// The int2 and fp8 KV cache and the attention the CPU backend computes on it: the number formats
// against hand-computed values and their error bounds, the integer (homomorphic) scores and
// weighted values bit-exact against dequantize-then-multiply where every value is dyadic (so
// that the paper's identity holds exactly in floating point), and whole attention against exact
// f64 attention on the dequantized cache within bounds derived from Q's and P's 8-bit steps.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "pagoda/backend/cpu/kv_quantize.h"
#include "pagoda/backend/cpu/quantized_attention.h"
#include "pagoda/backend/cpu/quantized_kv_cache.h"
#include "pagoda/core/error.h"

namespace pagoda::cpu {
namespace {

TEST(E4m3, KnownValuesAndRoundTripOfEveryCode) {
  EXPECT_EQ(f32_to_e4m3(1.f), 0x38);
  EXPECT_EQ(f32_to_e4m3(-2.f), 0xc0);
  EXPECT_EQ(f32_to_e4m3(448.f), 0x7e);
  EXPECT_EQ(f32_to_e4m3(1e6f), 0x7e);  // saturates
  EXPECT_EQ(f32_to_e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(f32_to_e4m3(1.0625f), 0x38);  // halfway between 1 and 1.125: to even
  EXPECT_EQ(f32_to_e4m3(1.1875f), 0x3a);  // halfway between 1.125 and 1.25: to even
  EXPECT_FLOAT_EQ(e4m3_to_f32(0x7e), 448.f);
  EXPECT_FLOAT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0x7f)));
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f || code == 0x80) continue;  // NaNs; -0 comes back as -0 (0x80) too
    EXPECT_EQ(f32_to_e4m3(e4m3_to_f32(uint8_t(code))), code) << code;
  }
}

TEST(Int2Quantize, ErrorBelowOneStepUnbiasedAndSumsStored) {
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> x(64);
  for (float& v : x) v = normal(rng);
  std::vector<uint8_t> codes(64);
  std::vector<double> mean(64, 0.0);
  constexpr int kDraws = 4096;
  double step = 0;
  for (int draw = 0; draw < kDraws; ++draw) {
    Int2Params params{};
    const int32_t sum = quantize_int2(x.data(), 1, 64, uint64_t(draw), 0, 1, codes.data(), params);
    EXPECT_EQ(sum, std::accumulate(codes.begin(), codes.end(), 0));
    const float min = f16_to_f32(params.min.bits);
    step = f16_to_f32(params.scale.bits);
    for (int i = 0; i < 64; ++i) {
      const double y = min + step * codes[size_t(i)];
      ASSERT_LE(std::fabs(y - x[size_t(i)]), step * (1 + 1e-3)) << i;
      mean[size_t(i)] += y / kDraws;
    }
  }
  // Stochastic rounding is unbiased: one draw's variance is at most step^2 / 4, so the mean of
  // kDraws lies within 5 sigma = 5 step / (2 sqrt(kDraws)) of x, plus f16's rounding of min.
  for (int i = 0; i < 64; ++i)
    EXPECT_NEAR(mean[size_t(i)], x[size_t(i)], 2.5 * step / std::sqrt(double(kDraws)) + 1e-2 * step) << i;
}

TEST(Uint8Quantize, NearestWithinHalfAStepAndZerosStayZero) {
  const std::vector<float> x{0.f, 0.25f, 1.f, 0.5f, 0.f, 0.75f};
  std::vector<uint8_t> codes(x.size());
  Uint8Params params;
  const int32_t sum = quantize_uint8(x.data(), int32_t(x.size()), codes.data(), params);
  EXPECT_EQ(params.min, 0.f);
  EXPECT_FLOAT_EQ(params.scale, 1.f / 255.f);
  EXPECT_EQ(codes[0], 0);
  EXPECT_EQ(codes[4], 0);
  EXPECT_EQ(codes[2], 255);
  EXPECT_EQ(codes[1], 64);  // 63.75 rounds to 64
  EXPECT_EQ(sum, std::accumulate(codes.begin(), codes.end(), 0));
}

kv::KvCacheConfig config(KvQuant quant, int32_t partition, int32_t block_size, int32_t head_dim = 64,
                         int32_t kv_heads = 2, int32_t blocks = 8, KvQuant key_quant = KvQuant::kInt2,
                         int32_t sink_tokens = 0) {
  return {.num_layers = 1,
          .num_blocks = blocks,
          .block_size = block_size,
          .num_kv_heads = kv_heads,
          .head_dim = head_dim,
          .dtype = DType::kF16,
          .quant = quant,
          .partition = partition,
          .key_quant = key_quant,
          .sink_tokens = sink_tokens};
}

TEST(QuantizedKvCache, RefusesPartitionsThatDoNotFit) {
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kInt2, 128, 128, 64)), Error);  // head_dim 64
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kInt2, 64, 32, 64)), Error);    // block of 32
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kInt2, 48, 48, 96)), Error);    // not 32, 64 or 128
  EXPECT_NO_THROW(QuantizedKvCache(config(KvQuant::kInt2, 32, 64, 64)));
  EXPECT_NO_THROW(QuantizedKvCache(config(KvQuant::kFp8, 64, 16, 64)));
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kInt2, 32, 64, 64, 2, 8, KvQuant::kInt2, 32)), Error);  // sinks >= Π
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kInt2, 32, 64, 64, 2, 8, KvQuant::kNone)), Error);
  EXPECT_THROW(QuantizedKvCache(config(KvQuant::kFp8, 64, 16, 64, 2, 8, KvQuant::kInt2, 1)), Error);  // int2 only
  EXPECT_NO_THROW(QuantizedKvCache(config(KvQuant::kInt2, 32, 64, 64, 2, 8, KvQuant::kFp8, 31)));
}

TEST(Int2Quantize, NearestRoundingHandComputed) {
  // min 0, scale 1 (both exact in f16): halves round down, the rest to the nearest code.
  const std::vector<float> x{0.f, 3.f, 0.4f, 0.6f, 1.5f, 2.51f, 1.49f, 2.f};
  std::vector<uint8_t> codes(x.size());
  Int2Params params{};
  const int32_t sum = quantize_int2(x.data(), 1, int32_t(x.size()), 0, 0, 1, codes.data(), params, false);
  EXPECT_EQ(codes, (std::vector<uint8_t>{0, 3, 0, 1, 1, 3, 1, 2}));
  EXPECT_EQ(sum, 11);
  EXPECT_EQ(f16_to_f32(params.min.bits), 0.f);
  EXPECT_EQ(f16_to_f32(params.scale.bits), 1.f);
}

TEST(QuantizedKvCache, BytesPerTokenOfInt2AtPartition64AreAtMost17PercentOfF16) {
  const int64_t f16 = kv_block_head_bytes(KvQuant::kNone, 2, 128, 64, 64);
  const int64_t int2 = kv_block_head_bytes(KvQuant::kInt2, 2, 128, 64, 64);
  // Per token and head: K 32 + 2 x 5, V 32 + 128 x 5 / 64 bytes, against 512.
  EXPECT_EQ(int2, 64 * (32 + 10 + 32 + 10));
  EXPECT_LE(double(int2) / double(f16), 0.17);
  EXPECT_LE(double(kv_block_head_bytes(KvQuant::kInt2, 2, 64, 64, 64)) / double(kv_block_head_bytes(KvQuant::kNone, 2, 64, 64, 64)), 0.17);
  const QuantizedKvCache cache(config(KvQuant::kInt2, 64, 64, 128, 2, 8));
  EXPECT_GE(cache.nbytes(), size_t(int2 * 2 * 8));  // the arena holds at least the counted bytes
  // fp8 keys beside int2 values: K 64 + 4 (e4m3 and an f32 scale), V 16 + 64 x 5 / 64, against 256.
  const int64_t fp8_keys = kv_block_head_bytes(KvQuant::kInt2, 2, 64, 64, 64, KvQuant::kFp8);
  EXPECT_EQ(fp8_keys, 64 * (68 + 21));
  const QuantizedKvCache mixed(config(KvQuant::kInt2, 64, 64, 64, 2, 8, KvQuant::kFp8));
  EXPECT_GE(mixed.nbytes(), size_t(fp8_keys * 2 * 8));
}

// A sequence of `length` tokens of K and V [length, heads, dim] in blocks 0, 1, ...
struct Sequence {
  std::vector<float> k, v;
  std::vector<int32_t> blocks;
};

Tensor rows(std::vector<float>& data, int64_t begin, int64_t n, int32_t heads, int32_t dim) {
  return Tensor::contiguous(data.data() + begin * heads * dim, DType::kF32, {n, heads, dim});
}

Sequence write_random(QuantizedKvCache& cache, int32_t length, uint32_t seed, std::vector<int32_t> blocks = {}) {
  const auto& c = cache.config();
  Sequence s;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  s.k.resize(size_t(length) * size_t(c.num_kv_heads) * size_t(c.head_dim));
  s.v.resize(s.k.size());
  for (float& x : s.k) x = normal(rng);
  for (float& x : s.v) x = normal(rng);
  if (blocks.empty()) {
    blocks.resize(size_t((length + c.block_size - 1) / c.block_size));
    std::iota(blocks.begin(), blocks.end(), 0);
  }
  s.blocks = blocks;
  // In uneven chunks, as chunked prefill and decode append.
  for (int32_t start = 0, chunk = 1; start < length; start += chunk, chunk = chunk * 3 % 17 + 1) {
    const int32_t n = std::min(chunk, length - start);
    cache.write(0, s.blocks, start, rows(s.k, start, n, c.num_kv_heads, c.head_dim), rows(s.v, start, n, c.num_kv_heads, c.head_dim));
  }
  return s;
}

// K and V of one head as attention reads them back: [length, dim], dequantized.
void dequantize(const QuantizedPagedKv& kv, int32_t head, std::span<const int32_t> blocks, int32_t length,
                std::vector<double>& k, std::vector<double>& v) {
  const int32_t dim = kv.head_dim;
  k.assign(size_t(length) * size_t(dim), 0);
  v.assign(k.size(), 0);
  for (int32_t t = 0; t < length; ++t) {
    const int64_t block = blocks[size_t(t / kv.block_size)], slot = t % kv.block_size;
    if (kv.quant == KvQuant::kFp8) {
      const int64_t at = block * kv.k_codes_block() + head * kv.k_codes_head() + slot * dim;
      const int64_t s = block * kv.fp8_scale_block() + head * kv.fp8_scale_head() + slot;
      for (int32_t d = 0; d < dim; ++d) {
        k[size_t(t * dim + d)] = double(kv.k_fp8_scale[s]) * e4m3_to_f32(kv.k_codes[at + d]);
        v[size_t(t * dim + d)] = double(kv.v_fp8_scale[s]) * e4m3_to_f32(kv.v_codes[at + d]);
      }
      continue;
    }
    if (t < kv.sink_tokens) {  // the sinks' f16 copies
      const int64_t at = kv.sink_slot[blocks[0]] * kv.sink_slot_stride() + head * kv.sink_head() + int64_t(t) * dim;
      for (int32_t d = 0; d < dim; ++d) {
        k[size_t(t * dim + d)] = f16_to_f32(kv.sink_k[at + d].bits);
        v[size_t(t * dim + d)] = f16_to_f32(kv.sink_v[at + d].bits);
      }
      continue;
    }
    if (kv.fp8_keys()) {
      const int64_t at = block * kv.k_codes_block() + head * kv.k_codes_head() + slot * dim;
      const float scale = kv.k_fp8_scale[block * kv.fp8_scale_block() + head * kv.fp8_scale_head() + slot];
      for (int32_t d = 0; d < dim; ++d) k[size_t(t * dim + d)] = double(scale) * e4m3_to_f32(kv.k_codes[at + d]);
    }
    const uint8_t* kc = kv.k_codes + block * kv.k_codes_block() + head * kv.k_codes_head() + slot * (dim / 4);
    for (int32_t d = 0; d < dim && !kv.fp8_keys(); ++d) {
      const int64_t m = block * kv.k_meta_block() + head * kv.k_meta_head() + slot * kv.k_parts() + d / kv.partition;
      k[size_t(t * dim + d)] = f16_to_f32(kv.k_min[m].bits) + double(f16_to_f32(kv.k_scale[m].bits)) * int2_code(kc, d);
    }
    const int32_t index = int32_t(slot) / kv.partition;
    if (index < kv.sealed[block]) {
      for (int32_t c = 0; c < dim; ++c) {
        const int64_t m = block * kv.v_meta_block() + head * kv.v_meta_head() + int64_t(index) * dim + c;
        const uint8_t* vc = kv.v_codes + block * kv.v_codes_block() + head * kv.v_codes_head() + int64_t(c) * (kv.block_size / 4);
        v[size_t(t * dim + c)] = f16_to_f32(kv.v_min[m].bits) + double(f16_to_f32(kv.v_scale[m].bits)) * int2_code(vc, slot);
      }
    } else {
      const f16* tail = kv.tail + int64_t(kv.tail_slot[block]) * kv.tail_slot_stride() + head * kv.tail_head() +
                        (slot % kv.partition) * dim;
      for (int32_t c = 0; c < dim; ++c) v[size_t(t * dim + c)] = f16_to_f32(tail[c].bits);
    }
  }
}

TEST(QuantizedKvCache, StoredSumsEqualTheCodesSumsAndTheTailHoldsTheOpenPartition) {
  QuantizedKvCache cache(config(KvQuant::kInt2, 32, 64, 64, 2, 4));
  const int32_t length = 64 + 32 + 20;  // block 0 sealed, block 1: one partition sealed, 20 tokens in the tail
  const Sequence s = write_random(cache, length, 7);
  const QuantizedPagedKv kv = cache.layer(0);
  EXPECT_EQ(kv.sealed[0], 2);
  EXPECT_EQ(kv.tail_slot[0], -1);
  EXPECT_EQ(kv.sealed[1], 1);
  ASSERT_GE(kv.tail_slot[1], 0);
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t t = 0; t < length; ++t) {
      const int64_t block = t / 64, slot = t % 64;
      const uint8_t* kc = kv.k_codes + block * kv.k_codes_block() + h * kv.k_codes_head() + slot * 16;
      for (int32_t p = 0; p < 2; ++p) {
        int32_t sum = 0;
        for (int32_t d = p * 32; d < (p + 1) * 32; ++d) sum += int2_code(kc, d);
        EXPECT_EQ(kv.k_sums[block * kv.k_meta_block() + h * kv.k_meta_head() + slot * 2 + p], sum);
      }
      if (t >= 96) {  // in the tail, in f16
        const f16* tail = kv.tail + kv.tail_slot[1] * kv.tail_slot_stride() + h * kv.tail_head() + (t - 96) * 64;
        EXPECT_EQ(tail[5].bits, f32_to_f16(s.v[size_t((t * 2 + h) * 64 + 5)]));
      }
    }
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t partition = 0; partition < 3; ++partition) {
      const int64_t block = partition / 2, index = partition % 2;
      for (int32_t c = 0; c < 64; ++c) {
        const uint8_t* vc = kv.v_codes + block * kv.v_codes_block() + h * kv.v_codes_head() + c * 16;
        int32_t sum = 0;
        for (int32_t i = 0; i < 32; ++i) sum += int2_code(vc, index * 32 + i);
        EXPECT_EQ(kv.v_sums[block * kv.v_meta_block() + h * kv.v_meta_head() + index * 64 + c], sum);
      }
    }
}

// K and V on the int2 grid of each partition (min and scale dyadic, codes 0 and 3 present so
// that quantizing gives back exactly these codes), Q and P on a uint8 grid: every product and
// sum below is exact in float, so Eq. 4's integer form must equal dequantize-then-multiply.
TEST(QuantizedAttention, IntegerScoresAndWeightedValuesAreBitExactOnDyadicData) {
  for (const int32_t partition : {32, 64}) {
    SCOPED_TRACE(partition);
    const int32_t dim = 64, length = 64 + partition + 5, heads = 1;
    QuantizedKvCache cache(config(KvQuant::kInt2, partition, 64, dim, heads, 4));
    std::mt19937 rng(3);
    auto grid = [&](std::vector<float>& x, int64_t count, int64_t stride, float min, float scale, int levels) {
      for (int64_t i = 0; i < count; ++i) {
        const int code = i == 0 ? 0 : i == 1 ? levels - 1 : int(rng() % uint32_t(levels));
        x[size_t(i * stride)] = min + scale * float(code);
      }
    };
    std::vector<float> k(size_t(length) * dim), v(size_t(length) * dim);
    for (int32_t t = 0; t < length; ++t)
      for (int32_t p = 0; p < dim / partition; ++p) {
        std::vector<float> part(static_cast<size_t>(partition));
        grid(part, partition, 1, -1.5f + 0.25f * float(p), 0.25f, 4);
        std::copy(part.begin(), part.end(), k.begin() + int64_t(t) * dim + p * partition);
      }
    for (int32_t start = 0; start < length; start += partition)
      for (int32_t c = 0; c < dim; ++c) {
        std::vector<float> column(static_cast<size_t>(partition));
        grid(column, partition, 1, -0.75f - 0.125f * float(c % 4), 0.5f, 4);
        for (int32_t i = 0; i < partition && start + i < length; ++i) v[size_t((start + i) * dim + c)] = column[size_t(i)];
      }
    std::vector<int32_t> blocks{2, 0, 3};
    cache.write(0, blocks, 0, Tensor::contiguous(k.data(), DType::kF32, {length, heads, dim}),
                Tensor::contiguous(v.data(), DType::kF32, {length, heads, dim}));
    const QuantizedPagedKv kv = cache.layer(0);
    std::vector<double> k_hat, v_hat;
    dequantize(kv, 0, blocks, length, k_hat, v_hat);
    for (size_t i = 0; i < k.size(); ++i) ASSERT_EQ(k_hat[i], k[i]) << "K codes are not the grid's";
    for (size_t i = 0; i < size_t((length - 5) * dim); ++i) ASSERT_EQ(v_hat[i], v[i]) << "V codes are not the grid's";

    const int32_t rows = 2;
    std::vector<float> q(size_t(rows) * dim);
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t p = 0; p < dim / partition; ++p) {
        std::vector<float> part(static_cast<size_t>(partition));
        grid(part, partition, 1, -2.f + float(r), 1.f / 64.f, 256);
        std::copy(part.begin(), part.end(), q.begin() + r * dim + p * partition);
      }
    std::vector<float> scores(size_t(rows) * length);
    quantized_scores(kv, 0, blocks, length, q.data(), rows, scores.data());
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t t = 0; t < length; ++t) {
        double exact = 0;
        for (int32_t d = 0; d < dim; ++d) exact += double(q[size_t(r * dim + d)]) * k_hat[size_t(t * dim + d)];
        ASSERT_EQ(scores[size_t(r * length + t)], float(exact)) << r << " " << t;
      }

    // P: each partition of the sequence on [0, 255 / 256] in steps of 1/256, 0 and the top present.
    std::vector<float> p(size_t(rows) * length);
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t start = 0; start < length; start += partition) {
        std::vector<float> part(static_cast<size_t>(partition));
        grid(part, partition, 1, 0.f, 1.f / 256.f, 256);
        for (int32_t i = 0; i < partition && start + i < length; ++i) p[size_t(r * length + start + i)] = part[size_t(i)];
      }
    std::vector<float> out(size_t(rows) * dim);
    quantized_weighted_values(kv, 0, blocks, length, p.data(), rows, out.data());
    for (int32_t r = 0; r < rows; ++r)
      for (int32_t c = 0; c < dim; ++c) {
        double exact = 0;
        for (int32_t t = 0; t < length; ++t) exact += double(p[size_t(r * length + t)]) * v_hat[size_t(t * dim + c)];
        ASSERT_EQ(out[size_t(r * dim + c)], float(exact)) << r << " " << c;
      }
  }
}

// Exact f64 attention over the dequantized cache, with q as int2 attention sees it (its uint8
// codes per partition, dequantized; fp8 attends with q itself), and the bound on how far attention
// on the codes may be from it: P's rounding to the nearest uint8 step moves each numerator by at
// most half its partition's step; f32 arithmetic moves each score by a relative 1e-5 at most.
struct Reference {
  std::vector<double> out;
  std::vector<double> bound;
};

Reference reference(const QuantizedPagedKv& kv, int32_t head, std::span<const int32_t> blocks, int32_t length,
                    const float* q, float scale) {
  std::vector<double> k, v;
  dequantize(kv, head, blocks, length, k, v);
  const int32_t dim = kv.head_dim, part = kv.quant == KvQuant::kInt2 ? kv.partition : dim;
  std::vector<double> q_hat(q, q + dim);
  if (!kv.fp8_keys()) {
    std::vector<uint8_t> codes(static_cast<size_t>(part));
    for (int32_t p = 0; p < dim / part; ++p) {
      Uint8Params params;
      quantize_uint8(q + p * part, part, codes.data(), params);
      for (int32_t d = 0; d < part; ++d) q_hat[size_t(p * part + d)] = params.min + double(params.scale) * codes[size_t(d)];
    }
  }
  std::vector<double> s(static_cast<size_t>(length)), delta(size_t(length), 0);
  double max = -1e300;
  for (int32_t t = 0; t < length; ++t) {
    double abs = 0;
    for (int32_t d = 0; d < dim; ++d) {
      const double qd = t < kv.sink_tokens ? double(q[d]) : q_hat[size_t(d)];  // sinks meet q unquantized
      s[size_t(t)] += qd * k[size_t(t * dim + d)];
      abs += std::fabs(qd * k[size_t(t * dim + d)]);
    }
    s[size_t(t)] *= scale;
    delta[size_t(t)] = 1e-5 * (1 + abs * scale);
    max = std::max(max, s[size_t(t)]);
  }
  double sum = 0, max_delta = 0;
  for (int32_t t = 0; t < length; ++t) {
    s[size_t(t)] = std::exp(s[size_t(t)] - max);
    sum += s[size_t(t)];
    max_delta = std::max(max_delta, delta[size_t(t)]);
  }
  Reference ref{.out = std::vector<double>(size_t(dim), 0), .bound = std::vector<double>(size_t(dim), 0)};
  // The steps of P's partitions: the numerators attention quantizes lie within exp(+-delta) of s.
  const double widen = std::exp(max_delta);
  std::vector<double> p_step(size_t((length + part - 1) / part));
  for (size_t j = 0; j < p_step.size(); ++j) {
    double lo = 1e300, hi = 0;
    const auto end = std::min<int64_t>(int64_t(j + 1) * kv.partition, length);
    for (int64_t t = std::max<int64_t>(int64_t(j) * kv.partition, kv.sink_tokens); t < end; ++t)
      lo = std::min(lo, s[size_t(t)]), hi = std::max(hi, s[size_t(t)]);
    // Masked tokens, and sinks (weighted apart, in fp32), weigh 0 in the 8-bit product.
    if (end - int64_t(j) * kv.partition < kv.partition || (j == 0 && kv.sink_tokens > 0)) lo = 0;
    p_step[j] = (hi * widen - lo / widen) / 255;
  }
  for (int32_t c = 0; c < dim; ++c) {
    double weighted_abs = 0, p_error = 0;
    for (int32_t t = 0; t < length; ++t) {
      ref.out[size_t(c)] += s[size_t(t)] / sum * v[size_t(t * dim + c)];
      weighted_abs += s[size_t(t)] / sum * std::fabs(v[size_t(t * dim + c)]);
      if (kv.quant == KvQuant::kInt2 && t >= kv.sink_tokens)
        p_error += p_step[size_t(t / kv.partition)] / 2 * std::fabs(v[size_t(t * dim + c)]);
    }
    // The sum divided by is of the perturbed numerators: within exp(+-delta) of sum.
    ref.bound[size_t(c)] = (std::exp(2 * max_delta) - 1) * weighted_abs + p_error * widen / sum + 1e-5 * (1 + weighted_abs);
  }
  return ref;
}

struct Format {
  KvQuant quant;
  int32_t partition;
  KvQuant key_quant = KvQuant::kInt2;
  int32_t sink_tokens = 0;
};

class QuantizedAttentionFormats : public ::testing::TestWithParam<Format> {};

TEST_P(QuantizedAttentionFormats, DecodeAndPrefillMatchExactAttentionOnDequantizedKv) {
  const auto [quant, partition, key_quant, sink_tokens] = GetParam();
  const int32_t dim = 64, kv_heads = 2, group = 3, block = 64;
  QuantizedKvCache cache(config(quant, partition, block, dim, kv_heads, 8, key_quant, sink_tokens));
  const int32_t length = 2 * block + partition + 9;  // a sealed-partition run, then an open tail
  const Sequence s = write_random(cache, length, 11, {5, 1, 6, 2});
  const QuantizedPagedKv kv = cache.layer(0);
  const attention::AttentionShape shape{.num_q_heads = kv_heads * group, .num_kv_heads = kv_heads, .head_dim = dim,
                                        .block_size = block, .softmax_scale = 1.f / 8.f};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 1.5f);
  // Decode: one query at the end.
  std::vector<float> q(size_t(shape.num_q_heads) * dim), out(q.size());
  for (float& x : q) x = normal(rng);
  attention::DecodeBatch batch;
  batch.add_sequence(s.blocks, length);
  decode_attention_quantized(batch, shape, kv, q.data(), out.data());
  double worst = 0, loosest = 0;
  for (int32_t h = 0; h < shape.num_q_heads; ++h) {
    const Reference ref = reference(kv, h / group, s.blocks, length, q.data() + h * dim, shape.softmax_scale);
    for (int32_t c = 0; c < dim; ++c) {
      EXPECT_NEAR(out[size_t(h * dim + c)], ref.out[size_t(c)], ref.bound[size_t(c)]) << h << " " << c;
      worst = std::max(worst, std::fabs(out[size_t(h * dim + c)] - ref.out[size_t(c)]));
      loosest = std::max(loosest, ref.bound[size_t(c)]);
    }
  }
  // Unit-normal V under these weights gives outputs of a few tenths: a bound near that would
  // test nothing (measured: 0.03 at Π = 32, 0.06 at Π = 64, against errors of 0.004 and 0.009).
  EXPECT_LT(loosest, 0.1);
  EXPECT_GT(worst, 0.0);
  RecordProperty("worst_error", std::to_string(worst));
  RecordProperty("loosest_bound", std::to_string(loosest));
  // Prefill of the last 70 tokens on the cached blocks: the early queries stop inside sealed
  // partitions, whose later tokens must weigh nothing.
  const int32_t num_new = 70, start = length - num_new;
  std::vector<float> qs(size_t(num_new) * q.size()), outs(qs.size());
  for (float& x : qs) x = normal(rng);
  prefill_attention_quantized(shape, kv, s.blocks, start, num_new, qs.data(), outs.data());
  for (int32_t i = 0; i < num_new; i += 7)
    for (int32_t h = 0; h < shape.num_q_heads; ++h) {
      const float* qi = qs.data() + (int64_t(i) * shape.num_q_heads + h) * dim;
      const Reference ref = reference(kv, h / group, s.blocks, start + i + 1, qi, shape.softmax_scale);
      for (int32_t c = 0; c < dim; ++c)
        ASSERT_NEAR(outs[size_t((int64_t(i) * shape.num_q_heads + h) * dim + c)], ref.out[size_t(c)], ref.bound[size_t(c)])
            << i << " " << h << " " << c;
    }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedAttentionFormats,
                         ::testing::Values(Format{KvQuant::kInt2, 32}, Format{KvQuant::kInt2, 64},
                                           Format{KvQuant::kFp8, 64}, Format{KvQuant::kInt2, 64, KvQuant::kFp8},
                                           Format{KvQuant::kInt2, 32, KvQuant::kInt2, 3},
                                           Format{KvQuant::kInt2, 64, KvQuant::kFp8, 1}),
                         [](const auto& info) {
                           return std::string(kv_quant_name(info.param.quant)) + "_" +
                                  std::to_string(info.param.partition) +
                                  (info.param.key_quant == KvQuant::kFp8 ? "_fp8_keys" : "") +
                                  (info.param.sink_tokens > 0 ? "_sinks" + std::to_string(info.param.sink_tokens) : "");
                         });

// Sink tokens are the f16 of what was written, whatever the chunking; they do not widen the
// first V partition's range (an outlier sink leaves the other tokens' step as it was); a copy of
// the first block carries them; the block written again from a later position gives its slot up.
TEST(QuantizedKvCache, SinkTokensAreStoredInF16AndLeaveTheirPartitionsRange) {
  const int32_t sinks = 3;
  QuantizedKvCache cache(config(KvQuant::kInt2, 32, 64, 64, 2, 8, KvQuant::kInt2, sinks));
  QuantizedKvCache plain(config(KvQuant::kInt2, 32, 64, 64, 2, 8));
  std::mt19937 rng(4);
  std::normal_distribution<float> normal;
  std::vector<float> k(size_t(40) * 2 * 64), v(k.size());
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (int32_t i = 0; i < sinks * 2 * 64; ++i) v[size_t(i)] = 100.f;  // the sinks' values: outliers
  std::vector<float> v_plain = v;  // the same tokens, without the outliers, in a cache without sinks
  for (int32_t i = 0; i < sinks * 2 * 64; ++i) v_plain[size_t(i)] = v[size_t(sinks * 2 * 64 + i % 128)];
  const std::vector<int32_t> blocks{3};
  for (int32_t start = 0; start < 40; start += 7) {
    const int32_t n = std::min(7, 40 - start);
    cache.write(0, blocks, start, rows(k, start, n, 2, 64), rows(v, start, n, 2, 64));
    plain.write(0, blocks, start, rows(k, start, n, 2, 64), rows(v_plain, start, n, 2, 64));
  }
  const QuantizedPagedKv kv = cache.layer(0);
  ASSERT_GE(kv.sink_slot[3], 0);
  for (int32_t t = 0; t < sinks; ++t)
    for (int32_t h = 0; h < 2; ++h)
      for (int32_t d = 0; d < 64; ++d) {
        const int64_t at = kv.sink_slot[3] * kv.sink_slot_stride() + h * kv.sink_head() + t * 64 + d;
        ASSERT_EQ(kv.sink_k[at].bits, f32_to_f16(k[size_t((t * 2 + h) * 64 + d)]));
        ASSERT_EQ(kv.sink_v[at].bits, f32_to_f16(100.f));
      }
  // The first partition (sealed at token 32) is quantized as if the sinks were the token after them.
  const QuantizedPagedKv ref = plain.layer(0);
  ASSERT_EQ(kv.sealed[3], 1);
  for (int32_t h = 0; h < 2; ++h)
    for (int32_t c = 0; c < 64; ++c) {  // partition 0 of each head (partition 1 is still in the tail)
      const int64_t i = 3 * kv.v_meta_block() + h * kv.v_meta_head() + c;
      ASSERT_EQ(kv.v_min[i].bits, ref.v_min[i].bits) << h << " " << c;
      ASSERT_EQ(kv.v_scale[i].bits, ref.v_scale[i].bits) << h << " " << c;
    }
  cache.copy_block(3, 6);
  const QuantizedPagedKv copied = cache.layer(0);
  ASSERT_GE(copied.sink_slot[6], 0);
  EXPECT_NE(copied.sink_slot[6], copied.sink_slot[3]);
  for (int64_t i = 0; i < copied.sink_slot_stride(); ++i) {
    ASSERT_EQ(copied.sink_k[copied.sink_slot[6] * copied.sink_slot_stride() + i].bits,
              copied.sink_k[copied.sink_slot[3] * copied.sink_slot_stride() + i].bits);
    ASSERT_EQ(copied.sink_v[copied.sink_slot[6] * copied.sink_slot_stride() + i].bits,
              copied.sink_v[copied.sink_slot[3] * copied.sink_slot_stride() + i].bits);
  }
  // Block 3 handed to another sequence as its second block: no sinks there any more.
  cache.write(0, std::vector<int32_t>{0, 3}, 64, rows(k, 0, 1, 2, 64), rows(v, 0, 1, 2, 64));
  EXPECT_EQ(cache.layer(0).sink_slot[3], -1);
  EXPECT_GE(cache.layer(0).sink_slot[6], 0);
}

// Copy on write of a partial block (its tail included), then the copy grows until its partition seals:
// it reads exactly what a cache that wrote it alone reads, since rounding depends on positions only,
// and the source block is untouched.
TEST(QuantizedKvCache, CopyOfAPartialBlockKeepsItsTail) {
  for (const KvQuant quant : {KvQuant::kInt2, KvQuant::kFp8}) {
    QuantizedKvCache shared(config(quant, 32, 64, 64, 2, 8));
    const Sequence a = write_random(shared, 64 + 40, 21, {0, 1});
    shared.copy_block(1, 4);
    std::vector<float> more(size_t(24) * 2 * 64);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    for (float& x : more) x = normal(rng);
    const Tensor rows_more = Tensor::contiguous(more.data(), DType::kF32, {24, 2, 64});
    shared.write(0, std::vector<int32_t>{0, 4}, 104, rows_more, rows_more);  // b continues in its copy
    QuantizedKvCache alone(config(quant, 32, 64, 64, 2, 8));
    std::vector<float> k = a.k, v = a.v;
    k.insert(k.end(), more.begin(), more.end());
    v.insert(v.end(), more.begin(), more.end());
    alone.write(0, std::vector<int32_t>{0, 1}, 0, Tensor::contiguous(k.data(), DType::kF32, {128, 2, 64}),
                Tensor::contiguous(v.data(), DType::kF32, {128, 2, 64}));
    for (int32_t h = 0; h < 2; ++h) {
      std::vector<double> k1, v1, k2, v2, ka, va;
      dequantize(shared.layer(0), h, std::vector<int32_t>{0, 4}, 128, k1, v1);
      dequantize(alone.layer(0), h, std::vector<int32_t>{0, 1}, 128, k2, v2);
      EXPECT_EQ(k1, k2);
      EXPECT_EQ(v1, v2);
      dequantize(shared.layer(0), h, std::vector<int32_t>{0, 1}, 104, ka, va);  // a's block is untouched
      dequantize(alone.layer(0), h, std::vector<int32_t>{0, 1}, 104, k2, v2);
      EXPECT_EQ(ka, k2);
      if (quant == KvQuant::kFp8) {
        EXPECT_EQ(va, v2);
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::cpu
