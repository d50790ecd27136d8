// The attention-state merge (⊕ of the cascade paper, attention/merge.h) on the GPU: folds the
// partial states of each of a plan's merge tasks into its output rows. Split-KV decode ends here.
#pragma once

#include <cuda_runtime.h>

#include "pagoda/attention/plan.h"
#include "pagoda/core/dtype.h"

namespace pagoda::cuda {

// merges:      [num_merges] on the device; task m stands for heads_per_task tasks, of kv heads
//              kv_head + h, each folding slots partial_begin + h * head_slot_stride + [0, num_partials)
//              (a DecodePlan's merges: 1 and 0; a PrefixPlan's: its kv heads and at least its
//              num_pieces); a task of seq -1 writes nothing
// max_partials: the most partials of any task: how many warps share an output row
// partial_o:   [num_partials, group, head_dim] of out_dtype (head_dim <= 256), each normalized
//              over its own KV range
// partial_lse: [num_partials, group] fp32, log(sum(exp(s))) over that range; -inf when empty
// out:         [num_seqs, num_q_heads, head_dim] of out_dtype (f16 or bf16): the task's rows are
//              q heads kv_head * group + [0, group) of sequence seq
// lse:         [num_seqs, num_q_heads] fp32, may be null
// How many warps share an output row (1, 2, 4 or 8): what the launch's grid is cut by. A CUDA
// graph of the launch replays it only for the same count.
int merge_warps_per_row(int num_merges, int heads_per_task, int group, int head_dim, int max_partials);

void merge_partial_states(const attention::MergeTask* merges, int num_merges, int max_partials, int heads_per_task,
                          int64_t head_slot_stride, int group,
                          int num_q_heads, int head_dim, const void* partial_o,
                          const float* partial_lse, DType out_dtype, void* out, float* lse,
                          cudaStream_t stream);

}  // namespace pagoda::cuda
