// pagoda.ops: the attention kernels as ops on DLPack tensors, FlashInfer's plan/run split.
//   PagedKVCache     one layer's K and V pools (made here, or a caller's tensors wrapped), a block
//                    allocator for block tables, and append() of K/V rows
//   DecodeAttention  plan(): the decode planner (attention/plan.h) on the host, and on the GPU
//                    the plan's upload; run(): the CPU executor or the CUDA kernel, nothing else
//   QuantizedKvPool  one layer's int2 or fp8 pools (core/quantized_paged_kv.h), quantized on
//                    append by the engine's own quantizer (backend/{cpu,cuda}/quantized_kv_cache.h),
//                    and read() (CPU) or widen() (CUDA) of what it stored; DecodeAttention runs
//                    over it
//   PrefixAttention  the same for the prefix-aware planner and kernel (attention/prefix_plan.h)
//   merge_states     the ⊕ of attention/merge.h over stacked states
// run() allocates nothing and, on the GPU, only launches on the caller's stream, so that a
// CUDA graph can capture it; its outputs are tensors the caller passes.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/attention/merge.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/backend/cpu/kv_quantize.h"
#include "pagoda/backend/cpu/quantized_attention.h"
#include "pagoda/backend/cpu/quantized_kv_cache.h"
#include "pagoda/core/error.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/kv_cache_config.h"
#include "tensor_checks.h"
#ifdef PAGODA_HAVE_CUDA
#include <cuda_runtime.h>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/kv_tensor_map.h"
#include "pagoda/backend/cuda/merge_states.h"
#include "pagoda/backend/cuda/prefix_attention.h"
#include "pagoda/backend/cuda/quantized_kv.h"
#include "pagoda/backend/cuda/quantized_kv_cache.h"
#endif

namespace nb = nanobind;

namespace pagoda::python {
namespace {

struct Place {
  Device device = Device::kCpu;
  int id = 0;
};

// "cpu", "cuda" or "cuda:N".
Place parse_place(const std::string& name) {
  if (name.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    const long id = std::strtol(name.c_str() + 5, &end, 10);
    if (*end != '\0' || end == name.c_str() + 5 || id < 0 || id > 1024)
      fail(ErrorKind::kInvalidArgument, "device must be cpu, cuda or cuda:N, not '{}'", name);
    return {Device::kCuda, int(id)};
  }
  return {parse_device(name), 0};
}

#ifdef PAGODA_HAVE_CUDA
cudaStream_t as_stream(uintptr_t stream) { return reinterpret_cast<cudaStream_t>(stream); }
void use_device(const Place& place) { cuda::check_cuda(cudaSetDevice(place.id), "cudaSetDevice"); }
#endif

void require_cuda_build(const Place& place) {
#ifndef PAGODA_HAVE_CUDA
  if (place.device == Device::kCuda)
    fail(ErrorKind::kUnsupported, "CUDA tensors: this pagoda was built without CUDA (no nvcc at build time)");
#else
  (void)place;
#endif
}

// Block ids for a sequence of num_tokens tokens (its block table), from the free blocks.
std::vector<int32_t> allocate_blocks(kv::BlockPool& blocks, int32_t num_tokens) {
  if (num_tokens < 0) fail(ErrorKind::kInvalidArgument, "num_tokens must be >= 0, not {}", num_tokens);
  const int32_t count = (num_tokens + blocks.block_size() - 1) / blocks.block_size();
  if (count > blocks.num_free())
    fail(ErrorKind::kOutOfMemory, "{} tokens need {} blocks; {} of the pool's {} are free", num_tokens, count,
         blocks.num_free(), blocks.num_blocks());
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < count; ++i) ids.push_back(blocks.allocate());
  return ids;
}

void free_blocks(kv::BlockPool& blocks, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) {
    if (id < 0 || id >= blocks.num_blocks() || blocks.refcount(id) == 0)
      fail(ErrorKind::kInvalidArgument, "block {} is not an allocated block of this pool", id);
  }
  for (int32_t id : ids) blocks.release(id);
}

// One layer's paged K and V pools. Pools it made are freed with the last of it and the tensors
// it handed out (the capsule owns them); wrapped pools stay the caller's.
class KvPool {
 public:
  KvPool(int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim, const std::string& dtype,
         const std::string& device, const std::string& layout)
      : place_(parse_place(device)), layout_(parse_layout(layout)), blocks_(checked_blocks(num_blocks), block_size) {
    require_cuda_build(place_);
    if (block_size < 1 || num_kv_heads < 1 || head_dim < 1 || block_size > 4096 || num_kv_heads > 4096 ||
        head_dim > 4096)
      fail(ErrorKind::kInvalidArgument, "block_size, num_kv_heads and head_dim must be in [1, 4096]");
    const DType t = parse_dtype(dtype);
    const size_t pool_bytes = size_t(num_blocks) * size_t(block_size) * size_t(num_kv_heads) * size_t(head_dim) *
                              dtype_size(t);
    void* memory = nullptr;
    if (place_.device == Device::kCpu) {
      memory = std::aligned_alloc(64, (2 * pool_bytes + 63) / 64 * 64);
      if (!memory) fail(ErrorKind::kOutOfMemory, "cannot allocate {} bytes for the KV pools", 2 * pool_bytes);
      std::memset(memory, 0, 2 * pool_bytes);
      owner_ = nb::capsule(memory, [](void* p) noexcept { std::free(p); });
    } else {
#ifdef PAGODA_HAVE_CUDA
      use_device(place_);
      cuda::check_cuda(cudaMalloc(&memory, 2 * pool_bytes), "cudaMalloc of the KV pools");
      cuda::check_cuda(cudaMemset(memory, 0, 2 * pool_bytes), "cudaMemset of the KV pools");
      owner_ = nb::capsule(memory, [](void* p) noexcept { cudaFree(p); });
#endif
    }
    void* v = static_cast<char*>(memory) + pool_bytes;
    kv_ = make_paged_kv(memory, v, t, layout_, num_blocks, block_size, num_kv_heads, head_dim, place_.device);
    const size_t shape[4] = {size_t(num_blocks), size_t(layout_ == KvLayout::kHnd ? num_kv_heads : block_size),
                             size_t(layout_ == KvLayout::kHnd ? block_size : num_kv_heads), size_t(head_dim)};
    k_ = Array(memory, 4, shape, owner_, nullptr, dlpack_dtype(t), device_type(), place_.id);
    v_ = Array(v, 4, shape, owner_, nullptr, dlpack_dtype(t), device_type(), place_.id);
  }

  // A caller's pools: [num_blocks, num_kv_heads, block_size, head_dim] (HND) or
  // [num_blocks, block_size, num_kv_heads, head_dim] (NHD), contiguous, f32/f16/bf16.
  KvPool(nb::handle k_obj, nb::handle v_obj, const std::string& layout)
      : layout_(parse_layout(layout)), blocks_(1, 1), k_obj_(nb::borrow(k_obj)), v_obj_(nb::borrow(v_obj)) {
    const TensorArg k(k_obj, "k_cache"), v(v_obj, "v_cache");
    place_ = {device_of(k), k.device_id()};
    require_cuda_build(place_);
    if (k.ndim() != 4)
      fail(ErrorKind::kInvalidArgument, "k_cache must have 4 dimensions {}, not shape {}", dims(), shape_string(k));
    const DType t = dtype_of(k);
    const int64_t n = k.shape(0), a = k.shape(1), b = k.shape(2), d = k.shape(3);
    check_tensor(k, {dims(), {n, a, b, d}, t, place_.device, place_.id});
    check_tensor(v, {dims(), {n, a, b, d}, t, place_.device, place_.id});
    const int64_t heads = layout_ == KvLayout::kHnd ? a : b, block_size = layout_ == KvLayout::kHnd ? b : a;
    blocks_ = kv::BlockPool(checked_blocks(n), int32_t(block_size));
    kv_ = make_paged_kv(k.data(), v.data(), t, layout_, int32_t(n), int32_t(block_size), int32_t(heads), int32_t(d),
                        place_.device);
  }

