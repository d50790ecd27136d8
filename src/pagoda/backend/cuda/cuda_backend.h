// The CUDA backend: f16 or bf16 activations and KV cache on one GPU, weights of that type or in
// GGUF quantized blocks (quant_matmul.h); cuBLASLt GEMMs,
// fused elementwise kernels (residual add + RMSNorm, RoPE + KV append, SwiGLU), the paged decode
// and prefill attention kernels, and sampling and beam candidates (top log-probs) on the GPU.
//
// Every op is issued on one stream and reads the step's metadata from device arrays that
// begin_step() filled, so a decode step can be captured once into a CUDA graph and replayed:
// graph_rows() pads decode batches to a few sizes, and run_graph() keeps one graph per GraphKey
// (graph_table.h): the padded rows, the attention kind and its launch shape, and the generation
// of every buffer the step reads. That generation changes when a metadata array or attention
// workspace grows (its device pointer moves, or a count baked into the launches changes) and
// when any buffer is allocated or freed through allocate() (the caller's weights and
// activations, the KV cache); every captured graph is then dropped and captured again on next
// use.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <memory>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/prefix_attention.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/graph_table.h"
#include "pagoda/backend/cuda/prefill_attention.h"
#include "pagoda/backend/cuda/quantized_kv_cache.h"
#include "pagoda/backend/cuda/quant_matmul.h"
#include "pagoda/backend/cuda/sampling.h"

namespace pagoda {

struct CudaBackendOptions {
  bool graphs = true;  // capture decode steps into CUDA graphs (off: every op is launched each step)
  // The GPU to run on, made the constructing thread's current device (every call must come from a
  // thread whose current device it is: a tensor-parallel rank's own thread); -1: the current one.
  int gpu = -1;
  cuda::DecodeOptions decode;
};

class CudaBackend final : public Backend {
 public:
  // dtype: f16 or bf16. Throws Error(kUnsupported) when no GPU is usable.
  explicit CudaBackend(DType dtype, const CudaBackendOptions& options = {});
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Device device() const override { return Device::kCuda; }
  DType activation_dtype() const override { return dtype_; }
  void bind_to_this_thread() override;  // makes gpu() the thread's current device
  bool takes_quantized_weights(DType t) const override { return cuda::quantized_matmul_type(t); }

  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void upload(void* device_dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* device_src, size_t bytes) override;

  void begin_step(const StepBatch& step) override;
  void embed(const Tensor& table, const StepBatch& step, Tensor out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                           Tensor out) override;
  void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override;
  void silu_mul(const Tensor& gate_up, Tensor out) override;
  void add(Tensor x, const Tensor& y) override;

