// QuantizedKvCache (GPU): the CUDA backend's fp8 or int2 pools for every layer
// (core/quantized_paged_kv.h, device memory), and the host bookkeeping they need:
//   - int2 tail slots. A block takes a slot on the host when a step writes the first token of one
//     of its V partitions, and gives it back at the next step once its last partition sealed;
//     the table block -> slot is copied to the device in begin_step, so the step's kernels (and a
//     CUDA graph of them) read it from a fixed address. Slots are a fixed pool of about an eighth
//     of the blocks: running out is an Error(kOutOfMemory).
//   - prefill over cached blocks: the blocks a step's prefill chunks read are listed in
//     begin_step and widened to T, one layer at a time, into a scratch HND pool that the f16
//     prefill kernel reads (prefill_block_ids() is the chunks' block tables renumbered into it).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/core/quantized_paged_kv.h"
#include "pagoda/kv/kv_cache_config.h"

namespace pagoda::cuda {

class QuantizedKvCache {
 public:
  using Allocate = std::function<std::shared_ptr<Backend::Buffer>(size_t)>;
  // config.quant: kFp8 or kInt2 (checked by the caller against quantized_kv_unsupported_reason).
  // dtype: the activations' (the prefill scratch's). Memory comes from `allocate`.
  QuantizedKvCache(const kv::KvCacheConfig& config, DType dtype, const Allocate& allocate, cudaStream_t stream);

  const kv::KvCacheConfig& config() const { return config_; }
  size_t nbytes() const { return storage_->size(); }
  const QuantizedPagedKv& layer(int32_t layer) const { return layers_.at(size_t(layer)); }

  // Tail slots for the tokens of `step` (int2); the blocks its prefill chunks read, with
  // `block_ids` (the chunks' tables, concatenated) renumbered into the scratch pool.
  void begin_step(const StepBatch& step, std::vector<int32_t>& prefill_block_ids, cudaStream_t stream);
  // The prefill scratch pool with layer's listed blocks widened into it (stream-ordered).
  PagedKv widen_prefill_blocks(int32_t layer, cudaStream_t stream);
  // Copy on write: codes, metadata and (int2) the open partition's tail, in every layer.
  void copy_block(int32_t src, int32_t dst, cudaStream_t stream);

  int32_t tail_slots() const { return num_tail_slots_; }
  // The host's table block -> tail slot (what the device's holds after begin_step).
  const std::vector<int32_t>& tail_slot_table() const { return tail_slot_; }

 private:
  int32_t acquire_tail_slot(int32_t block);
  void release_tail_slot(int32_t block);
  void upload_tail_updates(cudaStream_t stream);

  kv::KvCacheConfig config_;
  DType dtype_;
  std::shared_ptr<Backend::Buffer> storage_;
  std::vector<QuantizedPagedKv> layers_;
  int32_t num_tail_slots_ = 0;
  int32_t* tail_slot_device_ = nullptr;  // in storage_
  std::vector<int32_t> tail_slot_, free_tail_slots_, pending_release_, tail_updates_host_;
  DeviceArray<int32_t> tail_updates_;
  // Prefill over cached blocks.
  std::vector<int32_t> widen_blocks_host_, widen_valid_host_;
  DeviceArray<int32_t> widen_blocks_, widen_valid_;
  DeviceArray<uint16_t> scratch_k_, scratch_v_;
};

}  // namespace pagoda::cuda