  std::vector<int32_t> allocate(int32_t num_tokens) { return allocate_blocks(blocks_, num_tokens); }
  void free(const std::vector<int32_t>& ids) { free_blocks(blocks_, ids); }

  // Writes K and V of tokens [start, start + n) of the sequence whose blocks are block_table.
  //   k, v: [n, num_kv_heads, head_dim] of the pool's dtype and device
  void append(nb::handle k_obj, nb::handle v_obj, const std::vector<int32_t>& block_table, int32_t start,
              int64_t stream_arg) {
    const TensorArg k(k_obj, "k"), v(v_obj, "v");
    if (k.ndim() != 3)
      fail(ErrorKind::kInvalidArgument, "k must have 3 dimensions [n, num_kv_heads, head_dim], not shape {}",
           shape_string(k));
    const int64_t n = k.shape(0);
    check_tensor(k, {"[n, num_kv_heads, head_dim]", {n, kv_.num_kv_heads, kv_.head_dim}, kv_.dtype, place_.device,
                     place_.id});
    check_tensor(v, {"[n, num_kv_heads, head_dim]", {n, kv_.num_kv_heads, kv_.head_dim}, kv_.dtype, place_.device,
                     place_.id});
    const uintptr_t stream = k.stream(stream_arg);
    if (start < 0) fail(ErrorKind::kInvalidArgument, "start must be >= 0, not {}", start);
    if ((int64_t(start) + n + kv_.block_size - 1) / kv_.block_size > int64_t(block_table.size()))
      fail(ErrorKind::kInvalidArgument, "tokens [{}, {}) need {} blocks; block_table has {}", start, start + n,
           (int64_t(start) + n + kv_.block_size - 1) / kv_.block_size, block_table.size());
    for (int32_t id : block_table) {
      if (id < 0 || id >= kv_.num_blocks)
        fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, kv_.num_blocks);
    }
    const size_t elem = dtype_size(kv_.dtype);
    const size_t row_bytes = size_t(kv_.head_dim) * elem;
    // Runs of tokens within one block: per head (HND), or all heads at once (NHD, where a token's
    // heads are one contiguous row), one 2-D copy each.
    for (int64_t t = 0; t < n;) {
      const int64_t pos = start + t;
      const int64_t slot = pos % kv_.block_size;
      const int64_t run = std::min<int64_t>(n - t, kv_.block_size - slot);
      const int64_t block = block_table[size_t(pos / kv_.block_size)];
      const int32_t copies = layout_ == KvLayout::kHnd ? kv_.num_kv_heads : 1;
      const size_t width = layout_ == KvLayout::kHnd ? row_bytes : row_bytes * size_t(kv_.num_kv_heads);
      for (int32_t h = 0; h < copies; ++h) {
        const int64_t dst_offset = (block * kv_.page_stride + h * kv_.head_stride + slot * kv_.token_stride) * int64_t(elem);
        const int64_t src_offset = (t * kv_.num_kv_heads + h) * int64_t(row_bytes);
        for (int pool = 0; pool < 2; ++pool) {
          char* dst = static_cast<char*>(pool == 0 ? kv_.k : kv_.v) + dst_offset;
          const char* src = static_cast<const char*>((pool == 0 ? k : v).data()) + src_offset;
          copy_rows(dst, size_t(kv_.token_stride) * elem, src, size_t(kv_.num_kv_heads) * row_bytes, width,
                    size_t(run), stream);
        }
      }
      t += run;
    }
  }

  const PagedKv& view() const { return kv_; }
  const Place& place() const { return place_; }
  Array k() const { return k_; }
  Array v() const { return v_; }
  std::string layout_name() const { return layout_ == KvLayout::kHnd ? "HND" : "NHD"; }
  int32_t num_free_blocks() const { return blocks_.num_free(); }

#ifdef PAGODA_HAVE_CUDA
  // The pools' tensor maps (the prefix kernel's TMA copies), encoded once.
  const cuda::KvTensorMaps& tensor_maps() {
    if (!maps_) maps_ = cuda::kv_tensor_maps(kv_);
    return *maps_;
  }
#endif

 private:
  static KvLayout parse_layout(const std::string& name) {
    if (name == "HND" || name == "hnd") return KvLayout::kHnd;
    if (name == "NHD" || name == "nhd") return KvLayout::kNhd;
    fail(ErrorKind::kInvalidArgument, "layout must be HND or NHD, not '{}'", name);
  }
  static int32_t checked_blocks(int64_t num_blocks) {
    if (num_blocks < 1 || num_blocks > (int64_t(1) << 30))
      fail(ErrorKind::kInvalidArgument, "num_blocks must be in [1, 2^30], not {}", num_blocks);
    return int32_t(num_blocks);
  }
  const char* dims() const {
    return layout_ == KvLayout::kHnd ? "[num_blocks, num_kv_heads, block_size, head_dim]"
                                     : "[num_blocks, block_size, num_kv_heads, head_dim]";
  }
  static nb::dlpack::dtype dlpack_dtype(DType t) {
    if (t == DType::kF32) return nb::dtype<float>();
    return nb::dlpack::dtype{uint8_t(t == DType::kF16 ? nb::dlpack::dtype_code::Float : nb::dlpack::dtype_code::Bfloat),
                             16, 1};
  }
  int device_type() const { return place_.device == Device::kCpu ? nb::device::cpu::value : nb::device::cuda::value; }

  void copy_rows(char* dst, size_t dst_pitch, const char* src, size_t src_pitch, size_t width, size_t rows,
                 uintptr_t stream) const {
    if (place_.device == Device::kCpu) {
      for (size_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_pitch, src + r * src_pitch, width);
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    use_device(place_);
    cuda::check_cuda(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDeviceToDevice,
                                       as_stream(stream)),
                     "cudaMemcpy2DAsync (append)");
#else
    (void)stream;
#endif
  }

  Place place_;
  KvLayout layout_;
  kv::BlockPool blocks_;
  nb::object owner_;  // the memory of pools made here
  Array k_, v_;
  nb::object k_obj_, v_obj_;  // the tensors of wrapped pools, kept alive
  PagedKv kv_;
#ifdef PAGODA_HAVE_CUDA
  std::optional<cuda::KvTensorMaps> maps_;
#endif
};

// An array handed to numpy that owns its memory.
template <class T>
nb::ndarray<nb::numpy, T> numpy_array(std::vector<T>&& data, std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(data));
  nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(owned->data(), shape.size(), shape.begin(), owner);
}

#ifdef PAGODA_HAVE_CUDA
// Device memory for cuda::QuantizedKvCache's pools.
class CudaBuffer final : public Backend::Buffer {
 public:
  explicit CudaBuffer(size_t bytes) {
    cuda::check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc of the quantized KV pools");
    size_ = bytes;
  }
  ~CudaBuffer() override { cudaFree(data_); }
};
#endif