  size_t allocate_kv_cache(const kv::KvCacheConfig& config) override;
  void copy_kv_block(int32_t src, int32_t dst) override;
  size_t kv_page_bytes() const override;
  void read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) override;
  void write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) override;
  void rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) override;
  void attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) override;
  attention::DeviceInfo device_info() const override { return device_info_; }
  std::optional<PrefixPlanning> prefix_planning(const attention::AttentionShape& shape) const override;

  int32_t graph_rows(int32_t rows) const override;
  void run_graph(const std::function<void()>& body) override;
  GraphStats graph_stats() const override {
    return {.captures = graph_captures_, .replays = graph_replays_, .invalidations = graphs_.invalidations()};
  }

  bool can_sample() const override { return true; }
  void sample(const Tensor& logits, int32_t vocab, std::span<const SamplingRow> rows,
              std::span<int32_t> tokens) override;
  void top_logprobs(const Tensor& logits, int32_t vocab, std::span<const int32_t> rows, int32_t k,
                    std::span<int32_t> tokens, std::span<float> logprobs) override;

  cudaStream_t stream() const { return stream_; }
  // The fp8 or int2 cache's pools of `layer` (null without one): for tests that compare them with
  // the CPU's byte for byte.
  const cuda::QuantizedKvCache* quantized_kv_cache() const { return quantized_kv_.get(); }
  int gpu() const { return gpu_; }  // the device stream() and every buffer are on
  // Layer `layer`'s K and V pools in device memory (for the NCCL KV transport, disagg/nccl/).
  const PagedKv& kv_layer(int layer) const { return kv_layers_.at(size_t(layer)); }
  // Switches graph capture and replay on or off (tests compare the two on one backend, whose
  // GEMM algorithm choices then stay the same).
  void enable_graphs(bool on) { options_.graphs = on; }

 private:
  void check_dtype(const Tensor& t, const char* what) const;
  // matmul with w in a block-quantized type: the GEMV for few rows, else w dequantized into
  // dequantized_ and cuBLASLt.
  void quantized_matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out);
  // The generation of every buffer a padded decode step reads (GraphKey::generation): the sum of
  // counts that only grow, so it changes whenever one of them does.
  uint64_t buffers_generation() const;
  size_t allocate_quantized_kv_cache(const kv::KvCacheConfig& config);
  std::byte* kv_staging(size_t bytes);
  void copy_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* staging, bool to_device);

  DType dtype_;
  CudaBackendOptions options_;
  int gpu_ = 0;  // before gemm_: the GEMM workspace is allocated on it
  cudaStream_t stream_ = nullptr;
  cuda::Gemm gemm_;

  // Buffers allocated or freed through allocate(), shared with the buffers (which may outlive the
  // backend).
  std::shared_ptr<std::atomic<uint64_t>> allocations_ = std::make_shared<std::atomic<uint64_t>>(0);

  // The KV cache: per layer a K pool and a V pool in one allocation, HND.
  kv::KvCacheConfig kv_config_;
  std::shared_ptr<Buffer> kv_storage_;
  std::vector<PagedKv> kv_layers_;
  std::unique_ptr<cuda::QuantizedKvCache> quantized_kv_;  // an fp8 or int2 cache instead of kv_layers_
  std::vector<cuda::KvTensorMaps> kv_maps_;  // kv_layers_' tensor maps, made at the first prefix step
  size_t max_copy_pitch_ = 0;  // the device's largest pitch of a 2D copy (copy_kv_block)
  void* kv_staging_ = nullptr;  // pinned host memory for read_kv_pages / write_kv_pages
  size_t kv_staging_bytes_ = 0;
  attention::DeviceInfo device_info_;

  // The step's metadata on the device (begin_step).
  cuda::DeviceArray<int32_t> tokens_, positions_, slot_blocks_, logit_rows_;
  cuda::DeviceArray<float> rope_inv_freq_;
  std::vector<float> rope_inv_freq_host_;  // what rope_inv_freq_ holds
  int32_t graph_rows_ = 0;  // the step's StepBatch::graph_rows: > 0 for a padded decode step (GEMMs are tuned)
  cuda::DecodeWorkspace decode_;
  cuda::PrefixWorkspace prefix_;
  std::optional<cuda::PrefixTiles> prefix_tiles_;  // made at the first prefix step
  bool prefix_step_ = false;  // the step's decode rows attend by its prefix plan
  cuda::PrefillWorkspace prefill_;
  int32_t num_decode_ = 0;
  bool has_prefill_ = false;
  // A quantized weight dequantized for a matmul of more rows than quant_gemv takes (grows to the
  // largest such weight; a graph captures its address, so its generation counts).
  cuda::DeviceArray<uint16_t> dequantized_;
  cuda::DeviceArray<cuda::SampleRow> sample_rows_;
  cuda::DeviceArray<int32_t> sampled_;
  cuda::DeviceArray<int32_t> top_rows_, top_pairs_;  // top_logprobs' rows, and its tokens then log-probs

  cuda::GraphTable<cudaGraphExec_t> graphs_{[](cudaGraphExec_t exec) { cudaGraphExecDestroy(exec); }};
  int64_t graph_captures_ = 0;
  int64_t graph_replays_ = 0;
};

}  // namespace pagoda
