#include "pagoda/backend/cuda/quantized_kv_cache.h"

#include <algorithm>
#include <unordered_map>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/quantized_kv.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

size_t round_up(size_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

QuantizedKvCache::QuantizedKvCache(const kv::KvCacheConfig& config, DType dtype, const Allocate& allocate,
                                   cudaStream_t stream)
    : config_(config), dtype_(dtype) {
  const auto& c = config;
  const QuantizedPagedKv shape{.quant = c.quant,
                               .num_blocks = c.num_blocks,
                               .block_size = c.block_size,
                               .num_kv_heads = c.num_kv_heads,
                               .head_dim = c.head_dim,
                               .partition = c.partition};
  const bool int2 = c.quant == KvQuant::kInt2;
  const size_t blocks = size_t(c.num_blocks);
  // A sequence holds at most one open partition. A slot is Π x d f16 per kv head, four times a
  // block's codes: one for every eighth block (plus a floor for small pools) keeps the tails
  // within about half of the codes' bytes and serves sequences of eight blocks and more.
  num_tail_slots_ = int2 ? std::min(c.num_blocks, c.num_blocks / 8 + 256) : 0;
  const size_t k_codes = round_up(blocks * size_t(shape.k_codes_block()));
  const size_t v_codes = round_up(blocks * size_t(shape.v_codes_block()));
  const size_t k_meta = int2 ? blocks * size_t(shape.k_meta_block()) : 0;
  const size_t v_meta = int2 ? blocks * size_t(shape.v_meta_block()) : 0;
  const size_t fp8_scales = int2 ? 0 : blocks * size_t(shape.fp8_scale_block());
  const size_t tail = size_t(num_tail_slots_) * size_t(shape.tail_slot_stride());
  const size_t layer_bytes = k_codes + v_codes + 2 * round_up(k_meta * 2) + round_up(k_meta * size_t(shape.sum_bytes())) +
                             2 * round_up(v_meta * 2) + round_up(v_meta * size_t(shape.sum_bytes())) +
                             2 * round_up(fp8_scales * sizeof(float)) + round_up(tail * 2);
  const size_t table_bytes = int2 ? round_up(blocks * sizeof(int32_t)) : 0;
  storage_ = allocate(table_bytes + layer_bytes * size_t(c.num_layers));
  auto* at = static_cast<uint8_t*>(storage_->data());
  auto take = [&](size_t bytes) {
    uint8_t* p = at;
    at += round_up(bytes);
    return p;
  };
  if (int2) {
    tail_slot_device_ = reinterpret_cast<int32_t*>(take(blocks * sizeof(int32_t)));
    check_cuda(cudaMemsetAsync(tail_slot_device_, 0xff, blocks * sizeof(int32_t), stream), "tail slot table");
    tail_slot_.assign(blocks, -1);
    for (int32_t s = num_tail_slots_ - 1; s >= 0; --s) free_tail_slots_.push_back(s);
  }
  for (int32_t l = 0; l < c.num_layers; ++l) {
    QuantizedPagedKv view = shape;
    view.k_codes = take(k_codes);
    view.v_codes = take(v_codes);
    if (int2) {
      view.k_min = reinterpret_cast<f16*>(take(k_meta * 2));
      view.k_scale = reinterpret_cast<f16*>(take(k_meta * 2));
      view.k_sums = take(k_meta * size_t(shape.sum_bytes()));
      view.v_min = reinterpret_cast<f16*>(take(v_meta * 2));
      view.v_scale = reinterpret_cast<f16*>(take(v_meta * 2));
      view.v_sums = take(v_meta * size_t(shape.sum_bytes()));
      view.tail_slot = tail_slot_device_;
      view.tail = reinterpret_cast<f16*>(take(tail * 2));
    } else {
      view.k_fp8_scale = reinterpret_cast<float*>(take(fp8_scales * sizeof(float)));
      view.v_fp8_scale = reinterpret_cast<float*>(take(fp8_scales * sizeof(float)));
    }
    layers_.push_back(view);
  }
}

int32_t QuantizedKvCache::acquire_tail_slot(int32_t block) {
  int32_t& slot = tail_slot_[size_t(block)];
  if (slot >= 0) return slot;
  if (free_tail_slots_.empty())
    fail(ErrorKind::kOutOfMemory, "int2 KV: all {} tail slots (open V partitions) are in use", num_tail_slots_);
  slot = free_tail_slots_.back();
  free_tail_slots_.pop_back();
  tail_updates_host_.insert(tail_updates_host_.end(), {block, slot});
  return slot;
}

void QuantizedKvCache::release_tail_slot(int32_t block) {
  int32_t& slot = tail_slot_[size_t(block)];
  if (slot < 0) return;
  free_tail_slots_.push_back(slot);
  slot = -1;
  tail_updates_host_.insert(tail_updates_host_.end(), {block, -1});
}

void QuantizedKvCache::upload_tail_updates(cudaStream_t stream) {
  if (tail_updates_host_.empty()) return;
  tail_updates_.upload_grown(tail_updates_host_, stream);
  scatter_tail_slots(tail_updates_.data(), int32_t(tail_updates_host_.size() / 2), tail_slot_device_, stream);
  tail_updates_host_.clear();
}

void QuantizedKvCache::begin_step(const StepBatch& step, std::vector<int32_t>& prefill_block_ids, cudaStream_t stream) {
  const int32_t bs = config_.block_size, part = config_.partition;
  if (config_.quant == KvQuant::kInt2) {
    // Blocks whose last partition sealed in the previous step: their tails are not read again.
    for (int32_t block : pending_release_) release_tail_slot(block);
    pending_release_.clear();
    for (const SequenceStep& s : step.sequences) {
      for (int32_t pos = s.start_pos; pos < s.start_pos + s.num_new; ++pos) {
        const int32_t block = s.block_ids[size_t(pos / bs)];
        if (block < 0 || block >= config_.num_blocks)
          fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", block, config_.num_blocks);
        if (pos % part == 0) {
          acquire_tail_slot(block);
        } else if (tail_slot_[size_t(block)] < 0) {
          fail(ErrorKind::kInternal, "int2 KV: token {} lands in the middle of a V partition of block {} whose start "
               "was never written", pos, block);
        }
        if (pos % bs == bs - 1) pending_release_.push_back(block);
      }
    }
    upload_tail_updates(stream);
  }
  // Prefill chunks: the blocks they read, each once, with the tokens written in it after this step.
  widen_blocks_host_.clear();
  widen_valid_host_.clear();
  std::unordered_map<int32_t, int32_t> index;
  for (int32_t seq : step.prefill_seqs) {
    const SequenceStep& s = step.sequences[size_t(seq)];
    const int32_t length = s.start_pos + s.num_new;
    for (int32_t b = 0; b < int32_t(s.block_ids.size()); ++b) {
      const int32_t id = s.block_ids[size_t(b)];
      const int32_t valid = std::clamp(length - b * bs, 0, bs);
      const auto [it, inserted] = index.try_emplace(id, int32_t(widen_blocks_host_.size()));
      if (inserted) {
        widen_blocks_host_.push_back(id);
        widen_valid_host_.push_back(valid);
      } else {
        widen_valid_host_[size_t(it->second)] = std::max(widen_valid_host_[size_t(it->second)], valid);
      }
      prefill_block_ids.push_back(it->second);
    }
  }
  if (widen_blocks_host_.empty()) return;
  widen_blocks_.upload_grown(widen_blocks_host_, stream);
  widen_valid_.upload_grown(widen_valid_host_, stream);
  const size_t elements = widen_blocks_host_.size() * size_t(bs) * size_t(config_.num_kv_heads) * size_t(config_.head_dim);
  scratch_k_.make_room(elements);
  scratch_v_.make_room(elements);
}

PagedKv QuantizedKvCache::widen_prefill_blocks(int32_t layer, cudaStream_t stream) {
  const auto count = int32_t(widen_blocks_host_.size());
  PagedKv out = make_paged_kv(scratch_k_.data(), scratch_v_.data(), dtype_, KvLayout::kHnd, count, config_.block_size,
                              config_.num_kv_heads, config_.head_dim, Device::kCuda);
  dequantize_kv_blocks(layers_.at(size_t(layer)), widen_blocks_.data(), widen_valid_.data(), count, out, stream);
  return out;
}

void QuantizedKvCache::copy_block(int32_t src, int32_t dst, cudaStream_t stream) {
  if (src < 0 || src >= config_.num_blocks || dst < 0 || dst >= config_.num_blocks)
    fail(ErrorKind::kInvalidArgument, "block copy {} -> {} outside the pool's {} blocks", src, dst, config_.num_blocks);
  if (src == dst) return;
  const bool int2 = config_.quant == KvQuant::kInt2;
  const int32_t src_slot = int2 ? tail_slot_[size_t(src)] : -1;
  int32_t dst_slot = -1;
  if (int2) {
    if (src_slot >= 0) {
      dst_slot = acquire_tail_slot(dst);
    } else {
      release_tail_slot(dst);
    }
    upload_tail_updates(stream);
  }
  for (const QuantizedPagedKv& kv : layers_) {
    auto copy = [&](void* base, int64_t block_elements, size_t element_bytes) {
      auto* bytes = static_cast<uint8_t*>(base);
      const size_t block_bytes = size_t(block_elements) * element_bytes;
      check_cuda(cudaMemcpyAsync(bytes + block_bytes * size_t(dst), bytes + block_bytes * size_t(src), block_bytes,
                                 cudaMemcpyDeviceToDevice, stream),
                 "quantized copy_kv_block");
    };
    copy(kv.k_codes, kv.k_codes_block(), 1);
    copy(kv.v_codes, kv.v_codes_block(), 1);
    if (!int2) {
      copy(kv.k_fp8_scale, kv.fp8_scale_block(), sizeof(float));
      copy(kv.v_fp8_scale, kv.fp8_scale_block(), sizeof(float));
      continue;
    }
    copy(kv.k_min, kv.k_meta_block(), 2);
    copy(kv.k_scale, kv.k_meta_block(), 2);
    copy(kv.k_sums, kv.k_meta_block(), size_t(kv.sum_bytes()));
    copy(kv.v_min, kv.v_meta_block(), 2);
    copy(kv.v_scale, kv.v_meta_block(), 2);
    copy(kv.v_sums, kv.v_meta_block(), size_t(kv.sum_bytes()));
    if (src_slot >= 0) {
      const size_t slot_bytes = size_t(kv.tail_slot_stride()) * 2;
      auto* tail = reinterpret_cast<uint8_t*>(kv.tail);
      check_cuda(cudaMemcpyAsync(tail + slot_bytes * size_t(dst_slot), tail + slot_bytes * size_t(src_slot), slot_bytes,
                                 cudaMemcpyDeviceToDevice, stream),
                 "quantized copy_kv_block (tail)");
    }
  }
}

}  // namespace pagoda::cuda
