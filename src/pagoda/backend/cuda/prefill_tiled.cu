// The prefill kernel's instantiations, {f16, bf16} x head_dim {64, 128}, and its launch.
#include <cstdint>
#include <numbers>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/dispatch.cuh"
#include "pagoda/backend/cuda/kernels/shared_memory.cuh"
#include "pagoda/backend/cuda/kernels/prefill_tiled.cuh"
#include "pagoda/backend/cuda/prefill_attention.h"

namespace pagoda::cuda {
namespace {

template <typename T, int kHeadDim>
void allow_shared_memory() {
  allow_dynamic_shared_memory<prefill_tiled_kernel<T, kHeadDim>, int(PrefillTiledConfig<kHeadDim>::kSmemBytes)>(
      "cudaFuncSetAttribute(prefill_tiled_kernel)");
}

}  // namespace

void launch_prefill_tiled(const PrefillWorkspace& ws, const attention::AttentionShape& shape,
                          const PagedKv& kv, const void* q, void* out, cudaStream_t stream) {
  const int64_t num_ctas = int64_t(ws.tiles.size()) * shape.num_kv_heads;
  if (num_ctas == 0) return;
  const PrefillParams params{
      .tiles = ws.tiles.data(),
      .block_ids = ws.block_ids.data(),
      .pool = kv_pool_params(kv, shape.block_size),
      .q = q,
      .out = out,
      .num_q_heads = shape.num_q_heads,
      .num_kv_heads = shape.num_kv_heads,
      .group = shape.group_size(),
      .scale_log2 = shape.softmax_scale * std::numbers::log2e_v<float>,
  };
  dispatch_head_dim_64_128(kv.dtype, shape.head_dim, "prefill_tiled_kernel dispatch", [&]<typename T, int kHeadDim>() {
    using C = PrefillTiledConfig<kHeadDim>;
    allow_shared_memory<T, kHeadDim>();
    prefill_tiled_kernel<T, kHeadDim><<<unsigned(num_ctas), C::kThreads, C::kSmemBytes, stream>>>(params);
    check_cuda(cudaGetLastError(), "prefill_tiled_kernel launch");
  });
}

}  // namespace pagoda::cuda
