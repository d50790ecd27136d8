#include "pagoda/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/layer_ops.h"
#include "pagoda/core/error.h"

namespace pagoda {
namespace {

// Counts itself in `allocations` when it is made and when it is freed.
class DeviceBuffer final : public Backend::Buffer {
 public:
  DeviceBuffer(size_t bytes, std::shared_ptr<std::atomic<uint64_t>> allocations) : allocations_(std::move(allocations)) {
    size_ = bytes;
    ++*allocations_;
    if (bytes == 0) return;
    if (cudaMalloc(&data_, bytes) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free allocation error
      size_t free = 0, total = 0;
      cudaMemGetInfo(&free, &total);
      fail(ErrorKind::kOutOfMemory, "GPU out of memory: {} MiB needed, {} MiB free of {} MiB", bytes >> 20,
           free >> 20, total >> 20);
    }
  }
  ~DeviceBuffer() override {
    cudaFree(data_);
    ++*allocations_;
  }

 private:
  std::shared_ptr<std::atomic<uint64_t>> allocations_;
};

DType checked(DType dtype) {
  if (!cuda::device_available()) fail(ErrorKind::kUnsupported, "the CUDA backend needs a GPU and none is usable");
  if (dtype != DType::kF16 && dtype != DType::kBF16)
    fail(ErrorKind::kInvalidArgument, "the CUDA backend runs f16 or bf16, not {}", dtype_name(dtype));
  return dtype;
}

// Decode batches are padded up to the next of these sizes (vLLM captures a similar ladder): few
// graphs, and at most 1/8 of a large batch's rows wasted on padding.
constexpr std::array<int32_t, 19> kGraphSizes = {1,  2,  4,  8,  16,  24,  32,  40,  48, 56,
                                                 64, 80, 96, 112, 128, 160, 192, 224, 256};

}  // namespace

CudaBackend::CudaBackend(DType dtype, const CudaBackendOptions& options) : dtype_(checked(dtype)), options_(options) {
  cuda::check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
}

CudaBackend::~CudaBackend() {
  graphs_.clear();
  if (kv_staging_) cudaFreeHost(kv_staging_);
  if (stream_) cudaStreamDestroy(stream_);
}

std::shared_ptr<Backend::Buffer> CudaBackend::allocate(size_t bytes) {
  return std::make_shared<DeviceBuffer>(bytes, allocations_);
}

void CudaBackend::upload(void* device_dst, const void* host_src, size_t bytes) {
  cuda::check_cuda(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream_), "upload");
  cuda::check_cuda(cudaStreamSynchronize(stream_), "upload");
}

void CudaBackend::download(void* host_dst, const void* device_src, size_t bytes) {
  cuda::check_cuda(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream_), "download");
  cuda::check_cuda(cudaStreamSynchronize(stream_), "download");
}

void CudaBackend::check_dtype(const Tensor& t, const char* what) const {
  if (t.device != Device::kCuda || t.dtype != dtype_)
    fail(ErrorKind::kInternal, "cuda backend: {} is {} on the {}, expected {} on the GPU", what, dtype_name(t.dtype),
         t.device == Device::kCuda ? "GPU" : "CPU", dtype_name(dtype_));
}

void CudaBackend::begin_step(const StepBatch& step) {
  graph_rows_ = step.graph_rows;
  tokens_.upload_grown(step.tokens, stream_);
  positions_.upload_grown(step.positions, stream_);
  slot_blocks_.upload_grown(step.slot_blocks, stream_);
  logit_rows_.upload_grown(step.logit_rows, stream_);
  if (!std::ranges::equal(rope_inv_freq_host_, step.rope_inv_freq)) {
    rope_inv_freq_host_.assign(step.rope_inv_freq.begin(), step.rope_inv_freq.end());
    rope_inv_freq_.upload_grown(step.rope_inv_freq, stream_);
  }

  num_decode_ = step.decode_batch.num_seqs();
  prefix_step_ = step.prefix_plan != nullptr;
  if (num_decode_ > 0 && prefix_step_) {
    if (!prefix_tiles_) prefix_tiles_ = cuda::prefix_tiles(step.shape, dtype_);
    if (kv_maps_.empty()) {
      for (const PagedKv& layer : kv_layers_) kv_maps_.push_back(cuda::kv_tensor_maps(layer));
    }
    // For a graph's step, launches that stay the same from step to step.
    prefix_.upload(*step.prefix_plan, step.decode_batch, step.shape, *prefix_tiles_, stream_, step.graph_rows);
  } else if (num_decode_ > 0) {
    decode_.upload(step.decode_plan, step.decode_batch, step.shape, stream_);
  }
  has_prefill_ = !step.prefill_seqs.empty();
  if (has_prefill_) {
    std::vector<cuda::PrefillChunk> chunks;
    std::vector<int32_t> block_ids;
    for (int32_t index : step.prefill_seqs) {
      const SequenceStep& s = step.sequences[size_t(index)];
      chunks.push_back({.row_begin = s.row_begin, .start_pos = s.start_pos, .num_new = s.num_new,
                        .block_begin = int32_t(block_ids.size())});
      block_ids.insert(block_ids.end(), s.block_ids.begin(), s.block_ids.end());
    }
    prefill_.upload(chunks, block_ids, step.shape, stream_);
  }
}

