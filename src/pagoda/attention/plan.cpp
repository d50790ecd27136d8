#include "pagoda/attention/plan.h"

#include <algorithm>

#include "pagoda/core/error.h"

namespace pagoda::attention {

void validate_decode_batch(const DecodeBatch& batch, const AttentionShape& shape) {
  if (shape.num_q_heads <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
      shape.block_size <= 0 || shape.num_q_heads % shape.num_kv_heads != 0) {
    fail(ErrorKind::kInvalidArgument,
         "bad attention shape: {} q heads, {} kv heads, head dim {}, block size {}",
         shape.num_q_heads, shape.num_kv_heads, shape.head_dim, shape.block_size);
  }
  validate_block_tables(batch, shape.block_size);
}

int32_t max_partials(const std::vector<MergeTask>& merges) {
  int32_t most = 0;
  for (const MergeTask& m : merges) most = std::max(most, m.num_partials);
  return most;
}

void validate_block_tables(const DecodeBatch& batch, int32_t block_size) {
  if (block_size <= 0) fail(ErrorKind::kInvalidArgument, "decode batch: block size {}", block_size);
  if (batch.block_offsets.size() != batch.kv_lengths.size() + 1 || batch.block_offsets[0] != 0 ||
      size_t(batch.block_offsets.back()) != batch.block_ids.size()) {
    fail(ErrorKind::kInvalidArgument, "decode batch: {} block offsets for {} sequences and {} ids",
         batch.block_offsets.size(), batch.kv_lengths.size(), batch.block_ids.size());
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t num_blocks = batch.block_offsets[size_t(s) + 1] - batch.block_offsets[size_t(s)];
    const int32_t length = batch.kv_lengths[size_t(s)];
    if (length < 0 || num_blocks < 0 || int64_t(num_blocks) * block_size < int64_t(length)) {
      fail(ErrorKind::kInvalidArgument, "decode batch: sequence {} has {} tokens in {} blocks of {}",
           s, length, num_blocks, block_size);
    }
  }
}

namespace {

// Items the batch makes when every sequence longer than `chunk` is cut into chunk-token pieces.
int64_t count_items(const DecodeBatch& batch, const AttentionShape& shape, int64_t chunk) {
  int64_t items = 0;
  for (int32_t length : batch.kv_lengths) items += std::max<int64_t>(1, (length + chunk - 1) / chunk);
  return items * shape.num_kv_heads;
}

// Tokens per item, or 0 for no split. Splitting pays only when the batch alone cannot keep the
// workers busy; then the KV is cut into the smallest pieces (whole blocks, at least
// min_kv_tokens_per_item) whose items still fit in one round of the workers. Smaller pieces
// would leave a second, mostly idle round; for equal lengths the pieces come out equal, so no
// worker waits on a longer one.
int32_t choose_chunk(const DecodeBatch& batch, const AttentionShape& shape,
                     const DeviceInfo& device, const PlanOptions& options) {
  const int64_t bs = shape.block_size;
  if (!options.allow_split) return 0;
  if (options.max_kv_tokens_per_item > 0) {
    return int32_t(std::max<int64_t>(bs, options.max_kv_tokens_per_item / bs * bs));
  }
  const int64_t workers = std::max(device.num_workers, 1);
  const int64_t units = int64_t(batch.num_seqs()) * shape.num_kv_heads;
  if (units == 0 || units >= workers) return 0;
  const int64_t longest = *std::max_element(batch.kv_lengths.begin(), batch.kv_lengths.end());
  int64_t lo = std::max<int64_t>(bs, (options.min_kv_tokens_per_item + bs - 1) / bs * bs);
  int64_t hi = (longest + bs - 1) / bs * bs;  // no split: units <= workers items
  if (lo >= hi) return 0;
  while (lo < hi) {  // count_items falls as chunk grows: the smallest chunk that fits
    const int64_t mid = (lo + hi) / 2 / bs * bs;
    if (count_items(batch, shape, mid) <= workers) {
      hi = mid;
    } else {
      lo = mid + bs;
    }
  }
  return lo >= longest ? 0 : int32_t(lo);
}

}  // namespace

DecodePlan plan_decode(const DecodeBatch& batch, const AttentionShape& shape,
                       const DeviceInfo& device, const PlanOptions& options) {
  validate_decode_batch(batch, shape);
  DecodePlan plan;
  plan.kv_tokens_per_item = choose_chunk(batch, shape, device, options);
  const int32_t chunk = plan.kv_tokens_per_item;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t length = batch.kv_lengths[size_t(s)];
    const int32_t first_block = batch.block_offsets[size_t(s)];
    for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
      if (chunk == 0 || length <= chunk) {
        plan.items.push_back({.seq = s, .kv_head = h, .block_begin = first_block,
                              .token_begin = 0, .token_end = length, .partial = -1});
        continue;
      }
      MergeTask merge{.seq = s, .kv_head = h, .partial_begin = plan.num_partials, .num_partials = 0};
      for (int64_t begin = 0; begin < length; begin += chunk) {
        plan.items.push_back({.seq = s, .kv_head = h,
                              .block_begin = first_block + int32_t(begin / shape.block_size),
                              .token_begin = int32_t(begin),
                              .token_end = int32_t(std::min<int64_t>(length, begin + chunk)),
                              .partial = plan.num_partials++});
        ++merge.num_partials;
      }
      plan.merges.push_back(merge);
    }
  }
  if (plan.merges.empty()) plan.kv_tokens_per_item = 0;
  return plan;
}

}  // namespace pagoda::attention
