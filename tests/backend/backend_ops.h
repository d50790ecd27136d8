// Every Backend operation (backend/backend.h) on one backend, against a double-precision
// reference, as llama.cpp's test-backend-ops does: a table of ops x shapes x dtypes, each run
// through the Backend interface only. tests/backend/backend_ops_test.cpp runs it on the CPU
// backend (`make test`), tests/gpu/backend_ops_test.cpp on the CUDA backend in f16 and bf16 (the
// GPU suite). Both binaries take --perf: the perf table instead, each op's achieved GB/s and
// TFLOP/s against its roofline bound (see run_perf).
//
// Inputs are random values stored in the backend's dtypes; the reference reads the same stored
// values in double, so a result differs from it only by what the backend computes and rounds.
// Outputs start as NaN bytes, so an element an op fails to write fails its comparison.
//
// Tolerance, one formula for every op (tolerance() below). An element computed in fp32 from
// stored inputs and rounded once to its output dtype is within
//     u_out |ref|                              the final rounding (unit roundoff u_out: 2^-24 f32,
//                                              2^-11 f16, 2^-8 bf16)
//   + (r u_act + (K + 16) u_f32) magnitude     r intermediate roundings to the activation dtype
//                                              (attention rounds P for the tensor-core P.V
//                                              product, the prefix kernel's warps hand over o in
//                                              it, split KV's partial states are in it: r = 3),
//                                              fp32 sums of K terms (Higham's worst case, K u_f32
//                                              of the sum of |terms|), and 8 ulp (16 u_f32) for the
//                                              few fp32 operations and math calls (each within
//                                              2 ulp: expf, rsqrtf, sincosf) of an element
//   + 2^-24                                    f16's subnormal spacing
// where magnitude is the sum of |terms| the element is made of (|ref| for a product, the
// dot product's sum of |x w| for a matmul; for attention sum_j p_j |v_j| times 1 + the largest
// sum_i |q_i k_ij| scale, through which the scores' fp32 error moves p). A wrong row, head,
// position, weight or block is off by O(|ref|), far outside it. Copies, adds and the stored
// residual are compared bit for bit (an fp32 sum rounded once is exactly defined).
//
// Every Backend method is exercised here: name, device, activation_dtype, allocate, upload and
// download by BufferRoundTrip; begin_step by every op that reads a StepBatch; embed by Embed;
// rms_norm, rms_norm_logit_rows and add_rms_norm by RmsNorm; matmul by Matmul; silu_mul and add
// by Elementwise; allocate_kv_cache, copy_kv_block, kv_page_bytes, read_kv_pages, write_kv_pages,
// rope_append_kv and attention (prefill, paged decode, prefix-aware decode, copy on write, a
// block moved through host pages) by AttentionSteps, whose graph kinds also run
// run_graph and read graph_stats; the same on an fp8 or int2 cache by QuantizedAttentionSteps
// (quantized_kv_steps.h); device_info, prefix_planning and graph_rows by Queries;
// can_sample and sample by Sample; top_logprobs by TopLogprobs.
//
// Adding an op (a new Backend method, or a new dtype or shape of one: quantized KV, collectives):
// write an OpTest (prepare / run / check / bytes / flops) next to its kind below, add its
// shapes to correctness_table() (small: the CPU runs them in CI) and perf_table() (model-sized),
// and, when the op has a tolerance of its own, express it in tolerance()'s terms (its K and r)
// rather than a new constant. unsupported() says why a backend skips a case (printed, never
// silent); a case every backend skips is dead and should go.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/backend/backend.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/format/dequantize.h"

