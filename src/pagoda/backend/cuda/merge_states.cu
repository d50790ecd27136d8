#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/merge_states.h"

namespace pagoda::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxDimsPerLane = 8;  // head_dim <= 256

// One CTA per output row. The row's partials are dealt round-robin to the warps, and each warp
// keeps four of its partials' loads in flight, so a long split (a batch of one cuts each
// sequence into dozens of partials) costs a few memory latencies, not one per partial; every
// lane of a warp owns head_dim / 32 dims. Each partial weighs exp(lse_s - max); a row whose
// partials are all empty (lse -inf) gets o = 0 and lse = -inf rather than the NaN of
// exp(-inf - -inf).
template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    merge_partial_states_kernel(const attention::MergeTask* __restrict__ merges, int heads_per_task,
                                int64_t head_slot_stride, int group, int num_q_heads, int head_dim, const float* __restrict__ partial_o,
                                const float* __restrict__ partial_lse, T* __restrict__ out,
                                float* __restrict__ lse) {
  __shared__ float warp_max[kWarps];
  __shared__ float warp_weight[kWarps];
  extern __shared__ float warp_acc[];  // [kWarps][head_dim]
  const int task_index = blockIdx.x / group;
  const attention::MergeTask task = merges[task_index / heads_per_task];
  const int head = task_index % heads_per_task;  // of the task's kv heads
  const int r = blockIdx.x % group;
  ptx::wait_prerequisite_grid();  // launched early (programmatic dependent launch): wait for the partials
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int64_t row = int64_t(task.seq) * num_q_heads + int64_t(task.kv_head + head) * group + r;
  const int64_t first = task.partial_begin + head * head_slot_stride;
  const int64_t last = first + task.num_partials;

  float max_lse = -INFINITY;
  for (int64_t s = first + threadIdx.x; s < last; s += kWarps * 32) {
    max_lse = fmaxf(max_lse, partial_lse[int64_t(s) * group + r]);
  }
  for (int offset = 16; offset > 0; offset /= 2) max_lse = fmaxf(max_lse, __shfl_xor_sync(0xffffffffu, max_lse, offset));
  if (lane == 0) warp_max[warp] = max_lse;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kWarps; ++w) max_lse = fmaxf(max_lse, warp_max[w]);
  if (max_lse == -INFINITY) {
    for (int d = threadIdx.x; d < head_dim; d += kWarps * 32) out[row * head_dim + d] = ptx::from_float<T>(0.f);
    if (lse && threadIdx.x == 0) lse[row] = -INFINITY;
    return;
  }

  float weight_sum = 0.f;
  float acc[kMaxDimsPerLane] = {};
#pragma unroll 4
  for (int64_t s = first + warp; s < last; s += kWarps) {
    const int64_t slot = int64_t(s) * group + r;
    const float weight = __expf(partial_lse[slot] - max_lse);
    weight_sum += weight;
#pragma unroll
    for (int i = 0; i < kMaxDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < head_dim) acc[i] += weight * partial_o[slot * head_dim + d];
    }
  }
#pragma unroll
  for (int i = 0; i < kMaxDimsPerLane; ++i) {
    if (lane + 32 * i < head_dim) warp_acc[warp * head_dim + lane + 32 * i] = acc[i];
  }
  if (lane == 0) warp_weight[warp] = weight_sum;
  __syncthreads();
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_weight[w];
  for (int d = threadIdx.x; d < head_dim; d += kWarps * 32) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w * head_dim + d];
    out[row * head_dim + d] = ptx::from_float<T>(sum / total);
  }
  if (lse && threadIdx.x == 0) lse[row] = max_lse + logf(total);
}

}  // namespace

void merge_partial_states(const attention::MergeTask* merges, int num_merges, int heads_per_task,
                          int64_t head_slot_stride, int group,
                          int num_q_heads, int head_dim, const float* partial_o,
                          const float* partial_lse, DType out_dtype, void* out, float* lse,
                          cudaStream_t stream) {
  if (num_merges == 0) return;
  if (head_dim > 32 * kMaxDimsPerLane || (out_dtype != DType::kF16 && out_dtype != DType::kBF16)) {
    check_cuda(cudaErrorInvalidValue, "merge_partial_states (head_dim > 256, or out not f16 or bf16)");
  }
  // Programmatic dependent launch: the merge's launch and CTA start-up overlap the tail of the
  // kernel that wrote the partials (which calls launch_dependents); its CTAs then wait for that
  // grid. At batch 1 the two launches are a large share of the step.
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(int64_t(num_merges) * heads_per_task * group));
  config.blockDim = dim3(kWarps * 32);
  config.dynamicSmemBytes = size_t(kWarps) * size_t(head_dim) * sizeof(float);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  if (out_dtype == DType::kF16) {
    check_cuda(cudaLaunchKernelEx(&config, merge_partial_states_kernel<__half>, merges, heads_per_task,
                                  head_slot_stride, group, num_q_heads,
                                  head_dim, partial_o, partial_lse, static_cast<__half*>(out), lse),
               "merge_partial_states launch");
  } else {
    check_cuda(cudaLaunchKernelEx(&config, merge_partial_states_kernel<__nv_bfloat16>, merges, heads_per_task,
                                  head_slot_stride, group, num_q_heads,
                                  head_dim, partial_o, partial_lse, static_cast<__nv_bfloat16*>(out), lse),
               "merge_partial_states launch");
  }
}

}  // namespace pagoda::cuda
