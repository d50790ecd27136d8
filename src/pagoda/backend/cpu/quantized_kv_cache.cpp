#include "pagoda/backend/cpu/quantized_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "pagoda/backend/cpu/kv_quantize.h"
#include "pagoda/core/error.h"

namespace pagoda::cpu {
namespace {

void check_rows(const Tensor& t, const char* name, int32_t num_kv_heads, int32_t head_dim) {
  if (t.dtype != DType::kF32 || t.device != Device::kCpu || t.ndim != 3 || t.shape[1] != num_kv_heads ||
      t.shape[2] != head_dim || !t.is_contiguous()) {
    fail(ErrorKind::kInvalidArgument, "KV write: {} must be contiguous fp32 [n, {}, {}] on the CPU, got {} {}", name,
         num_kv_heads, head_dim, dtype_name(t.dtype), t.shape_string());
  }
}

void store_sum(uint8_t* sums, int64_t index, int32_t sum_bytes, int32_t sum) {
  if (sum_bytes == 1) {
    sums[index] = uint8_t(sum);
  } else {
    const auto value = uint16_t(sum);
    std::memcpy(sums + index * 2, &value, 2);
  }
}

size_t round_up(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

QuantizedKvCache::QuantizedKvCache(const kv::KvCacheConfig& config) : config_(config) {
  const auto& c = config;
  if (c.num_layers <= 0 || c.num_blocks <= 0 || c.block_size <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 ||
      c.head_dim % 4 != 0 || c.block_size % 4 != 0 || (c.quant != KvQuant::kFp8 && c.quant != KvQuant::kInt2)) {
    fail(ErrorKind::kInvalidArgument,
         "bad quantized KV cache config: layers {}, blocks {}, block size {}, kv heads {}, head dim {}, {}",
         c.num_layers, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim, kv_quant_name(c.quant));
  }
  if (c.hadamard && (c.head_dim & (c.head_dim - 1)) != 0)
    fail(ErrorKind::kInvalidArgument, "the Hadamard rotation of keys needs a power-of-two head_dim, not {}", c.head_dim);
  if (c.quant == KvQuant::kInt2) {
    if (c.partition != 32 && c.partition != 64 && c.partition != 128)
      fail(ErrorKind::kInvalidArgument, "int2 KV: the partition must be 32, 64 or 128, not {}", c.partition);
    if (c.head_dim % c.partition != 0)
      fail(ErrorKind::kInvalidArgument, "int2 KV: partition {} does not divide head_dim {}", c.partition, c.head_dim);
    if (c.block_size % c.partition != 0)
      fail(ErrorKind::kInvalidArgument, "int2 KV: partition {} does not divide the block size {}", c.partition,
           c.block_size);
    if (c.key_quant != KvQuant::kInt2 && c.key_quant != KvQuant::kFp8)
      fail(ErrorKind::kInvalidArgument, "int2 KV: keys must be int2 or fp8, not {}", kv_quant_name(c.key_quant));
    // The sinks lie in the first V partition, which must keep a token to quantize.
    if (c.sink_tokens < 0 || c.sink_tokens >= c.partition)
      fail(ErrorKind::kInvalidArgument, "int2 KV: {} sink tokens outside [0, {})", c.sink_tokens, c.partition);
  } else if (c.key_quant != KvQuant::kInt2 || c.sink_tokens != 0) {
    fail(ErrorKind::kInvalidArgument, "fp8 keys beside int2 values and sink tokens apply to an int2 KV cache");
  }
  QuantizedPagedKv shape{.quant = c.quant,
                         .num_blocks = c.num_blocks,
                         .block_size = c.block_size,
                         .num_kv_heads = c.num_kv_heads,
                         .head_dim = c.head_dim,
                         .partition = c.partition,
                         .key_quant = c.quant == KvQuant::kInt2 ? c.key_quant : KvQuant::kInt2,
                         .sink_tokens = c.sink_tokens};
  const size_t blocks = size_t(c.num_blocks);
  // One arena per layer: the arrays one after another, each on a cache line.
  const size_t k_codes = round_up(blocks * size_t(shape.k_codes_block()));
  const size_t v_codes = round_up(blocks * size_t(shape.v_codes_block()));
  size_t layer_bytes = k_codes + v_codes;
  size_t k_meta = 0, v_meta = 0, fp8_scales = blocks * size_t(shape.fp8_scale_block());
  if (c.quant == KvQuant::kInt2) {
    if (!shape.fp8_keys()) {
      k_meta = blocks * size_t(shape.k_meta_block());
      layer_bytes += 2 * round_up(k_meta * 2) + round_up(k_meta * size_t(shape.sum_bytes()));
    }
    v_meta = blocks * size_t(shape.v_meta_block());
    layer_bytes += 2 * round_up(v_meta * 2) + round_up(v_meta * size_t(shape.sum_bytes()));
  }
  if (shape.fp8_keys()) layer_bytes += round_up(fp8_scales * sizeof(float));
  if (c.quant == KvQuant::kFp8) layer_bytes += round_up(fp8_scales * sizeof(float));
  layers_.resize(size_t(c.num_layers));
  for (Layer& layer : layers_) {
    // Not zeroed, as KvCache: attention reads only what was written.
    layer.arena = std::make_unique_for_overwrite<std::byte[]>(layer_bytes);
    auto* at = reinterpret_cast<uint8_t*>(layer.arena.get());
    auto take = [&](size_t bytes) {
      uint8_t* p = at;
      at += round_up(bytes);
      return p;
    };
    layer.view = shape;
    layer.view.k_codes = take(k_codes);
    layer.view.v_codes = take(v_codes);
    if (shape.fp8_keys()) {
      layer.view.k_fp8_scale = reinterpret_cast<float*>(take(fp8_scales * sizeof(float)));
    } else {
      layer.view.k_min = reinterpret_cast<f16*>(take(k_meta * 2));
      layer.view.k_scale = reinterpret_cast<f16*>(take(k_meta * 2));
      layer.view.k_sums = take(k_meta * size_t(shape.sum_bytes()));
    }
    if (c.quant == KvQuant::kInt2) {
      layer.view.v_min = reinterpret_cast<f16*>(take(v_meta * 2));
      layer.view.v_scale = reinterpret_cast<f16*>(take(v_meta * 2));
      layer.view.v_sums = take(v_meta * size_t(shape.sum_bytes()));
      layer.sealed.assign(blocks, 0);
      layer.tail_slot.assign(blocks, -1);
      layer.sink_slot.assign(blocks, -1);
    } else {
      layer.view.v_fp8_scale = reinterpret_cast<float*>(take(fp8_scales * sizeof(float)));
    }
  }
  nbytes_ = layer_bytes * size_t(c.num_layers);
}

QuantizedPagedKv QuantizedKvCache::layer(int32_t index) const {
  if (index < 0 || index >= config_.num_layers)
    fail(ErrorKind::kInvalidArgument, "layer {} outside [0, {})", index, config_.num_layers);
  const Layer& layer = layers_[size_t(index)];
  QuantizedPagedKv view = layer.view;
  if (config_.quant == KvQuant::kInt2) {
    // The executors only read through the view.
    view.sealed = const_cast<int32_t*>(layer.sealed.data());
    view.tail_slot = const_cast<int32_t*>(layer.tail_slot.data());
    view.tail = const_cast<f16*>(layer.tail.data());
    view.sink_slot = const_cast<int32_t*>(layer.sink_slot.data());
    view.sink_k = const_cast<f16*>(layer.sink_k.data());
    view.sink_v = const_cast<f16*>(layer.sink_v.data());
  }
  return view;
}

int32_t QuantizedKvCache::acquire_tail_slot(Layer& layer, int32_t block) {
  int32_t& slot = layer.tail_slot[size_t(block)];
  if (slot >= 0) return slot;
  if (!layer.free_slots.empty()) {
    slot = layer.free_slots.back();
    layer.free_slots.pop_back();
  } else {
    const int64_t stride = layer.view.tail_slot_stride();
    slot = int32_t(int64_t(layer.tail.size()) / stride);
    layer.tail.resize(layer.tail.size() + size_t(stride));
  }
  return slot;
}

int32_t QuantizedKvCache::acquire_sink_slot(Layer& layer, int32_t block) {
  int32_t& slot = layer.sink_slot[size_t(block)];
  if (slot >= 0) return slot;
  if (!layer.free_sink_slots.empty()) {
    slot = layer.free_sink_slots.back();
    layer.free_sink_slots.pop_back();
  } else {
    const int64_t stride = layer.view.sink_slot_stride();
    slot = int32_t(int64_t(layer.sink_k.size()) / stride);
    layer.sink_k.resize(layer.sink_k.size() + size_t(stride));
    layer.sink_v.resize(layer.sink_v.size() + size_t(stride));
  }
  return slot;
}

void QuantizedKvCache::release_sink_slot(Layer& layer, int32_t block) {
  int32_t& slot = layer.sink_slot[size_t(block)];
  if (slot < 0) return;
  layer.free_sink_slots.push_back(slot);
  slot = -1;
}

void QuantizedKvCache::release_tail_slot(Layer& layer, int32_t block) {
  int32_t& slot = layer.tail_slot[size_t(block)];
  if (slot < 0) return;
  layer.free_slots.push_back(slot);
  slot = -1;
}

void QuantizedKvCache::write_int2_token(int32_t layer_index, Layer& layer, int32_t block, int32_t slot, int32_t pos,
                                        const float* k, const float* v) {
  const QuantizedPagedKv& kv = layer.view;
  const int32_t part = kv.partition, dim = kv.head_dim, sum_bytes = kv.sum_bytes();
  const bool stochastic = config_.stochastic_rounding;
  std::vector<uint8_t> codes(size_t(std::max(part, dim)));
  // The sinks: a block whose first token is written at position 0 holds a sequence's first tokens;
  // one written from a later position (a block handed out again) no longer does.
  if (kv.sink_tokens > 0 && slot == 0) {
    if (pos == 0) {
      acquire_sink_slot(layer, block);
    } else {
      release_sink_slot(layer, block);
    }
  }
  if (pos < kv.sink_tokens) {
    const int32_t sink = layer.sink_slot[size_t(block)];
    if (sink < 0 || slot != pos)
      fail(ErrorKind::kInternal, "int2 KV: sink token {} written before its sequence's first token", pos);
    for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
      const int64_t at = int64_t(sink) * kv.sink_slot_stride() + h * kv.sink_head() + int64_t(pos) * dim;
      for (int32_t d = 0; d < dim; ++d) {
        layer.sink_k[size_t(at + d)] = f16{f32_to_f16(k[int64_t(h) * dim + d])};
        layer.sink_v[size_t(at + d)] = f16{f32_to_f16(v[int64_t(h) * dim + d])};
      }
    }
  }
  if (kv.fp8_keys()) write_fp8_keys(layer, block, slot, k);
  // K: each partition of the key is complete now.
  for (int32_t h = 0; h < kv.num_kv_heads && !kv.fp8_keys(); ++h) {
    const float* row = k + int64_t(h) * dim;
    const uint64_t stream = kv_stream(config_.seed, layer_index, 0, h);
    uint8_t* packed = kv.k_codes + block * kv.k_codes_block() + h * kv.k_codes_head() + int64_t(slot) * (dim / 4);
    const int64_t meta = block * kv.k_meta_block() + h * kv.k_meta_head() + int64_t(slot) * kv.k_parts();
    for (int32_t p = 0; p < kv.k_parts(); ++p) {
      Int2Params params{};
      const int32_t sum = quantize_int2(row + p * part, 1, part, stream, uint64_t(pos) * uint64_t(dim) + uint64_t(p * part),
                                        1, codes.data(), params, stochastic);
      pack_int2(codes.data(), part, packed + p * part / 4);
      kv.k_min[meta + p] = params.min;
      kv.k_scale[meta + p] = params.scale;
      store_sum(kv.k_sums, meta + p, sum_bytes, sum);
    }
  }
  // V: into the tail; the partition is quantized when this is its last token.
  const int32_t partition_index = slot / part, offset = slot % part;
  if (offset == 0) {
    acquire_tail_slot(layer, block);
    layer.sealed[size_t(block)] = partition_index;
  } else if (layer.tail_slot[size_t(block)] < 0 || layer.sealed[size_t(block)] != partition_index) {
    fail(ErrorKind::kInternal, "int2 KV: token {} lands in the middle of a V partition of block {} whose start was "
         "never written", pos, block);
  }
  f16* tail = layer.tail.data() + int64_t(layer.tail_slot[size_t(block)]) * kv.tail_slot_stride();
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    f16* out = tail + h * kv.tail_head() + int64_t(offset) * dim;
    for (int32_t d = 0; d < dim; ++d) out[d] = f16{f32_to_f16(v[int64_t(h) * dim + d])};
  }
  if (offset != part - 1) return;
  std::vector<float> column(size_t(part) * size_t(dim));
  const int32_t first_pos = pos - (part - 1);
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    const f16* rows = tail + h * kv.tail_head();
    for (int64_t i = 0; i < int64_t(part) * dim; ++i) column[size_t(i)] = f16_to_f32(rows[i].bits);
    // Sinks are read from their f16 copy; their values, often far from the others', must not widen
    // the partition's range: they are quantized as copies of the first token after them.
    for (int32_t i = 0; first_pos + i < kv.sink_tokens; ++i)
      std::copy_n(column.begin() + int64_t(kv.sink_tokens - first_pos) * dim, dim, column.begin() + int64_t(i) * dim);
    const uint64_t stream = kv_stream(config_.seed, layer_index, 1, h);
    const int64_t meta = block * kv.v_meta_block() + h * kv.v_meta_head() + int64_t(partition_index) * dim;
    for (int32_t c = 0; c < dim; ++c) {
      Int2Params params{};
      const int32_t sum = quantize_int2(column.data() + c, dim, part, stream,
                                        uint64_t(first_pos) * uint64_t(dim) + uint64_t(c), uint64_t(dim), codes.data(),
                                        params, stochastic);
      uint8_t* packed = kv.v_codes + block * kv.v_codes_block() + h * kv.v_codes_head() +
                        int64_t(c) * (kv.block_size / 4) + partition_index * part / 4;
      pack_int2(codes.data(), part, packed);
      kv.v_min[meta + c] = params.min;
      kv.v_scale[meta + c] = params.scale;
      store_sum(kv.v_sums, meta + c, sum_bytes, sum);
    }
  }
  layer.sealed[size_t(block)] = partition_index + 1;
  if (partition_index + 1 == kv.v_parts()) release_tail_slot(layer, block);
}