namespace pagoda::backend_ops {

// ---- Numbers: the dtypes' rounding and the one tolerance -------------------------------------

inline double unit_roundoff(DType dtype) {
  switch (dtype) {
    case DType::kF16: return 0x1p-11;
    case DType::kBF16: return 0x1p-8;
    default: return 0x1p-24;
  }
}

constexpr double kF32Roundoff = 0x1p-24;
constexpr int64_t kElementRoundoffs = 16;  // fp32 operations and math calls of an element: 8 ulp
constexpr double kFloor = 0x1p-24;

// How far one element may be from the exact value (the file comment derives it).
struct Tolerance {
  int roundings = 0;      // r: intermediate roundings to the activation dtype
  int64_t reduction = 0;  // K: terms of the longest fp32 sum
};

inline double tolerance(DType out, DType act, Tolerance t, double ref, double magnitude) {
  return unit_roundoff(out) * std::abs(ref) +
         (t.roundings * unit_roundoff(act) + double(t.reduction + kElementRoundoffs) * kF32Roundoff) * magnitude + kFloor;
}

// x as stored in dtype (round to nearest even), read back.
inline float round_to(DType dtype, float x) {
  switch (dtype) {
    case DType::kF16: return f16_to_f32(f32_to_f16(x));
    case DType::kBF16: return bf16_to_f32(f32_to_bf16(x));
    default: return x;
  }
}

inline std::vector<uint8_t> encode(DType dtype, std::span<const float> values) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    const float f = values[i];
    if (dtype == DType::kF32) {
      std::memcpy(&bytes[4 * i], &f, 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? f32_to_f16(f) : f32_to_bf16(f);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

inline std::vector<double> decode(DType dtype, std::span<const uint8_t> bytes) {
  std::vector<double> values(bytes.size() / dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kF32) {
      float f;
      std::memcpy(&f, &bytes[4 * i], 4);
      values[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, &bytes[2 * i], 2);
      values[i] = dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return values;
}

// Deterministic random numbers (xorshift64), the same on every platform.
class Random {
 public:
  explicit Random(uint64_t seed) : state_(seed * 0x9e3779b97f4a7c15ull + 1) {}
  uint64_t bits() {
    state_ ^= state_ << 13;
    state_ ^= state_ >> 7;
    state_ ^= state_ << 17;
    return state_;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(bits() >> 40) * 0x1p-24f; }

 private:
  uint64_t state_;
};

// ---- Arrays on the backend --------------------------------------------------------------------

// A backend buffer and the values it holds (exactly representable in dtype, so in f32).
struct Array {
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  std::vector<float> values;
  std::shared_ptr<Backend::Buffer> buffer;

  Tensor view(std::initializer_list<int64_t> shape) const {
    return Tensor::contiguous(buffer->data(), dtype, shape, device);
  }
  size_t bytes() const { return dtype_bytes(dtype, int64_t(values.size())); }
};

// values rounded to dtype and uploaded.
inline Array upload(Backend& backend, DType dtype, std::vector<float> values) {
  Array a{.dtype = dtype, .device = backend.device(), .values = std::move(values)};
  for (float& v : a.values) v = round_to(dtype, v);
  a.buffer = backend.allocate(a.bytes());
  const std::vector<uint8_t> bytes = encode(dtype, a.values);
  if (!bytes.empty()) backend.upload(a.buffer->data(), bytes.data(), bytes.size());
  return a;
}

inline Array random_array(Backend& backend, DType dtype, size_t n, Random& rng, float lo = -1.f, float hi = 1.f) {
  std::vector<float> values(n);
  for (float& v : values) v = rng.uniform(lo, hi);
  return upload(backend, dtype, std::move(values));
}

// ---- GGUF block-quantized weights ------------------------------------------------------------

inline GgmlType ggml_of(DType t) {
  switch (t) {
    case DType::kQ4_0: return GgmlType::kQ4_0;
    case DType::kQ4_1: return GgmlType::kQ4_1;
    case DType::kQ5_0: return GgmlType::kQ5_0;
    case DType::kQ5_1: return GgmlType::kQ5_1;
    case DType::kQ8_0: return GgmlType::kQ8_0;
    case DType::kQ4_K: return GgmlType::kQ4_K;
    case DType::kQ5_K: return GgmlType::kQ5_K;
    case DType::kQ6_K: return GgmlType::kQ6_K;
    default: throw std::invalid_argument("not a block-quantized dtype");
  }
}

// The fp16 scale fields of a block of t: byte offset and the largest magnitude that keeps the
// type's weights within about [-0.2, 0.2] (the quants' range times each scale's multipliers).
struct ScaleField {
  int offset;
  float max;
};
inline std::vector<ScaleField> scale_fields(DType t) {
  switch (t) {
    case DType::kQ4_0: return {{0, 0.2f / 8}};
    case DType::kQ4_1: return {{0, 0.2f / 15}, {2, 0.1f}};
    case DType::kQ5_0: return {{0, 0.2f / 16}};
    case DType::kQ5_1: return {{0, 0.2f / 31}, {2, 0.1f}};
    case DType::kQ8_0: return {{0, 0.2f / 128}};
    case DType::kQ4_K: return {{0, 0.1f / (63 * 15)}, {2, 0.1f / 63}};
    case DType::kQ5_K: return {{0, 0.1f / (63 * 31)}, {2, 0.1f / 63}};
    case DType::kQ6_K: return {{208, 0.2f / (128 * 32)}};
    default: throw std::invalid_argument("not a block-quantized dtype");
  }
}

// `blocks` blocks of t: random quant bytes and random scales of either sign, up to
// scale_fields' magnitudes, or (wild) any finite fp16 value, subnormals included.
inline std::vector<uint8_t> random_blocks(DType t, size_t blocks, Random& rng, bool wild = false) {
  std::vector<uint8_t> bytes(blocks * block_bytes(t));
  for (uint8_t& b : bytes) b = uint8_t(rng.bits() >> 24);
  for (size_t i = 0; i < blocks; ++i) {
    for (const ScaleField& f : scale_fields(t)) {
      uint16_t h = f32_to_f16(rng.uniform(-f.max, f.max));
      if (wild) {
        h = uint16_t(rng.bits() >> 32);
        if ((h & 0x7c00) == 0x7c00) h &= 0xbfff;  // inf or nan: take a finite exponent instead
      }
      std::memcpy(&bytes[i * block_bytes(t) + size_t(f.offset)], &h, 2);
    }
  }
  return bytes;
}

// A [rows, k] matrix of random blocks of t on the backend; values: its weights as
// format/dequantize.cpp reads them (the reference every backend's dequantization must equal).
inline Array upload_blocks(Backend& backend, DType t, int64_t rows, int64_t k, Random& rng) {
  const std::vector<uint8_t> bytes = random_blocks(t, size_t(rows * k / block_elements(t)), rng);
  Array a{.dtype = t, .device = backend.device(), .values = std::vector<float>(size_t(rows * k))};
  dequantize_row(ggml_of(t), bytes.data(), a.values.data(), rows * k);
  a.buffer = backend.allocate(bytes.size());
  backend.upload(a.buffer->data(), bytes.data(), bytes.size());
  return a;
}

// n elements of NaN bytes (0xff is a NaN in f32, f16 and bf16): an element no op writes fails.
inline Array output_array(Backend& backend, DType dtype, size_t n) {
  Array a{.dtype = dtype, .device = backend.device(), .values = std::vector<float>(n, std::nanf(""))};
  a.buffer = backend.allocate(a.bytes());
  const std::vector<uint8_t> bytes(a.bytes(), 0xff);
  if (!bytes.empty()) backend.upload(a.buffer->data(), bytes.data(), bytes.size());
  return a;
}

inline std::vector<double> fetch(Backend& backend, const Array& a) {
  std::vector<uint8_t> bytes(a.bytes());
  if (!bytes.empty()) backend.download(bytes.data(), a.buffer->data(), bytes.size());
  return decode(a.dtype, bytes);
}

// ---- Comparison -----------------------------------------------------------------------------

// The worst |got - ref| / tolerance of one op case (printed, so a loose tolerance shows), and
// its first failures as gtest failures.
class Report {
 public:
  explicit Report(std::string op) : op_(std::move(op)) {}

  void close(const std::string& what, std::span<const double> got, std::span<const double> ref,
             std::span<const double> magnitude, DType out, DType act, Tolerance t) {
    ASSERT_EQ(got.size(), ref.size()) << op_ << " " << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const double bound = tolerance(out, act, t, ref[i], magnitude[i]);
      const double error = std::abs(got[i] - ref[i]);
      worst_ = std::max(worst_, std::isfinite(error) ? error / bound : std::numeric_limits<double>::infinity());
      if (!(error <= bound) && failures_++ < 5) {
        ADD_FAILURE() << op_ << ": " << what << "[" << i << "] = " << got[i] << ", reference " << ref[i]
                      << ", |error| " << error << " > tolerance " << bound;
      }
    }
  }

  // The same with each element's bound given (an op whose tolerance has terms of its own).
  void within(const std::string& what, std::span<const double> got, std::span<const double> ref,
              std::span<const double> bound) {
    ASSERT_EQ(got.size(), ref.size()) << op_ << " " << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const double error = std::abs(got[i] - ref[i]);
      worst_ = std::max(worst_, std::isfinite(error) ? error / bound[i] : std::numeric_limits<double>::infinity());
      if (!(error <= bound[i]) && failures_++ < 5) {
        ADD_FAILURE() << op_ << ": " << what << "[" << i << "] = " << got[i] << ", reference " << ref[i]
                      << ", |error| " << error << " > tolerance " << bound[i];
      }
    }
  }

  void exact(const std::string& what, std::span<const double> got, std::span<const double> ref) {
    ASSERT_EQ(got.size(), ref.size()) << op_ << " " << what;
    for (size_t i = 0; i < got.size(); ++i) {
      const bool same = got[i] == ref[i] || (std::isnan(got[i]) && std::isnan(ref[i]));
      if (!same && failures_++ < 5) {
        ADD_FAILURE() << op_ << ": " << what << "[" << i << "] = " << got[i] << ", exactly " << ref[i] << " expected";
      }
    }
  }

  void fail(const std::string& why) {
    ++failures_;
    ADD_FAILURE() << op_ << ": " << why;
  }

  void merge(const Report& other) {
    worst_ = std::max(worst_, other.worst_);
    failures_ += other.failures_;
  }

  double worst() const { return worst_; }
  int failures() const { return failures_; }

 private:
  std::string op_;
  double worst_ = 0;
  int failures_ = 0;
};

// ---- The op interface ---------------------------------------------------------------------------

class OpTest {
 public:
  virtual ~OpTest() = default;
  virtual std::string name() const = 0;
  // Why this backend cannot run the case, or null.
  virtual const char* unsupported(const Backend&) const { return nullptr; }
  // Inputs on the backend, and what the op needs first (a KV cache, begin_step of its step).
  virtual void prepare(Backend& backend) = 0;
  // The op, once; repeatable (--perf times repeated runs).
  virtual void run(Backend& backend) = 0;
  // After one run: its outputs against the reference.
  virtual void check(Backend& backend, Report& report) = 0;
  // What one run moves and computes: the roofline's numerators.
  virtual double bytes() const = 0;
  virtual double flops() const { return 0; }
};

// The dtype of weights and tables: the activations', or (CPU) a narrower stored one.
inline DType weight_dtype(const Backend& backend, std::optional<DType> dtype) {
  return dtype.value_or(backend.activation_dtype());
}
inline std::string dtype_label(std::optional<DType> dtype) { return std::string(dtype ? dtype_name(*dtype) : "act"); }

// allocate, upload, download: bytes round trip unchanged; name, device, activation dtype agree.
class BufferRoundTrip final : public OpTest {
 public:
  explicit BufferRoundTrip(size_t n) : n_(n) {}
  std::string name() const override { return "allocate/upload/download " + std::to_string(n_) + " B"; }
  void prepare(Backend& backend) override {
    Random rng(n_);
    host_.resize(n_);
    for (uint8_t& b : host_) b = uint8_t(rng.bits());
    buffer_ = backend.allocate(n_);
  }
  void run(Backend& backend) override {
    if (n_) backend.upload(buffer_->data(), host_.data(), n_);
  }
  void check(Backend& backend, Report& report) override {
    std::vector<uint8_t> back(n_, 0);
    if (n_) backend.download(back.data(), buffer_->data(), n_);
    if (back != host_) report.fail("download differs from upload");
    if (buffer_->size() != n_) report.fail("buffer size " + std::to_string(buffer_->size()));
    if (backend.name().empty()) report.fail("empty name()");
    if ((backend.device() == Device::kCpu) != (backend.activation_dtype() == DType::kF32))
      report.fail("the CPU backend computes in f32, a GPU backend in f16/bf16");
  }
  double bytes() const override { return double(n_); }

 private:
  size_t n_;
  std::vector<uint8_t> host_;
  std::shared_ptr<Backend::Buffer> buffer_;
};

// A step of `rows` rows and no attention: what embed and rms_norm_logit_rows read.
inline StepBatch plain_step(std::vector<int32_t> tokens, std::vector<int32_t> logit_rows) {
  StepBatch step;
  step.positions.assign(tokens.size(), 0);
  step.slot_blocks.assign(tokens.size(), -1);
  step.tokens = std::move(tokens);
  step.logit_rows = std::move(logit_rows);
  return step;
}

// embed: rows of the table, widened or copied exactly.
class Embed final : public OpTest {
 public:
  Embed(int64_t vocab, int64_t hidden, std::vector<int32_t> tokens, std::optional<DType> table_dtype = {})
      : vocab_(vocab), hidden_(hidden), tokens_(std::move(tokens)), table_dtype_(table_dtype) {}
  std::string name() const override {
    return "embed vocab=" + std::to_string(vocab_) + " hidden=" + std::to_string(hidden_) + " rows=" +
           std::to_string(tokens_.size()) + " table=" + dtype_label(table_dtype_);
  }
  const char* unsupported(const Backend& backend) const override {
    if (table_dtype_ && is_block_quantized(*table_dtype_))
      return backend.takes_quantized_weights(*table_dtype_) ? nullptr : "no tables in this quantized type";
    if (backend.device() != Device::kCpu && table_dtype_ && *table_dtype_ != backend.activation_dtype())
      return "a GPU backend's table has the activation dtype";
    return nullptr;
  }
  void prepare(Backend& backend) override {
    Random rng(1);
    table_ = table_dtype_ && is_block_quantized(*table_dtype_)
                 ? upload_blocks(backend, *table_dtype_, vocab_, hidden_, rng)
                 : random_array(backend, weight_dtype(backend, table_dtype_), size_t(vocab_ * hidden_), rng);
    out_ = output_array(backend, backend.activation_dtype(), tokens_.size() * size_t(hidden_));
    step_ = plain_step(tokens_, {});
    backend.begin_step(step_);
  }
  void run(Backend& backend) override {
    backend.embed(table_.view({vocab_, hidden_}), step_, out_.view({int64_t(tokens_.size()), hidden_}));
  }
  void check(Backend& backend, Report& report) override {
    std::vector<double> ref;
    for (int32_t t : tokens_) {
      for (int64_t c = 0; c < hidden_; ++c) ref.push_back(round_to(out_.dtype, table_.values[size_t(t * hidden_ + c)]));
    }
    report.exact("out", fetch(backend, out_), ref);
  }
  double bytes() const override {
    return double(tokens_.size()) * double(dtype_bytes(table_.dtype, hidden_) + dtype_bytes(out_.dtype, hidden_));
  }

 private:
  int64_t vocab_, hidden_;
  std::vector<int32_t> tokens_;
  std::optional<DType> table_dtype_;
  Array table_, out_;
  StepBatch step_;
};

// The exact RMSNorm of row x with weight w; magnitude: |ref| (a product of the inputs and the
// inverse RMS, whose sum of squares is the reduction).
inline void rms_norm_reference(std::span<const float> x, std::span<const float> w, double eps,
                               std::vector<double>& ref, std::vector<double>& magnitude) {
  double sum_squares = 0;
  for (double v : x) sum_squares += v * v;
  const double inv_rms = 1.0 / std::sqrt(sum_squares / double(x.size()) + eps);
  for (size_t i = 0; i < x.size(); ++i) {
    ref.push_back(x[i] * inv_rms * double(w[i]));
    magnitude.push_back(std::abs(ref.back()));
  }
}

// rms_norm, rms_norm_logit_rows (rows given) and add_rms_norm (add_first).
class RmsNorm final : public OpTest {
 public:
  enum class Kind : uint8_t { kPlain, kLogitRows, kAddFirst };
  RmsNorm(Kind kind, int64_t rows, int64_t hidden, std::vector<int32_t> logit_rows = {})
      : kind_(kind), rows_(rows), hidden_(hidden), logit_rows_(std::move(logit_rows)) {}
  std::string name() const override {
    const char* op = kind_ == Kind::kPlain ? "rms_norm" : kind_ == Kind::kLogitRows ? "rms_norm_logit_rows" : "add_rms_norm";
    return std::string(op) + " rows=" + std::to_string(rows_) + " hidden=" + std::to_string(hidden_) +
           (kind_ == Kind::kLogitRows ? " logit_rows=" + std::to_string(logit_rows_.size()) : "");
  }
  void prepare(Backend& backend) override {
    Random rng(2);
    const DType act = backend.activation_dtype();
    x_ = random_array(backend, act, size_t(rows_ * hidden_), rng, -3.f, 3.f);
    y_ = random_array(backend, act, size_t(rows_ * hidden_), rng, -0.5f, 0.5f);
    weight_ = random_array(backend, act, size_t(hidden_), rng, 0.8f, 1.2f);
    out_ = output_array(backend, act, size_t(out_rows() * hidden_));
    step_ = plain_step(std::vector<int32_t>(size_t(rows_), 0), logit_rows_);
    if (kind_ == Kind::kLogitRows) backend.begin_step(step_);
  }
  void run(Backend& backend) override {
    const Tensor x = x_.view({rows_, hidden_}), w = weight_.view({hidden_}), out = out_.view({out_rows(), hidden_});
    switch (kind_) {
      case Kind::kPlain: backend.rms_norm(x, w, kEps, out); break;
      case Kind::kLogitRows: backend.rms_norm_logit_rows(x, step_, w, kEps, out); break;
      case Kind::kAddFirst: backend.add_rms_norm(x, y_.view({rows_, hidden_}), w, kEps, out); break;
    }
  }
  void check(Backend& backend, Report& report) override {
    std::vector<float> x = x_.values;
    if (kind_ == Kind::kAddFirst) {  // the stored residual: the fp32 sum rounded once (run once)
      for (size_t i = 0; i < x.size(); ++i) x[i] = round_to(x_.dtype, x_.values[i] + y_.values[i]);
      report.exact("residual", fetch(backend, x_), std::vector<double>(x.begin(), x.end()));
    }
    std::vector<double> ref, magnitude;
    for (int64_t j = 0; j < out_rows(); ++j) {
      const int64_t r = kind_ == Kind::kLogitRows ? logit_rows_[size_t(j)] : j;
      rms_norm_reference(std::span(x).subspan(size_t(r * hidden_), size_t(hidden_)), weight_.values, kEps, ref, magnitude);
    }
    report.close("out", fetch(backend, out_), ref, magnitude, out_.dtype, out_.dtype, {.reduction = hidden_});
  }
  double bytes() const override {
    const double row = double(hidden_ * int64_t(dtype_size(x_.dtype)));
    return kind_ == Kind::kAddFirst ? 4 * row * double(rows_) : 2 * row * double(out_rows());
  }

 private:
  static constexpr float kEps = 1e-5f;
  int64_t out_rows() const { return kind_ == Kind::kLogitRows ? int64_t(logit_rows_.size()) : rows_; }
  Kind kind_;
  int64_t rows_, hidden_;
  std::vector<int32_t> logit_rows_;
  Array x_, y_, weight_, out_;
  StepBatch step_;
};

// matmul: out [n, m] = x [n, k] @ w [m, k]^T (+ bias), w stored in weight_dtype (or in GGUF
// blocks, whose dequantized values are the reference's weights), out in the activation dtype or
// f32 (the logits). A GPU may round dequantized weights to the activation dtype before a
// tensor-core GEMM: one more rounding (r = 1) for quantized weights.
class Matmul final : public OpTest {
 public:
  Matmul(int64_t n, int64_t m, int64_t k, std::optional<DType> w_dtype, bool bias, bool f32_out = false)
      : n_(n), m_(m), k_(k), w_dtype_(w_dtype), bias_(bias), f32_out_(f32_out) {}
  std::string name() const override {
    return "matmul n=" + std::to_string(n_) + " m=" + std::to_string(m_) + " k=" + std::to_string(k_) +
           " w=" + dtype_label(w_dtype_) + (bias_ ? " bias" : "") + (f32_out_ ? " out=f32" : "");
  }
  const char* unsupported(const Backend& backend) const override {
    if (quantized() && backend.device() == Device::kCpu)
      return "the CPU quantizes activations to int8 (tests/backend/quant_matmul_test.cpp)";
    if (quantized() && !backend.takes_quantized_weights(*w_dtype_)) return "no matmul in this quantized type";
    if (backend.device() == Device::kCpu) return nullptr;
    if (w_dtype_ && !quantized() && *w_dtype_ != backend.activation_dtype())
      return "a GPU backend's weights have the activation dtype";
    if (m_ % 8 || k_ % 8) return "cuBLASLt needs m and k multiples of 8";
    if (bias_ && f32_out_) return "a GPU bias has the output's dtype";
    return nullptr;
  }
  void prepare(Backend& backend) override {
    Random rng(3);
    const DType act = backend.activation_dtype();
    x_ = random_array(backend, act, size_t(n_ * k_), rng);
    w_ = quantized() ? upload_blocks(backend, *w_dtype_, m_, k_, rng)
                     : random_array(backend, weight_dtype(backend, w_dtype_), size_t(m_ * k_), rng, -0.2f, 0.2f);
    // The CPU backend's bias is f32 (its activations); a GPU's has the output's dtype.
    bias_values_ = random_array(backend, act, size_t(m_), rng);
    out_ = output_array(backend, f32_out_ ? DType::kF32 : act, size_t(n_ * m_));
  }
  void run(Backend& backend) override {
    const Tensor bias = bias_values_.view({m_});
    backend.matmul(x_.view({n_, k_}), w_.view({m_, k_}), bias_ ? &bias : nullptr, out_.view({n_, m_}));
  }
  void check(Backend& backend, Report& report) override {
    std::vector<double> ref(size_t(n_ * m_)), magnitude(ref.size());
    for (int64_t r = 0; r < n_; ++r) {
      for (int64_t j = 0; j < m_; ++j) {
        double sum = bias_ ? bias_values_.values[size_t(j)] : 0.0, mag = std::abs(sum);
        for (int64_t i = 0; i < k_; ++i) {
          const double term = double(x_.values[size_t(r * k_ + i)]) * w_.values[size_t(j * k_ + i)];
          sum += term;
          mag += std::abs(term);
        }
        ref[size_t(r * m_ + j)] = sum;
        magnitude[size_t(r * m_ + j)] = mag;
      }
    }
    report.close("out", fetch(backend, out_), ref, magnitude, out_.dtype, x_.dtype,
                 {.roundings = quantized() ? 1 : 0, .reduction = k_ + 1});
  }
  double bytes() const override {
    return double(dtype_bytes(x_.dtype, n_ * k_) + dtype_bytes(w_.dtype, m_ * k_) + dtype_bytes(out_.dtype, n_ * m_));
  }
  double flops() const override { return 2.0 * double(n_) * double(m_) * double(k_); }

 private:
  bool quantized() const { return w_dtype_ && is_block_quantized(*w_dtype_); }
  int64_t n_, m_, k_;
  std::optional<DType> w_dtype_;
  bool bias_, f32_out_;
  Array x_, w_, bias_values_, out_;
};

// silu_mul: out = silu(gate) * up; add: x += y (exact: the fp32 sum rounded once).
class Elementwise final : public OpTest {
 public:
  enum class Kind : uint8_t { kSiluMul, kAdd };
  Elementwise(Kind kind, int64_t rows, int64_t width) : kind_(kind), rows_(rows), width_(width) {}
  std::string name() const override {
    return std::string(kind_ == Kind::kSiluMul ? "silu_mul" : "add") + " rows=" + std::to_string(rows_) +
           " width=" + std::to_string(width_);
  }
  void prepare(Backend& backend) override {
    Random rng(4);
    const DType act = backend.activation_dtype();
    if (kind_ == Kind::kSiluMul) {
      a_ = random_array(backend, act, size_t(rows_ * 2 * width_), rng, -6.f, 6.f);
      out_ = output_array(backend, act, size_t(rows_ * width_));
    } else {
      a_ = random_array(backend, act, size_t(rows_ * width_), rng);
      b_ = random_array(backend, act, size_t(rows_ * width_), rng);
    }
  }
  void run(Backend& backend) override {
    if (kind_ == Kind::kSiluMul) {
      backend.silu_mul(a_.view({rows_, 2 * width_}), out_.view({rows_, width_}));
    } else {
      backend.add(a_.view({rows_, width_}), b_.view({rows_, width_}));
    }
  }
  void check(Backend& backend, Report& report) override {
    if (kind_ == Kind::kAdd) {
      std::vector<double> ref(a_.values.size());
      for (size_t i = 0; i < ref.size(); ++i) ref[i] = round_to(a_.dtype, a_.values[i] + b_.values[i]);
      report.exact("x", fetch(backend, a_), ref);
      return;
    }
    std::vector<double> ref, magnitude;
    for (int64_t r = 0; r < rows_; ++r) {
      for (int64_t j = 0; j < width_; ++j) {
        const double g = a_.values[size_t(r * 2 * width_ + j)], u = a_.values[size_t(r * 2 * width_ + width_ + j)];
        ref.push_back(g / (1.0 + std::exp(-g)) * u);
        magnitude.push_back(std::abs(ref.back()));
      }
    }
    report.close("out", fetch(backend, out_), ref, magnitude, out_.dtype, out_.dtype, {});
  }
  double bytes() const override { return 3.0 * double(rows_ * width_) * double(dtype_size(a_.dtype)); }

 private:
  Kind kind_;
  int64_t rows_, width_;
  Array a_, b_, out_;
};

// ---- Attention: allocate_kv_cache, copy_kv_block, rope_append_kv, attention, run_graph ----------

// How a scenario's decode rows attend, and whether its decode-only steps run as graphs.
enum class DecodeMode : uint8_t { kPaged, kPrefix };

// One attention shape and the sequences of a scenario, with what the reference knows of their
// KV: per layer and position, the rotated K (rounded to the cache dtype, as stored) and V.
class KvScenario {
 public:
  static constexpr int kLayers = 2;  // layer 1 holds other values: a wrong layer index shows

  KvScenario(Backend& backend, attention::AttentionShape shape, int32_t num_blocks)
      : backend_(backend), shape_(shape), num_blocks_(num_blocks) {
    for (int i = 0; i < shape.head_dim / 2; ++i)
      inv_freq_.push_back(float(1.0 / std::pow(500000.0, 2.0 * i / shape.head_dim)));
  }

  void allocate() {
    backend_.allocate_kv_cache({.num_layers = kLayers, .num_blocks = num_blocks_, .block_size = shape_.block_size,
                                .num_kv_heads = shape_.num_kv_heads, .head_dim = shape_.head_dim,
                                .dtype = backend_.activation_dtype(), .layout = KvLayout::kHnd});
  }

  // A new sequence over `blocks`; its first `shared` tokens are those of sequence `from`
  // (shared prefix blocks, or blocks copied from it).
  int add_sequence(std::vector<int32_t> blocks, int from = -1, int32_t shared = 0) {
    Sequence s{.blocks = std::move(blocks)};
    s.k.resize(kLayers);
    s.v.resize(kLayers);
    if (from >= 0) {
      const Sequence& f = sequences_[size_t(from)];
      if (shared > f.length) throw std::logic_error("a sequence shares more tokens than its source holds");
      s.length = shared;
      for (int l = 0; l < kLayers; ++l) {
        s.k[size_t(l)].assign(f.k[size_t(l)].begin(), f.k[size_t(l)].begin() + shared * kv_width());
        s.v[size_t(l)].assign(f.v[size_t(l)].begin(), f.v[size_t(l)].begin() + shared * kv_width());
      }
    }
    sequences_.push_back(std::move(s));
    return int(sequences_.size()) - 1;
  }

  // Copies KV block src to dst on the backend (copy on write).
  void copy_block(int32_t src, int32_t dst) { backend_.copy_kv_block(src, dst); }

  // Moves KV block src to dst through host memory, a layer's K page then its V page, as
  // disaggregated serving ships a request's KV between servers.
  void transfer_block(int32_t src, int32_t dst) {
    std::vector<std::byte> pages(2 * backend_.kv_page_bytes());
    const int32_t from[] = {src}, to[] = {dst};
    for (int l = 0; l < kLayers; ++l) {
      backend_.read_kv_pages(l, from, pages.data());
      backend_.write_kv_pages(l, to, pages.data());
    }
  }

  // One step: `chunks` (sequence, new tokens) appended and attended to, through the Backend as
  // the model issues them (decode rows first; a decode-only step padded to graph_rows and run
  // by run_graph when `graph`). Checks every layer's q and attention output. Returns the step's
  // padded rows (0: not a graph step).
  int32_t step(const std::vector<std::pair<int, int32_t>>& chunks, DecodeMode mode, bool graph, Report& report) {
    StepBatch step;
    step.shape = shape_;
    step.rope_inv_freq = inv_freq_;
    std::vector<std::pair<int, int32_t>> ordered;
    for (const auto& c : chunks)
      if (c.second == 1) ordered.push_back(c);
    for (const auto& c : chunks)
      if (c.second != 1) ordered.push_back(c);
    std::vector<int> row_seq;
    std::vector<int32_t> row_pos;
    for (const auto& [seq, n] : ordered) {
      Sequence& s = sequences_[size_t(seq)];
      const auto row = int32_t(step.tokens.size());
      step.sequences.push_back({s.blocks, s.length, n, row});
      for (int32_t t = 0; t < n; ++t) {
        const int32_t pos = s.length + t;
        step.tokens.push_back(0);
        step.positions.push_back(pos);
        step.slot_blocks.push_back(s.blocks[size_t(pos / shape_.block_size)]);
        row_seq.push_back(seq);
        row_pos.push_back(pos);
      }
      if (n == 1) {
        step.decode_batch.add_sequence(s.blocks, s.length + 1);
      } else {
        step.prefill_seqs.push_back(int32_t(step.sequences.size()) - 1);
      }
    }
    const int32_t real_rows = int32_t(step.tokens.size()), num_decode = step.decode_batch.num_seqs();
    const int32_t graph_rows = graph && step.prefill_seqs.empty() ? backend_.graph_rows(num_decode) : 0;
    auto pad = [&] {
      step.graph_rows = graph_rows;
      for (int32_t r = num_decode; r < graph_rows; ++r) {
        step.tokens.push_back(0);
        step.positions.push_back(0);
        step.slot_blocks.push_back(-1);
      }
    };
    if (num_decode > 0 && mode == DecodeMode::kPrefix) {
      const std::optional<Backend::PrefixPlanning> planning = backend_.prefix_planning(shape_);
      if (!planning) {
        report.fail("prefix_planning() gave nothing for a shape the case expects it to run");
        return 0;
      }
      if (!planner_) planner_.emplace(shape_, planning->device, planning->options);
      step.prefix_plan = &planner_->plan(step.decode_batch);
      if (graph_rows >= num_decode) pad();
    } else if (num_decode > 0) {
      attention::DecodeBatch padded = step.decode_batch;
      for (int32_t r = num_decode; r < graph_rows; ++r) padded.add_sequence({}, 0);
      attention::DecodePlan plan = attention::plan_decode(padded, shape_, backend_.device_info());
      if (graph_rows >= num_decode && plan.merges.empty()) {  // a graph holds no merge (as the model)
        step.decode_batch = std::move(padded);
        step.decode_plan = std::move(plan);
        pad();
      } else {
        step.decode_plan = attention::plan_decode(step.decode_batch, shape_, backend_.device_info());
      }
    }
    for (int32_t r = 0; r < real_rows; ++r) step.logit_rows.push_back(r);
    const int32_t rows = int32_t(step.tokens.size());

    // Inputs of every layer; buffers sized once for the largest step, so a graph's addresses hold.
    reserve(rows);
    Random rng(uint64_t(++steps_) * 7919);
    std::vector<std::vector<float>> qkv(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      std::vector<float> values(size_t(rows * qkv_width()));
      for (float& v : values) v = round_to(backend_.activation_dtype(), rng.uniform(-1.f, 1.f));
      const std::vector<uint8_t> bytes = encode(backend_.activation_dtype(), values);
      backend_.upload(qkv_[size_t(l)]->data(), bytes.data(), bytes.size());
      qkv[size_t(l)] = std::move(values);
    }
    const std::vector<uint8_t> poison(size_t(rows) * q_width() * dtype_size(backend_.activation_dtype()), 0xff);
    for (int l = 0; l < kLayers; ++l) {
      backend_.upload(q_[size_t(l)]->data(), poison.data(), poison.size());
      backend_.upload(out_[size_t(l)]->data(), poison.data(), poison.size());
    }
    backend_.begin_step(step);
    const auto body = [&] {
      for (int l = 0; l < kLayers; ++l) {
        backend_.rope_append_kv(l, step, tensor(qkv_[size_t(l)], {rows, qkv_width()}),
                                tensor(q_[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}));
        backend_.attention(l, step, tensor(q_[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}),
                           tensor(out_[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}));
      }
    };
    // run_graph runs padded steps; on a backend without graphs (graph_rows always 0) it must
    // simply run the body.
    if (step.graph_rows > 0 || (graph && backend_.graph_rows(1) == 0)) {
      backend_.run_graph(body);
    } else {
      body();
    }

    // The reference: append each row's rotated K and V, then attend.
    for (int l = 0; l < kLayers; ++l) {
      for (int32_t r = 0; r < real_rows; ++r) {
        Sequence& s = sequences_[size_t(row_seq[size_t(r)])];
        const float* row = &qkv[size_t(l)][size_t(r * qkv_width())];
        std::vector<double> k(row + q_width(), row + q_width() + kv_width());
        rotate(k, row_pos[size_t(r)]);
        for (double& x : k) x = round_to(backend_.activation_dtype(), float(x));
        s.k[size_t(l)].insert(s.k[size_t(l)].end(), k.begin(), k.end());
        s.v[size_t(l)].insert(s.v[size_t(l)].end(), row + q_width() + kv_width(), row + q_width() + 2 * kv_width());
      }
    }
    for (const auto& [seq, n] : ordered) sequences_[size_t(seq)].length += n;
    for (int l = 0; l < kLayers; ++l) check_layer(l, qkv[size_t(l)], row_seq, row_pos, real_rows, report);
    return step.graph_rows;
  }

  // Buffers for `rows` rows (growing them moves a backend's graph generation).
  void reserve(int32_t rows) {
    if (rows <= reserved_rows_) return;
    const size_t act = dtype_size(backend_.activation_dtype());
    qkv_.clear(), q_.clear(), out_.clear();
    for (int l = 0; l < kLayers; ++l) {
      qkv_.push_back(backend_.allocate(size_t(rows * qkv_width()) * act));
      q_.push_back(backend_.allocate(size_t(rows) * q_width() * act));
      out_.push_back(backend_.allocate(size_t(rows) * q_width() * act));
    }
    reserved_rows_ = rows;
  }

  const attention::AttentionShape& shape() const { return shape_; }

 private:
  struct Sequence {
    std::vector<int32_t> blocks;
    int32_t length = 0;
    std::vector<std::vector<double>> k, v;  // [layer][position * kv_width + head * head_dim + d]
  };

  int64_t q_width() const { return int64_t(shape_.num_q_heads) * shape_.head_dim; }
  int64_t kv_width() const { return int64_t(shape_.num_kv_heads) * shape_.head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }

  Tensor tensor(const std::shared_ptr<Backend::Buffer>& b, std::initializer_list<int64_t> shape) const {
    return Tensor::contiguous(b->data(), backend_.activation_dtype(), shape, backend_.device());
  }

  // Rotate-half RoPE of every head in x, the angle the fp32 product position * inv_freq.
  void rotate(std::vector<double>& x, int32_t pos) const {
    const int32_t d = shape_.head_dim, half = d / 2;
    for (size_t h = 0; h < x.size() / size_t(d); ++h) {
      double* v = &x[h * size_t(d)];
      for (int32_t i = 0; i < half; ++i) {
        const double angle = float(pos) * inv_freq_[size_t(i)];
        const double a = v[i], b = v[i + half];
        v[i] = a * std::cos(angle) - b * std::sin(angle);
        v[i + half] = b * std::cos(angle) + a * std::sin(angle);
      }
    }
  }

  void check_layer(int l, const std::vector<float>& qkv, const std::vector<int>& row_seq,
                   const std::vector<int32_t>& row_pos, int32_t rows, Report& report) {
    const DType act = backend_.activation_dtype();
    const int32_t d = shape_.head_dim, half = d / 2;
    const std::vector<double> q = fetch_rows(q_[size_t(l)], rows), out = fetch_rows(out_[size_t(l)], rows);
    std::vector<double> q_ref, q_mag, o_ref, o_mag;
    for (int32_t r = 0; r < rows; ++r) {
      std::vector<double> x(&qkv[size_t(r * qkv_width())], &qkv[size_t(r * qkv_width() + q_width())]);
      rotate(x, row_pos[size_t(r)]);
      const float* raw = &qkv[size_t(r * qkv_width())];
      for (int64_t i = 0; i < q_width(); ++i) {  // |a cos| + |b sin|: the fp32 rotation's terms
        const int32_t pair = int32_t(i % d) % half;
        const int64_t head = i / d * d;
        const double angle = float(row_pos[size_t(r)]) * inv_freq_[size_t(pair)];
        q_ref.push_back(x[size_t(i)]);
        q_mag.push_back(std::abs(raw[head + pair] * std::cos(angle)) + std::abs(raw[head + pair + half] * std::sin(angle)) +
                        std::abs(raw[head + pair] * std::sin(angle)) + std::abs(raw[head + pair + half] * std::cos(angle)));
      }
      // Attention of the backend's own q (the op's input) over the sequence's keys [0, pos].
      const Sequence& s = sequences_[size_t(row_seq[size_t(r)])];
      const int32_t keys = row_pos[size_t(r)] + 1;
      for (int32_t h = 0; h < shape_.num_q_heads; ++h) {
        const int32_t kv_head = h / shape_.group_size();
        const double* qh = &q[size_t(r * q_width() + h * d)];
        std::vector<double> scores(static_cast<size_t>(keys));
        double max_score = -INFINITY, score_mag = 0;
        for (int32_t j = 0; j < keys; ++j) {
          const double* k = &s.k[size_t(l)][size_t(j * kv_width() + kv_head * d)];
          double dot = 0, mag = 0;
          for (int32_t i = 0; i < d; ++i) {
            dot += qh[i] * k[i];
            mag += std::abs(qh[i] * k[i]);
          }
          scores[size_t(j)] = dot * shape_.softmax_scale;
          max_score = std::max(max_score, scores[size_t(j)]);
          score_mag = std::max(score_mag, mag * shape_.softmax_scale);
        }
        double total = 0;
        for (double& sc : scores) total += (sc = std::exp(sc - max_score));
        for (int32_t i = 0; i < d; ++i) {
          double o = 0, mag = 0;
          for (int32_t j = 0; j < keys; ++j) {
            const double v = s.v[size_t(l)][size_t(j * kv_width() + kv_head * d + i)];
            o += scores[size_t(j)] / total * v;
            mag += scores[size_t(j)] / total * std::abs(v);
          }
          o_ref.push_back(o);
          o_mag.push_back(mag * (1 + score_mag));
        }
      }
    }
    const std::string layer = "layer " + std::to_string(l) + " ";
    report.close(layer + "q", q, q_ref, q_mag, act, act, {});
    const int64_t longest = *std::max_element(row_pos.begin(), row_pos.end()) + 1;
    report.close(layer + "attention out", out, o_ref, o_mag, act, act,
                 {.roundings = 3, .reduction = longest + shape_.head_dim});
  }

  std::vector<double> fetch_rows(const std::shared_ptr<Backend::Buffer>& b, int32_t rows) const {
    std::vector<uint8_t> bytes(size_t(rows) * size_t(q_width()) * dtype_size(backend_.activation_dtype()));
    backend_.download(bytes.data(), b->data(), bytes.size());
    return decode(backend_.activation_dtype(), bytes);
  }

  Backend& backend_;
  attention::AttentionShape shape_;
  int32_t num_blocks_;
  std::vector<float> inv_freq_;
  std::vector<Sequence> sequences_;
  std::optional<attention::PrefixPlanner> planner_;
  std::vector<std::shared_ptr<Backend::Buffer>> qkv_, q_, out_;  // [layer]
  int32_t reserved_rows_ = 0;
  int steps_ = 0;
};

inline attention::AttentionShape attention_shape(int32_t q_heads, int32_t kv_heads, int32_t head_dim, int32_t block_size) {
  return {.num_q_heads = q_heads, .num_kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size,
          .softmax_scale = float(1.0 / std::sqrt(double(head_dim)))};
}

// A scenario of steps through allocate_kv_cache, rope_append_kv and attention (and
// copy_kv_block, run_graph), each step checked. Not timed: perf_table's AttentionPerf is.
class AttentionSteps final : public OpTest {
 public:
  enum class Kind : uint8_t {
    kPrefill,        // prefill, then a chunk over its cached prefix next to a decode row
    kDecode,         // sequences of 1 to 300 tokens decode (a plan that may split KV)
    kDecodeGraph,    // decode steps padded and run by run_graph: captured, then replayed
    kPrefix,         // sequences sharing prefix blocks, one of them a copied block, decode prefix-aware
    kPrefixGraph,    // the same through run_graph
  };
  AttentionSteps(Kind kind, attention::AttentionShape shape) : kind_(kind), shape_(shape) {}
  std::string name() const override {
    static const char* kinds[] = {"prefill", "decode paged", "decode paged graph", "decode prefix", "decode prefix graph"};
    return std::string("rope_append_kv+attention ") + kinds[int(kind_)] + " q_heads=" + std::to_string(shape_.num_q_heads) +
           " kv_heads=" + std::to_string(shape_.num_kv_heads) + " head_dim=" + std::to_string(shape_.head_dim) +
           " block=" + std::to_string(shape_.block_size);
  }
  const char* unsupported(const Backend& backend) const override {
    if ((kind_ == Kind::kPrefix || kind_ == Kind::kPrefixGraph) && !backend.prefix_planning(shape_))
      return "no prefix-aware attention for this shape";
    return nullptr;
  }
  void prepare(Backend&) override { steps_report_ = Report(name()); }
  // The steps, each checked as it runs (a step's outputs are overwritten by the next).
  void run(Backend& backend) override { run_steps(backend, steps_report_); }
  void check(Backend&, Report& report) override { report.merge(steps_report_); }
  double bytes() const override { return 0; }

 private:
  void run_steps(Backend& backend, Report& report) {
    const int32_t bs = shape_.block_size;
    auto blocks = [&](int32_t first, int32_t count) {
      std::vector<int32_t> ids(static_cast<size_t>(count));
      std::iota(ids.begin(), ids.end(), first);
      return ids;
    };
    KvScenario kv(backend, shape_, 64);
    kv.allocate();
    const bool graph = kind_ == Kind::kDecodeGraph || kind_ == Kind::kPrefixGraph;
    const DecodeMode mode = kind_ == Kind::kPrefix || kind_ == Kind::kPrefixGraph ? DecodeMode::kPrefix : DecodeMode::kPaged;
    if (kind_ == Kind::kPrefill) {
      const int a = kv.add_sequence(blocks(0, 8)), b = kv.add_sequence(blocks(8, 8)), c = kv.add_sequence(blocks(16, 4));
      kv.step({{a, 37}, {b, 20}, {c, 5}}, mode, false, report);
      kv.step({{b, 17}, {c, 1}, {a, 2 * bs + 3}}, mode, false, report);  // over cached prefixes, with a decode row
      return;
    }
    if (kind_ == Kind::kDecode || kind_ == Kind::kDecodeGraph) {
      // Lengths 1 to 300 (paged graphs need a plan without splits: shorter sequences there).
      const std::vector<int32_t> lengths = graph ? std::vector<int32_t>{1, 17, 40} : std::vector<int32_t>{1, 17, 100, 300};
      std::vector<int> seqs;
      int32_t next_block = 0;
      for (int32_t len : lengths) {
        const int32_t count = (len + 8 + bs - 1) / bs;
        seqs.push_back(kv.add_sequence(blocks(next_block, count)));
        next_block += count;
        if (len > 1) kv.step({{seqs.back(), len - 1}}, mode, false, report);
      }
      const Backend::GraphStats before = backend.graph_stats();
      int32_t graph_steps = 0;
      for (int s = 0; s < 4; ++s) {
        std::vector<std::pair<int, int32_t>> chunks;
        for (int seq : seqs) chunks.push_back({seq, 1});
        graph_steps += kv.step(chunks, mode, graph, report) > 0;
      }
      if (graph) expect_graphs(backend, before, graph_steps, report);
      return;
    }
    // Prefix: sequence a's prompt fills blocks 0 and 1 and 8 tokens of block 2; b and c share its
    // two full blocks and add their own; d shares them and a copy of the partial third block, e
    // the same block moved through host pages.
    const int a = kv.add_sequence(blocks(0, 4));
    kv.step({{a, 2 * bs + 8}}, mode, false, report);
    const int b = kv.add_sequence({0, 1, 10, 11}, a, 2 * bs);
    const int c = kv.add_sequence({0, 1, 20, 21, 22, 23, 24}, a, 2 * bs);
    kv.step({{b, 9}, {c, 3 * bs + 5}}, mode, false, report);
    kv.copy_block(2, 30);
    const int d = kv.add_sequence({0, 1, 30, 31}, a, 2 * bs + 8);
    kv.transfer_block(2, 40);
    const int e = kv.add_sequence({0, 1, 40, 41}, a, 2 * bs + 8);
    const Backend::GraphStats before = backend.graph_stats();
    int32_t graph_steps = 0;
    for (int s = 0; s < 4; ++s)
      graph_steps += kv.step({{a, 1}, {b, 1}, {c, 1}, {d, 1}, {e, 1}}, mode, graph, report) > 0;
    if (graph) expect_graphs(backend, before, graph_steps, report);
  }

  // A backend with graphs captures or replays every padded step, and replays at least one (the
  // steps have the same padded size, attention kind and buffers, unless a workspace grew: then it
  // captures again); one without graphs runs them all eagerly. Each step's outputs were checked.
  static void expect_graphs(const Backend& backend, const Backend::GraphStats& before, int32_t graph_steps,
                            Report& report) {
    const Backend::GraphStats after = backend.graph_stats();
    const int64_t captures = after.captures - before.captures, replays = after.replays - before.replays;
    if (graph_steps == 0) {
      if (captures != 0 || replays != 0) report.fail("graph stats moved without a graph step");
      return;
    }
    if (captures < 1 || replays < 1 || captures + replays != graph_steps)
      report.fail(std::to_string(graph_steps) + " graph steps: " + std::to_string(captures) + " captures and " +
                  std::to_string(replays) + " replays");
  }

  Kind kind_;
  attention::AttentionShape shape_;
  Report steps_report_{""};
};


// A decode step of `seqs` sequences of `length` tokens, their first `shared` tokens in blocks
// every sequence shares: the timed op is rope_append_kv or attention of layer 0. Its KV holds
// whatever rope_append_kv of random rows wrote (only the time is measured).
class AttentionPerf final : public OpTest {
 public:
  enum class Op : uint8_t { kRopeAppendKv, kAttention };
  AttentionPerf(Op op, DecodeMode mode, attention::AttentionShape shape, int32_t seqs, int32_t length, int32_t shared)
      : op_(op), mode_(mode), shape_(shape), seqs_(seqs), length_(length), shared_(shared) {}
  std::string name() const override {
    return std::string(op_ == Op::kRopeAppendKv ? "rope_append_kv" : mode_ == DecodeMode::kPaged ? "attention paged"
                                                                                                 : "attention prefix") +
           " seqs=" + std::to_string(seqs_) + " kv=" + std::to_string(length_) +
           (shared_ ? " shared=" + std::to_string(shared_) : "") + " q_heads=" + std::to_string(shape_.num_q_heads) +
           " kv_heads=" + std::to_string(shape_.num_kv_heads) + " head_dim=" + std::to_string(shape_.head_dim);
  }
  const char* unsupported(const Backend& backend) const override {
    if (mode_ == DecodeMode::kPrefix && !backend.prefix_planning(shape_)) return "no prefix-aware attention for this shape";
    return nullptr;
  }
  void prepare(Backend& backend) override {
    const int32_t bs = shape_.block_size;
    const int32_t shared_blocks = shared_ / bs, own_blocks = (length_ - shared_ + bs) / bs + 1;
    const int32_t num_blocks = shared_blocks + seqs_ * own_blocks;
    backend.allocate_kv_cache({.num_layers = 1, .num_blocks = num_blocks, .block_size = bs,
                               .num_kv_heads = shape_.num_kv_heads, .head_dim = shape_.head_dim,
                               .dtype = backend.activation_dtype(), .layout = KvLayout::kHnd});
    tables_.assign(size_t(seqs_), {});
    for (int32_t s = 0; s < seqs_; ++s) {
      for (int32_t b = 0; b < shared_blocks; ++b) tables_[size_t(s)].push_back(b);
      for (int32_t b = 0; b < own_blocks; ++b) tables_[size_t(s)].push_back(shared_blocks + s * own_blocks + b);
    }
    for (int32_t i = 0; i < shape_.head_dim / 2; ++i)
      inv_freq_.push_back(float(1.0 / std::pow(500000.0, 2.0 * i / shape_.head_dim)));
    const int64_t width = int64_t(shape_.num_q_heads + 2 * shape_.num_kv_heads) * shape_.head_dim;
    const int64_t q_width = int64_t(shape_.num_q_heads) * shape_.head_dim;
    Random rng(5);
    // Fill the KV: one prefill step per sequence (the shared blocks written by the first only).
    const int32_t chunk = std::max(length_, 1);
    Array qkv = random_array(backend, backend.activation_dtype(), size_t(chunk * width), rng);
    Array q = output_array(backend, backend.activation_dtype(), size_t(chunk * q_width));
    for (int32_t s = 0; s < seqs_; ++s) {
      const int32_t begin = s == 0 ? 0 : shared_;
      if (length_ - begin <= 0) continue;
      StepBatch fill = step_of({s}, begin, length_ - begin);
      backend.begin_step(fill);
      backend.rope_append_kv(0, fill, qkv.view({fill.num_rows(), width}), q.view({fill.num_rows(), shape_.num_q_heads, shape_.head_dim}));
    }
    // The timed step: every sequence decodes its token at position length.
    std::vector<int32_t> all(static_cast<size_t>(seqs_));
    std::iota(all.begin(), all.end(), 0);
    step_ = step_of(all, length_, 1);
    if (mode_ == DecodeMode::kPrefix) {
      const Backend::PrefixPlanning planning = *backend.prefix_planning(shape_);
      planner_.emplace(shape_, planning.device, planning.options);
      step_.prefix_plan = &planner_->plan(step_.decode_batch);
    } else {
      step_.decode_plan = attention::plan_decode(step_.decode_batch, shape_, backend.device_info());
    }
    qkv_ = random_array(backend, backend.activation_dtype(), size_t(seqs_ * width), rng);
    q_ = random_array(backend, backend.activation_dtype(), size_t(seqs_ * q_width), rng);
    out_ = output_array(backend, backend.activation_dtype(), size_t(seqs_ * q_width));
    backend.begin_step(step_);
    backend.rope_append_kv(0, step_, qkv_.view({seqs_, width}), q_.view({seqs_, shape_.num_q_heads, shape_.head_dim}));
  }
  void run(Backend& backend) override {
    const Tensor q = q_.view({seqs_, shape_.num_q_heads, shape_.head_dim});
    if (op_ == Op::kRopeAppendKv) {
      const int64_t width = int64_t(shape_.num_q_heads + 2 * shape_.num_kv_heads) * shape_.head_dim;
      backend.rope_append_kv(0, step_, qkv_.view({seqs_, width}), q);
    } else {
      backend.attention(0, step_, q, out_.view({seqs_, shape_.num_q_heads, shape_.head_dim}));
    }
  }
  void check(Backend&, Report&) override {}  // timed only: AttentionSteps checks these ops
  double bytes() const override {
    const double act = double(dtype_size(q_.dtype)), row = double(shape_.head_dim) * act;
    const double q_rows = double(seqs_) * shape_.num_q_heads, kv_rows = double(seqs_) * shape_.num_kv_heads;
    if (op_ == Op::kRopeAppendKv) return (q_rows + 2 * kv_rows) * row * 2;  // qkv in; q, K, V out
    const double tokens = mode_ == DecodeMode::kPrefix ? double(shared_) + double(seqs_) * (length_ + 1 - shared_)
                                                       : double(seqs_) * (length_ + 1);
    return tokens * shape_.num_kv_heads * 2 * row + 2 * q_rows * row;
  }
  double flops() const override {
    return op_ == Op::kAttention ? 4.0 * seqs_ * (length_ + 1) * shape_.num_q_heads * shape_.head_dim : 0;
  }

 private:
  // A step of `n` new tokens from position `start` for each of `seqs`.
  StepBatch step_of(const std::vector<int32_t>& seqs, int32_t start, int32_t n) const {
    StepBatch step;
    step.shape = shape_;
    step.rope_inv_freq = inv_freq_;
    for (int32_t s : seqs) {
      const std::vector<int32_t>& blocks = tables_[size_t(s)];
      step.sequences.push_back({blocks, start, n, int32_t(step.tokens.size())});
      for (int32_t t = 0; t < n; ++t) {
        step.tokens.push_back(0);
        step.positions.push_back(start + t);
        step.slot_blocks.push_back(blocks[size_t((start + t) / shape_.block_size)]);
      }
      if (n == 1) step.decode_batch.add_sequence(blocks, start + 1);
    }
    return step;
  }

  Op op_;
  DecodeMode mode_;
  attention::AttentionShape shape_;
  int32_t seqs_, length_, shared_;
  std::vector<std::vector<int32_t>> tables_;
  std::vector<float> inv_freq_;
  std::optional<attention::PrefixPlanner> planner_;
  StepBatch step_;
  Array qkv_, q_, out_;
};

// sample: every row's argmax over its first `vocab` columns, reached through each filter alone
// (greedy; top-k 1; a top-p that keeps only the best; min-p 1), with a larger logit past vocab
// that must be ignored. A backend that cannot sample says so (can_sample) and throws
// Error(kUnsupported).
class Sample final : public OpTest {
 public:
  Sample(int32_t vocab, int32_t padding) : vocab_(vocab), ld_(vocab + padding) {}
  std::string name() const override { return "sample vocab=" + std::to_string(vocab_) + " ld=" + std::to_string(ld_); }
  void prepare(Backend& backend) override {
    rows_ = {{.temperature = 0.f},
             {.temperature = 1.f, .top_k = 1, .seed = 1},
             {.temperature = 0.7f, .top_p = 1e-6f, .seed = 2, .offset = 5},
             {.temperature = 1.3f, .min_p = 1.f, .seed = 3},
             {.temperature = 0.f}};
    Random rng(6);
    std::vector<float> logits(rows_.size() * size_t(ld_));
    for (float& x : logits) x = rng.uniform(-4.f, 4.f);
    for (size_t r = 0; r < rows_.size(); ++r) {
      best_.push_back(int32_t(rng.bits() % uint64_t(vocab_)));
      logits[r * size_t(ld_) + size_t(best_.back())] = 8.0;
      if (ld_ > vocab_) logits[r * size_t(ld_) + size_t(vocab_)] = 20.0;  // past vocab: never drawn
    }
    logits_ = upload(backend, DType::kF32, std::move(logits));
  }
  void run(Backend& backend) override {
    tokens_.assign(rows_.size(), -1);
    if (!backend.can_sample()) return;
    backend.sample(logits_.view({int64_t(rows_.size()), ld_}), vocab_, rows_, tokens_);
  }
  void check(Backend& backend, Report& report) override {
    if (!backend.can_sample()) {
      try {
        backend.sample(logits_.view({int64_t(rows_.size()), ld_}), vocab_, rows_, tokens_);
        report.fail("sample() ran on a backend whose can_sample() is false");
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::kUnsupported) report.fail(std::string("sample() threw ") + e.what());
      }
      return;
    }
    std::vector<double> got(tokens_.begin(), tokens_.end()), want(best_.begin(), best_.end());
    report.exact("tokens", got, want);
  }
  double bytes() const override { return double(rows_.size()) * double(ld_) * 4; }

 private:
  int32_t vocab_, ld_;
  std::vector<SamplingRow> rows_;
  std::vector<int32_t> best_, tokens_;
  Array logits_;
};

// top_logprobs: the k best tokens of chosen rows by log-softmax, against the exact ranking and
// log-sum-exp (long double). Logits are multiples of 1/64 in [-6, 6], so distinct logits stay
// distinct after the subtraction of the lse (their log-probs are far more than an ulp apart) and
// equal logits are exact ties, which must come lower token id first (transformers' order); a
// tie is made to straddle the k-th place, and a column past vocab holds the largest logit, which
// must be ignored. A row may hold -inf (masked tokens): with fewer finite tokens than k, the -inf
// ones follow, lowest ids first.
class TopLogprobs final : public OpTest {
 public:
  TopLogprobs(int32_t vocab, int32_t padding, int32_t num_rows, std::vector<int32_t> rows, int32_t k,
              int32_t masked_row = -1)
      : vocab_(vocab), ld_(vocab + padding), num_rows_(num_rows), rows_(std::move(rows)), k_(k), masked_row_(masked_row) {}
  std::string name() const override {
    return "top_logprobs vocab=" + std::to_string(vocab_) + " ld=" + std::to_string(ld_) + " rows=" +
           std::to_string(rows_.size()) + "/" + std::to_string(num_rows_) + " k=" + std::to_string(k_) +
           (masked_row_ >= 0 ? " masked" : "");
  }
  void prepare(Backend& backend) override {
    Random rng(uint64_t(vocab_) * 31 + uint64_t(k_));
    logits_host_.resize(size_t(num_rows_) * size_t(ld_));
    for (float& x : logits_host_) x = float(int32_t(rng.bits() % 769) - 384) / 64.f;  // [-6, 6] in steps of 1/64
    for (int32_t r = 0; r < num_rows_; ++r) {
      float* row = &logits_host_[size_t(r) * size_t(ld_)];
      // k / 2 tokens above the rest, then a tie of k tokens across the k-th place.
      const int32_t above = std::min(k_ / 2, vocab_ / 2);
      for (int32_t j = 0; j < above; ++j) row[rng.bits() % uint64_t(vocab_)] = 7.f + float(j % 3);
      for (int32_t j = 0; j < k_ && j < vocab_ / 2; ++j) row[rng.bits() % uint64_t(vocab_)] = 6.5f;
      for (int32_t c = vocab_; c < ld_; ++c) row[c] = 50.f;  // past vocab: never ranked
      if (r == masked_row_) {
        for (int32_t c = 0; c < vocab_; ++c) row[c] = -std::numeric_limits<float>::infinity();
        for (int32_t j = 0; j < std::max(1, k_ / 2); ++j) row[rng.bits() % uint64_t(vocab_)] = float(j % 5) / 4.f;
      }
    }
    logits_ = upload(backend, DType::kF32, logits_host_);
  }
  void run(Backend& backend) override {
    tokens_.assign(rows_.size() * size_t(k_), -1);
    logprobs_.assign(tokens_.size(), std::nanf(""));
    backend.top_logprobs(logits_.view({num_rows_, ld_}), vocab_, rows_, k_, tokens_, logprobs_);
  }
  void check(Backend&, Report& report) override {
    std::vector<double> got_tokens, want_tokens, got, want, magnitude;
    for (size_t i = 0; i < rows_.size(); ++i) {
      const float* row = &logits_host_[size_t(rows_[i]) * size_t(ld_)];
      long double max = -INFINITY, sum = 0;
      for (int32_t c = 0; c < vocab_; ++c) max = std::max<long double>(max, row[c]);
      for (int32_t c = 0; c < vocab_; ++c) sum += std::exp((long double)row[c] - max);
      const long double lse = max + std::log(sum);
      std::vector<int32_t> order(static_cast<size_t>(vocab_));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
      for (int32_t j = 0; j < k_; ++j) {
        const size_t at = i * size_t(k_) + size_t(j);
        const int32_t t = order[size_t(j)];
        got_tokens.push_back(tokens_[at]);
        want_tokens.push_back(t);
        if (std::isinf(row[t])) {  // masked: exactly -inf
          if (logprobs_[at] != row[t]) report.fail("logprob of a masked token " + std::to_string(logprobs_[at]));
          continue;
        }
        got.push_back(logprobs_[at]);
        want.push_back(double((long double)row[t] - lse));
        magnitude.push_back(std::abs(double(row[t])) + std::abs(double(lse)));
      }
    }
    report.exact("tokens", got_tokens, want_tokens);
    report.close("logprobs", got, want, magnitude, DType::kF32, DType::kF32, Tolerance{});
  }
  double bytes() const override { return double(rows_.size()) * double(vocab_) * 4; }

