#include "pagoda/backend/cuda/prefill_attention.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {

void PrefillWorkspace::upload(std::span<const PrefillChunk> chunks, std::span<const int32_t> ids,
                              const attention::AttentionShape& shape, cudaStream_t stream) {
  // Any dtype the kernel takes: the tiling depends on the shape only.
  if (const char* reason = prefill_unsupported_reason(shape, DType::kF16)) {
    fail(ErrorKind::kUnsupported, "prefill attention on the GPU: {}", reason);
  }
  const int32_t group = shape.group_size();
  const int32_t tokens_per_tile = kPrefillTileRows / group;
  std::vector<PrefillTile> host_tiles;
  min_block_id = INT32_MAX;
  max_block_id = INT32_MIN;
  for (const PrefillChunk& c : chunks) {
    const int64_t num_keys = int64_t(c.start_pos) + c.num_new;
    const int64_t blocks_used = (num_keys + shape.block_size - 1) / shape.block_size;
    if (c.row_begin < 0 || c.start_pos < 0 || c.num_new < 0 || c.block_begin < 0 ||
        num_keys > INT32_MAX || c.block_begin + blocks_used > int64_t(ids.size())) {
      fail(ErrorKind::kInvalidArgument,
           "prefill attention: chunk of rows [{}, +{}) at position {} needs {} blocks from block "
           "{}, of {} block ids",
           c.row_begin, c.num_new, c.start_pos, blocks_used, c.block_begin, ids.size());
    }
    const auto used = ids.subspan(size_t(c.block_begin), size_t(blocks_used));
    if (!used.empty()) {
      const auto [lo, hi] = std::ranges::minmax(used);
      min_block_id = std::min(min_block_id, lo);
      max_block_id = std::max(max_block_id, hi);
    }
    for (int32_t first = 0; first < c.num_new; first += tokens_per_tile) {
      host_tiles.push_back({.row_begin = c.row_begin + first,
                            .first_pos = c.start_pos + first,
                            .num_tokens = std::min(tokens_per_tile, c.num_new - first),
                            .block_begin = c.block_begin});
    }
  }
  // A tile's time grows with its keys: start the longest first so that none is left running
  // alone at the end.
  std::ranges::stable_sort(host_tiles, std::greater<>(), [](const PrefillTile& tile) {
    return tile.first_pos + tile.num_tokens;
  });
  if (min_block_id > max_block_id) {  // no chunk uses a block
    min_block_id = 0;
    max_block_id = -1;
  }
  tiles.upload(host_tiles, stream);
  block_ids.upload(ids, stream);
  group_size = group;
  head_dim = shape.head_dim;
  block_size = shape.block_size;
}

const char* prefill_unsupported_reason(const attention::AttentionShape& shape, DType dtype) {
  // The decode kernel's dtypes, block sizes and groups; its head_dim 256 is not instantiated here.
  if (shape.head_dim == 256) return "head_dim must be 64 or 128";
  return decode_shape_unsupported_reason(shape, dtype);
}

void prefill_attention(const PrefillWorkspace& ws, const attention::AttentionShape& shape,
                       const PagedKv& kv, const void* q, void* out, cudaStream_t stream) {
  if (const char* reason = prefill_unsupported_reason(shape, kv.dtype)) {
    fail(ErrorKind::kUnsupported, "prefill attention on the GPU: {}", reason);
  }
  // The pool's own requirements (on the GPU, matching the shape, 16-byte rows) are decode's.
  if (const char* reason = decode_unsupported_reason(shape, kv)) {
    fail(ErrorKind::kUnsupported, "prefill attention on the GPU: {}", reason);
  }
  if (ws.group_size != shape.group_size() || ws.head_dim != shape.head_dim ||
      ws.block_size != shape.block_size) {
    fail(ErrorKind::kInvalidArgument,
         "prefill attention: the workspace was uploaded for group {}, head_dim {}, block size {}, "
         "not {}, {}, {}",
         ws.group_size, ws.head_dim, ws.block_size, shape.group_size(), shape.head_dim,
         shape.block_size);
  }
  if (ws.min_block_id < 0 || ws.max_block_id >= kv.num_blocks) {
    fail(ErrorKind::kInvalidArgument,
         "prefill attention: block ids [{}, {}] outside the pool's {} blocks", ws.min_block_id,
         ws.max_block_id, kv.num_blocks);
  }
  // The kernel moves q and out in pairs of elements.
  if (reinterpret_cast<uintptr_t>(q) % 4 != 0 || reinterpret_cast<uintptr_t>(out) % 4 != 0) {
    fail(ErrorKind::kInvalidArgument, "prefill attention: q and out must be 4-byte aligned");
  }
  launch_prefill_tiled(ws, shape, kv, q, out, stream);
}

}  // namespace pagoda::cuda