// A padded decode step has no prefill (prefill_ and the sampling arrays are not in its graph).
uint64_t CudaBackend::buffers_generation() const {
  return tokens_.generation() + positions_.generation() + slot_blocks_.generation() + logit_rows_.generation() +
         rope_inv_freq_.generation() + decode_.generation() + prefix_.generation() + allocations_->load();
}

void CudaBackend::embed(const Tensor& table, const StepBatch& step, Tensor out) {
  check_dtype(table, "the embedding table");
  check_dtype(out, "the embedding output");
  cuda::embed(table.data, tokens_.data(), step.num_rows(), table.size(1), dtype_, out.data, stream_);
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  check_dtype(weight, "an RMSNorm weight");
  cuda::rms_norm(x.data, nullptr, weight.data, eps, x.size(0), x.size(1), dtype_, out.data, stream_);
}

void CudaBackend::rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                                      Tensor out) {
  check_dtype(weight, "an RMSNorm weight");
  cuda::rms_norm(x.data, logit_rows_.data(), weight.data, eps, int64_t(step.logit_rows.size()), x.size(1), dtype_,
                 out.data, stream_);
}

void CudaBackend::add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) {
  check_dtype(weight, "an RMSNorm weight");
  cuda::add_rms_norm(x.data, y.data, weight.data, eps, x.size(0), x.size(1), dtype_, out.data, stream_);
}

void CudaBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) {
  check_dtype(x, "a matmul input");
  check_dtype(w, "a matmul weight");
  if (bias) check_dtype(*bias, "a bias");
  if (!x.is_contiguous() || !out.is_contiguous() || x.size(1) != w.size(1) || out.size(1) != w.size(0) ||
      out.size(0) != x.size(0))
    fail(ErrorKind::kInternal, "cuda matmul: {} @ {}^T -> {}", x.shape_string(), w.shape_string(), out.shape_string());
  if (x.size(0) == 0) return;
  gemm_.run(x.data, w.data, bias ? bias->data : nullptr, out.data, x.size(0), w.size(0), w.size(1), dtype_, out.dtype,
            stream_, /*tune=*/graph_rows_ > 0);
}

void CudaBackend::silu_mul(const Tensor& gate_up, Tensor out) {
  cuda::silu_mul(gate_up.data, gate_up.size(0), out.size(1), dtype_, out.data, stream_);
}

void CudaBackend::add(Tensor x, const Tensor& y) { cuda::add(x.data, y.data, x.size(0), x.size(1), dtype_, stream_); }