 private:
  int32_t vocab_, ld_, num_rows_;
  std::vector<int32_t> rows_;
  int32_t k_, masked_row_;
  std::vector<float> logits_host_;
  std::vector<int32_t> tokens_;
  std::vector<float> logprobs_;
  Array logits_;
};

// What the planners ask of a backend: device_info (workers), prefix_planning, graph_rows (a
// ladder: at least the rows, non-decreasing, 0 past its top or on a backend without graphs).
class Queries final : public OpTest {
 public:
  std::string name() const override { return "device_info/prefix_planning/graph_rows"; }
  void prepare(Backend&) override {}
  void run(Backend&) override {}
  void check(Backend& backend, Report& report) override {
    KvScenario kv(backend, attention_shape(4, 2, 64, 16), 4);
    kv.allocate();  // a GPU backend sizes its workers for the cache's shape
    if (backend.device_info().num_workers < 1) report.fail("device_info().num_workers < 1");
    if (const auto planning = backend.prefix_planning(kv.shape())) {
      if (planning->device.num_workers < 1 || planning->options.m_tiles.empty())
        report.fail("prefix_planning() without workers or M tiles");
    }
    int32_t previous = 0;
    bool ended = false;
    for (int32_t rows = 1; rows <= 1024; ++rows) {
      const int32_t padded = backend.graph_rows(rows);
      if (padded == 0) {
        ended = true;
        continue;
      }
      if (ended || padded < rows || padded < previous)
        report.fail("graph_rows(" + std::to_string(rows) + ") = " + std::to_string(padded));
      previous = padded;
    }
  }
  double bytes() const override { return 0; }
};

}  // namespace pagoda::backend_ops