// One layer's int2 or fp8 pools: the engine's own cache (one layer of it), so that append() stores
// exactly the codes `pagoda --kv-cache-dtype int2|fp8` stores for the same rows, position, layer 0
// and seed. On the CPU, cpu::QuantizedKvCache from f32 rows; on CUDA, cuda::QuantizedKvCache from
// f16/bf16 rows through the backend's fused RoPE-and-append kernel with every rotation angle 0
// (cos 1, sin 0: the rows pass unrotated), its codes bit for bit the CPU's for the same values.
class QuantizedKvPool {
 public:
  QuantizedKvPool(int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                  const std::string& kv_cache_dtype, int32_t partition, uint64_t seed, const std::string& device,
                  const std::string& dtype)
      : place_(parse_place(device)),
        dtype_(parse_dtype(dtype)),
        config_(config(num_blocks, block_size, num_kv_heads, head_dim, kv_cache_dtype, partition, seed)),
        blocks_(checked_blocks(num_blocks), block_size) {
    require_cuda_build(place_);
    if (place_.device == Device::kCpu) {
      if (dtype_ != DType::kF32) fail(ErrorKind::kInvalidArgument, "int2/fp8 pools on the CPU take f32 rows, not {}", dtype);
      cpu_.emplace(config_);
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    const attention::AttentionShape shape{.num_q_heads = num_kv_heads, .num_kv_heads = num_kv_heads,
                                          .head_dim = head_dim, .block_size = block_size};
    if (const char* why = cuda::quantized_kv_unsupported_reason(shape, config_.quant, partition, dtype_))
      fail(ErrorKind::kUnsupported, "int2/fp8 KV pool on CUDA: {}", why);
    use_device(place_);
    gpu_.emplace(config_, dtype_, [](size_t bytes) { return std::make_shared<CudaBuffer>(bytes); }, nullptr);
    const std::vector<float> zeros(size_t(head_dim / 2), 0.f);
    inv_freq_.upload(zeros);
    cuda::check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
#endif
  }
  QuantizedKvPool(const QuantizedKvPool&) = delete;
  QuantizedKvPool& operator=(const QuantizedKvPool&) = delete;

  std::vector<int32_t> allocate(int32_t num_tokens) { return allocate_blocks(blocks_, num_tokens); }
  void free(const std::vector<int32_t>& ids) { free_blocks(blocks_, ids); }

  // Quantizes and stores K and V ([n, num_kv_heads, head_dim] f32 on the CPU) as tokens
  // [start, start + n) of the sequence whose blocks are block_table. int2 writes must come in
  // order within a V partition (its codes are made when its last token arrives).
  void append(nb::handle k_obj, nb::handle v_obj, const std::vector<int32_t>& block_table, int32_t start,
              int64_t stream_arg) {
    const kv::KvCacheConfig& c = config_;
    const TensorArg k(k_obj, "k"), v(v_obj, "v");
    if (k.ndim() != 3)
      fail(ErrorKind::kInvalidArgument, "k must have 3 dimensions [n, num_kv_heads, head_dim], not shape {}",
           shape_string(k));
    const int64_t n = k.shape(0);
    for (const TensorArg* t : {&k, &v})
      check_tensor(*t, {"[n, num_kv_heads, head_dim]", {n, c.num_kv_heads, c.head_dim}, dtype_, place_.device, place_.id});
    if (place_.device == Device::kCpu) {
      const auto rows = [&](const TensorArg& t) {
        return Tensor::contiguous(t.data(), DType::kF32, {n, c.num_kv_heads, c.head_dim});
      };
      nb::gil_scoped_release release;
      cpu_->write(0, block_table, start, rows(k), rows(v));
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    if (start < 0 || int64_t(start) + n > int64_t(block_table.size()) * c.block_size)
      fail(ErrorKind::kInvalidArgument, "KV write of tokens [{}, {}) outside {} blocks of {}", start, int64_t(start) + n,
           block_table.size(), c.block_size);
    for (int32_t id : block_table)
      if (id < 0 || id >= c.num_blocks)
        fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, c.num_blocks);
    if (n == 0) return;
    const cudaStream_t stream = as_stream(k.stream(stream_arg));
    use_device(place_);
    // The step the backend would run for these rows: its tail slots (int2), then one fused append.
    StepBatch step;
    step.sequences.push_back({.block_ids = block_table, .start_pos = start, .num_new = int32_t(n)});
    std::vector<int32_t> positions, slot_blocks, unused;
    for (int32_t pos = start; pos < start + int32_t(n); ++pos) {
      positions.push_back(pos);
      slot_blocks.push_back(block_table[size_t(pos / c.block_size)]);
    }
    gpu_->begin_step(step, unused, stream);
    positions_.upload_grown(positions, stream);
    slot_blocks_.upload_grown(slot_blocks, stream);
    // qkv rows [q | k | v] with q a copy of k (one q head per kv head; its output is unused).
    const size_t row = size_t(c.num_kv_heads) * size_t(c.head_dim) * 2;
    qkv_.make_room(size_t(n) * row * 3 / 2);
    q_out_.make_room(size_t(n) * row / 2);
    for (int part = 0; part < 3; ++part)
      cuda::check_cuda(cudaMemcpy2DAsync(reinterpret_cast<char*>(qkv_.data()) + size_t(part) * row, 3 * row,
                                         (part == 2 ? v : k).data(), row, row, size_t(n), cudaMemcpyDeviceToDevice,
                                         stream),
                       "cudaMemcpy2DAsync (quantized append)");
    cuda::quantized_rope_append_kv(qkv_.data(), n, positions_.data(), slot_blocks_.data(), inv_freq_.data(),
                                   c.num_kv_heads, c.num_kv_heads, c.head_dim, gpu_->layer(0), 0, c.seed, false, dtype_,
                                   q_out_.data(), stream);
#else
    (void)stream_arg;
#endif
  }

#ifdef PAGODA_HAVE_CUDA
  // Tokens [0, length) widened to the rows' dtype into k_pages, v_pages [num_blocks of the table,
  // num_kv_heads, block_size, head_dim] (HND pages, page i for block_table[i]; tokens past length
  // left as they are), by the kernel the backend's prefill over cached blocks uses.
  void widen(const std::vector<int32_t>& block_table, int32_t length, nb::handle k_obj, nb::handle v_obj,
             int64_t stream_arg) {
    const kv::KvCacheConfig& c = config_;
    if (length < 0 || int64_t(length) > int64_t(block_table.size()) * c.block_size)
      fail(ErrorKind::kInvalidArgument, "length {} outside the {} tokens of block_table's {} blocks", length,
           int64_t(block_table.size()) * c.block_size, block_table.size());
    for (int32_t id : block_table)
      if (id < 0 || id >= c.num_blocks)
        fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, c.num_blocks);
    const TensorArg k(k_obj, "k_pages"), v(v_obj, "v_pages");
    const auto count = int64_t(block_table.size());
    for (const TensorArg* t : {&k, &v})
      check_tensor(*t, {"[num_blocks, num_kv_heads, block_size, head_dim]", {count, c.num_kv_heads, c.block_size, c.head_dim},
                        dtype_, place_.device, place_.id});
    if (count == 0) return;
    std::vector<int32_t> valid;
    for (int64_t b = 0; b < count; ++b) valid.push_back(std::clamp(length - int32_t(b) * c.block_size, 0, c.block_size));
    const cudaStream_t stream = as_stream(k.stream(stream_arg));
    use_device(place_);
    widen_blocks_.upload(block_table, stream);
    widen_valid_.upload(valid, stream);
    const PagedKv out = make_paged_kv(k.data(), v.data(), dtype_, KvLayout::kHnd, int32_t(count), c.block_size,
                                      c.num_kv_heads, c.head_dim, Device::kCuda);
    cuda::dequantize_kv_blocks(gpu_->layer(0), widen_blocks_.data(), widen_valid_.data(), int32_t(count), out, stream);
  }
#endif

