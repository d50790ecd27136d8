#include "pagoda/backend/cpu/cpu_backend.h"

#include <omp.h>

#include <cstdlib>
#include <cstring>
#include <new>

#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/backend/cpu/prefill_attention.h"
#include "pagoda/backend/cpu/elementwise.h"
#include "pagoda/backend/cpu/hadamard.h"
#include "pagoda/backend/cpu/matmul.h"
#include "pagoda/backend/cpu/quantized_attention.h"
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

// The [rows, heads, head_dim] view of columns [column, column + heads * head_dim) of qkv.
Tensor heads_view(const Tensor& qkv, int64_t column, int64_t heads, int64_t head_dim) {
  Tensor t = qkv;
  t.data = qkv.ptr<float>() + column;
  t.ndim = 3;
  t.shape = {qkv.size(0), heads, head_dim, 0};
  t.strides = {qkv.strides[0], head_dim, 1, 0};
  return t;
}

// Copies a [rows, heads, head_dim] view with strided rows into dst, contiguous.
void gather(const Tensor& src, float* dst) {
  const int64_t width = src.size(1) * src.size(2);
  for (int64_t r = 0; r < src.size(0); ++r)
    std::memcpy(dst + r * width, src.ptr<float>() + r * src.strides[0], size_t(width) * sizeof(float));
}

}  // namespace

CpuBackend::CpuBackend(int threads) : threads_(threads) {
  if (threads > 0) pool_ = std::make_unique<cpu::ThreadPool>(threads);
}

CpuBackend::~CpuBackend() = default;

void CpuBackend::bind_to_this_thread() {
  if (threads_ == 0) return;
  omp_set_num_threads(threads_);  // OpenMP's count is per thread: this one's regions only
  cpu::ThreadPool::bind_to_this_thread(pool_.get());
}

std::shared_ptr<Backend::Buffer> CpuBackend::allocate(size_t bytes) { return std::make_shared<HostBuffer>(bytes); }
void CpuBackend::upload(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }
void CpuBackend::download(void* dst, const void* src, size_t bytes) { std::memcpy(dst, src, bytes); }

void CpuBackend::embed(const Tensor& table, const StepBatch& step, Tensor out) { cpu::embed(table, step.tokens, out); }
void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) { cpu::rms_norm(x, weight, eps, out); }
void CpuBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) { cpu::matmul(x, w, bias, out); }
void CpuBackend::silu_mul(const Tensor& gate_up, Tensor out) { cpu::silu_mul(gate_up, out); }
void CpuBackend::add(Tensor x, const Tensor& y) { cpu::add(x, y); }

void CpuBackend::rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                                     Tensor out) {
  for (size_t j = 0; j < step.logit_rows.size(); ++j) {
    const int64_t row = step.logit_rows[j];
    cpu::rms_norm(x.rows(row, row + 1), weight, eps, out.rows(int64_t(j), int64_t(j) + 1));
  }
}

void CpuBackend::add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) {
  cpu::add(x, y);
  cpu::rms_norm(x, weight, eps, out);
}

size_t CpuBackend::allocate_kv_cache(const kv::KvCacheConfig& config) {
  cache_.reset();  // free the old cache before allocating the new one
  quantized_cache_.reset();
  if (config.quant != KvQuant::kNone) {
    quantized_cache_ = std::make_unique<cpu::QuantizedKvCache>(config);
    return quantized_cache_->nbytes();
  }
  cache_ = std::make_unique<cpu::KvCache>(config);
  return cache_->nbytes();
}

void CpuBackend::copy_kv_block(int32_t src, int32_t dst) {
  if (quantized_cache_) return quantized_cache_->copy_block(src, dst);
  cache_->copy_block(src, dst);
}

size_t CpuBackend::kv_page_bytes() const {
  if (quantized_cache_) return quantized_cache_->page_bytes();
  if (!cache_) fail(ErrorKind::kInternal, "kv_page_bytes before allocate_kv_cache");
  const PagedKv pool = cache_->layer(0);
  return size_t(pool.page_stride) * dtype_size(pool.dtype);
}

namespace {

// Where block `id`'s page starts in each pool of `pool`, checked against the pool's size.
size_t page_offset(const PagedKv& pool, int32_t id, size_t page_bytes) {
  if (id < 0 || id >= pool.num_blocks)
    fail(ErrorKind::kInvalidArgument, "KV page of block {} outside the pool's {} blocks", id, pool.num_blocks);
  return size_t(id) * page_bytes;
}

}  // namespace

void CpuBackend::read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) {
  if (quantized_cache_) return quantized_cache_->read_pages(layer, blocks, dst);
  const PagedKv pool = cache_->layer(layer);
  const size_t page = kv_page_bytes();
  for (const void* base : {pool.k, pool.v})
    for (int32_t id : blocks) {
      std::memcpy(dst, static_cast<const std::byte*>(base) + page_offset(pool, id, page), page);
      dst += page;
    }
}

void CpuBackend::write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) {
  if (quantized_cache_) return quantized_cache_->write_pages(layer, blocks, src);
  const PagedKv pool = cache_->layer(layer);
  const size_t page = kv_page_bytes();
  for (void* base : {pool.k, pool.v})
    for (int32_t id : blocks) {
      std::memcpy(static_cast<std::byte*>(base) + page_offset(pool, id, page), src, page);
      src += page;
    }
}

