#include "pagoda/bench/profiling_backend.h"

#include <utility>

#include "pagoda/core/error.h"

#if PAGODA_HAVE_CUDA
#include <cuda_runtime.h>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#endif

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;

class HostClock : public OpClock {
 public:
  explicit HostClock(size_t capacity) : marks_(capacity) {}
  void mark(size_t i) override { marks_.at(i) = Clock::now(); }
  std::vector<double> read(size_t n) override {
    std::vector<double> us(n);
    for (size_t i = 0; i < n; ++i) us[i] = std::chrono::duration<double, std::micro>(marks_.at(i) - marks_[0]).count();
    return us;
  }

 private:
  std::vector<Clock::time_point> marks_;
};

#if PAGODA_HAVE_CUDA
// Events recorded on the backend's stream: each is stamped when the GPU reaches it, so the time
// between two brackets an op's kernels and the time between ops is the GPU idling.
class StreamClock : public OpClock {
 public:
  StreamClock(cudaStream_t stream, size_t capacity) : stream_(stream) {
    events_.reserve(capacity);
    for (size_t i = 0; i < capacity; ++i) {
      cudaEvent_t e = nullptr;
      cuda::check_cuda(cudaEventCreate(&e), "cudaEventCreate");
      events_.push_back(e);
    }
  }
  ~StreamClock() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void mark(size_t i) override { cuda::check_cuda(cudaEventRecord(events_.at(i), stream_), "cudaEventRecord"); }
  std::vector<double> read(size_t n) override {
    std::vector<double> us(n);
    if (n == 0) return us;
    cuda::check_cuda(cudaEventSynchronize(events_.at(n - 1)), "cudaEventSynchronize");
    for (size_t i = 0; i < n; ++i) {
      float ms = 0;
      cuda::check_cuda(cudaEventElapsedTime(&ms, events_[0], events_[i]), "cudaEventElapsedTime");
      us[i] = double(ms) * 1e3;
    }
    return us;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
};
#endif

double tensor_bytes(const Tensor& t) {
  if (t.ndim == 0) return 0;
  const int64_t cols = t.shape[t.ndim - 1];
  return double(t.numel() / cols) * double(dtype_bytes(t.dtype, cols));
}

int64_t rows_of(const Tensor& t) { return t.ndim == 0 ? 0 : t.numel() / t.shape[t.ndim - 1]; }

}  // namespace

std::unique_ptr<OpClock> make_host_clock(size_t capacity) { return std::make_unique<HostClock>(capacity); }

std::unique_ptr<OpClock> make_backend_clock(Backend& backend, size_t capacity) {
#if PAGODA_HAVE_CUDA
  if (auto* cuda_backend = dynamic_cast<CudaBackend*>(&backend))
    return std::make_unique<StreamClock>(cuda_backend->stream(), capacity);
#endif
  (void)backend;
  return make_host_clock(capacity);
}

ProfilingBackend::ProfilingBackend(Backend& inner, const ModelConfig& config, std::unique_ptr<OpClock> clock,
                                   size_t max_ops)
    : inner_(inner), config_(config), clock_(std::move(clock)), max_ops_(max_ops) {}

void ProfilingBackend::set_profiling(bool on) {
  profiling_ = on;
  ops_.clear();
}

template <typename Op>
void ProfilingBackend::timed(const char* name, double bytes, double flops, Op&& op) {
  if (!profiling_) {
    op();
    return;
  }
  const size_t i = ops_.size();
  if (i >= max_ops_) fail(ErrorKind::kInternal, "more than {} ops in one profiled step", max_ops_);
  const auto start = Clock::now();
  clock_->mark(2 * i);
  op();
  clock_->mark(2 * i + 1);
  ops_.push_back({name, std::chrono::duration<double, std::micro>(Clock::now() - start).count(), bytes, flops});
}

// The model's GEMMs by their weight's [out, in] shape.
std::string ProfilingBackend::gemm_name(const Tensor& w) const {
  const int64_t m = w.shape[0], k = w.shape[1];
  const ModelConfig& c = config_;
  if (m == c.q_dim() + 2 * c.kv_dim() && k == c.hidden_size) return "gemm qkv";
  if (m == c.hidden_size && k == c.q_dim()) return "gemm o_proj";
  if (m == 2 * int64_t(c.intermediate_size) && k == c.hidden_size) return "gemm gate_up";
  if (m == c.hidden_size && k == c.intermediate_size) return "gemm down";
  if (m == c.vocab_size && k == c.hidden_size) return "gemm lm_head";
  return "gemm other";
}

