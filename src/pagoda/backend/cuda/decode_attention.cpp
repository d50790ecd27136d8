#include "pagoda/backend/cuda/decode_attention.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "pagoda/backend/cuda/kernels/decode_launch.h"
#include "pagoda/backend/cuda/merge_states.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {

void DecodeWorkspace::upload(const attention::DecodePlan& plan, const attention::DecodeBatch& batch,
                             const attention::AttentionShape& shape, cudaStream_t stream) {
  items.upload_grown(plan.items, stream);
  merges.upload(plan.merges, stream);
  max_partials = attention::max_partials(plan.merges);
  block_ids.upload_grown(batch.block_ids, stream);
  // The plan came from plan_decode, which rejected a shape without kv heads; stay safe anyway.
  group_size = shape.num_kv_heads > 0 ? shape.group_size() : 0;
  head_dim = shape.head_dim;
  const size_t group = size_t(std::max(group_size, 1));
  partial_o.resize(size_t(plan.num_partials) * group * size_t(std::max(head_dim, 0)));
  partial_lse.resize(size_t(plan.num_partials) * group);
  max_block_id = batch.block_ids.empty() ? -1 : *std::ranges::max_element(batch.block_ids);
  min_block_id = batch.block_ids.empty() ? 0 : *std::ranges::min_element(batch.block_ids);
}

attention::DeviceInfo decode_device_info(const attention::AttentionShape& shape, DType dtype) {
  int device = 0;
  int sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  const int ctas = decode_shape_unsupported_reason(shape, dtype) == nullptr
                       ? decode_tiled_ctas_per_sm(dtype, shape.head_dim)
                       : 1;
  return {.num_workers = sms * std::max(ctas, 1)};
}

const char* decode_shape_unsupported_reason(const attention::AttentionShape& shape, DType dtype) {
  if (dtype != DType::kF16 && dtype != DType::kBF16) return "KV dtype must be f16 or bf16";
  if (shape.head_dim != 64 && shape.head_dim != 128 && shape.head_dim != 256) {
    return "head_dim must be 64, 128 or 256";
  }
  if (shape.block_size != 16 && shape.block_size != 32 && shape.block_size != 64) {
    return "block size must be 16, 32 or 64";
  }
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0 ||
      shape.group_size() < 1 || shape.group_size() > 8) {
    return "query heads per kv head (GQA group) must be 1 to 8";
  }
  return nullptr;
}

const char* decode_unsupported_reason(const attention::AttentionShape& shape, const PagedKv& kv) {
  if (kv.device != Device::kCuda) return "the KV pool is not on the GPU";
  if (const char* reason = decode_shape_unsupported_reason(shape, kv.dtype)) return reason;
  if (kv.head_dim != shape.head_dim || kv.block_size != shape.block_size ||
      kv.num_kv_heads != shape.num_kv_heads) {
    return "the KV pool's head_dim, block size or kv heads differ from the attention shape";
  }
  if (kv.k == nullptr || kv.v == nullptr || reinterpret_cast<uintptr_t>(kv.k) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(kv.v) % 16 != 0 || kv.token_stride % 8 != 0 ||
      kv.head_stride % 8 != 0 || kv.page_stride % 8 != 0) {
    return "KV rows must be 16-byte aligned";
  }
  return nullptr;
}

void check_workspace(const char* op, int32_t group, int32_t head_dim, int32_t min_block_id, int32_t max_block_id,
                     const attention::AttentionShape& shape, const PagedKv& kv) {
  if (group != shape.group_size() || head_dim != shape.head_dim) {
    fail(ErrorKind::kInvalidArgument, "{}: the workspace was uploaded for group {} and head_dim {}, not {} and {}", op,
         group, head_dim, shape.group_size(), shape.head_dim);
  }
  if (min_block_id < 0 || max_block_id >= kv.num_blocks) {
    fail(ErrorKind::kInvalidArgument, "{}: block ids [{}, {}] outside the pool's {} blocks", op, min_block_id,
         max_block_id, kv.num_blocks);
  }
}

void decode_attention(DecodeWorkspace& workspace, const attention::AttentionShape& shape,
                      const PagedKv& kv, const void* q, void* out, float* lse,
                      const DecodeOptions& options, cudaStream_t stream) {
  if (const char* reason = decode_unsupported_reason(shape, kv)) {
    fail(ErrorKind::kUnsupported, "decode attention on the GPU: {}", reason);
  }
  check_workspace("decode attention", workspace.group_size, workspace.head_dim, workspace.min_block_id,
                  workspace.max_block_id, shape, kv);
  const int num_items = int(workspace.items.size());
  if (num_items == 0) return;
  const DecodeParams params{
      .items = workspace.items.data(),
      .block_ids = workspace.block_ids.data(),
      .pool = kv_pool_params(kv, shape.block_size),
      .blocks_contiguous = kv.token_stride == shape.head_dim,
      .q = q,
      .out = out,
      .lse = lse,
      .partial_o = workspace.partial_o.data(),
      .partial_lse = workspace.partial_lse.data(),
      .num_q_heads = shape.num_q_heads,
      .group = shape.group_size(),
      .scale_log2 = shape.softmax_scale * std::numbers::log2e_v<float>,
      .l2_prefetch = options.l2_prefetch,
      .evict_first = options.evict_first,
      .prefetch_distance = options.prefetch_distance,
  };
  options.launch(kv.dtype, shape.head_dim, params, num_items, stream);
  merge_partial_states(workspace.merges.data(), int(workspace.merges.size()), workspace.max_partials, 1, 0,
                       shape.group_size(), shape.num_q_heads, shape.head_dim, workspace.partial_o.data(),
                       workspace.partial_lse.data(), kv.dtype, out, lse, stream);
}

}  // namespace pagoda::cuda