size_t CudaBackend::allocate_kv_cache(const kv::KvCacheConfig& config) {
  if (config.quant != KvQuant::kNone)
    fail(ErrorKind::kUnsupported, "cuda backend: no {} KV kernels yet (the CPU backend runs them)",
         kv_quant_name(config.quant));
  if (config.dtype != dtype_ || config.layout != KvLayout::kHnd)
    fail(ErrorKind::kInternal, "cuda backend: the KV cache is HND of the activation dtype");
  // The same cache for a new engine: keep it, and the graphs that point into it. A new one is
  // allocated through allocate(), which moves the graphs' generation.
  if (kv_storage_ && config.num_layers == kv_config_.num_layers && config.num_blocks == kv_config_.num_blocks &&
      config.block_size == kv_config_.block_size && config.num_kv_heads == kv_config_.num_kv_heads &&
      config.head_dim == kv_config_.head_dim)
    return kv_storage_->size();
  kv_storage_.reset();
  kv_layers_.clear();
  kv_maps_.clear();
  const size_t pool_elements =
      size_t(config.num_blocks) * size_t(config.block_size) * size_t(config.num_kv_heads) * size_t(config.head_dim);
  const size_t pool_bytes = pool_elements * dtype_size(dtype_);
  kv_storage_ = allocate(2 * pool_bytes * size_t(config.num_layers));
  auto* base = static_cast<char*>(kv_storage_->data());
  for (int32_t l = 0; l < config.num_layers; ++l) {
    char* k = base + 2 * size_t(l) * pool_bytes;
    kv_layers_.push_back(make_paged_kv(k, k + pool_bytes, dtype_, KvLayout::kHnd, config.num_blocks, config.block_size,
                                       config.num_kv_heads, config.head_dim, Device::kCuda));
  }
  kv_config_ = config;
  // The planner's worker count depends on head_dim only (resident CTAs of the decode kernel);
  // a group of 1 stands in for the model's, which the kernels check at each call.
  const attention::AttentionShape shape{.num_q_heads = config.num_kv_heads, .num_kv_heads = config.num_kv_heads,
                                        .head_dim = config.head_dim, .block_size = config.block_size};
  device_info_ = cuda::decode_device_info(shape, dtype_);
  return kv_storage_->size();
}

void CudaBackend::copy_kv_block(int32_t src, int32_t dst) {
  for (const PagedKv& layer : kv_layers_) {
    const size_t page_bytes = size_t(layer.page_stride) * dtype_size(dtype_);
    for (void* pool : {layer.k, layer.v}) {
      char* base = static_cast<char*>(pool);
      cuda::check_cuda(cudaMemcpyAsync(base + size_t(dst) * page_bytes, base + size_t(src) * page_bytes, page_bytes,
                                       cudaMemcpyDeviceToDevice, stream_),
                       "copy_kv_block");
    }
  }
}

size_t CudaBackend::kv_page_bytes() const {
  return size_t(kv_config_.block_size) * size_t(kv_config_.num_kv_heads) * size_t(kv_config_.head_dim) *
         dtype_size(dtype_);
}

// Pages go through a pinned staging buffer: copies from pageable memory would be staged by the
// driver anyway, a page at a time and synchronously.
std::byte* CudaBackend::kv_staging(size_t bytes) {
  if (bytes > kv_staging_bytes_) {
    if (kv_staging_) cudaFreeHost(kv_staging_);
    kv_staging_ = nullptr;
    kv_staging_bytes_ = 0;
    cuda::check_cuda(cudaMallocHost(&kv_staging_, bytes), "pinned KV staging");
    kv_staging_bytes_ = bytes;
  }
  return static_cast<std::byte*>(kv_staging_);
}

void CudaBackend::copy_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* staging, bool to_device) {
  const PagedKv& kv = kv_layers_.at(size_t(layer));
  const size_t page = kv_page_bytes();
  for (void* pool : {kv.k, kv.v})
    for (int32_t id : blocks) {
      if (id < 0 || id >= kv.num_blocks)
        fail(ErrorKind::kInvalidArgument, "KV page of block {} outside the pool's {} blocks", id, kv.num_blocks);
      std::byte* device = static_cast<std::byte*>(pool) + size_t(id) * page;
      cuda::check_cuda(to_device ? cudaMemcpyAsync(device, staging, page, cudaMemcpyHostToDevice, stream_)
                                 : cudaMemcpyAsync(staging, device, page, cudaMemcpyDeviceToHost, stream_),
                       "KV page copy");
      staging += page;
    }
  cuda::check_cuda(cudaStreamSynchronize(stream_), "KV page copy");
}

void CudaBackend::read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) {
  const size_t bytes = 2 * blocks.size() * kv_page_bytes();
  std::byte* staging = kv_staging(bytes);
  copy_kv_pages(layer, blocks, staging, false);
  std::memcpy(dst, staging, bytes);
}

