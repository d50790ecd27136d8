#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"
#include "pagoda/backend/cuda/merge_states.h"

namespace pagoda::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kBatch = 4;  // partials whose loads a warp issues together

// kDims consecutive elements of a row, moved by one vector load or store.
template <typename T, int kDims>
struct alignas(sizeof(T) * kDims) LaneDims {
  T x[kDims];
};

// A CTA of 8 warps merges 8 / warps_per_row output rows; lane l owns dims [l kDims, (l + 1) kDims)
// of a row (kDims = head_dim / 32), one vector load per partial. A row's partials are dealt
// round-robin to its warps, and a warp loads kBatch of its partials (o and lse) at once and folds
// them with the online softmax, so a row costs a memory latency per batch: one for the handful
// of partials prefix attention leaves per row (one warp, no barrier), a few for a long split (a
// batch of one cuts each sequence into dozens of partials, spread over up to 8 warps). A row
// whose partials are all empty (lse -inf) gets o = 0 and lse = -inf rather than the NaN of
// exp(-inf - -inf).
// Occupancy is what hides the latencies: 48 warps per SM (40 registers) up to head_dim 128.
template <typename T, int kDims>
__global__ void __launch_bounds__(kWarps * 32, kDims <= 4 ? 6 : 4)
    merge_partial_states_kernel(const attention::MergeTask* __restrict__ merges, int64_t num_rows, int warps_per_row,
                                int heads_per_task, int64_t head_slot_stride, int group, int num_q_heads,
                                const T* __restrict__ partial_o, const float* __restrict__ partial_lse,
                                T* __restrict__ out, float* __restrict__ lse) {
  constexpr int kHeadDim = 32 * kDims;
  using Dims = LaneDims<T, kDims>;
  __shared__ float warp_max[kWarps];
  __shared__ float warp_sum[kWarps];
  __shared__ float warp_acc[kWarps][kHeadDim];  // when warps_per_row > 1
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int part = warp % warps_per_row;  // the row's partials part, part + warps_per_row, ...
  const int64_t row_index = int64_t(blockIdx.x) * (kWarps / warps_per_row) + warp / warps_per_row;
  const bool shared_row = warps_per_row > 1;  // uniform over the CTA: every warp meets the barrier
  if (row_index >= num_rows && !shared_row) return;

  // Row index -> (task, kv head of the task, row r of the group): consecutive warps take
  // consecutive rows of one task, whose partial rows are adjacent.
  const int64_t task_row = row_index < num_rows ? row_index : 0;
  const attention::MergeTask task = merges[task_row / group / heads_per_task];
  const int head = int(task_row / group % heads_per_task);
  const int r = int(task_row % group);
  const int64_t row = int64_t(task.seq) * num_q_heads + int64_t(task.kv_head + head) * group + r;
  const int64_t first = task.partial_begin + head * head_slot_stride + part;
  const int64_t last = row_index < num_rows ? task.partial_begin + head * head_slot_stride + task.num_partials : 0;
  // Launched early (programmatic dependent launch): the task, uploaded before either grid, is
  // read while the partials' grid finishes; the partials only once it has.
  ptx::wait_prerequisite_grid();

  float max_lse = -INFINITY, weight_sum = 0.f;
  float acc[kDims] = {};
  for (int64_t batch = first; batch < last; batch += kBatch * warps_per_row) {
    // Lane j < kBatch holds the lse of the batch's partial j; every lane its dims of each o.
    const int64_t own = batch + int64_t(lane) * warps_per_row;
    const float lane_lse = lane < kBatch && own < last ? partial_lse[own * group + r] : -INFINITY;
    Dims o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const int64_t s = batch + int64_t(j) * warps_per_row;
      if (s < last) o[j] = reinterpret_cast<const Dims*>(partial_o + (s * group + r) * kHeadDim)[lane];
    }
    float batch_max = lane_lse;
    for (int offset = kBatch / 2; offset > 0; offset /= 2) {
      batch_max = fmaxf(batch_max, __shfl_xor_sync(0xffffffffu, batch_max, offset));
    }
    batch_max = __shfl_sync(0xffffffffu, batch_max, 0);
    const float new_max = fmaxf(max_lse, batch_max);
    if (new_max == -INFINITY) continue;  // every partial so far is empty
    const float scale = __expf(max_lse - new_max);  // 0 while max_lse is -inf
    weight_sum *= scale;
#pragma unroll
    for (int i = 0; i < kDims; ++i) acc[i] *= scale;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const float weight = __expf(__shfl_sync(0xffffffffu, lane_lse, j) - new_max);
      if (batch + int64_t(j) * warps_per_row >= last) continue;  // no partial j (weight 0)
      weight_sum += weight;
#pragma unroll
      for (int i = 0; i < kDims; ++i) acc[i] += weight * ptx::to_float(o[j].x[i]);
    }
    max_lse = new_max;
  }
  if (shared_row) {  // fold the row's warps into its first
#pragma unroll
    for (int i = 0; i < kDims; ++i) warp_acc[warp][lane * kDims + i] = acc[i];
    if (lane == 0) {
      warp_max[warp] = max_lse;
      warp_sum[warp] = weight_sum;
    }
    __syncthreads();
    if (part > 0 || row_index >= num_rows) return;
    max_lse = -INFINITY;
    for (int w = warp; w < warp + warps_per_row; ++w) max_lse = fmaxf(max_lse, warp_max[w]);
    weight_sum = 0.f;
#pragma unroll
    for (int i = 0; i < kDims; ++i) acc[i] = 0.f;
    if (max_lse != -INFINITY) {
      for (int w = warp; w < warp + warps_per_row; ++w) {
        const float weight = __expf(warp_max[w] - max_lse);  // 0 for a warp with only empty partials
        weight_sum += warp_sum[w] * weight;
#pragma unroll
        for (int i = 0; i < kDims; ++i) acc[i] += warp_acc[w][lane * kDims + i] * weight;
      }
    }
  }
  const bool empty = max_lse == -INFINITY;
  const float inv = empty ? 0.f : 1.f / weight_sum;
  Dims result;