size_t CpuBackend::kv_tail_bytes(int32_t tokens) const {
  return quantized_cache_ ? quantized_cache_->tail_bytes(tokens) : 0;
}

void CpuBackend::read_kv_tail(int layer, int32_t block, int32_t tokens, std::byte* dst) {
  if (quantized_cache_) quantized_cache_->read_tail(layer, block, tokens, dst);
}

void CpuBackend::write_kv_tail(int layer, int32_t block, int32_t tokens, const std::byte* src) {
  if (quantized_cache_) quantized_cache_->write_tail(layer, block, tokens, src);
}

void CpuBackend::rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) {
  if (!cache_ && !quantized_cache_) fail(ErrorKind::kInternal, "rope_append_kv before allocate_kv_cache");
  const attention::AttentionShape& shape = step.shape;
  const int64_t rows = qkv.size(0), dim = shape.head_dim;
  const int64_t q_width = int64_t(shape.num_q_heads) * dim, kv_width = int64_t(shape.num_kv_heads) * dim;
  gather(heads_view(qkv, 0, shape.num_q_heads, dim), q.ptr<float>());
  cpu::rope(q, step.positions, step.rope_inv_freq);
  k_scratch_.resize(size_t(rows * kv_width));
  v_scratch_.resize(size_t(rows * kv_width));
  gather(heads_view(qkv, q_width, shape.num_kv_heads, dim), k_scratch_.data());
  gather(heads_view(qkv, q_width + kv_width, shape.num_kv_heads, dim), v_scratch_.data());
  cpu::rope(Tensor::contiguous(k_scratch_.data(), DType::kF32, {rows, shape.num_kv_heads, dim}), step.positions,
            step.rope_inv_freq);
  if (quantized_cache_ && quantized_cache_->config().hadamard) {
    cpu::hadamard_rotate(q.ptr<float>(), rows * shape.num_q_heads, int32_t(dim));
    cpu::hadamard_rotate(k_scratch_.data(), rows * shape.num_kv_heads, int32_t(dim));
  }
  for (const SequenceStep& s : step.sequences) {
    auto rows_of = [&](std::vector<float>& scratch) {
      return Tensor::contiguous(scratch.data() + s.row_begin * kv_width, DType::kF32,
                                {s.num_new, shape.num_kv_heads, dim});
    };
    if (quantized_cache_) {
      quantized_cache_->write(layer, s.block_ids, s.start_pos, rows_of(k_scratch_), rows_of(v_scratch_));
    } else {
      cache_->write(layer, s.block_ids, s.start_pos, rows_of(k_scratch_), rows_of(v_scratch_));
    }
  }
}

void CpuBackend::attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) {
  if (!cache_ && !quantized_cache_) fail(ErrorKind::kInternal, "attention before allocate_kv_cache");
  const attention::AttentionShape& shape = step.shape;
  const int64_t q_width = int64_t(shape.num_q_heads) * shape.head_dim;
  if (quantized_cache_) {  // the reference executors: one task per (sequence, kv head), whatever the plan
    const QuantizedPagedKv pool = quantized_cache_->layer(layer);
    for (int32_t index : step.prefill_seqs) {
      const SequenceStep& s = step.sequences[size_t(index)];
      cpu::prefill_attention_quantized(shape, pool, s.block_ids, s.start_pos, s.num_new,
                                       q.ptr<float>() + s.row_begin * q_width, out.ptr<float>() + s.row_begin * q_width);
    }
    if (step.decode_batch.num_seqs() > 0)
      cpu::decode_attention_quantized(step.decode_batch, shape, pool, q.ptr<float>(), out.ptr<float>());
    return;
  }
  const PagedKv pool = cache_->layer(layer);
  for (int32_t index : step.prefill_seqs) {
    const SequenceStep& s = step.sequences[size_t(index)];
    cpu::prefill_attention_cpu(shape, pool, s.block_ids, s.start_pos, s.num_new,
                                     q.ptr<float>() + s.row_begin * q_width,
                                     out.ptr<float>() + s.row_begin * q_width);
  }
  // Decode rows lead the step: q and out rows [0, num_seqs) are the plan's sequences.
  if (step.decode_batch.num_seqs() == 0) return;
  if (step.prefix_plan) {
    cpu::run_prefix_cpu(*step.prefix_plan, step.decode_batch, shape, pool, q.ptr<float>(), out.ptr<float>());
  } else {
    cpu::run_decode_cpu(step.decode_plan, step.decode_batch, shape, pool, q.ptr<float>(), out.ptr<float>());
  }
}

attention::DeviceInfo CpuBackend::device_info() const { return {.num_workers = omp_get_max_threads()}; }

// The CPU executor runs any plan; there an M tile only bounds the queries one item computes.
std::optional<Backend::PrefixPlanning> CpuBackend::prefix_planning(const attention::AttentionShape&) const {
  return PrefixPlanning{.options = {.kv_bytes_per_element = 4}, .device = device_info()};
}

}  // namespace pagoda
