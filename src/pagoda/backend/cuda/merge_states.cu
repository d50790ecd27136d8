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

// Rows a warp covers: one 16-byte chunk of a row per lane (the kernel and its launch's grid).
constexpr int rows_per_warp(int head_dim) { return 32 / (head_dim / 8); }

// 8 consecutive elements of a row (16 bytes, 4 pairs), moved by one vector load or store.
struct alignas(16) RowChunk {
  uint32_t pairs[4];
};

// A CTA of 8 warps; a warp covers 256 / head_dim rows (2 at head_dim 128), kLanesPerRow lanes
// each, lane c of a row owning its dims [8c, 8c + 8): one 16-byte load per partial, and a warp's
// load reads 512 contiguous bytes when its rows are adjacent rows of a partial. A row's partials
// are dealt round-robin to the warps_per_row warps that share it; a warp loads kBatch of its
// partials (o and lse) at once and folds them with the online softmax, so a row costs a memory
// latency per batch: one for the handful of partials prefix attention leaves per row (no
// barrier), a few for a long split (a batch of one cuts each sequence into dozens of partials,
// spread over up to 8 warps). A row whose partials are all empty (lse -inf) gets o = 0 and
// lse = -inf rather than the NaN of exp(-inf - -inf).
// Occupancy is what hides the latencies: 32 warps per SM (64 registers), 64 rows at head_dim 128.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kWarps * 32, 4)
    merge_partial_states_kernel(const attention::MergeTask* __restrict__ merges, int64_t num_rows, int warps_per_row,
                                int heads_per_task, int64_t head_slot_stride, int group, int num_q_heads,
                                const T* __restrict__ partial_o, const float* __restrict__ partial_lse,
                                T* __restrict__ out, float* __restrict__ lse) {
  constexpr int kLanesPerRow = kHeadDim / 8;
  constexpr int kRowsPerWarp = rows_per_warp(kHeadDim);
  __shared__ float warp_max[kWarps][kRowsPerWarp];
  __shared__ float warp_sum[kWarps][kRowsPerWarp];
  __shared__ float warp_acc[kWarps][32 * 8];  // when warps_per_row > 1
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int sub = lane / kLanesPerRow;  // the warp's row
  const int col = lane % kLanesPerRow;  // its 16-byte chunk of the row
  const int part = warp % warps_per_row;  // the row's partials part, part + warps_per_row, ...
  const int64_t warp_row = (int64_t(blockIdx.x) * (kWarps / warps_per_row) + warp / warps_per_row) * kRowsPerWarp;
  const bool shared_row = warps_per_row > 1;  // uniform over the CTA: every warp meets the barrier
  if (warp_row >= num_rows && !shared_row) return;
  const int64_t row_index = warp_row + sub;

  // Row index -> (task, kv head of the task, row r of the group): consecutive rows of one task
  // are adjacent partial rows. A task of sequence -1 writes nothing (a CUDA graph's launch is
  // padded with them to a fixed count).
  const int64_t task_row = row_index < num_rows ? row_index : 0;
  const attention::MergeTask task = merges[task_row / group / heads_per_task];
  const bool has_row = row_index < num_rows && task.seq >= 0;
  const int head = int(task_row / group % heads_per_task);
  const int r = int(task_row % group);
  const int64_t row = int64_t(task.seq) * num_q_heads + int64_t(task.kv_head + head) * group + r;
  const int64_t base = task.partial_begin + head * head_slot_stride;
  const int count = has_row ? task.num_partials : 0;
  int warp_count = count;  // the loop runs to the warp's longest row; shuffles need every lane
#pragma unroll
  for (int offset = kLanesPerRow; offset < 32; offset *= 2) {
    warp_count = max(warp_count, __shfl_xor_sync(0xffffffffu, warp_count, offset));
  }
  // Launched early (programmatic dependent launch): the task, uploaded before either grid, is
  // read while the partials' grid finishes; the partials only once it has.
  ptx::wait_prerequisite_grid();

  // The warp's partials of its row, from `part` on: a step of warps_per_row partials.
  const int64_t step = int64_t(warps_per_row) * group;
  const float* lse_at = partial_lse + (base + part) * group + r + (col < kBatch ? col * step : 0);
  const RowChunk* o_at = reinterpret_cast<const RowChunk*>(partial_o + ((base + part) * group + r) * kHeadDim) + col;
  float max_lse = -INFINITY, weight_sum = 0.f;
  float acc[8] = {};
  for (int first = part; first < warp_count; first += kBatch * warps_per_row) {
    // Lane c < kBatch of the row holds the lse of the batch's partial c; every lane its chunk of each o.
    const float lane_lse = col < kBatch && first + col * warps_per_row < count ? *lse_at : -INFINITY;
    RowChunk o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      o[j] = first + j * warps_per_row < count ? o_at[j * step * kLanesPerRow] : RowChunk{};
    }
    lse_at += kBatch * step;
    o_at += kBatch * step * kLanesPerRow;
    float batch_max = lane_lse;
#pragma unroll
    for (int offset = kBatch / 2; offset > 0; offset /= 2) {
      batch_max = fmaxf(batch_max, __shfl_xor_sync(0xffffffffu, batch_max, offset));
    }
    batch_max = __shfl_sync(0xffffffffu, batch_max, 0, kLanesPerRow);
    const float new_max = fmaxf(max_lse, batch_max);
    const bool any = new_max != -INFINITY;  // false while every partial so far is empty
    const float scale = any ? __expf(max_lse - new_max) : 1.f;  // 0 while max_lse is -inf
    weight_sum *= scale;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] *= scale;
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      // Every lane shuffles (any differs between the warp's rows); the weight is 0 for a missing
      // or empty partial (its lse is -inf, its o zero or finite).
      const float partial_lse_j = __shfl_sync(0xffffffffu, lane_lse, j, kLanesPerRow);
      const float weight = any ? __expf(partial_lse_j - new_max) : 0.f;
      weight_sum += weight;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float2 x = ptx::unpack2<T>(o[j].pairs[e]);
        acc[2 * e] += weight * x.x;
        acc[2 * e + 1] += weight * x.y;
      }
    }
    max_lse = new_max;
  }
  if (shared_row) {  // fold the row's warps into its first
#pragma unroll
    for (int e = 0; e < 8; ++e) warp_acc[warp][lane * 8 + e] = acc[e];
    if (col == 0) {
      warp_max[warp][sub] = max_lse;
      warp_sum[warp][sub] = weight_sum;
    }
    __syncthreads();
    if (part > 0 || !has_row) return;
    max_lse = -INFINITY;
    for (int w = warp; w < warp + warps_per_row; ++w) max_lse = fmaxf(max_lse, warp_max[w][sub]);
    weight_sum = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
    if (max_lse != -INFINITY) {
      for (int w = warp; w < warp + warps_per_row; ++w) {
        const float weight = __expf(warp_max[w][sub] - max_lse);  // 0 for a warp with only empty partials
        weight_sum += warp_sum[w][sub] * weight;
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += warp_acc[w][lane * 8 + e] * weight;
      }
    }
  }
  if (!has_row) return;
  const bool empty = max_lse == -INFINITY;
  const float inv = empty ? 0.f : 1.f / weight_sum;
  RowChunk result;
