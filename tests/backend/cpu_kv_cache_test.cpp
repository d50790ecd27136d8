#include "pagoda/backend/cpu/kv_cache.h"

#include <gtest/gtest.h>

#include <cstring>
#include <tuple>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::kv {
namespace {

using cpu::KvCache;

constexpr int32_t kLayers = 2, kBlocks = 6, kBlockSize = 4, kHeads = 3, kHeadDim = 8;

// Element (block, head, slot, d) read back as fp32, with the layout's offset written out here
// rather than taken from the view's strides.
float read(const PagedKv& kv, bool is_v, KvLayout layout, int32_t block, int32_t head,
           int32_t slot, int32_t d) {
  const size_t at = layout == KvLayout::kHnd
                        ? ((size_t(block) * kHeads + size_t(head)) * kBlockSize + size_t(slot)) * kHeadDim + size_t(d)
                        : ((size_t(block) * kBlockSize + size_t(slot)) * kHeads + size_t(head)) * kHeadDim + size_t(d);
  const auto* base = static_cast<const uint8_t*>(is_v ? kv.v : kv.k);
  if (kv.dtype == DType::kF32) {
    float x;
    std::memcpy(&x, base + at * 4, 4);
    return x;
  }
  uint16_t bits;
  std::memcpy(&bits, base + at * 2, 2);
  return kv.dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits);
}

float rounded(DType dtype, float x) {
  if (dtype == DType::kF16) return f16_to_f32(f32_to_f16(x));
  if (dtype == DType::kBF16) return bf16_to_f32(f32_to_bf16(x));
  return x;
}

// Input value of token t (sequence position), head h, dim d; distinct for K and V. Exact in fp32
// (no rounding that could differ between call sites), with bits that bf16 and f16 must round.
float value(bool is_v, int32_t t, int32_t h, int32_t d) {
  return float((is_v ? -1 : 1) * (t * 4096 + h * 256 + d * 16 + 1)) / 1024.f;
}

Tensor rows(std::vector<float>& storage, bool is_v, int32_t start, int32_t n) {
  storage.assign(size_t(n) * kHeads * kHeadDim, 0.f);
  for (int32_t i = 0; i < n; ++i)
    for (int32_t h = 0; h < kHeads; ++h)
      for (int32_t d = 0; d < kHeadDim; ++d)
        storage[(size_t(i) * kHeads + size_t(h)) * kHeadDim + size_t(d)] = value(is_v, start + i, h, d);
  return Tensor::contiguous(storage.data(), DType::kF32, {n, kHeads, kHeadDim});
}

class KvCacheLayouts : public ::testing::TestWithParam<std::tuple<KvLayout, DType>> {};

TEST_P(KvCacheLayouts, WritesLandWhereTheLayoutSays) {
  const auto [layout, dtype] = GetParam();
  KvCache cache({.num_layers = kLayers, .num_blocks = kBlocks, .block_size = kBlockSize,
                 .num_kv_heads = kHeads, .head_dim = kHeadDim, .dtype = dtype, .layout = layout});
  EXPECT_EQ(cache.nbytes(), size_t(kLayers) * 2 * kBlocks * kBlockSize * kHeads * kHeadDim * dtype_size(dtype));
  BlockPool pool(kBlocks, kBlockSize);
  pool.allocate();  // keep block 0 out of the first sequence so ids are not positions
  BlockTable table;
  append_tokens(table, 10, pool);
  // Layer 0 holds other values (V's as K, K's as V) that writes to layer 1 must not touch.
  std::vector<float> k, v;
  cache.write(0, table, 0, rows(v, true, 0, 10), rows(k, false, 0, 10));
  // Two chunks, the second starting mid-block, into layer 1.
  cache.write(1, table, 0, rows(k, false, 0, 6), rows(v, true, 0, 6));
  cache.write(1, table, 6, rows(k, false, 6, 4), rows(v, true, 6, 4));
  const PagedKv kv = cache.layer(1);
  EXPECT_EQ(kv.dtype, dtype);
  EXPECT_EQ(kv.block_size, kBlockSize);
  for (int32_t t = 0; t < 10; ++t) {
    const BlockId block = table.block_ids[size_t(t / kBlockSize)];
    for (int32_t h = 0; h < kHeads; ++h) {
      for (int32_t d = 0; d < kHeadDim; ++d) {
        EXPECT_EQ(read(kv, false, layout, block, h, t % kBlockSize, d), rounded(dtype, value(false, t, h, d)));
        EXPECT_EQ(read(kv, true, layout, block, h, t % kBlockSize, d), rounded(dtype, value(true, t, h, d)));
      }
    }
  }
  // Layer 0 untouched.
  const PagedKv layer0 = cache.layer(0);
  for (int32_t t = 0; t < 10; ++t) {
    const BlockId block = table.block_ids[size_t(t / kBlockSize)];
    EXPECT_EQ(read(layer0, false, layout, block, 1, t % kBlockSize, 3), rounded(dtype, value(true, t, 1, 3)));
    EXPECT_EQ(read(layer0, true, layout, block, 1, t % kBlockSize, 3), rounded(dtype, value(false, t, 1, 3)));
  }
}

