#include <algorithm>
#include <numbers>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/merge_states.h"
#include "pagoda/backend/cuda/quantized_kv.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {

const char* quantized_kv_unsupported_reason(const attention::AttentionShape& shape, KvQuant quant, int32_t partition,
                                            DType dtype) {
  if (quant != KvQuant::kFp8 && quant != KvQuant::kInt2) return "the KV cache is not fp8 or int2";
  if (dtype != DType::kF16 && dtype != DType::kBF16) return "activations must be f16 or bf16";
  if (shape.head_dim != 64 && shape.head_dim != 128) return "head_dim must be 64 or 128";
  if (shape.num_kv_heads <= 0 || shape.num_q_heads % shape.num_kv_heads != 0 || shape.group_size() < 1 ||
      shape.group_size() > 8)
    return "query heads per kv head (GQA group) must be 1 to 8";
  if (quant == KvQuant::kInt2 && (partition != kInt2Partition || shape.block_size != kInt2Partition))
    return "int2 needs --kv-partition 64 (and so blocks of 64 tokens) on the GPU";
  if (quant == KvQuant::kFp8 && shape.block_size != 16 && shape.block_size != 32 && shape.block_size != 64)
    return "block size must be 16, 32 or 64";
  return nullptr;
}

kernels::QuantizedPoolArgs quantized_pool_args(const QuantizedPagedKv& kv) {
  return {.k_codes = kv.k_codes,
          .v_codes = kv.v_codes,
          .k_min = reinterpret_cast<__half*>(kv.k_min),
          .k_scale = reinterpret_cast<__half*>(kv.k_scale),
          .k_sums = kv.k_sums,
          .v_min = reinterpret_cast<__half*>(kv.v_min),
          .v_scale = reinterpret_cast<__half*>(kv.v_scale),
          .v_sums = kv.v_sums,
          .tail_slot = kv.tail_slot,
          .tail = reinterpret_cast<__half*>(kv.tail),
          .k_fp8_scale = kv.k_fp8_scale,
          .v_fp8_scale = kv.v_fp8_scale,
          .k_codes_block = kv.k_codes_block(),
          .k_codes_head = kv.k_codes_head(),
          .k_meta_block = kv.quant == KvQuant::kInt2 ? kv.k_meta_block() : 0,
          .k_meta_head = kv.quant == KvQuant::kInt2 ? kv.k_meta_head() : 0,
          .v_codes_block = kv.v_codes_block(),
          .v_codes_head = kv.v_codes_head(),
          .v_meta_block = kv.quant == KvQuant::kInt2 ? kv.v_meta_block() : 0,
          .v_meta_head = kv.quant == KvQuant::kInt2 ? kv.v_meta_head() : 0,
          .fp8_scale_block = kv.fp8_scale_block(),
          .fp8_scale_head = kv.fp8_scale_head(),
          .tail_slot_stride = kv.tail_slot_stride(),
          .tail_head = kv.tail_head(),
          .block_size = kv.block_size,
          .partition = kv.partition,
          .sum_bytes = kv.sum_bytes(),
          .int2 = kv.quant == KvQuant::kInt2};
}


void decode_attention_quantized(DecodeWorkspace& workspace, const attention::AttentionShape& shape,
                                const QuantizedPagedKv& kv, DType dtype, const void* q, void* out, float* lse,
                                cudaStream_t stream) {
  if (const char* reason = quantized_kv_unsupported_reason(shape, kv.quant, kv.partition, dtype))
    fail(ErrorKind::kUnsupported, "quantized decode attention on the GPU: {}", reason);
  if (kv.head_dim != shape.head_dim || kv.block_size != shape.block_size || kv.num_kv_heads != shape.num_kv_heads)
    fail(ErrorKind::kInvalidArgument, "quantized decode attention: the pool's shape differs from the attention's");
  if (workspace.group_size != shape.group_size() || workspace.head_dim != shape.head_dim)
    fail(ErrorKind::kInvalidArgument, "quantized decode attention: the workspace was uploaded for another shape");
  if (workspace.min_block_id < 0 || workspace.max_block_id >= kv.num_blocks)
    fail(ErrorKind::kInvalidArgument, "quantized decode attention: block ids [{}, {}] outside the pool's {} blocks",
         workspace.min_block_id, workspace.max_block_id, kv.num_blocks);
  const int num_items = int(workspace.items.size());
  if (num_items == 0) return;
  QuantizedDecodeParams params{};
  params.base = DecodeParams{.items = workspace.items.data(),
                             .block_ids = workspace.block_ids.data(),
                             .pool = {},
                             .blocks_contiguous = true,
                             .q = q,
                             .out = out,
                             .lse = lse,
                             .partial_o = workspace.partial_o.data(),
                             .partial_lse = workspace.partial_lse.data(),
                             .num_q_heads = shape.num_q_heads,
                             .group = shape.group_size(),
                             .scale_log2 = shape.softmax_scale * std::numbers::log2e_v<float>,
                             .l2_prefetch = false,
                             .evict_first = true,
                             .prefetch_distance = 1};
  params.pool = quantized_pool_args(kv);
  launch_decode_quantized(kv.quant, dtype, shape.head_dim, params, num_items, stream);
  merge_partial_states(workspace.merges.data(), int(workspace.merges.size()), workspace.max_partials, 1, 0,
                       shape.group_size(), shape.num_q_heads, shape.head_dim, workspace.partial_o.data(),
                       workspace.partial_lse.data(), dtype, out, lse, stream);
}

attention::DeviceInfo decode_quantized_device_info(KvQuant quant, DType dtype, int head_dim) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  return {.num_workers = sms * std::max(decode_quantized_ctas_per_sm(quant, dtype, head_dim), 1)};
}

}  // namespace pagoda::cuda