#include "quantized_kv_steps.h"  // the quantized-KV rows, written against the classes above

namespace pagoda::backend_ops {

// ---- The tables ------------------------------------------------------------------------------

// Small shapes (the CPU runs them in CI), with the odd sizes and dtypes that take other paths.
inline std::vector<std::unique_ptr<OpTest>> correctness_table() {
  std::vector<std::unique_ptr<OpTest>> t;
  auto add = [&](OpTest* op) { t.emplace_back(op); };
  using R = RmsNorm::Kind;
  using E = Elementwise::Kind;
  using A = AttentionSteps::Kind;
  add(new BufferRoundTrip(0));
  add(new BufferRoundTrip(4099));
  add(new Queries());
  add(new Embed(50, 576, {7, 0, 49, 7, 23}));
  add(new Embed(50, 64, {3, 1}, DType::kF16));
  add(new Embed(50, 64, {3, 1}, DType::kBF16));
  add(new RmsNorm(R::kPlain, 9, 576));
  add(new RmsNorm(R::kPlain, 3, 4096));
  add(new RmsNorm(R::kLogitRows, 9, 576, {8, 0, 3}));
  add(new RmsNorm(R::kAddFirst, 5, 4096));
  add(new RmsNorm(R::kAddFirst, 3, 576));
  add(new RmsNorm(R::kAddFirst, 3, 16));
  add(new Matmul(1, 576, 576, {}, false));            // a decode row
  add(new Matmul(3, 64, 576, {}, true));
  add(new Matmul(33, 512, 96, {}, false));            // many rows: the CPU's sgemm path
  add(new Matmul(4, 1000, 576, {}, false, true));     // the logits, f32
  add(new Matmul(1, 37, 64, DType::kF16, false));     // CPU: stored f16/bf16/f32 weights, odd sizes
  add(new Matmul(5, 7, 13, DType::kF16, true));
  add(new Matmul(4, 19, 35, DType::kBF16, false));
  add(new Matmul(33, 513, 100, DType::kBF16, false));
  add(new Matmul(8, 300, 72, DType::kF32, true));
  // GGUF blocks (the CUDA backend: a GEMV up to 16 rows, SIMT for one row and bf16, tensor cores
  // for 2-16 rows of f16; dequantized + cuBLASLt above): every type at one decode row; rows 18
  // blocks long (SmolLM2's 576) whose starts are not 16-byte aligned; the logits, 1000 rows (a
  // partial tile of 16); a bias on every path.
  for (DType q : {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                  DType::kQ6_K})
    add(new Matmul(1, 72, 1280, q, false));
  add(new Matmul(5, 64, 576, DType::kQ4_1, true));
  add(new Matmul(3, 1000, 576, DType::kQ8_0, false, true));
  add(new Matmul(16, 40, 768, DType::kQ6_K, false));
  add(new Matmul(17, 64, 512, DType::kQ4_K, false));
  add(new Matmul(40, 48, 256, DType::kQ5_1, false));
  add(new Matmul(65, 72, 576, DType::kQ5_0, true));
  add(new Embed(50, 576, {7, 0, 49, 7, 23}, DType::kQ8_0));
  add(new Embed(20, 256, {3, 19}, DType::kQ6_K));
  add(new Elementwise(E::kSiluMul, 4, 1536));
  add(new Elementwise(E::kSiluMul, 2, 8));
  add(new Elementwise(E::kAdd, 3, 2056));             // 257 vectors per row: a GPU's grid-stride tail
  for (const attention::AttentionShape& shape : {attention_shape(4, 2, 64, 16), attention_shape(6, 2, 128, 32),
                                                 attention_shape(8, 1, 64, 16)}) {
    for (A kind : {A::kPrefill, A::kDecode, A::kDecodeGraph, A::kPrefix, A::kPrefixGraph}) add(new AttentionSteps(kind, shape));
  }
  add(new Sample(1000, 3));
  add(new Sample(32000, 0));
  add(new QuantizedAttentionSteps(KvQuant::kFp8, attention_shape(4, 2, 64, 16), false));
  add(new QuantizedAttentionSteps(KvQuant::kFp8, attention_shape(8, 2, 128, 64), true));
  add(new QuantizedAttentionSteps(KvQuant::kInt2, attention_shape(4, 2, 64, 64), false));
  add(new QuantizedAttentionSteps(KvQuant::kInt2, attention_shape(8, 2, 128, 64), true));
  add(new QuantizedAttentionSteps(KvQuant::kInt2, attention_shape(4, 4, 128, 64), true));
  add(new TopLogprobs(1000, 3, 4, {2, 0, 3}, 8));
  add(new TopLogprobs(1000, 0, 3, {1, 2}, 10, 2));  // row 2: 5 finite tokens, 5 masked ones follow
  add(new TopLogprobs(50, 0, 2, {1, 0}, 50));       // k = vocab: the whole row sorted
  add(new TopLogprobs(32000, 0, 5, {4, 3, 2, 1, 0}, 64));
  add(new TopLogprobs(5000, 1, 1, {0}, kMaxTopLogprobs));
  return t;
}

// Model-sized shapes for --perf: Llama-3-8B's (hidden 4096, 32 q / 8 kv heads of 128) at batch 1
// and a batch (64 rows on a GPU, 16 on a CPU), and a prefill-sized matmul.
inline std::vector<std::unique_ptr<OpTest>> perf_table(const Backend& backend) {
  const bool gpu = backend.device() != Device::kCpu;
  const int64_t batch = gpu ? 64 : 16, prefill = gpu ? 4096 : 256;
  const int32_t kv_len = gpu ? 4096 : 1024;
  const std::optional<DType> weights = gpu ? std::nullopt : std::optional<DType>(DType::kBF16);
  std::vector<std::unique_ptr<OpTest>> t;
  auto add = [&](OpTest* op) { t.emplace_back(op); };
  using R = RmsNorm::Kind;
  using E = Elementwise::Kind;
  using P = AttentionPerf::Op;
  add(new Embed(4096, 4096, std::vector<int32_t>(size_t(batch), 1000), weights));
  add(new RmsNorm(R::kPlain, batch, 4096));
  add(new RmsNorm(R::kAddFirst, batch, 4096));
  for (int64_t rows : {int64_t(1), batch}) {
    add(new Matmul(rows, 6144, 4096, weights, false));   // qkv
    add(new Matmul(rows, 28672, 4096, weights, false));  // gate_up
    add(new Matmul(rows, 4096, 14336, weights, false));  // down
  }
  add(new Matmul(prefill, 4096, 4096, weights, false));
  if (gpu) {
    for (DType q : {DType::kQ4_K, DType::kQ8_0})
      for (int64_t rows : {int64_t(1), int64_t(16), batch}) add(new Matmul(rows, 28672, 4096, q, false));
  }
  add(new Elementwise(E::kSiluMul, batch, 14336));
  add(new Elementwise(E::kAdd, batch, 4096));
  const attention::AttentionShape llama = attention_shape(32, 8, 128, 16);
  add(new AttentionPerf(P::kRopeAppendKv, DecodeMode::kPaged, llama, int32_t(batch), kv_len, 0));
  add(new AttentionPerf(P::kAttention, DecodeMode::kPaged, llama, 1, kv_len, 0));
  add(new AttentionPerf(P::kAttention, DecodeMode::kPaged, llama, int32_t(batch), kv_len, 0));
  add(new AttentionPerf(P::kAttention, DecodeMode::kPrefix, llama, int32_t(batch), kv_len, kv_len / 2));
  std::vector<int32_t> all_rows(static_cast<size_t>(batch));
  std::iota(all_rows.begin(), all_rows.end(), 0);
  add(new TopLogprobs(128256, 0, int32_t(batch), all_rows, 8));  // 16 beam searches of width 4 (K = 2W)
  return t;
}

// ---- Runners ----------------------------------------------------------------------------------

// Every case of the correctness table on backend, each checked; prints each case's worst
// |error| / tolerance (or why it was skipped).
inline void test_every_op(Backend& backend, const std::string& label) {
  for (std::unique_ptr<OpTest>& op : correctness_table()) {
    if (const char* why = op->unsupported(backend)) {
      std::printf("  %-6s %-80s skipped: %s\n", label.c_str(), op->name().c_str(), why);
      continue;
    }
    SCOPED_TRACE(label + ": " + op->name());
    Report report(label + ": " + op->name());
    const auto start = std::chrono::steady_clock::now();
    try {
      op->prepare(backend);
      op->run(backend);
      op->check(backend, report);
    } catch (const std::exception& e) {
      report.fail(std::string("threw: ") + e.what());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::printf("  %-6s %-80s %s  worst |error|/tolerance %.3f  (%.0f ms)\n", label.c_str(), op->name().c_str(),
                report.failures() ? "FAIL" : "ok  ", report.worst(), ms);
    op.reset();
  }
}

// The roofline of a backend, measured or specified in the same run.
struct Roofline {
  double bytes_per_second = 0;  // streaming bandwidth
  double flops_per_second = 0;  // peak of the matmul's arithmetic
  std::string bandwidth_from, flops_from;
};

// Each perf case, run repeatedly for at least min_seconds after a warm-up: its time, GB/s and
// TFLOP/s, and the fraction of the roofline bound max(bytes / bandwidth, flops / peak) it
// reaches. Ops are asynchronous on a GPU: a download of a few bytes waits for them.
inline void run_perf(Backend& backend, const std::string& label, const Roofline& roofline, double min_seconds = 0.2) {
  std::printf("%s: bandwidth %.1f GB/s (%s), peak %.2f TFLOP/s (%s)\n\n", label.c_str(),
              roofline.bytes_per_second / 1e9, roofline.bandwidth_from.c_str(), roofline.flops_per_second / 1e12,
              roofline.flops_from.c_str());
  std::printf("A case repeated back to back keeps operands that fit in cache there: it can pass its\n"
              "memory bound (of bound > 1).\n\n");
  std::printf("| op | time (us) | GB/s | TFLOP/s | bound (us) | of bound |\n|---|---:|---:|---:|---:|---:|\n");
  const std::shared_ptr<Backend::Buffer> fence = backend.allocate(4);
  uint8_t sink[4];
  const auto wait = [&] { backend.download(sink, fence->data(), sizeof sink); };
  for (std::unique_ptr<OpTest>& op : perf_table(backend)) {
    if (const char* why = op->unsupported(backend)) {
      std::printf("| %s | skipped: %s |||||\n", op->name().c_str(), why);
      continue;
    }
    op->prepare(backend);
    op->run(backend);  // warm-up: first-use setup (GEMM algorithm choice, kernel attributes)
    wait();
    int64_t runs = 0;
    const auto start = std::chrono::steady_clock::now();
    double seconds = 0;
    while (seconds < min_seconds || runs < 3) {
      op->run(backend);
      ++runs;
      if (runs % 8 == 0 || seconds == 0) {
        wait();
        seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      }
    }
    wait();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / double(runs);
    const double bound = std::max(op->bytes() / roofline.bytes_per_second, op->flops() / roofline.flops_per_second);
    std::printf("| %s | %.1f | %.1f | %.2f | %.1f | %.2f |\n", op->name().c_str(), seconds * 1e6,
                op->bytes() / seconds / 1e9, op->flops() / seconds / 1e12, bound * 1e6, bound / seconds);
    std::fflush(stdout);
    op.reset();  // its buffers go before the next case's
  }
}

// The test binaries' main: --perf runs perf(), anything else the gtest tests.
inline int main_with_perf(int argc, char** argv, const std::function<void()>& perf) {
  bool want_perf = false;
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--perf") {
      want_perf = true;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  ::testing::InitGoogleTest(&argc, argv);
  if (!want_perf) return RUN_ALL_TESTS();
  perf();
  return 0;
}

}  // namespace pagoda::backend_ops
