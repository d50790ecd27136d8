// The CPU backend: f32 activations, f32/f16/bf16 weights, OpenBLAS for prefill GEMMs, OpenMP for
// the rest, and the CPU attention executors (decode_attention.h, prefill_attention.h) over a paged
// KV cache in host memory (kv_cache.h).
#pragma once

#include <memory>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/backend/cpu/kv_cache.h"
#include "pagoda/backend/cpu/quantized_kv_cache.h"
#include "pagoda/backend/cpu/thread_pool.h"

namespace pagoda {

class CpuBackend final : public Backend {
 public:
  // threads 0: the process's cores (OpenMP's and the shared ThreadPool's count); > 0: a pool of
  // its own that many threads wide, for the thread bind_to_this_thread() is called on (a
  // tensor-parallel rank of threads / N cores).
  explicit CpuBackend(int threads = 0);
  ~CpuBackend() override;
  std::string name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  DType activation_dtype() const override { return DType::kF32; }
  void bind_to_this_thread() override;
  bool takes_quantized_weights(DType t) const override { return is_block_quantized(t); }

  std::shared_ptr<Buffer> allocate(size_t bytes) override;
  void upload(void* device_dst, const void* host_src, size_t bytes) override;
  void download(void* host_dst, const void* device_src, size_t bytes) override;

  void begin_step(const StepBatch&) override {}
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
  size_t kv_tail_bytes(int32_t tokens) const override;
  void read_kv_tail(int layer, int32_t block, int32_t tokens, std::byte* dst) override;
  void write_kv_tail(int layer, int32_t block, int32_t tokens, const std::byte* src) override;
  void rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) override;
  void attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) override;
  attention::DeviceInfo device_info() const override;
  std::optional<PrefixPlanning> prefix_planning(const attention::AttentionShape& shape) const override;

 private:
  int threads_ = 0;
  std::unique_ptr<cpu::ThreadPool> pool_;
  std::unique_ptr<cpu::KvCache> cache_;
  std::unique_ptr<cpu::QuantizedKvCache> quantized_cache_;  // instead of cache_ for int2 and fp8 KV
  std::vector<float> k_scratch_, v_scratch_;  // [rows, kv_heads, head_dim]
};

}  // namespace pagoda