#pragma unroll
  for (int i = 0; i < kDims; ++i) result.x[i] = ptx::from_float<T>(acc[i] * inv);
  reinterpret_cast<Dims*>(out + row * kHeadDim)[lane] = result;
  if (lse && lane == 0) lse[row] = empty ? -INFINITY : max_lse + logf(weight_sum);
}

}  // namespace

void merge_partial_states(const attention::MergeTask* merges, int num_merges, int max_partials, int heads_per_task,
                          int64_t head_slot_stride, int group,
                          int num_q_heads, int head_dim, const void* partial_o,
                          const float* partial_lse, DType out_dtype, void* out, float* lse,
                          cudaStream_t stream) {
  if (num_merges == 0) return;
  if ((head_dim != 64 && head_dim != 128 && head_dim != 256) ||
      (out_dtype != DType::kF16 && out_dtype != DType::kBF16)) {
    check_cuda(cudaErrorInvalidValue, "merge_partial_states (head_dim not 64, 128 or 256, or out not f16 or bf16)");
  }
  // Programmatic dependent launch: the merge's launch and CTA start-up overlap the tail of the
  // kernel that wrote the partials (which calls launch_dependents); its CTAs then wait for that
  // grid. At batch 1 the two launches are a large share of the step.
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  // A warp per row while a row has a few batches of partials, more for long splits. A small
  // merge (a batch of a few sequences split into many pieces) is all latency: it gets a warp per
  // batch, as long as that keeps it well within one wave (an H100 holds 6336 of these warps).
  constexpr int64_t kSmallMergeWarps = 4096;
  const int64_t num_rows = int64_t(num_merges) * heads_per_task * group;
  int warps_per_row = 1;
  while (warps_per_row < kWarps && warps_per_row * kBatch < max_partials &&
         (warps_per_row * 2 * kBatch < max_partials || num_rows * warps_per_row * 2 <= kSmallMergeWarps)) {
    warps_per_row *= 2;
  }
  const int rows_per_cta = kWarps / warps_per_row;
  config.gridDim = dim3(unsigned((num_rows + rows_per_cta - 1) / rows_per_cta));
  config.blockDim = dim3(kWarps * 32);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  auto launch = [&]<typename T, int kDims>() {
    check_cuda(cudaLaunchKernelEx(&config, merge_partial_states_kernel<T, kDims>, merges, num_rows, warps_per_row,
                                  heads_per_task, head_slot_stride, group, num_q_heads,
                                  static_cast<const T*>(partial_o), partial_lse, static_cast<T*>(out), lse),
               "merge_partial_states launch");
  };
  auto launch_dims = [&]<typename T>() {
    if (head_dim == 64) launch.template operator()<T, 2>();
    if (head_dim == 128) launch.template operator()<T, 4>();
    if (head_dim == 256) launch.template operator()<T, 8>();
  };
  if (out_dtype == DType::kF16) {
    launch_dims.template operator()<__half>();
  } else {
    launch_dims.template operator()<__nv_bfloat16>();
  }
}

}  // namespace pagoda::cuda