namespace {

// One row of dim values as e4m3 codes with one scale, amax / 448.
void store_fp8_row(const float* row, int32_t dim, uint8_t* codes, float* scale) {
  float amax = 0.f;
  for (int32_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(row[d]));
  *scale = amax / 448.f;
  for (int32_t d = 0; d < dim; ++d) codes[d] = *scale > 0.f ? f32_to_e4m3(row[d] / *scale) : 0;
}

}  // namespace

void QuantizedKvCache::write_fp8_keys(Layer& layer, int32_t block, int32_t slot, const float* k) {
  const QuantizedPagedKv& kv = layer.view;
  const int32_t dim = kv.head_dim;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h)
    store_fp8_row(k + int64_t(h) * dim, dim, kv.k_codes + block * kv.k_codes_block() + h * kv.k_codes_head() + int64_t(slot) * dim,
                  kv.k_fp8_scale + block * kv.fp8_scale_block() + h * kv.fp8_scale_head() + slot);
}

void QuantizedKvCache::write_fp8_token(Layer& layer, int32_t block, int32_t slot, const float* k, const float* v) {
  const QuantizedPagedKv& kv = layer.view;
  const int32_t dim = kv.head_dim;
  write_fp8_keys(layer, block, slot, k);
  for (int32_t h = 0; h < kv.num_kv_heads; ++h)
    store_fp8_row(v + int64_t(h) * dim, dim, kv.v_codes + block * kv.v_codes_block() + h * kv.v_codes_head() + int64_t(slot) * dim,
                  kv.v_fp8_scale + block * kv.fp8_scale_block() + h * kv.fp8_scale_head() + slot);
}

