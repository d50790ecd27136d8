#include "pagoda/backend/cpu/prefill_attention.h"

#include <vector>

#include "pagoda/backend/cpu/group_attention.h"

namespace pagoda::cpu {

void prefill_attention_cpu(const attention::AttentionShape& shape, const PagedKv& kv,
                           std::span<const int32_t> block_ids, int32_t start_pos, int32_t num_new,
                           const float* q, float* out, float* lse) {
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0 ||
      shape.block_size <= 0 || start_pos < 0 || num_new < 0 ||
      int64_t(block_ids.size()) * shape.block_size < int64_t(start_pos) + num_new) {
    fail(ErrorKind::kInvalidArgument,
         "prefill: tokens [{}, {}) with {} blocks of {}, {} q heads / {} kv heads", start_pos,
         int64_t(start_pos) + num_new, block_ids.size(), shape.block_size, shape.num_q_heads,
         shape.num_kv_heads);
  }
  check_pool(kv, shape.num_kv_heads, shape.head_dim, shape.block_size);
  const int32_t blocks_used = int32_t((int64_t(start_pos) + num_new + shape.block_size - 1) / shape.block_size);
  check_block_ids(block_ids.first(size_t(blocks_used)), kv.num_blocks);

  const int32_t group = shape.group_size();
  const int64_t head_dim = shape.head_dim;
  const int64_t num_tasks = int64_t(num_new) * shape.num_kv_heads;
  dispatch_kv_dtype(kv.dtype, [&]<typename T>() {
#pragma omp parallel
    {
      GroupScratch scratch(group, shape.head_dim, shape.block_size);
      std::vector<float> row_lse(static_cast<size_t>(group));
      // Dynamic: later tokens attend to more KV.
#pragma omp for schedule(dynamic)
      for (int64_t task = 0; task < num_tasks; ++task) {
        const int32_t i = int32_t(task / shape.num_kv_heads);
        const int32_t kv_head = int32_t(task % shape.num_kv_heads);
        const int64_t first_row = int64_t(i) * shape.num_q_heads + int64_t(kv_head) * group;
        attend_group<T>(kv, kv_head, block_ids, 0, start_pos + i + 1, q + first_row * head_dim,
                        group, shape.softmax_scale, out + first_row * head_dim,
                        lse ? lse + first_row : row_lse.data(), scratch);
      }
    }
  });
}

}  // namespace pagoda::cpu