#pragma unroll
  for (int e = 0; e < 4; ++e) result.pairs[e] = ptx::pack2<T>(acc[2 * e] * inv, acc[2 * e + 1] * inv);
  reinterpret_cast<RowChunk*>(out + row * kHeadDim)[col] = result;
  if (lse && col == 0) lse[row] = empty ? -INFINITY : max_lse + logf(weight_sum);
}

}  // namespace

// A warp per row while a row has a few batches of partials, more for long splits. A small merge
// (a batch of a few sequences split into many pieces) is all latency: it gets a warp per batch,
// as long as that keeps it within one wave (a large GPU holds a few thousand of these warps).
int merge_warps_per_row(int num_merges, int heads_per_task, int group, int head_dim, int max_partials) {
  constexpr int64_t kSmallMergeWarps = 4096;
  const int64_t num_rows = int64_t(num_merges) * heads_per_task * group;
  const int warp_rows = rows_per_warp(head_dim);
  const int64_t row_warps = (num_rows + warp_rows - 1) / warp_rows;
  int warps_per_row = 1;
  while (warps_per_row < kWarps && warps_per_row * kBatch < max_partials &&
         (warps_per_row * 2 * kBatch < max_partials || row_warps * warps_per_row * 2 <= kSmallMergeWarps)) {
    warps_per_row *= 2;
  }
  return warps_per_row;
}

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
  const int64_t num_rows = int64_t(num_merges) * heads_per_task * group;
  const int warp_rows = rows_per_warp(head_dim);
  const int warps_per_row = merge_warps_per_row(num_merges, heads_per_task, group, head_dim, max_partials);
  const int64_t rows_per_cta = int64_t(kWarps / warps_per_row) * warp_rows;
  config.gridDim = dim3(unsigned((num_rows + rows_per_cta - 1) / rows_per_cta));
  config.blockDim = dim3(kWarps * 32);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  auto launch = [&]<typename T, int kHeadDim>() {
    check_cuda(cudaLaunchKernelEx(&config, merge_partial_states_kernel<T, kHeadDim>, merges, num_rows, warps_per_row,
                                  heads_per_task, head_slot_stride, group, num_q_heads,
                                  static_cast<const T*>(partial_o), partial_lse, static_cast<T*>(out), lse),
               "merge_partial_states launch");
  };
  auto launch_dims = [&]<typename T>() {
    if (head_dim == 64) launch.template operator()<T, 64>();
    if (head_dim == 128) launch.template operator()<T, 128>();
    if (head_dim == 256) launch.template operator()<T, 256>();
  };
  if (out_dtype == DType::kF16) {
    launch_dims.template operator()<__half>();
  } else {
    launch_dims.template operator()<__nv_bfloat16>();
  }
}

}  // namespace pagoda::cuda