void QuantizedKvCache::write(int32_t layer_index, std::span<const int32_t> block_ids, int32_t start_pos,
                             const Tensor& k, const Tensor& v) {
  if (layer_index < 0 || layer_index >= config_.num_layers)
    fail(ErrorKind::kInvalidArgument, "layer {} outside [0, {})", layer_index, config_.num_layers);
  check_rows(k, "k", config_.num_kv_heads, config_.head_dim);
  check_rows(v, "v", config_.num_kv_heads, config_.head_dim);
  if (k.shape[0] != v.shape[0]) fail(ErrorKind::kInvalidArgument, "KV write: k has {} rows, v has {}", k.shape[0], v.shape[0]);
  const auto n = int32_t(k.shape[0]);
  if (start_pos < 0 || int64_t(start_pos) + n > int64_t(block_ids.size()) * config_.block_size)
    fail(ErrorKind::kInvalidArgument, "KV write of tokens [{}, {}) outside {} blocks of {}", start_pos,
         int64_t(start_pos) + n, block_ids.size(), config_.block_size);
  Layer& layer = layers_[size_t(layer_index)];
  const int64_t row = int64_t(config_.num_kv_heads) * config_.head_dim;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t pos = start_pos + i;
    const int32_t block = block_ids[size_t(pos / config_.block_size)];
    if (block < 0 || block >= config_.num_blocks)
      fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", block, config_.num_blocks);
    const int32_t slot = pos % config_.block_size;
    if (config_.quant == KvQuant::kInt2) {
      write_int2_token(layer_index, layer, block, slot, pos, k.ptr<float>() + i * row, v.ptr<float>() + i * row);
    } else {
      write_fp8_token(layer, block, slot, k.ptr<float>() + i * row, v.ptr<float>() + i * row);
    }
  }
}