  // What the pools hold for tokens [0, length) of the sequence whose blocks are block_table, as
  // numpy arrays (codes unpacked, one a byte; f16 metadata widened to f32):
  //   fp8:  k_codes, v_codes [length, heads, dim]; k_scale, v_scale [length, heads]
  //         (x ~ scale * e4m3(code))
  //   int2: k_codes [length, heads, dim]; k_min, k_scale [length, heads, dim / Π];
  //         v_codes [sealed, heads, dim] of the sealed V partitions' tokens (sealed = length
  //         rounded down to Π); v_min, v_scale [sealed / Π, heads, dim]; v_tail [length - sealed,
  //         heads, dim], the open partition's rows as stored (f16)
  // Tokens never written are refused where the pools can tell (an unsealed V partition, a block
  // without an open one); within the open partition they cannot, and read back what is there.
  nb::dict read(const std::vector<int32_t>& block_table, int32_t length) const {
    if (place_.device != Device::kCpu)
      fail(ErrorKind::kUnsupported, "read() of a CUDA pool: widen() it to f16/bf16 pages (dequantize())");
    const QuantizedPagedKv kv = cpu_->layer(0);
    const size_t heads = size_t(kv.num_kv_heads), dim = size_t(kv.head_dim), len = size_t(std::max(length, 0));
    if (length < 0 || int64_t(length) > int64_t(block_table.size()) * kv.block_size)
      fail(ErrorKind::kInvalidArgument, "length {} outside the {} tokens of block_table's {} blocks", length,
           int64_t(block_table.size()) * kv.block_size, block_table.size());
    for (int32_t id : block_table)
      if (id < 0 || id >= kv.num_blocks)
        fail(ErrorKind::kInvalidArgument, "block id {} outside the pool's {} blocks", id, kv.num_blocks);
    const auto block_of = [&](size_t t) { return int64_t(block_table[t / size_t(kv.block_size)]); };
    const auto slot_of = [&](size_t t) { return int64_t(t % size_t(kv.block_size)); };
    const auto widen = [](f16 x) { return f16_to_f32(x.bits); };
    nb::dict out;
    std::vector<uint8_t> k_codes(len * heads * dim);
    if (kv.quant == KvQuant::kFp8) {
      std::vector<uint8_t> v_codes(k_codes.size());
      std::vector<float> k_scale(len * heads), v_scale(len * heads);
      for (size_t t = 0; t < len; ++t)
        for (size_t h = 0; h < heads; ++h) {
          const int64_t codes = block_of(t) * kv.k_codes_block() + int64_t(h) * kv.k_codes_head() + slot_of(t) * kv.head_dim;
          const int64_t scale = block_of(t) * kv.fp8_scale_block() + int64_t(h) * kv.fp8_scale_head() + slot_of(t);
          std::memcpy(&k_codes[(t * heads + h) * dim], kv.k_codes + codes, dim);
          std::memcpy(&v_codes[(t * heads + h) * dim], kv.v_codes + codes, dim);
          k_scale[t * heads + h] = kv.k_fp8_scale[scale];
          v_scale[t * heads + h] = kv.v_fp8_scale[scale];
        }
      out["k_codes"] = numpy_array(std::move(k_codes), {len, heads, dim});
      out["v_codes"] = numpy_array(std::move(v_codes), {len, heads, dim});
      out["k_scale"] = numpy_array(std::move(k_scale), {len, heads});
      out["v_scale"] = numpy_array(std::move(v_scale), {len, heads});
      return out;
    }
    const size_t part = size_t(kv.partition), k_parts = size_t(kv.k_parts());
    std::vector<float> k_min(len * heads * k_parts), k_scale(k_min.size());
    for (size_t t = 0; t < len; ++t)
      for (size_t h = 0; h < heads; ++h) {
        const uint8_t* packed =
            kv.k_codes + block_of(t) * kv.k_codes_block() + int64_t(h) * kv.k_codes_head() + slot_of(t) * kv.head_dim / 4;
        for (size_t d = 0; d < dim; ++d) k_codes[(t * heads + h) * dim + d] = cpu::int2_code(packed, int64_t(d));
        const int64_t meta = block_of(t) * kv.k_meta_block() + int64_t(h) * kv.k_meta_head() + slot_of(t) * kv.k_parts();
        for (size_t p = 0; p < k_parts; ++p) {
          k_min[(t * heads + h) * k_parts + p] = widen(kv.k_min[meta + int64_t(p)]);
          k_scale[(t * heads + h) * k_parts + p] = widen(kv.k_scale[meta + int64_t(p)]);
        }
      }
    const size_t sealed = len / part * part;
    std::vector<uint8_t> v_codes(sealed * heads * dim);
    std::vector<float> v_min(sealed / part * heads * dim), v_scale(v_min.size()), v_tail((len - sealed) * heads * dim);
    for (size_t t = 0; t < len; ++t) {
      const int64_t block = block_of(t), slot = slot_of(t), partition_index = slot / int64_t(part);
      if (t < sealed && kv.sealed[block] <= partition_index)
        fail(ErrorKind::kInvalidArgument, "int2 KV: token {} was never written (its V partition is not sealed)", t);
      if (t >= sealed && (kv.tail_slot[block] < 0 || kv.sealed[block] != partition_index))
        fail(ErrorKind::kInvalidArgument, "int2 KV: token {} was never written", t);
      for (size_t h = 0; h < heads; ++h)
        for (size_t c = 0; c < dim; ++c) {
          if (t >= sealed) {
            const f16* tail = kv.tail + int64_t(kv.tail_slot[block]) * kv.tail_slot_stride() +
                              int64_t(h) * kv.tail_head() + (slot % int64_t(part)) * kv.head_dim;
            v_tail[((t - sealed) * heads + h) * dim + c] = widen(tail[c]);
            continue;
          }
          const uint8_t* packed =
              kv.v_codes + block * kv.v_codes_block() + int64_t(h) * kv.v_codes_head() + int64_t(c) * (kv.block_size / 4);
          v_codes[(t * heads + h) * dim + c] = cpu::int2_code(packed, slot);
          if (slot % int64_t(part) == 0) {
            const int64_t meta = block * kv.v_meta_block() + int64_t(h) * kv.v_meta_head() + partition_index * kv.head_dim;
            v_min[((t / part) * heads + h) * dim + c] = widen(kv.v_min[meta + int64_t(c)]);
            v_scale[((t / part) * heads + h) * dim + c] = widen(kv.v_scale[meta + int64_t(c)]);
          }
        }
    }
    out["k_codes"] = numpy_array(std::move(k_codes), {len, heads, dim});
    out["k_min"] = numpy_array(std::move(k_min), {len, heads, k_parts});
    out["k_scale"] = numpy_array(std::move(k_scale), {len, heads, k_parts});
    out["v_codes"] = numpy_array(std::move(v_codes), {sealed, heads, dim});
    out["v_min"] = numpy_array(std::move(v_min), {sealed / part, heads, dim});
    out["v_scale"] = numpy_array(std::move(v_scale), {sealed / part, heads, dim});
    out["v_tail"] = numpy_array(std::move(v_tail), {len - sealed, heads, dim});
    return out;
  }

  QuantizedPagedKv view() const {
#ifdef PAGODA_HAVE_CUDA
    if (gpu_) return gpu_->layer(0);
#endif
    return cpu_->layer(0);
  }
  const kv::KvCacheConfig& config() const { return config_; }
  const Place& place() const { return place_; }
  DType dtype() const { return dtype_; }
  int32_t num_free_blocks() const { return blocks_.num_free(); }

 private:
  static int32_t checked_blocks(int64_t num_blocks) {
    if (num_blocks < 1 || num_blocks > (int64_t(1) << 30))
      fail(ErrorKind::kInvalidArgument, "num_blocks must be in [1, 2^30], not {}", num_blocks);
    return int32_t(num_blocks);
  }
  static kv::KvCacheConfig config(int32_t num_blocks, int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                  const std::string& kv_cache_dtype, int32_t partition, uint64_t seed) {
    if (kv_cache_dtype != "int2" && kv_cache_dtype != "fp8")
      fail(ErrorKind::kInvalidArgument, "kv_cache_dtype must be int2 or fp8, not '{}'", kv_cache_dtype);
    if (block_size < 1 || num_kv_heads < 1 || head_dim < 1 || block_size > 4096 || num_kv_heads > 4096 ||
        head_dim > 4096)
      fail(ErrorKind::kInvalidArgument, "block_size, num_kv_heads and head_dim must be in [1, 4096]");
    // QuantizedKvCache checks the rest (multiples of 4, the partition dividing head_dim and block_size).
    return {.num_layers = 1,
            .num_blocks = num_blocks,
            .block_size = block_size,
            .num_kv_heads = num_kv_heads,
            .head_dim = head_dim,
            .quant = kv_cache_dtype == "int2" ? KvQuant::kInt2 : KvQuant::kFp8,
            .partition = partition,
            .seed = seed,
            .stochastic_rounding = true};  // the paper's format, which the GPU kernels also run
  }

