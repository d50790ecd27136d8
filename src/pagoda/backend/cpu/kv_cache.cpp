#include "pagoda/backend/cpu/kv_cache.h"

#include <cstring>
#include <span>
#include <type_traits>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::cpu {
namespace {

template <typename T>
T from_f32(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else if constexpr (std::is_same_v<T, f16>) {
    return f16{f32_to_f16(x)};
  } else {
    return bf16{f32_to_bf16(x)};
  }
}

// Writes rows [n, num_kv_heads, head_dim] of `src` into pool `dst` at positions start_pos...
template <typename T>
void scatter_rows(const PagedKv& kv, T* dst, std::span<const kv::BlockId> block_ids, int32_t start_pos,
                  int32_t n, const float* src) {
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = start_pos + i;
    const int64_t block = block_ids[size_t(pos / kv.block_size)];
    const int64_t slot = pos % kv.block_size;
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      T* out = dst + block * kv.page_stride + h * kv.head_stride + slot * kv.token_stride;
      const float* in = src + (int64_t(i) * kv.num_kv_heads + h) * kv.head_dim;
      for (int32_t d = 0; d < kv.head_dim; ++d) out[d] = from_f32<T>(in[d]);
    }
  }
}

void check_rows(const Tensor& t, const char* name, int32_t num_kv_heads, int32_t head_dim) {
  if (t.dtype != DType::kF32 || t.device != Device::kCpu || t.ndim != 3 ||
      t.shape[1] != num_kv_heads || t.shape[2] != head_dim || !t.is_contiguous()) {
    fail(ErrorKind::kInvalidArgument,
         "KV write: {} must be contiguous fp32 [n, {}, {}] on the CPU, got {} {}", name,
         num_kv_heads, head_dim, dtype_name(t.dtype), t.shape_string());
  }
}

}  // namespace

KvCache::KvCache(const kv::KvCacheConfig& config) : config_(config) {
  const bool dtype_ok = config.dtype == DType::kF32 || config.dtype == DType::kF16 ||
                        config.dtype == DType::kBF16;
  if (config.num_layers <= 0 || config.num_blocks <= 0 || config.block_size <= 0 ||
      config.num_kv_heads <= 0 || config.head_dim <= 0 || !dtype_ok || config.quant != KvQuant::kNone) {
    fail(ErrorKind::kInvalidArgument,
         "bad KV cache config: layers {}, blocks {}, block size {}, kv heads {}, head dim {}, dtype {}{}",
         config.num_layers, config.num_blocks, config.block_size, config.num_kv_heads,
         config.head_dim, dtype_name(config.dtype),
         config.quant != KvQuant::kNone ? " (quantized pools live in backend/cpu/quantized_kv_cache.h)" : "");
  }
  pool_bytes_ = size_t(config.num_blocks) * size_t(config.block_size) *
                size_t(config.num_kv_heads) * size_t(config.head_dim) * dtype_size(config.dtype);
  nbytes_ = pool_bytes_ * 2 * size_t(config.num_layers);
  // Not zeroed: attention reads only tokens that were written, and untouched pages of a large
  // cache then cost no memory and no startup time.
  storage_ = std::make_unique_for_overwrite<std::byte[]>(nbytes_);
}

PagedKv KvCache::layer(int32_t layer) const {
  if (layer < 0 || layer >= config_.num_layers) {
    fail(ErrorKind::kInvalidArgument, "layer {} outside [0, {})", layer, config_.num_layers);
  }
  std::byte* k = storage_.get() + pool_bytes_ * 2 * size_t(layer);
  return make_paged_kv(k, k + pool_bytes_, config_.dtype, config_.layout, config_.num_blocks,
                       config_.block_size, config_.num_kv_heads, config_.head_dim);
}

void KvCache::write(int32_t layer, const kv::BlockTable& table, int32_t start_pos, const Tensor& k,
                    const Tensor& v) {
  if (start_pos < 0 || int64_t(start_pos) + k.shape[0] > table.length) {
    fail(ErrorKind::kInvalidArgument, "KV write of tokens [{}, {}) outside the sequence's {} tokens",
         start_pos, int64_t(start_pos) + k.shape[0], table.length);
  }
  write(layer, table.block_ids, start_pos, k, v);
}

void KvCache::write(int32_t layer, std::span<const kv::BlockId> block_ids, int32_t start_pos,
                    const Tensor& k, const Tensor& v) {
  const PagedKv kv = this->layer(layer);
  check_rows(k, "k", kv.num_kv_heads, kv.head_dim);
  check_rows(v, "v", kv.num_kv_heads, kv.head_dim);
  if (k.shape[0] != v.shape[0]) {
    fail(ErrorKind::kInvalidArgument, "KV write: k has {} rows, v has {}", k.shape[0], v.shape[0]);
  }
  const int32_t n = int32_t(k.shape[0]);
  if (start_pos < 0 || int64_t(start_pos) + n > int64_t(block_ids.size()) * kv.block_size) {
    fail(ErrorKind::kInvalidArgument, "KV write of tokens [{}, {}) outside {} blocks of {}",
         start_pos, int64_t(start_pos) + n, block_ids.size(), kv.block_size);
  }
  const int32_t first_block = start_pos / kv.block_size;
  const int32_t end_block = n == 0 ? first_block : (start_pos + n - 1) / kv.block_size + 1;
  for (int32_t b = first_block; b < end_block; ++b) {
    const kv::BlockId id = block_ids[size_t(b)];
    if (id < 0 || id >= kv.num_blocks) {
      fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, kv.num_blocks);
    }
  }
  auto scatter = [&]<typename T>() {
    scatter_rows(kv, static_cast<T*>(kv.k), block_ids, start_pos, n, k.ptr<float>());
    scatter_rows(kv, static_cast<T*>(kv.v), block_ids, start_pos, n, v.ptr<float>());
  };
  switch (kv.dtype) {
    case DType::kF32: scatter.template operator()<float>(); break;
    case DType::kF16: scatter.template operator()<f16>(); break;
    default: scatter.template operator()<bf16>(); break;  // the constructor admits no other
  }
}

void KvCache::copy_block(kv::BlockId src, kv::BlockId dst) {
  if (src < 0 || src >= config_.num_blocks || dst < 0 || dst >= config_.num_blocks) {
    fail(ErrorKind::kInvalidArgument, "block copy {} -> {} outside the pool's {} blocks", src, dst,
         config_.num_blocks);
  }
  if (src == dst) return;
  const size_t page_bytes = pool_bytes_ / size_t(config_.num_blocks);
  for (int32_t pool = 0; pool < 2 * config_.num_layers; ++pool) {
    std::byte* base = storage_.get() + pool_bytes_ * size_t(pool);
    std::memcpy(base + page_bytes * size_t(dst), base + page_bytes * size_t(src), page_bytes);
  }
}

}  // namespace pagoda::cpu