void CudaBackend::write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) {
  const size_t bytes = 2 * blocks.size() * kv_page_bytes();
  std::byte* staging = kv_staging(bytes);
  std::memcpy(staging, src, bytes);
  copy_kv_pages(layer, blocks, staging, true);
}

void CudaBackend::rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) {
  check_dtype(qkv, "qkv");
  const attention::AttentionShape& shape = step.shape;
  cuda::rope_append_kv(qkv.data, step.num_rows(), positions_.data(), slot_blocks_.data(), rope_inv_freq_.data(),
                       shape.num_q_heads, shape.num_kv_heads, shape.head_dim, kv_layers_.at(size_t(layer)), dtype_,
                       q.data, stream_);
}

void CudaBackend::attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) {
  const PagedKv& kv = kv_layers_.at(size_t(layer));
  if (num_decode_ > 0 && prefix_step_) {
    cuda::prefix_attention(prefix_, step.shape, kv, kv_maps_.at(size_t(layer)), q.data, out.data, nullptr, stream_);
  } else if (num_decode_ > 0) {
    cuda::decode_attention(decode_, step.shape, kv, q.data, out.data, nullptr, options_.decode, stream_);
  }
  if (has_prefill_) cuda::prefill_attention(prefill_, step.shape, kv, q.data, out.data, stream_);
}

std::optional<Backend::PrefixPlanning> CudaBackend::prefix_planning(const attention::AttentionShape& shape) const {
  if (cuda::prefix_shape_unsupported_reason(shape, dtype_)) return std::nullopt;
  try {
    const cuda::PrefixTiles tiles = cuda::prefix_tiles(shape, dtype_);
    return PrefixPlanning{.options = cuda::prefix_plan_options(tiles), .device = cuda::prefix_device_info(tiles)};
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kUnsupported) throw;
    return std::nullopt;  // no feasible tile on this device: paged attention only
  }
}

int32_t CudaBackend::graph_rows(int32_t rows) const {
  if (!options_.graphs) return 0;
  const auto* size = std::lower_bound(kGraphSizes.begin(), kGraphSizes.end(), rows);
  return size == kGraphSizes.end() ? 0 : *size;
}

void CudaBackend::run_graph(const std::function<void()>& body) {
  if (!options_.graphs) {  // graph_rows() is 0: as the default, just run it
    body();
    return;
  }
  const cuda::GraphKey key{.rows = graph_rows_,
                           .attention = prefix_step_ ? cuda::GraphAttention::kPrefix : cuda::GraphAttention::kPaged,
                           .launch_shape = prefix_step_ ? prefix_.graph_shape() : 0,
                           .generation = buffers_generation()};
  if (const cudaGraphExec_t* exec = graphs_.find(key)) {
    cuda::check_cuda(cudaGraphLaunch(*exec, stream_), "cudaGraphLaunch");
    ++graph_replays_;
    return;
  }
  // First time: run the step eagerly (which also does every first-use setup, such as choosing
  // GEMM algorithms and opting kernels into large shared memory, outside any capture), then
  // capture the same ops for the steps after.
  body();
  cuda::check_cuda(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  cudaGraph_t graph = nullptr;
  try {
    body();
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  cuda::check_cuda(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  cuda::check_cuda(status, "cudaGraphInstantiate");
  graphs_.insert(key, exec);
  ++graph_captures_;
}

void CudaBackend::sample(const Tensor& logits, int32_t vocab, std::span<const SamplingRow> rows,
                         std::span<int32_t> tokens) {
  if (logits.dtype != DType::kF32 || rows.size() != tokens.size() || int64_t(rows.size()) > logits.size(0))
    fail(ErrorKind::kInternal, "cuda sample: {} rows of logits {}", rows.size(), logits.shape_string());
  std::vector<cuda::SampleRow> host(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    const SamplingRow& r = rows[i];
    host[i] = {.temperature = r.temperature, .top_k = r.top_k, .top_p = r.top_p, .min_p = r.min_p, .seed = r.seed,
               .offset = r.offset};
  }
  sample_rows_.upload_grown(host, stream_);
  sampled_.resize(rows.size());
  cuda::sample_tokens(static_cast<const float*>(logits.data), logits.size(1), vocab, sample_rows_.data(),
                      int32_t(rows.size()), sampled_.data(), stream_);
  download(tokens.data(), sampled_.data(), tokens.size_bytes());
}

}  // namespace pagoda