TEST_P(KvCacheLayouts, CopyBlockCopiesEveryLayerKAndV) {
  const auto [layout, dtype] = GetParam();
  KvCache cache({.num_layers = kLayers, .num_blocks = kBlocks, .block_size = kBlockSize,
                 .num_kv_heads = kHeads, .head_dim = kHeadDim, .dtype = dtype, .layout = layout});
  BlockPool pool(kBlocks, kBlockSize);
  BlockTable parent;
  append_tokens(parent, 6, pool);
  std::vector<float> k, v;
  for (int32_t layer = 0; layer < kLayers; ++layer) cache.write(layer, parent, 0, rows(k, false, 0, 6), rows(v, true, 0, 6));
  // The child shares the partial tail; appending gives it a copy to fill.
  BlockTable child = fork(parent, 6, pool);
  const std::optional<BlockCopy> copy = append_tokens(child, 1, pool);
  ASSERT_TRUE(copy.has_value());
  cache.copy_block(copy->src, copy->dst);
  // The parent holds its tail alone again and appends in place.
  ASSERT_FALSE(append_tokens(parent, 1, pool).has_value());
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    cache.write(layer, child, 6, rows(k, false, 100, 1), rows(v, true, 100, 1));
    cache.write(layer, parent, 6, rows(k, false, 200, 1), rows(v, true, 200, 1));
    const PagedKv kv = cache.layer(layer);
    for (int32_t slot = 0; slot < 2; ++slot) {  // the parent's two tokens, now in both blocks
      for (int32_t h = 0; h < kHeads; ++h) {
        EXPECT_EQ(read(kv, false, layout, copy->dst, h, slot, 5), read(kv, false, layout, copy->src, h, slot, 5));
        EXPECT_EQ(read(kv, true, layout, copy->dst, h, slot, 5), read(kv, true, layout, copy->src, h, slot, 5));
      }
    }
    // Each sequence's new token went to its own block.
    EXPECT_EQ(read(kv, false, layout, copy->dst, 1, 2, 3), rounded(dtype, value(false, 100, 1, 3)));
    EXPECT_EQ(read(kv, false, layout, copy->src, 1, 2, 3), rounded(dtype, value(false, 200, 1, 3)));
  }
}

INSTANTIATE_TEST_SUITE_P(All, KvCacheLayouts,
                         ::testing::Combine(::testing::Values(KvLayout::kHnd, KvLayout::kNhd),
                                            ::testing::Values(DType::kF32, DType::kF16, DType::kBF16)));

TEST(KvCache, ViewStridesMatchTheLayouts) {
  const PagedKv hnd = make_paged_kv(nullptr, nullptr, DType::kF16, KvLayout::kHnd, 10, 16, 8, 128);
  EXPECT_EQ(hnd.page_stride, 16 * 8 * 128);
  EXPECT_EQ(hnd.head_stride, 16 * 128);
  EXPECT_EQ(hnd.token_stride, 128);
  const PagedKv nhd = make_paged_kv(nullptr, nullptr, DType::kF16, KvLayout::kNhd, 10, 16, 8, 128);
  EXPECT_EQ(nhd.page_stride, 16 * 8 * 128);
  EXPECT_EQ(nhd.head_stride, 128);
  EXPECT_EQ(nhd.token_stride, 8 * 128);
}

TEST(KvCache, RejectsBadConfigsAndWrites) {
  EXPECT_THROW(KvCache({.num_layers = 1, .num_blocks = 0, .num_kv_heads = 1, .head_dim = 8}), Error);
  EXPECT_THROW(KvCache({.num_layers = 1, .num_blocks = 2, .num_kv_heads = 1, .head_dim = 8,
                        .dtype = DType::kI32}), Error);
  KvCache cache({.num_layers = 1, .num_blocks = kBlocks, .block_size = kBlockSize,
                 .num_kv_heads = kHeads, .head_dim = kHeadDim});
  BlockPool pool(kBlocks, kBlockSize);
  BlockTable table;
  append_tokens(table, 5, pool);
  std::vector<float> k, v;
  EXPECT_THROW(cache.write(0, table, 3, rows(k, false, 0, 3), rows(v, true, 0, 3)), Error);  // past length
  EXPECT_THROW(cache.write(1, table, 0, rows(k, false, 0, 1), rows(v, true, 0, 1)), Error);  // no layer 1
  EXPECT_THROW(cache.write(0, table, 0, rows(k, false, 0, 2), rows(v, true, 0, 1)), Error);  // k/v rows differ
  // The span form checks coverage by blocks, not the table's length.
  const std::vector<BlockId> two_blocks = table.block_ids;
  EXPECT_NO_THROW(cache.write(0, two_blocks, 5, rows(k, false, 5, 3), rows(v, true, 5, 3)));
  EXPECT_THROW(cache.write(0, two_blocks, 6, rows(k, false, 6, 3), rows(v, true, 6, 3)), Error);
  const std::vector<BlockId> outside = {0, kBlocks};
  EXPECT_THROW(cache.write(0, outside, 0, rows(k, false, 0, 6), rows(v, true, 0, 6)), Error);
  std::vector<float> wrong(kHeadDim);
  const Tensor flat = Tensor::contiguous(wrong.data(), DType::kF32, {1, kHeadDim});
  EXPECT_THROW(cache.write(0, table, 0, flat, flat), Error);
}

}  // namespace
}  // namespace pagoda::kv
