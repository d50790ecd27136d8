#include "pagoda/backend/cpu/decode_attention.h"

#include <span>
#include <vector>

#include "pagoda/backend/cpu/group_attention.h"
#include "pagoda/attention/merge.h"

namespace pagoda::cpu {
namespace {

template <typename T>
void run_items(const attention::DecodePlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
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
      const attention::WorkItem& item = plan.items[size_t(i)];
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

// Each task stands for heads_per_task tasks: kv heads kv_head + h, slots shifted by
// h * head_slot_stride (a prefix plan's per-sequence merges; 1 and 0 for a DecodePlan's).
void run_merges(const std::vector<attention::MergeTask>& merges, int32_t heads_per_task, int64_t head_slot_stride,
                const attention::AttentionShape& shape, const float* partial_o, const float* partial_lse, float* out,
                float* lse) {
  const int32_t group = shape.group_size();
  const int64_t head_dim = shape.head_dim;
  const int64_t num_tasks = int64_t(merges.size()) * heads_per_task;
#pragma omp parallel for schedule(static)
  for (int64_t task = 0; task < num_tasks; ++task) {
    const attention::MergeTask& merge = merges[size_t(task / heads_per_task)];
    const int32_t h = int32_t(task % heads_per_task);
    const int64_t first_slot = merge.partial_begin + h * head_slot_stride;
    for (int32_t r = 0; r < group; ++r) {
      const int64_t row = int64_t(merge.seq) * shape.num_q_heads + int64_t(merge.kv_head + h) * group + r;
      float* o = out + row * head_dim;
      float row_lse = attention::kEmptyLse;  // start from the identity and fold every partial in, in order
      std::fill(o, o + head_dim, 0.f);
      for (int64_t p = first_slot; p < first_slot + merge.num_partials; ++p) {
        const int64_t slot_row = int64_t(p) * group + r;
        attention::merge_state(o, row_lse, partial_o + slot_row * head_dim, partial_lse[slot_row],
                    shape.head_dim);
      }
      if (lse) lse[row] = row_lse;
    }
  }
}

}  // namespace

void run_decode_cpu(const attention::DecodePlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                    const PagedKv& kv, const float* q, float* out, float* lse) {
  check_pool(kv, shape.num_kv_heads, shape.head_dim, shape.block_size);
  check_block_ids(batch.block_ids, kv.num_blocks);
  const int32_t group = shape.group_size();
  std::vector<float> partial_o(size_t(plan.num_partials) * size_t(group) * size_t(shape.head_dim));
  std::vector<float> partial_lse(size_t(plan.num_partials) * size_t(group));
  dispatch_kv_dtype(kv.dtype, [&]<typename T>() {
    run_items<T>(plan, batch, shape, kv, q, out, lse, partial_o.data(), partial_lse.data());
  });
  run_merges(plan.merges, 1, 0, shape, partial_o.data(), partial_lse.data(), out, lse);
}

namespace {

template <typename T>
void run_prefix_items(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                      const PagedKv& kv, const float* q, float* out, float* lse, float* partial_o,
                      float* partial_lse) {
  const int32_t group = shape.group_size();
  const int64_t head_dim = shape.head_dim;
  const int64_t num_items = plan.num_items();
  const std::span<const int32_t> block_ids(batch.block_ids);
#pragma omp parallel
  {
    GroupScratch scratch(group, shape.head_dim, shape.block_size);
    std::vector<float> row_lse(static_cast<size_t>(group));
    std::vector<float> tail_o(static_cast<size_t>(group * head_dim)), tail_lse(static_cast<size_t>(group));
#pragma omp for schedule(dynamic)
    for (int64_t i = 0; i < num_items; ++i) {
      const attention::PrefixUnit& unit = plan.units[size_t(i / plan.num_kv_heads)];
      const int32_t kv_head = int32_t(i % plan.num_kv_heads);
      const auto blocks = block_ids.subspan(size_t(unit.block_begin));
      for (int32_t j = 0; j < unit.num_queries; ++j) {
        const attention::UnitQuery& uq = plan.unit_queries[size_t(unit.query_begin + j)];
        const int64_t first_row = int64_t(uq.seq) * shape.num_q_heads + int64_t(kv_head) * group;
        const int64_t slot = int64_t(kv_head) * plan.num_pieces + uq.piece;
        float* o = uq.piece < 0 ? out + first_row * head_dim : partial_o + slot * group * head_dim;
        float* l = uq.piece >= 0 ? partial_lse + slot * group : lse ? lse + first_row : row_lse.data();
        attend_group<T>(kv, kv_head, blocks, 0, unit.num_tokens, q + first_row * head_dim, group,
                        shape.softmax_scale, o, l, scratch);
        for (int32_t t = unit.tail_begin; t < unit.tail_begin + unit.num_tails; ++t) {  // its tails, ⊕ in
          const attention::UnitTail& tail = plan.unit_tails[size_t(t)];
          if (j < tail.query_begin || j >= tail.query_end) continue;
          attend_group<T>(kv, kv_head, block_ids.subspan(size_t(tail.block_begin)), 0, tail.num_tokens,
                          q + first_row * head_dim, group, shape.softmax_scale, tail_o.data(), tail_lse.data(),
                          scratch);
          for (int32_t r = 0; r < group; ++r) {
            attention::merge_state(o + r * head_dim, l[r], tail_o.data() + r * head_dim, tail_lse[size_t(r)], shape.head_dim);
          }
        }
      }
    }
  }
}

}  // namespace

void run_prefix_cpu(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch, const attention::AttentionShape& shape,
                    const PagedKv& kv, const float* q, float* out, float* lse) {
  check_pool(kv, shape.num_kv_heads, shape.head_dim, shape.block_size);
  check_block_ids(batch.block_ids, kv.num_blocks);
  const int32_t group = shape.group_size();
  std::vector<float> partial_o(size_t(plan.num_partials()) * size_t(group) * size_t(shape.head_dim));
  std::vector<float> partial_lse(size_t(plan.num_partials()) * size_t(group));
  dispatch_kv_dtype(kv.dtype, [&]<typename T>() {
    run_prefix_items<T>(plan, batch, shape, kv, q, out, lse, partial_o.data(), partial_lse.data());
  });
  run_merges(plan.merges, plan.num_kv_heads, plan.num_pieces, shape, partial_o.data(), partial_lse.data(), out, lse);
}

}  // namespace pagoda::cpu