void ProfilingBackend::begin_step(const StepBatch& step) {
  // The step's metadata upload; its bytes are the host arrays it sends.
  const double bytes = double(step.tokens.size() * 3 + step.decode_batch.block_ids.size()) * 4;
  timed("step upload", bytes, 0, [&] { inner_.begin_step(step); });
}

void ProfilingBackend::embed(const Tensor& table, const StepBatch& step, Tensor out) {
  const double bytes = double(rows_of(out)) * double(dtype_bytes(table.dtype, table.shape[1])) + tensor_bytes(out);
  timed("embedding", bytes, 0, [&] { inner_.embed(table, step, out); });
}

void ProfilingBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) {
  const double bytes = tensor_bytes(x) + tensor_bytes(out) + tensor_bytes(weight);
  timed("rms_norm", bytes, 4 * double(x.numel()), [&] { inner_.rms_norm(x, weight, eps, out); });
}

void ProfilingBackend::rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                                           Tensor out) {
  const double bytes = 2 * tensor_bytes(out) + tensor_bytes(weight);
  timed("final rms_norm", bytes, 4 * double(out.numel()), [&] { inner_.rms_norm_logit_rows(x, step, weight, eps, out); });
}

void ProfilingBackend::add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) {
  // x read and written, y read, out written.
  const double bytes = 3 * tensor_bytes(x) + tensor_bytes(out) + tensor_bytes(weight);
  timed("add + rms_norm", bytes, 5 * double(x.numel()), [&] { inner_.add_rms_norm(x, y, weight, eps, out); });
}

void ProfilingBackend::matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) {
  const double bytes = tensor_bytes(w) + tensor_bytes(x) + tensor_bytes(out) + (bias ? tensor_bytes(*bias) : 0);
  const double flops = 2 * double(rows_of(x)) * double(w.shape[0]) * double(w.shape[1]);
  const std::string name = gemm_name(w);
  timed(name.c_str(), bytes, flops, [&] { inner_.matmul(x, w, bias, out); });
}

void ProfilingBackend::silu_mul(const Tensor& gate_up, Tensor out) {
  timed("silu * up", tensor_bytes(gate_up) + tensor_bytes(out), 4 * double(out.numel()),
        [&] { inner_.silu_mul(gate_up, out); });
}

void ProfilingBackend::add(Tensor x, const Tensor& y) {
  timed("add", 3 * tensor_bytes(x), double(x.numel()), [&] { inner_.add(x, y); });
}

void ProfilingBackend::rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) {
  // qkv read; rotated q written; k and v written to the cache.
  const double kv_bytes = double(rows_of(qkv)) * 2 * config_.kv_dim() * double(dtype_size(q.dtype));
  timed("rope + kv append", tensor_bytes(qkv) + tensor_bytes(q) + kv_bytes, 3 * double(q.numel()),
        [&] { inner_.rope_append_kv(layer, step, qkv, q); });
}

void ProfilingBackend::attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) {
  // Every sequence's K and V up to its last position, once; its queries and outputs.
  double kv_bytes = 0, flops = 0;
  const double token_bytes = 2.0 * config_.kv_dim() * double(dtype_size(q.dtype));
  for (const SequenceStep& s : step.sequences) {
    const double context = double(s.start_pos + s.num_new);
    kv_bytes += context * token_bytes;
    flops += 4 * double(s.num_new) * context * config_.q_dim();
  }
  timed("attention", kv_bytes + tensor_bytes(q) + tensor_bytes(out), flops,
        [&] { inner_.attention(layer, step, q, out); });
}

void ProfilingBackend::host_op(const char* name, double bytes, const std::function<void()>& work) {
  timed(name, bytes, 0, work);
}

void ProfilingBackend::run_graph(const std::function<void()>& body) {
  if (profiling_) {
    body();
  } else {
    inner_.run_graph(body);
  }
}

void ProfilingBackend::sample(const Tensor& logits, int32_t vocab, std::span<const SamplingRow> rows,
                              std::span<int32_t> tokens) {
  timed("sampling", double(rows.size()) * vocab * 4 + double(rows.size()) * 4, 0,
        [&] { inner_.sample(logits, vocab, rows, tokens); });
}

}  // namespace pagoda::bench