void QuantizedKvCache::copy_block(int32_t src, int32_t dst) {
  if (src < 0 || src >= config_.num_blocks || dst < 0 || dst >= config_.num_blocks)
    fail(ErrorKind::kInvalidArgument, "block copy {} -> {} outside the pool's {} blocks", src, dst, config_.num_blocks);
  if (src == dst) return;
  for (Layer& layer : layers_) {
    const QuantizedPagedKv& kv = layer.view;
    auto copy = [&](void* base, int64_t block_elements, size_t element_bytes) {
      auto* bytes = static_cast<std::byte*>(base);
      const size_t block_bytes = size_t(block_elements) * element_bytes;
      std::memcpy(bytes + block_bytes * size_t(dst), bytes + block_bytes * size_t(src), block_bytes);
    };
    copy(kv.k_codes, kv.k_codes_block(), 1);
    copy(kv.v_codes, kv.v_codes_block(), 1);
    if (kv.fp8_keys()) {
      copy(kv.k_fp8_scale, kv.fp8_scale_block(), sizeof(float));
    } else {
      copy(kv.k_min, kv.k_meta_block(), 2);
      copy(kv.k_scale, kv.k_meta_block(), 2);
      copy(kv.k_sums, kv.k_meta_block(), size_t(kv.sum_bytes()));
    }
    if (config_.quant == KvQuant::kFp8) {
      copy(kv.v_fp8_scale, kv.fp8_scale_block(), sizeof(float));
      continue;
    }
    if (layer.sink_slot[size_t(src)] < 0) {
      release_sink_slot(layer, dst);
    } else {
      const int32_t from = layer.sink_slot[size_t(src)], to = acquire_sink_slot(layer, dst);
      const int64_t stride = kv.sink_slot_stride();
      std::copy_n(layer.sink_k.begin() + from * stride, stride, layer.sink_k.begin() + to * stride);
      std::copy_n(layer.sink_v.begin() + from * stride, stride, layer.sink_v.begin() + to * stride);
    }
    copy(kv.v_min, kv.v_meta_block(), 2);
    copy(kv.v_scale, kv.v_meta_block(), 2);
    copy(kv.v_sums, kv.v_meta_block(), size_t(kv.sum_bytes()));
    layer.sealed[size_t(dst)] = layer.sealed[size_t(src)];
    const int32_t src_slot = layer.tail_slot[size_t(src)];
    if (src_slot < 0) {
      release_tail_slot(layer, dst);
      continue;
    }
    const int32_t dst_slot = acquire_tail_slot(layer, dst);
    const int64_t stride = kv.tail_slot_stride();
    std::copy_n(layer.tail.begin() + src_slot * stride, stride, layer.tail.begin() + dst_slot * stride);
  }
}

