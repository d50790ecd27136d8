#include "pagoda/attention/cpu_executor.h"

#include <vector>

#include "pagoda/attention/cpu_group_attention.h"
#include "pagoda/attention/merge.h"

namespace pagoda::attention {
namespace {

template <typename T>
void run_items(const DecodePlan& plan, const DecodeBatch& batch, const AttentionShape& shape,
               const PagedKv& kv, const float* q, float* out, float* lse, float* partial_o,
               float* partial_lse) {
  const int32_t group = shape.group_size();
  const int64_t head_dim = shape.head_dim;
  const int64_t num_items = int64_t(plan.items.size());
#pragma omp parallel
  {
    GroupScratch scratch(group, shape.head_dim, shape.block_size);
    std::vector<float> row_lse(static_cast<size_t>(group));  // lse of an item whose caller passed none
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < num_items; ++i) {
      const WorkItem& item = plan.items[size_t(i)];
      // Output rows: the group's q heads of the sequence, or the item's partial slot.
      const int64_t first_row = int64_t(item.seq) * shape.num_q_heads + int64_t(item.kv_head) * group;
      float* o = item.partial < 0 ? out + first_row * head_dim
                                  : partial_o + int64_t(item.partial) * group * head_dim;
      float* l = item.partial >= 0 ? partial_lse + int64_t(item.partial) * group
                 : lse             ? lse + first_row
                                   : row_lse.data();
      attend_group<T>(kv, item.kv_head, batch.blocks_of(item.seq), item.token_begin, item.token_end,
                      q + first_row * head_dim, group, shape.softmax_scale, o, l, scratch);
    }
  }
}

void run_merges(const DecodePlan& plan, const AttentionShape& shape, const float* partial_o,
                const float* partial_lse, float* out, float* lse) {
  const int32_t group = shape.group_size();
  const int64_t head_dim = shape.head_dim;
  const int64_t num_merges = int64_t(plan.merges.size());
#pragma omp parallel for schedule(static)
  for (int64_t m = 0; m < num_merges; ++m) {
    const MergeTask& merge = plan.merges[size_t(m)];
    for (int32_t r = 0; r < group; ++r) {
      const int64_t row = int64_t(merge.seq) * shape.num_q_heads + int64_t(merge.kv_head) * group + r;
      float* o = out + row * head_dim;
      float row_lse = kEmptyLse;  // start from the identity and fold every partial in, in order
      std::fill(o, o + head_dim, 0.f);
      for (int32_t p = merge.partial_begin; p < merge.partial_begin + merge.num_partials; ++p) {
        const int64_t slot_row = int64_t(p) * group + r;
        merge_state(o, row_lse, partial_o + slot_row * head_dim, partial_lse[slot_row],
                    shape.head_dim);
      }
      if (lse) lse[row] = row_lse;
    }
  }
}

}  // namespace

void run_decode_cpu(const DecodePlan& plan, const DecodeBatch& batch, const AttentionShape& shape,
                    const PagedKv& kv, const float* q, float* out, float* lse) {
  check_pool(kv, shape.num_kv_heads, shape.head_dim, shape.block_size);
  check_block_ids(batch.block_ids, kv.num_blocks);
  const int32_t group = shape.group_size();
  std::vector<float> partial_o(size_t(plan.num_partials) * size_t(group) * size_t(shape.head_dim));
  std::vector<float> partial_lse(size_t(plan.num_partials) * size_t(group));
  dispatch_kv_dtype(kv.dtype, [&]<typename T>() {
    run_items<T>(plan, batch, shape, kv, q, out, lse, partial_o.data(), partial_lse.data());
  });
  run_merges(plan, shape, partial_o.data(), partial_lse.data(), out, lse);
}

}  // namespace pagoda::attention