  Place place_;
  DType dtype_;  // of the rows appended (and on CUDA of q and out)
  kv::KvCacheConfig config_;
  kv::BlockPool blocks_;
  std::optional<cpu::QuantizedKvCache> cpu_;
#ifdef PAGODA_HAVE_CUDA
  std::optional<cuda::QuantizedKvCache> gpu_;
  cuda::DeviceArray<float> inv_freq_;
  cuda::DeviceArray<int32_t> positions_, slot_blocks_, widen_blocks_, widen_valid_;
  cuda::DeviceArray<uint16_t> qkv_, q_out_;
#endif
};

// Seconds per call of `call`, which runs one kernel: one warm-up call, then `iterations` timed
// ones, by the wall clock on the CPU and by events on `stream` on a GPU.
double seconds_per_call(Device device, uintptr_t stream, int32_t iterations, const std::function<void()>& call) {
  if (iterations < 1) fail(ErrorKind::kInvalidArgument, "iterations must be >= 1");
  call();
  if (device == Device::kCpu) {
    const auto start = std::chrono::steady_clock::now();
    for (int32_t i = 0; i < iterations; ++i) call();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iterations;
  }
#ifdef PAGODA_HAVE_CUDA
  cudaEvent_t begin, end;
  cuda::check_cuda(cudaEventCreate(&begin), "cudaEventCreate");
  cuda::check_cuda(cudaEventCreate(&end), "cudaEventCreate");
  cuda::check_cuda(cudaEventRecord(begin, as_stream(stream)), "cudaEventRecord");
  for (int32_t i = 0; i < iterations; ++i) call();
  cuda::check_cuda(cudaEventRecord(end, as_stream(stream)), "cudaEventRecord");
  cuda::check_cuda(cudaEventSynchronize(end), "cudaEventSynchronize");
  float ms = 0;
  cuda::check_cuda(cudaEventElapsedTime(&ms, begin, end), "cudaEventElapsedTime");
  cudaEventDestroy(begin);
  cudaEventDestroy(end);
  return double(ms) * 1e-3 / iterations;
#else
  (void)stream;
  return 0;
#endif
}

// What plan() fixes for run(): the batch, its shape and the KV dtype (or its int2/fp8 format).
struct Planned {
  attention::DecodeBatch batch;
  attention::AttentionShape shape;
  DType kv_dtype = DType::kF16;
  KvQuant quant = KvQuant::kNone;
  int32_t max_block_id = -1;
  bool valid = false;

  void set(const std::vector<std::vector<int32_t>>& block_tables, const std::vector<int32_t>& lengths,
           int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
           std::optional<float> softmax_scale, const std::string& kv_dtype_name) {
    valid = false;
    if (block_tables.size() != lengths.size())
      fail(ErrorKind::kInvalidArgument, "block_tables has {} sequences and lengths {}", block_tables.size(),
           lengths.size());
    if (num_q_heads < 1 || num_kv_heads < 1 || head_dim < 1 || block_size < 1)
      fail(ErrorKind::kInvalidArgument, "num_q_heads, num_kv_heads, head_dim and block_size must be positive");
    if (softmax_scale && !(std::isfinite(*softmax_scale) && *softmax_scale > 0))
      fail(ErrorKind::kInvalidArgument, "softmax_scale must be positive and finite");
    quant = kv_dtype_name == "int2" ? KvQuant::kInt2 : kv_dtype_name == "fp8" ? KvQuant::kFp8 : KvQuant::kNone;
    kv_dtype = quant == KvQuant::kNone ? parse_dtype(kv_dtype_name) : DType::kF32;  // quantized: f32 q and out
    shape = {.num_q_heads = num_q_heads,
             .num_kv_heads = num_kv_heads,
             .head_dim = head_dim,
             .block_size = block_size,
             .softmax_scale = softmax_scale.value_or(1.0f / std::sqrt(float(head_dim)))};
    batch = {};
    for (size_t s = 0; s < lengths.size(); ++s) {
      if (lengths[s] < 0) fail(ErrorKind::kInvalidArgument, "lengths[{}] is {}; lengths must be >= 0", s, lengths[s]);
      batch.add_sequence(block_tables[s], lengths[s]);
    }
    attention::validate_decode_batch(batch, shape);
    max_block_id = batch.block_ids.empty() ? -1 : *std::max_element(batch.block_ids.begin(), batch.block_ids.end());
    if (!batch.block_ids.empty() && *std::min_element(batch.block_ids.begin(), batch.block_ids.end()) < 0)
      fail(ErrorKind::kInvalidArgument, "block ids must be >= 0");
  }

  // The checks every run() makes: the pool, q, out and lse against the plan.
  void check_run(const KvPool& pool, const Place& place, const TensorArg& q, const TensorArg& out, const TensorArg& lse,
                 const char* op) const {
    if (!valid) fail(ErrorKind::kInvalidArgument, "{}.run() before plan()", op);
    if (quant != KvQuant::kNone)
      fail(ErrorKind::kInvalidArgument, "the plan is for an {} KV cache; kv_cache is {}", kv_quant_name(quant),
           dtype_name(pool.view().dtype));
    const PagedKv& kv = pool.view();
    if (pool.place().device != place.device || pool.place().id != place.id)
      fail(ErrorKind::kInvalidArgument, "kv_cache is on {}:{}; the plan is for {}:{}", device_name(pool.place().device),
           pool.place().id, device_name(place.device), place.id);
    if (kv.num_kv_heads != shape.num_kv_heads || kv.head_dim != shape.head_dim || kv.block_size != shape.block_size ||
        kv.dtype != kv_dtype)
      fail(ErrorKind::kInvalidArgument,
           "kv_cache ({} kv heads, head_dim {}, block_size {}, {}) does not match the plan ({}, {}, {}, {})",
           kv.num_kv_heads, kv.head_dim, kv.block_size, dtype_name(kv.dtype), shape.num_kv_heads, shape.head_dim,
           shape.block_size, dtype_name(kv_dtype));
    if (max_block_id >= kv.num_blocks)
      fail(ErrorKind::kInvalidArgument, "the plan reads block {}; kv_cache has {} blocks", max_block_id, kv.num_blocks);
    // The CPU executor computes in f32; the GPU kernels take q and write out in the KV dtype.
    const DType io = place.device == Device::kCpu ? DType::kF32 : kv_dtype;
    const int64_t n = batch.num_seqs();
    check_tensor(q, {"[num_seqs, num_q_heads, head_dim]", {n, shape.num_q_heads, shape.head_dim}, io,
                     place.device, place.id});
    check_tensor(out, {"[num_seqs, num_q_heads, head_dim]", {n, shape.num_q_heads, shape.head_dim}, io,
                       place.device, place.id});
    check_tensor(lse, {"[num_seqs, num_q_heads]", {n, shape.num_q_heads}, DType::kF32, place.device, place.id});
  }