std::vector<QuantizedKvCache::PageArray> QuantizedKvCache::page_arrays(const QuantizedPagedKv& kv, bool is_v) const {
  auto array = [](void* base, int64_t block_elements, size_t element_bytes) {
    return PageArray{static_cast<std::byte*>(base), size_t(block_elements) * element_bytes};
  };
  if (config_.quant == KvQuant::kFp8) {
    return {is_v ? array(kv.v_codes, kv.v_codes_block(), 1) : array(kv.k_codes, kv.k_codes_block(), 1),
            is_v ? array(kv.v_fp8_scale, kv.fp8_scale_block(), sizeof(float))
                 : array(kv.k_fp8_scale, kv.fp8_scale_block(), sizeof(float))};
  }
  if (is_v)
    return {array(kv.v_codes, kv.v_codes_block(), 1), array(kv.v_min, kv.v_meta_block(), 2),
            array(kv.v_scale, kv.v_meta_block(), 2), array(kv.v_sums, kv.v_meta_block(), size_t(kv.sum_bytes()))};
  return {array(kv.k_codes, kv.k_codes_block(), 1), array(kv.k_min, kv.k_meta_block(), 2),
          array(kv.k_scale, kv.k_meta_block(), 2), array(kv.k_sums, kv.k_meta_block(), size_t(kv.sum_bytes()))};
}

