#include "pagoda/backend/cpu/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "pagoda/attention/cpu_executor.h"
#include "pagoda/attention/prefill_cpu.h"
#include "pagoda/backend/cpu/elementwise.h"
#include "pagoda/backend/cpu/matmul.h"
#include "pagoda/core/error.h"

namespace pagoda {
namespace {

class HostBuffer final : public Backend::Buffer {
 public:
  explicit HostBuffer(size_t bytes) {
    // 64-byte alignment: whole cache lines for the vector loads.
    data_ = bytes ? std::aligned_alloc(64, (bytes + 63) / 64 * 64) : nullptr;
    if (bytes && !data_) fail(ErrorKind::kOutOfMemory, "cannot allocate {} bytes of host memory", bytes);
    size_ = bytes;
  }
  ~HostBuffer() override { std::free(data_); }
};

// Copies rows [begin, begin + n) of a [rows, heads, head_dim] view (strided rows) into dst,
// contiguous [n, heads, head_dim].
void gather_rows(const Tensor& src, int64_t begin, int64_t n, float* dst) {
  const int64_t width = src.size(1) * src.size(2);
  for (int64_t r = 0; r < n; ++r)
    std::memcpy(dst + r * width, src.ptr<float>() + (begin + r) * src.strides[0], size_t(width) * sizeof(float));
}

}  // namespace

std::shared_ptr<Backend::Buffer> CpuBackend::allocate(size_t bytes) { return std::make_shared<HostBuffer>(bytes); }
void CpuBackend::upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::embed(const Tensor& table, std::span<const int32_t> ids, Tensor out) { cpu::embed(table, ids, out); }
void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) { cpu::rms_norm(x, weight, eps, out); }
void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) { cpu::matmul(x, w, bias, out); }
void CpuBackend::rope(Tensor x, std::span<const int32_t> positions, std::span<const float> inv_freq) { cpu::rope(x, positions, inv_freq); }
void CpuBackend::silu_mul(const Tensor& gate_up, Tensor out) { cpu::silu_mul(gate_up, out); }
void CpuBackend::add(Tensor x, const Tensor& y) { cpu::add(x, y); }

size_t CpuBackend::allocate_kv_cache(const kv::KvCacheConfig& config) {
  cache_.reset();  // free the old cache before allocating the new one
  cache_ = std::make_unique<kv::KvCache>(config);
  return cache_->nbytes();
}

void CpuBackend::copy_kv_block(int32_t src, int32_t dst) { cache_->copy_block(src, dst); }

void CpuBackend::attention(int layer, const AttentionStep& step, const Tensor& q, const Tensor& k,
                           const Tensor& v, Tensor out) {
  if (!cache_) fail(ErrorKind::kInternal, "attention before allocate_kv_cache");
  const attention::AttentionShape& shape = step.shape;
  const int64_t q_width = int64_t(shape.num_q_heads) * shape.head_dim;
  const int64_t kv_width = int64_t(shape.num_kv_heads) * shape.head_dim;

  // Every sequence's new K/V first: a chunk attends to its own new tokens.
  for (const SequenceStep& s : step.sequences) {
    k_scratch_.resize(size_t(s.num_new * kv_width));
    v_scratch_.resize(size_t(s.num_new * kv_width));
    gather_rows(k, s.row_begin, s.num_new, k_scratch_.data());
    gather_rows(v, s.row_begin, s.num_new, v_scratch_.data());
    cache_->write(layer, s.block_ids, s.start_pos,
                  Tensor::contiguous(k_scratch_.data(), DType::kF32, {s.num_new, shape.num_kv_heads, shape.head_dim}),
                  Tensor::contiguous(v_scratch_.data(), DType::kF32, {s.num_new, shape.num_kv_heads, shape.head_dim}));
  }
  const PagedKv pool = cache_->layer(layer);

  for (int32_t index : step.prefill_seqs) {
    const SequenceStep& s = step.sequences[size_t(index)];
    q_scratch_.resize(size_t(s.num_new * q_width));
    gather_rows(q, s.row_begin, s.num_new, q_scratch_.data());
    attention::prefill_attention_cpu(shape, pool, s.block_ids, s.start_pos, s.num_new, q_scratch_.data(),
                                     out.ptr<float>() + s.row_begin * out.strides[0]);
  }

  const auto num_decode = int64_t(step.decode_rows.size());
  if (num_decode == 0) return;
  q_scratch_.resize(size_t(num_decode * q_width));
  out_scratch_.resize(size_t(num_decode * q_width));
  for (int64_t i = 0; i < num_decode; ++i) gather_rows(q, step.decode_rows[size_t(i)], 1, q_scratch_.data() + i * q_width);
  attention::run_decode_cpu(step.decode_plan, step.decode_batch, shape, pool, q_scratch_.data(), out_scratch_.data());
  for (int64_t i = 0; i < num_decode; ++i)
    std::memcpy(out.ptr<float>() + step.decode_rows[size_t(i)] * out.strides[0], out_scratch_.data() + i * q_width,
                size_t(q_width) * sizeof(float));
}

attention::DeviceInfo CpuBackend::device_info() const { return {.num_workers = omp_get_max_threads()}; }

}  // namespace pagoda