  // The same for an int2 or fp8 pool: q and out of the pool's row dtype (f32 on the CPU).
  void check_run(const QuantizedKvPool& pool, const Place& place, const TensorArg& q, const TensorArg& out,
                 const TensorArg& lse) const {
    if (!valid) fail(ErrorKind::kInvalidArgument, "DecodeAttention.run() before plan()");
    if (pool.place().device != place.device || pool.place().id != place.id)
      fail(ErrorKind::kInvalidArgument, "kv_cache is on {}:{}; the plan is for {}:{}", device_name(pool.place().device),
           pool.place().id, device_name(place.device), place.id);
    const kv::KvCacheConfig& c = pool.config();
    if (c.num_kv_heads != shape.num_kv_heads || c.head_dim != shape.head_dim || c.block_size != shape.block_size ||
        c.quant != quant)
      fail(ErrorKind::kInvalidArgument,
           "kv_cache ({} kv heads, head_dim {}, block_size {}, {}) does not match the plan ({}, {}, {}, {})",
           c.num_kv_heads, c.head_dim, c.block_size, kv_quant_name(c.quant), shape.num_kv_heads, shape.head_dim,
           shape.block_size, quant == KvQuant::kNone ? dtype_name(kv_dtype) : kv_quant_name(quant));
    if (max_block_id >= c.num_blocks)
      fail(ErrorKind::kInvalidArgument, "the plan reads block {}; kv_cache has {} blocks", max_block_id, c.num_blocks);
    const int64_t n = batch.num_seqs();
    check_tensor(q, {"[num_seqs, num_q_heads, head_dim]", {n, shape.num_q_heads, shape.head_dim}, pool.dtype(),
                     place.device, place.id});
    check_tensor(out, {"[num_seqs, num_q_heads, head_dim]", {n, shape.num_q_heads, shape.head_dim}, pool.dtype(),
                       place.device, place.id});
    check_tensor(lse, {"[num_seqs, num_q_heads]", {n, shape.num_q_heads}, DType::kF32, place.device, place.id});
  }
};

class DecodeAttention {
 public:
  explicit DecodeAttention(const std::string& device) : place_(parse_place(device)) { require_cuda_build(place_); }

  void plan(const std::vector<std::vector<int32_t>>& block_tables, const std::vector<int32_t>& lengths,
            int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
            std::optional<float> softmax_scale, const std::string& kv_dtype, uintptr_t stream) {
    planned_.set(block_tables, lengths, num_q_heads, num_kv_heads, head_dim, block_size, softmax_scale, kv_dtype);
    if (place_.device == Device::kCpu) {
      plan_ = attention::plan_decode(planned_.batch, planned_.shape, {.num_workers = omp_get_max_threads()});
    } else {
#ifdef PAGODA_HAVE_CUDA
      if (planned_.quant != KvQuant::kNone) {
        // The quantized kernel's occupancy, of f16: a plan is correct for either row dtype, and
        // bf16's differs at most in how many work items fill the machine.
        if (const char* why = cuda::quantized_kv_unsupported_reason(planned_.shape, planned_.quant,
                                                                    cuda::kInt2Partition, DType::kF16))
          fail(ErrorKind::kUnsupported, "DecodeAttention on CUDA: {}", why);
        use_device(place_);
        plan_ = attention::plan_decode(planned_.batch, planned_.shape,
                                       cuda::decode_quantized_device_info(planned_.quant, DType::kF16, planned_.shape.head_dim));
        workspace_.upload(plan_, planned_.batch, planned_.shape, as_stream(stream));
        planned_.valid = true;
        return;
      }
      if (const char* why = cuda::decode_shape_unsupported_reason(planned_.shape, planned_.kv_dtype))
        fail(ErrorKind::kUnsupported, "DecodeAttention on CUDA: {}", why);
      use_device(place_);
      plan_ = attention::plan_decode(planned_.batch, planned_.shape,
                                     cuda::decode_device_info(planned_.shape, planned_.kv_dtype));
      workspace_.upload(plan_, planned_.batch, planned_.shape, as_stream(stream));
#endif
    }
    (void)stream;
    planned_.valid = true;
  }