size_t QuantizedKvCache::page_bytes() const {
  size_t bytes = 0;
  for (const PageArray& a : page_arrays(layers_.at(0).view, false)) bytes += a.block_bytes;
  return bytes;
}

void QuantizedKvCache::check_block(int32_t layer, int32_t block, int32_t tokens) const {
  if (layer < 0 || layer >= config_.num_layers)
    fail(ErrorKind::kInvalidArgument, "layer {} outside [0, {})", layer, config_.num_layers);
  if (block < 0 || block >= config_.num_blocks)
    fail(ErrorKind::kInvalidArgument, "KV page of block {} outside the pool's {} blocks", block, config_.num_blocks);
  if (tokens < 1 || tokens > config_.block_size)
    fail(ErrorKind::kInvalidArgument, "a block of {} tokens holds {}", config_.block_size, tokens);
}

void QuantizedKvCache::read_pages(int32_t layer, std::span<const int32_t> blocks, std::byte* dst) const {
  for (int32_t id : blocks) check_block(layer, id, config_.block_size);
  for (bool is_v : {false, true}) {
    const std::vector<PageArray> arrays = page_arrays(layers_[size_t(layer)].view, is_v);
    for (int32_t id : blocks)
      for (const PageArray& a : arrays) {
        std::memcpy(dst, a.base + a.block_bytes * size_t(id), a.block_bytes);
        dst += a.block_bytes;
      }
  }
}

void QuantizedKvCache::write_pages(int32_t layer_index, std::span<const int32_t> blocks, const std::byte* src) {
  for (int32_t id : blocks) check_block(layer_index, id, config_.block_size);
  Layer& layer = layers_[size_t(layer_index)];
  for (bool is_v : {false, true}) {
    const std::vector<PageArray> arrays = page_arrays(layer.view, is_v);
    for (int32_t id : blocks)
      for (const PageArray& a : arrays) {
        std::memcpy(a.base + a.block_bytes * size_t(id), src, a.block_bytes);
        src += a.block_bytes;
      }
  }
  if (config_.quant != KvQuant::kInt2) return;
  for (int32_t id : blocks) {
    layer.sealed[size_t(id)] = layer.view.v_parts();
    release_tail_slot(layer, id);
  }
}

size_t QuantizedKvCache::tail_bytes(int32_t tokens) const {
  if (config_.quant != KvQuant::kInt2) return 0;
  return size_t(config_.num_kv_heads) * size_t(tokens % config_.partition) * size_t(config_.head_dim) * sizeof(f16);
}

void QuantizedKvCache::read_tail(int32_t layer_index, int32_t block, int32_t tokens, std::byte* dst) const {
  check_block(layer_index, block, tokens);
  const int32_t rows = config_.quant == KvQuant::kInt2 ? tokens % config_.partition : 0;
  if (rows == 0) return;
  const Layer& layer = layers_[size_t(layer_index)];
  const int32_t slot = layer.tail_slot[size_t(block)];
  if (slot < 0 || layer.sealed[size_t(block)] != tokens / config_.partition)
    fail(ErrorKind::kInternal, "int2 KV: block {} does not hold {} tokens ({} V partitions sealed, tail slot {})", block,
         tokens, layer.sealed[size_t(block)], slot);
  const QuantizedPagedKv& kv = layer.view;
  const size_t row_bytes = size_t(rows) * size_t(kv.head_dim) * sizeof(f16);
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    std::memcpy(dst, layer.tail.data() + slot * kv.tail_slot_stride() + h * kv.tail_head(), row_bytes);
    dst += row_bytes;
  }
}

void QuantizedKvCache::write_tail(int32_t layer_index, int32_t block, int32_t tokens, const std::byte* src) {
  check_block(layer_index, block, tokens);
  if (config_.quant != KvQuant::kInt2) return;
  Layer& layer = layers_[size_t(layer_index)];
  const int32_t rows = tokens % config_.partition;
  layer.sealed[size_t(block)] = tokens / config_.partition;
  if (rows == 0) {
    release_tail_slot(layer, block);
    return;
  }
  const int32_t slot = acquire_tail_slot(layer, block);
  const QuantizedPagedKv& kv = layer.view;
  const size_t row_bytes = size_t(rows) * size_t(kv.head_dim) * sizeof(f16);
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    std::memcpy(layer.tail.data() + slot * kv.tail_slot_stride() + h * kv.tail_head(), src, row_bytes);
    src += row_bytes;
  }
}

}  // namespace pagoda::cpu
