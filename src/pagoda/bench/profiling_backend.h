// ProfilingBackend: a Backend that forwards every call to another one and, while profiling,
// records each op of a step: its name (GEMMs by the weight they multiply), the host time its call
// took, two timestamps on the device's clock around it (CUDA events on the backend's stream, or
// the wall clock for the CPU backend, whose ops finish before they return), and the bytes it
// must move and the FLOPs it must do. A model built on it runs unchanged, so `pagoda bench
// profile` times exactly the ops a decode step issues.
//
// While profiling, run_graph runs its body eagerly (the step keeps its padded rows, so the
// kernels are those the graph replays); otherwise it forwards, graphs and all.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pagoda/backend/backend.h"
#include "pagoda/model/config.h"

namespace pagoda::bench {

// Timestamps in the order the device runs the ops.
class OpClock {
 public:
  virtual ~OpClock() = default;
  // Records timestamp i (i < capacity) after everything issued so far.
  virtual void mark(size_t i) = 0;
  // Microseconds of timestamps [0, n) since timestamp 0, once the device has passed them all.
  virtual std::vector<double> read(size_t n) = 0;
};

// The wall clock: for a backend whose ops are synchronous.
std::unique_ptr<OpClock> make_host_clock(size_t capacity);
// The clock `backend` runs on: CUDA events on its stream, or the wall clock.
std::unique_ptr<OpClock> make_backend_clock(Backend& backend, size_t capacity);

struct OpRecord {
  std::string name;  // "qkv", "o_proj", "gate_up", "down", "lm_head", "attention", "rms_norm", ...
  double host_us = 0;  // the call's wall time on the host (launch cost, or the op itself on the CPU)
  double bytes = 0;    // it must read and write at least these
  double flops = 0;
};

class ProfilingBackend : public Backend {
 public:
  // config names the GEMMs by their weight shapes. The clock holds 2 timestamps per op.
  ProfilingBackend(Backend& inner, const ModelConfig& config, std::unique_ptr<OpClock> clock, size_t max_ops);

  // Starts recording (clearing what was recorded) or stops.
  void set_profiling(bool on);
  const std::vector<OpRecord>& ops() const { return ops_; }
  // Device timestamps of the ops recorded: op i ran from [2i] to [2i + 1], in microseconds.
  std::vector<double> op_timestamps() { return clock_->read(2 * ops_.size()); }
  OpClock& clock() { return *clock_; }
  // Records work done on the host as an op of the step (the CPU backend's host sampling).
  void host_op(const char* name, double bytes, const std::function<void()>& work);

  std::string name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  std::shared_ptr<Buffer> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { inner_.upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { inner_.download(dst, src, bytes); }
  void begin_step(const StepBatch& step) override;
  void embed(const Tensor& table, const StepBatch& step, Tensor out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, Tensor out) override;
  void rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& weight, float eps,
                           Tensor out) override;
  void add_rms_norm(Tensor x, const Tensor& y, const Tensor& weight, float eps, Tensor out) override;
  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override;
  void silu_mul(const Tensor& gate_up, Tensor out) override;
  void add(Tensor x, const Tensor& y) override;
  size_t allocate_kv_cache(const kv::KvCacheConfig& config) override { return inner_.allocate_kv_cache(config); }
  void copy_kv_block(int32_t src, int32_t dst) override { inner_.copy_kv_block(src, dst); }
  size_t kv_page_bytes() const override { return inner_.kv_page_bytes(); }
  void read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) override {
    inner_.read_kv_pages(layer, blocks, dst);
  }
  void write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) override {
    inner_.write_kv_pages(layer, blocks, src);
  }
  void rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) override;
  void attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) override;
  attention::DeviceInfo device_info() const override { return inner_.device_info(); }
  std::optional<PrefixPlanning> prefix_planning(const attention::AttentionShape& shape) const override {
    return inner_.prefix_planning(shape);
  }
  int32_t graph_rows(int32_t rows) const override { return inner_.graph_rows(rows); }
  void run_graph(const std::function<void()>& body) override;
  GraphStats graph_stats() const override { return inner_.graph_stats(); }
  bool can_sample() const override { return inner_.can_sample(); }
  void sample(const Tensor& logits, int32_t vocab, std::span<const SamplingRow> rows,
              std::span<int32_t> tokens) override;

 private:
  template <typename Op>
  void timed(const char* name, double bytes, double flops, Op&& op);
  std::string gemm_name(const Tensor& w) const;

  Backend& inner_;
  ModelConfig config_;
  std::unique_ptr<OpClock> clock_;
  size_t max_ops_;
  bool profiling_ = false;
  std::vector<OpRecord> ops_;
};

}  // namespace pagoda::bench