  void run(nb::handle q_obj, KvPool& kv_cache, nb::handle out_obj, nb::handle lse_obj, int64_t stream_arg) {
    const TensorArg q(q_obj, "q"), out(out_obj, "out"), lse(lse_obj, "lse");
    planned_.check_run(kv_cache, place_, q, out, lse, "DecodeAttention");
    const uintptr_t stream = q.stream(stream_arg);
    if (place_.device == Device::kCpu) {
      nb::gil_scoped_release release;
      cpu::run_decode_cpu(plan_, planned_.batch, planned_.shape, kv_cache.view(), static_cast<const float*>(q.data()),
                                static_cast<float*>(out.data()), static_cast<float*>(lse.data()));
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    use_device(place_);
    cuda::decode_attention(workspace_, planned_.shape, kv_cache.view(), q.data(), out.data(),
                           static_cast<float*>(lse.data()), {}, as_stream(stream));
#endif
    (void)stream;
  }

  // Over an int2 or fp8 pool: the CPU's quantized executor (backend/cpu/quantized_attention.h),
  // which reads the batch itself rather than the plan's work items, or the CUDA backend's
  // quantized decode kernel by the uploaded plan (backend/cuda/quantized_kv.h).
  void run_quantized(nb::handle q_obj, QuantizedKvPool& kv_cache, nb::handle out_obj, nb::handle lse_obj,
                     int64_t stream_arg) {
    const TensorArg q(q_obj, "q"), out(out_obj, "out"), lse(lse_obj, "lse");
    planned_.check_run(kv_cache, place_, q, out, lse);
    if (place_.device == Device::kCpu) {
      nb::gil_scoped_release release;
      cpu::decode_attention_quantized(planned_.batch, planned_.shape, kv_cache.view(), static_cast<const float*>(q.data()),
                                      static_cast<float*>(out.data()), static_cast<float*>(lse.data()));
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    if (kv_cache.config().quant == KvQuant::kInt2 && kv_cache.config().partition != cuda::kInt2Partition)
      fail(ErrorKind::kUnsupported, "int2 on CUDA needs partition {}", cuda::kInt2Partition);
    use_device(place_);
    cuda::decode_attention_quantized(workspace_, planned_.shape, kv_cache.view(), kv_cache.dtype(), q.data(), out.data(),
                                     static_cast<float*>(lse.data()), as_stream(q.stream(stream_arg)));
#else
    (void)stream_arg;
#endif
  }

  // Seconds per call of the executor (CPU) or the kernels (CUDA, CUDA events on `stream`) alone,
  // `iterations` back to back after one untimed call: what run() costs without the binding.
  double time_kernel(nb::handle q_obj, KvPool& kv_cache, nb::handle out_obj, nb::handle lse_obj, int32_t iterations,
                     int64_t stream_arg) {
    const TensorArg q(q_obj, "q"), out(out_obj, "out"), lse(lse_obj, "lse");
    planned_.check_run(kv_cache, place_, q, out, lse, "DecodeAttention");
    const uintptr_t stream = q.stream(stream_arg);
    nb::gil_scoped_release release;
    return seconds_per_call(place_.device, stream, iterations, [&] {
      if (place_.device == Device::kCpu) {
        cpu::run_decode_cpu(plan_, planned_.batch, planned_.shape, kv_cache.view(), static_cast<const float*>(q.data()),
                            static_cast<float*>(out.data()), static_cast<float*>(lse.data()));
        return;
      }
#ifdef PAGODA_HAVE_CUDA
      cuda::decode_attention(workspace_, planned_.shape, kv_cache.view(), q.data(), out.data(),
                             static_cast<float*>(lse.data()), {}, as_stream(stream));
#endif
    });
  }

  int32_t num_work_items() const { return int32_t(plan_.items.size()); }
  int32_t num_merges() const { return int32_t(plan_.merges.size()); }
  std::vector<int32_t> out_shape() const { return {planned_.batch.num_seqs(), planned_.shape.num_q_heads, planned_.shape.head_dim}; }
  std::string out_dtype() const {
    return std::string(dtype_name(place_.device == Device::kCpu ? DType::kF32 : planned_.kv_dtype));
  }

 private:
  Place place_;
  Planned planned_;
  attention::DecodePlan plan_;
#ifdef PAGODA_HAVE_CUDA
  cuda::DecodeWorkspace workspace_;
#endif
};

class PrefixAttention {
 public:
  explicit PrefixAttention(const std::string& device) : place_(parse_place(device)) { require_cuda_build(place_); }

  void plan(const std::vector<std::vector<int32_t>>& block_tables, const std::vector<int32_t>& lengths,
            int32_t num_q_heads, int32_t num_kv_heads, int32_t head_dim, int32_t block_size,
            std::optional<float> softmax_scale, const std::string& kv_dtype, uintptr_t stream) {
    planned_.set(block_tables, lengths, num_q_heads, num_kv_heads, head_dim, block_size, softmax_scale, kv_dtype);
    if (planned_.quant != KvQuant::kNone)
      fail(ErrorKind::kUnsupported, "PrefixAttention runs on f32/f16/bf16 KV; int2 and fp8 caches take DecodeAttention");
    if (place_.device == Device::kCpu) {
      // As the CPU backend plans: f32 partial states, the KV's own element size in the byte model.
      plan_ = attention::plan_prefix(planned_.batch, planned_.shape, {.num_workers = omp_get_max_threads()},
                                     {.kv_bytes_per_element = int32_t(dtype_size(planned_.kv_dtype))});
    } else {
#ifdef PAGODA_HAVE_CUDA
      if (const char* why = cuda::prefix_shape_unsupported_reason(planned_.shape, planned_.kv_dtype))
        fail(ErrorKind::kUnsupported, "PrefixAttention on CUDA: {}", why);
      use_device(place_);
      tiles_ = cuda::prefix_tiles(planned_.shape, planned_.kv_dtype);
      plan_ = attention::plan_prefix(planned_.batch, planned_.shape, cuda::prefix_device_info(tiles_),
                                     cuda::prefix_plan_options(tiles_));
      workspace_.upload(plan_, planned_.batch, planned_.shape, tiles_, as_stream(stream));
#endif
    }
    (void)stream;
    planned_.valid = true;
  }

  void run(nb::handle q_obj, KvPool& kv_cache, nb::handle out_obj, nb::handle lse_obj, int64_t stream_arg) {
    const TensorArg q(q_obj, "q"), out(out_obj, "out"), lse(lse_obj, "lse");
    planned_.check_run(kv_cache, place_, q, out, lse, "PrefixAttention");
    const uintptr_t stream = q.stream(stream_arg);
    if (place_.device == Device::kCpu) {
      nb::gil_scoped_release release;
      cpu::run_prefix_cpu(plan_, planned_.batch, planned_.shape, kv_cache.view(), static_cast<const float*>(q.data()),
                                static_cast<float*>(out.data()), static_cast<float*>(lse.data()));
      return;
    }
#ifdef PAGODA_HAVE_CUDA
    use_device(place_);
    cuda::prefix_attention(workspace_, planned_.shape, kv_cache.view(), kv_cache.tensor_maps(), q.data(), out.data(),
                           static_cast<float*>(lse.data()), as_stream(stream));
#endif
    (void)stream;
  }

  // Seconds per call of the executor (CPU) or the kernels (CUDA, CUDA events on `stream`) alone,
  // `iterations` back to back after one untimed call: what run() costs without the binding.
  double time_kernel(nb::handle q_obj, KvPool& kv_cache, nb::handle out_obj, nb::handle lse_obj, int32_t iterations,
                     int64_t stream_arg) {
    const TensorArg q(q_obj, "q"), out(out_obj, "out"), lse(lse_obj, "lse");
    planned_.check_run(kv_cache, place_, q, out, lse, "PrefixAttention");
    const uintptr_t stream = q.stream(stream_arg);
    nb::gil_scoped_release release;
    return seconds_per_call(place_.device, stream, iterations, [&] {
      if (place_.device == Device::kCpu) {
        cpu::run_prefix_cpu(plan_, planned_.batch, planned_.shape, kv_cache.view(), static_cast<const float*>(q.data()),
                            static_cast<float*>(out.data()), static_cast<float*>(lse.data()));
        return;
      }
#ifdef PAGODA_HAVE_CUDA
      cuda::prefix_attention(workspace_, planned_.shape, kv_cache.view(), kv_cache.tensor_maps(), q.data(), out.data(),
                             static_cast<float*>(lse.data()), as_stream(stream));
#endif
    });
  }

  int32_t num_units() const { return int32_t(plan_.units.size()); }
  int64_t kv_tokens() const { return attention::plan_kv_tokens(plan_); }
  int32_t num_merges() const { return int32_t(plan_.merges.size()); }
  std::vector<int32_t> out_shape() const { return {planned_.batch.num_seqs(), planned_.shape.num_q_heads, planned_.shape.head_dim}; }
  std::string out_dtype() const {
    return std::string(dtype_name(place_.device == Device::kCpu ? DType::kF32 : planned_.kv_dtype));
  }

 private:
  Place place_;
  Planned planned_;
  attention::PrefixPlan plan_;
#ifdef PAGODA_HAVE_CUDA
  cuda::PrefixTiles tiles_;
  cuda::PrefixWorkspace workspace_;
#endif
};

#ifdef PAGODA_HAVE_CUDA
// The merge tasks of the last stacked shape merged on the GPU, kept on the device so that a
// repeated call (or a CUDA graph capturing it) uploads nothing.
struct MergeTasks {
  int device = -1;
  int64_t seqs = -1, states = -1;
  cuda::DeviceArray<attention::MergeTask> tasks;
};
#endif

// v: [seq, num_states, num_heads, head_dim], s: [seq, num_states, num_heads] (FlashInfer's
// layout); v_out [seq, num_heads, head_dim], s_out [seq, num_heads]. On the CPU all are f32; on the
// GPU v and v_out are f16 or bf16 and s, s_out f32.
void merge_states(nb::handle v_obj, nb::handle s_obj, nb::handle v_out_obj, nb::handle s_out_obj, int64_t stream_arg) {
  const TensorArg v(v_obj, "v"), s(s_obj, "s"), v_out(v_out_obj, "v_out"), s_out(s_out_obj, "s_out");
  if (v.ndim() != 4)
    fail(ErrorKind::kInvalidArgument, "v must have 4 dimensions [seq, num_states, num_heads, head_dim], not shape {}",
         shape_string(v));
  const Place place{device_of(v), v.device_id()};
  require_cuda_build(place);
  const DType dtype = dtype_of(v);
  const int64_t n = v.shape(0), states = v.shape(1), heads = v.shape(2), dim = v.shape(3);
  const uintptr_t stream = v.stream(stream_arg);
  if (place.device == Device::kCpu && dtype != DType::kF32)
    fail(ErrorKind::kInvalidArgument, "v is {}; merge_states on the CPU takes f32", dtype_name(dtype));
  if (place.device == Device::kCuda && dtype != DType::kF16 && dtype != DType::kBF16)
    fail(ErrorKind::kInvalidArgument, "v is {}; merge_states on CUDA takes f16 or bf16", dtype_name(dtype));
  check_tensor(v, {"[seq, num_states, num_heads, head_dim]", {n, states, heads, dim}, dtype, place.device, place.id});
  check_tensor(s, {"[seq, num_states, num_heads]", {n, states, heads}, DType::kF32, place.device, place.id});
  check_tensor(v_out, {"[seq, num_heads, head_dim]", {n, heads, dim}, dtype, place.device, place.id});
  check_tensor(s_out, {"[seq, num_heads]", {n, heads}, DType::kF32, place.device, place.id});
  if (place.device == Device::kCpu) {
    const float* vi = static_cast<const float*>(v.data());
    const float* si = static_cast<const float*>(s.data());
    float* vo = static_cast<float*>(v_out.data());
    float* so = static_cast<float*>(s_out.data());
    nb::gil_scoped_release release;
    for (int64_t row = 0; row < n * heads; ++row) {
      const int64_t seq = row / heads, head = row % heads;
      float* o = vo + row * dim;
      float lse = attention::kEmptyLse;  // the identity of ⊕
      std::fill(o, o + dim, 0.f);
      for (int64_t k = 0; k < states; ++k) {
        const int64_t in_row = (seq * states + k) * heads + head;
        attention::merge_state(o, lse, vi + in_row * dim, si[in_row], int32_t(dim));
      }
      so[row] = lse;
    }
    return;
  }
#ifdef PAGODA_HAVE_CUDA
  // One task per sequence over its states as partial slots, with every head a row of the group:
  // slot p, row h is v[p / states][p % states][h], exactly the stacked layout.
  if (dim != 64 && dim != 128 && dim != 256) fail(ErrorKind::kUnsupported, "merge_states on CUDA: head_dim must be 64, 128 or 256, not {}", dim);
  if (n * states > (int64_t(1) << 30)) fail(ErrorKind::kInvalidArgument, "merge_states: too many states");
  static MergeTasks cache;
  use_device(place);
  if (cache.device != place.id || cache.seqs != n || cache.states != states) {
    std::vector<attention::MergeTask> tasks;
    for (int64_t i = 0; i < n; ++i)
      tasks.push_back({.seq = int32_t(i), .kv_head = 0, .partial_begin = int32_t(i * states), .num_partials = int32_t(states)});
    cache.tasks.upload(tasks, as_stream(stream));
    cache.device = place.id, cache.seqs = n, cache.states = states;
  }
  cuda::merge_partial_states(cache.tasks.data(), int(n), int(states), 1, 0, int(heads), int(heads), int(dim), v.data(),
                             static_cast<const float*>(s.data()), dtype, v_out.data(), static_cast<float*>(s_out.data()),
                             as_stream(stream));
#endif
  (void)stream;
}

}  // namespace

void bind_ops(nb::module_& m) {
  nb::module_ ops = m.def_submodule("ops", "attention kernels on DLPack tensors");
  nb::class_<KvPool>(ops, "KvPool")
      .def(nb::init<int32_t, int32_t, int32_t, int32_t, const std::string&, const std::string&, const std::string&>(),
           nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("dtype"),
           nb::arg("device"), nb::arg("layout"))
      .def(nb::init<nb::handle, nb::handle, const std::string&>(), nb::arg("k_cache"), nb::arg("v_cache"),
           nb::arg("layout"))
      .def("allocate", &KvPool::allocate, nb::arg("num_tokens"))
      .def("free", &KvPool::free, nb::arg("block_ids"))
      .def("append", &KvPool::append, nb::arg("k"), nb::arg("v"), nb::arg("block_table"),
           nb::arg("start"), nb::arg("stream"))
      .def_prop_ro("k", &KvPool::k, nb::rv_policy::automatic)
      .def_prop_ro("v", &KvPool::v, nb::rv_policy::automatic)
      .def_prop_ro("k_numpy", [](const KvPool& p) { return nb::ndarray<nb::numpy>(p.k()); }, nb::rv_policy::automatic)
      .def_prop_ro("v_numpy", [](const KvPool& p) { return nb::ndarray<nb::numpy>(p.v()); }, nb::rv_policy::automatic)
      .def_prop_ro("layout", &KvPool::layout_name)
      .def_prop_ro("num_blocks", [](const KvPool& p) { return p.view().num_blocks; })
      .def_prop_ro("block_size", [](const KvPool& p) { return p.view().block_size; })
      .def_prop_ro("num_kv_heads", [](const KvPool& p) { return p.view().num_kv_heads; })
      .def_prop_ro("head_dim", [](const KvPool& p) { return p.view().head_dim; })
      .def_prop_ro("dtype", [](const KvPool& p) { return std::string(dtype_name(p.view().dtype)); })
      .def_prop_ro("device", [](const KvPool& p) {
        return p.place().device == Device::kCpu ? std::string("cpu") : "cuda:" + std::to_string(p.place().id);
      })
      .def_prop_ro("num_free_blocks", &KvPool::num_free_blocks);

  nb::class_<QuantizedKvPool>(ops, "QuantizedKvPool")
      .def(nb::init<int32_t, int32_t, int32_t, int32_t, const std::string&, int32_t, uint64_t, const std::string&,
                    const std::string&>(),
           nb::arg("num_blocks"), nb::arg("block_size"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
           nb::arg("kv_cache_dtype"), nb::arg("partition"), nb::arg("seed"), nb::arg("device"), nb::arg("dtype"))
      .def("allocate", &QuantizedKvPool::allocate, nb::arg("num_tokens"))
      .def("free", &QuantizedKvPool::free, nb::arg("block_ids"))
      .def("append", &QuantizedKvPool::append, nb::arg("k"), nb::arg("v"), nb::arg("block_table"), nb::arg("start"),
           nb::arg("stream"))
      .def("read", &QuantizedKvPool::read, nb::arg("block_table"), nb::arg("length"))
#ifdef PAGODA_HAVE_CUDA
      .def("widen", &QuantizedKvPool::widen, nb::arg("block_table"), nb::arg("length"), nb::arg("k_pages"),
           nb::arg("v_pages"), nb::arg("stream"))
#endif
      .def_prop_ro("dtype", [](const QuantizedKvPool& p) { return std::string(dtype_name(p.dtype())); })
      .def_prop_ro("device", [](const QuantizedKvPool& p) {
        return p.place().device == Device::kCpu ? std::string("cpu") : "cuda:" + std::to_string(p.place().id);
      })
      .def_prop_ro("num_blocks", [](const QuantizedKvPool& p) { return p.config().num_blocks; })
      .def_prop_ro("block_size", [](const QuantizedKvPool& p) { return p.config().block_size; })
      .def_prop_ro("num_kv_heads", [](const QuantizedKvPool& p) { return p.config().num_kv_heads; })
      .def_prop_ro("head_dim", [](const QuantizedKvPool& p) { return p.config().head_dim; })
      .def_prop_ro("partition", [](const QuantizedKvPool& p) { return p.config().partition; })
      .def_prop_ro("seed", [](const QuantizedKvPool& p) { return p.config().seed; })
      .def_prop_ro("kv_cache_dtype", [](const QuantizedKvPool& p) { return std::string(kv_quant_name(p.config().quant)); })
      .def_prop_ro("num_free_blocks", &QuantizedKvPool::num_free_blocks);

  auto plan_args = [](auto& cls) {
    using T = typename std::remove_reference_t<decltype(cls)>::Type;
    cls.def(nb::init<const std::string&>(), nb::arg("device"))
        .def("plan", &T::plan, nb::arg("block_tables"), nb::arg("lengths"), nb::arg("num_q_heads"),
             nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("block_size"), nb::arg("softmax_scale"),
             nb::arg("kv_dtype"), nb::arg("stream"))
        .def("run", &T::run, nb::arg("q"), nb::arg("kv_cache"), nb::arg("out"), nb::arg("lse"), nb::arg("stream"))
        .def("time_kernel", &T::time_kernel, nb::arg("q"), nb::arg("kv_cache"), nb::arg("out"), nb::arg("lse"), nb::arg("iterations"), nb::arg("stream"))
        .def_prop_ro("out_shape", &T::out_shape)
        .def_prop_ro("out_dtype", &T::out_dtype)
        .def_prop_ro("num_merges", &T::num_merges);
  };
  nb::class_<DecodeAttention> decode(ops, "DecodeAttention");
  plan_args(decode);
  decode.def_prop_ro("num_work_items", &DecodeAttention::num_work_items);
  decode.def("run_quantized", &DecodeAttention::run_quantized, nb::arg("q"), nb::arg("kv_cache"), nb::arg("out"),
             nb::arg("lse"), nb::arg("stream"));
  nb::class_<PrefixAttention> prefix(ops, "PrefixAttention");
  plan_args(prefix);
  prefix.def_prop_ro("num_units", &PrefixAttention::num_units);
  prefix.def_prop_ro("kv_tokens", &PrefixAttention::kv_tokens);  // KV tokens the plan reads per kv head

  ops.def("merge_states", &merge_states, nb::arg("v"), nb::arg("s"), nb::arg("v_out"), nb::arg("s_out"), nb::arg("stream"));
}

}  // namespace pagoda::python
