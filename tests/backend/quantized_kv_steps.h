// The backend-op table's rows for an fp8 or int2 KV cache (included by backend_ops.h):
// allocate_kv_cache, rope_append_kv, attention and copy_kv_block through the Backend interface,
// against the CPU's reference cache and executors (backend/cpu/quantized_kv_cache.h,
// quantized_attention.h) fed the same K and V.
//
// RoPE is the identity here (inv_freq 0: cos 1, sin 0 exactly on every backend), so the K a
// backend quantizes is bit for bit the K the reference quantizes, and the codes (seeded
// stochastic rounding) are the same; the Hadamard rotation, when on, is part of what is checked.
//
// Tolerances, in backend_ops.h's terms plus what quantizing on the fly adds:
//   - decode rows against cpu::attend_quantized_group on the reference cache: both compute the
//     same integer dot products; the scores differ by fp32 rounding (|Δs| <= 16 u_f32 times the
//     score's terms, at most 4 D max|q| max|k|), and that can move a P code across a rounding
//     boundary: one code step (the partition's (max p - min p) / 255) per token of a sealed int2
//     partition, times max|v|, over sum p;
//   - prefill rows on a GPU read the cached blocks widened to T (exact f64 attention on the
//     dequantized cache is their reference, with the f16 prefill kernel's tolerance); on the CPU
//     backend they are the reference executor itself.
// A wrong block, token, head or layer moves an output by O(max|v|), far outside either.
#pragma once

#include <numeric>

#include "pagoda/backend/cpu/hadamard.h"
#include "pagoda/backend/cpu/kv_quantize.h"
#include "pagoda/backend/cpu/quantized_attention.h"
#include "pagoda/backend/cpu/quantized_kv_cache.h"

namespace pagoda::backend_ops {

// K and V [length, dim] of one head of a CPU quantized cache as attention reads them, in f64.
inline void dequantize_head(const QuantizedPagedKv& kv, int32_t head, std::span<const int32_t> blocks, int32_t length,
                            std::vector<double>& k, std::vector<double>& v) {
  const int32_t dim = kv.head_dim;
  k.assign(size_t(length) * size_t(dim), 0);
  v.assign(k.size(), 0);
  for (int32_t t = 0; t < length; ++t) {
    const int64_t block = blocks[size_t(t / kv.block_size)], slot = t % kv.block_size;
    double* kt = &k[size_t(t) * size_t(dim)];
    double* vt = &v[size_t(t) * size_t(dim)];
    if (kv.quant == KvQuant::kFp8) {
      const int64_t at = block * kv.k_codes_block() + head * kv.k_codes_head() + slot * dim;
      const int64_t s = block * kv.fp8_scale_block() + head * kv.fp8_scale_head() + slot;
      for (int32_t d = 0; d < dim; ++d) {
        kt[d] = double(kv.k_fp8_scale[s]) * cpu::e4m3_to_f32(kv.k_codes[at + d]);
        vt[d] = double(kv.v_fp8_scale[s]) * cpu::e4m3_to_f32(kv.v_codes[at + d]);
      }
      continue;
    }
    const uint8_t* kc = kv.k_codes + block * kv.k_codes_block() + head * kv.k_codes_head() + slot * (dim / 4);
    for (int32_t d = 0; d < dim; ++d) {
      const int64_t m = block * kv.k_meta_block() + head * kv.k_meta_head() + slot * kv.k_parts() + d / kv.partition;
      kt[d] = f16_to_f32(kv.k_min[m].bits) + double(f16_to_f32(kv.k_scale[m].bits)) * cpu::int2_code(kc, d);
    }
    const int32_t index = int32_t(slot) / kv.partition;
    if (index < kv.sealed[block]) {
      for (int32_t c = 0; c < dim; ++c) {
        const int64_t m = block * kv.v_meta_block() + head * kv.v_meta_head() + int64_t(index) * dim + c;
        const uint8_t* vc = kv.v_codes + block * kv.v_codes_block() + head * kv.v_codes_head() +
                            int64_t(c) * (kv.block_size / 4);
        vt[c] = f16_to_f32(kv.v_min[m].bits) + double(f16_to_f32(kv.v_scale[m].bits)) * cpu::int2_code(vc, slot);
      }
    } else {
      const f16* tail = kv.tail + int64_t(kv.tail_slot[block]) * kv.tail_slot_stride() + head * kv.tail_head() +
                        (slot % kv.partition) * dim;
      for (int32_t c = 0; c < dim; ++c) vt[c] = f16_to_f32(tail[c].bits);
    }
  }
}

class QuantizedAttentionSteps final : public OpTest {
 public:
  QuantizedAttentionSteps(KvQuant quant, attention::AttentionShape shape, bool hadamard)
      : quant_(quant), shape_(shape), hadamard_(hadamard) {}
  std::string name() const override {
    return std::string("rope_append_kv+attention ") + kv_quant_name(quant_) + (hadamard_ ? " hadamard" : "") +
           " q_heads=" + std::to_string(shape_.num_q_heads) + " kv_heads=" + std::to_string(shape_.num_kv_heads) +
           " head_dim=" + std::to_string(shape_.head_dim) + " block=" + std::to_string(shape_.block_size);
  }
  void prepare(Backend&) override { report_ = Report(name()); }
  void run(Backend& backend) override {
    backend_ = &backend;
    run_steps(backend);
  }
  void check(Backend&, Report& report) override { report.merge(report_); }
  double bytes() const override { return 0; }

 private:
  static constexpr int kLayers = 2;
  static constexpr int32_t kBlocks = 24;

  kv::KvCacheConfig config(DType dtype) const {
    return {.num_layers = kLayers, .num_blocks = kBlocks, .block_size = shape_.block_size,
            .num_kv_heads = shape_.num_kv_heads, .head_dim = shape_.head_dim, .dtype = dtype,
            .layout = KvLayout::kHnd, .quant = quant_, .partition = 64, .seed = 0x5eed,
            .hadamard = hadamard_, .stochastic_rounding = true};
  }
  int64_t q_width() const { return int64_t(shape_.num_q_heads) * shape_.head_dim; }
  int64_t kv_width() const { return int64_t(shape_.num_kv_heads) * shape_.head_dim; }
  int64_t qkv_width() const { return q_width() + 2 * kv_width(); }

  struct Sequence {
    std::vector<int32_t> blocks;
    int32_t length = 0;
  };

  void run_steps(Backend& backend) {
    seqs_.clear();
    steps_ = 0;
    backend.allocate_kv_cache(config(DType::kF16));
    reference_.emplace(config(DType::kF16));
    inv_freq_.assign(size_t(shape_.head_dim / 2), 0.f);
    const int32_t bs = shape_.block_size;
    auto blocks = [&](int32_t first, int32_t tokens) {
      std::vector<int32_t> ids(size_t((tokens + bs - 1) / bs));
      std::iota(ids.begin(), ids.end(), first);
      return ids;
    };
    // a crosses a V partition boundary while decoding, b while prefilling a chunk over its cached
    // prefix next to decode rows; c shares b's full blocks and a copy of its partial one.
    seqs_ = {{blocks(0, 160), 0}, {blocks(8, 160), 0}};
    step({{0, 125}, {1, 37}});
    for (int i = 0; i < 2; ++i) step({{0, 1}, {1, 1}});
    step({{0, 1}, {1, 30}});
    for (int i = 0; i < 3; ++i) step({{0, 1}, {1, 1}}, /*graph=*/true);
    const Sequence& b = seqs_[1];
    const int32_t partial = b.length / bs;
    Sequence c{std::vector<int32_t>(b.blocks.begin(), b.blocks.begin() + partial), b.length};
    c.blocks.push_back(20);
    c.blocks.push_back(21);
    backend.copy_kv_block(b.blocks[size_t(partial)], 20);
    reference_->copy_block(b.blocks[size_t(partial)], 20);
    seqs_.push_back(c);
    for (int i = 0; i < 3; ++i) step({{0, 1}, {1, 1}, {2, 1}}, /*graph=*/true);
  }

  // One step of (sequence, new tokens): decode rows first, as the model orders them.
  void step(std::vector<std::pair<int, int32_t>> chunks, bool graph = false) {
    Backend& backend = *backend_;
    std::stable_sort(chunks.begin(), chunks.end(), [](auto& x, auto& y) { return (x.second == 1) > (y.second == 1); });
    StepBatch step;
    step.shape = shape_;
    step.rope_inv_freq = inv_freq_;
    std::vector<int> row_seq;
    for (const auto& [seq, n] : chunks) {
      Sequence& s = seqs_[size_t(seq)];
      step.sequences.push_back({s.blocks, s.length, n, int32_t(step.tokens.size())});
      for (int32_t t = 0; t < n; ++t) {
        step.tokens.push_back(0);
        step.positions.push_back(s.length + t);
        step.slot_blocks.push_back(s.blocks[size_t((s.length + t) / shape_.block_size)]);
        row_seq.push_back(seq);
      }
      if (n == 1) {
        step.decode_batch.add_sequence(s.blocks, s.length + 1);
      } else {
        step.prefill_seqs.push_back(int32_t(step.sequences.size()) - 1);
      }
    }
    const auto real_rows = int32_t(step.tokens.size());
    const int32_t num_decode = step.decode_batch.num_seqs();
    const int32_t graph_rows = graph && step.prefill_seqs.empty() ? backend.graph_rows(num_decode) : 0;
    attention::DecodeBatch padded = step.decode_batch;
    for (int32_t r = num_decode; r < graph_rows; ++r) padded.add_sequence({}, 0);
    attention::DecodePlan plan = attention::plan_decode(padded, shape_, backend.device_info());
    if (graph_rows >= num_decode && graph_rows > 0 && plan.merges.empty()) {
      step.decode_batch = std::move(padded);
      step.decode_plan = std::move(plan);
      step.graph_rows = graph_rows;
      for (int32_t r = num_decode; r < graph_rows; ++r) {
        step.tokens.push_back(0);
        step.positions.push_back(0);
        step.slot_blocks.push_back(-1);
      }
    } else if (num_decode > 0) {
      step.decode_plan = attention::plan_decode(step.decode_batch, shape_, backend.device_info());
    }
    for (int32_t r = 0; r < real_rows; ++r) step.logit_rows.push_back(r);
    const auto rows = int32_t(step.tokens.size());

    const DType act = backend.activation_dtype();
    Random rng(uint64_t(++steps_) * 104729);
    std::vector<std::vector<float>> qkv(kLayers);
    std::vector<std::shared_ptr<Backend::Buffer>> qkv_buf, q_buf, out_buf;
    for (int l = 0; l < kLayers; ++l) {
      qkv[size_t(l)].resize(size_t(rows * qkv_width()));
      for (float& v : qkv[size_t(l)]) v = round_to(act, rng.uniform(-1.f, 1.f));
      qkv_buf.push_back(upload(backend, act, qkv[size_t(l)]).buffer);
      q_buf.push_back(output_array(backend, act, size_t(rows * q_width())).buffer);
      out_buf.push_back(output_array(backend, act, size_t(rows * q_width())).buffer);
    }
    auto tensor = [&](const std::shared_ptr<Backend::Buffer>& b, std::initializer_list<int64_t> shape) {
      return Tensor::contiguous(b->data(), act, shape, backend.device());
    };
    backend.begin_step(step);
    const auto body = [&] {
      for (int l = 0; l < kLayers; ++l) {
        backend.rope_append_kv(l, step, tensor(qkv_buf[size_t(l)], {rows, qkv_width()}),
                               tensor(q_buf[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}));
        backend.attention(l, step, tensor(q_buf[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}),
                          tensor(out_buf[size_t(l)], {rows, shape_.num_q_heads, shape_.head_dim}));
      }
    };
    if (step.graph_rows > 0) {
      backend.run_graph(body);
    } else {
      body();
    }

    // The reference cache: each sequence's K (Hadamard-rotated when on) and V, as fp32 rows.
    for (int l = 0; l < kLayers; ++l) {
      for (const SequenceStep& s : step.sequences) {
        std::vector<float> k(size_t(s.num_new * kv_width())), v(k.size());
        for (int32_t i = 0; i < s.num_new; ++i) {
          const float* row = &qkv[size_t(l)][size_t((s.row_begin + i) * qkv_width())];
          std::copy(row + q_width(), row + q_width() + kv_width(), &k[size_t(i * kv_width())]);
          std::copy(row + q_width() + kv_width(), row + q_width() + 2 * kv_width(), &v[size_t(i * kv_width())]);
        }
        if (hadamard_) cpu::hadamard_rotate(k.data(), int64_t(s.num_new) * shape_.num_kv_heads, shape_.head_dim);
        auto view = [&](std::vector<float>& x) {
          return Tensor::contiguous(x.data(), DType::kF32, {s.num_new, shape_.num_kv_heads, shape_.head_dim});
        };
        reference_->write(l, s.block_ids, s.start_pos, view(k), view(v));
      }
    }
    for (const auto& [seq, n] : chunks) seqs_[size_t(seq)].length += n;
    for (int l = 0; l < kLayers; ++l) check_layer(backend, l, step, qkv[size_t(l)], row_seq, q_buf[size_t(l)], out_buf[size_t(l)]);
  }

  void check_layer(Backend& backend, int l, const StepBatch& step, const std::vector<float>& qkv,
                   const std::vector<int>& row_seq, const std::shared_ptr<Backend::Buffer>& q_buf,
                   const std::shared_ptr<Backend::Buffer>& out_buf) {
    const DType act = backend.activation_dtype();
    const auto real_rows = int32_t(row_seq.size());
    const int32_t d = shape_.head_dim, group = shape_.group_size();
    auto fetch_rows = [&](const std::shared_ptr<Backend::Buffer>& b) {
      std::vector<uint8_t> bytes(size_t(real_rows) * size_t(q_width()) * dtype_size(act));
      backend.download(bytes.data(), b->data(), bytes.size());
      return decode(act, bytes);
    };
    const std::vector<double> q = fetch_rows(q_buf), out = fetch_rows(out_buf);
    // q: the raw q, Hadamard-rotated when on (a sum of d terms of |q|), rounded to T.
    std::vector<double> q_ref(q.size()), q_mag(q.size());
    for (int32_t r = 0; r < real_rows; ++r) {
      std::vector<float> x(&qkv[size_t(r * qkv_width())], &qkv[size_t(r * qkv_width() + q_width())]);
      double mag = 0;
      if (hadamard_) {
        for (float f : x) mag = std::max(mag, double(std::abs(f)));
        cpu::hadamard_rotate(x.data(), shape_.num_q_heads, d);
      }
      for (int64_t i = 0; i < q_width(); ++i) {
        q_ref[size_t(r * q_width() + i)] = x[size_t(i)];
        q_mag[size_t(r * q_width() + i)] = hadamard_ ? mag * std::sqrt(double(d)) : std::abs(x[size_t(i)]);
      }
    }
    report_.close("layer " + std::to_string(l) + " q", q, q_ref, q_mag, act, act, {.reduction = hadamard_ ? d : 0});

    const QuantizedPagedKv pool = reference_->layer(l);
    const bool gpu = backend.device() != Device::kCpu;
    std::vector<double> o_ref(out.size()), o_tol(out.size());
    for (const SequenceStep& s : step.sequences) {
      for (int32_t h = 0; h < shape_.num_kv_heads; ++h) {
        // The sequence's K and V after this step, read by each of its rows up to its position.
        std::vector<double> k, v;
        dequantize_head(pool, h, s.block_ids, s.start_pos + s.num_new, k, v);
        double k_max = 0, v_max = 0;
        for (double x : k) k_max = std::max(k_max, std::abs(x));
        for (double x : v) v_max = std::max(v_max, std::abs(x));
        for (int32_t i = 0; i < s.num_new; ++i) {
          const int32_t row = s.row_begin + i, length = s.start_pos + i + 1;
          const bool decode_row = s.num_new == 1;
          const int64_t first = (int64_t(row) * shape_.num_q_heads + int64_t(h) * group) * d;
          std::vector<float> qg(size_t(group * d));
          for (size_t j = 0; j < qg.size(); ++j) qg[j] = float(q[size_t(first) + j]);
          if (decode_row || !gpu) {
            std::vector<float> o(static_cast<size_t>(group * d)), lse(static_cast<size_t>(group));
            cpu::attend_quantized_group(pool, h, s.block_ids, length, qg.data(), group, shape_.softmax_scale, o.data(),
                                        lse.data());
            std::vector<float> scores(size_t(group) * size_t(length));
            if (gpu) cpu::quantized_scores(pool, h, s.block_ids, length, qg.data(), group, scores.data());
            for (int32_t r = 0; r < group; ++r) {
              double q_max = 0;
              for (int32_t j = 0; j < d; ++j) q_max = std::max(q_max, double(std::abs(qg[size_t(r * d + j)])));
              // P relative to its max; one code step per token of each sealed int2 partition.
              const float* sr = &scores[size_t(r) * size_t(length)];
              const double s_max = *std::max_element(sr, sr + length) * double(shape_.softmax_scale);
              std::vector<double> p(static_cast<size_t>(length));
              double sum = 0;
              for (int32_t t = 0; t < length; ++t) sum += p[size_t(t)] = std::exp(sr[t] * double(shape_.softmax_scale) - s_max);
              double flips = 0;
              if (gpu && quant_ == KvQuant::kInt2)
                for (int32_t t0 = 0; t0 + 64 <= length; t0 += 64) {
                  const auto [lo, hi] = std::minmax_element(p.begin() + t0, p.begin() + t0 + 64);
                  flips += 64 * (*hi - *lo) / 255;
                }
              const double score_terms = 2 * double(shape_.softmax_scale) * 4 * d * q_max * k_max;
              for (int32_t j = 0; j < d; ++j) {
                const size_t at = size_t(first + r * d + j);
                o_ref[at] = o[size_t(r * d + j)];
                // Output and partial states rounded to T; fp32 score and sum errors; code flips.
                o_tol[at] = unit_roundoff(act) * (std::abs(o_ref[at]) + 3 * v_max) +
                            double(length + d + kElementRoundoffs) * kF32Roundoff * v_max * (1 + score_terms) +
                            kFloor + 1.01 * v_max * flips / sum;
              }
            }
          } else {
            // GPU prefill: exact attention on the dequantized cache.
            for (int32_t r = 0; r < group; ++r) {
              std::vector<double> sc(static_cast<size_t>(length));
              double s_max = -INFINITY, score_mag = 0;
              for (int32_t t = 0; t < length; ++t) {
                double dot = 0, mag = 0;
                for (int32_t j = 0; j < d; ++j) {
                  dot += qg[size_t(r * d + j)] * k[size_t(t * d + j)];
                  mag += std::abs(qg[size_t(r * d + j)] * k[size_t(t * d + j)]);
                }
                sc[size_t(t)] = dot * shape_.softmax_scale;
                s_max = std::max(s_max, sc[size_t(t)]);
                score_mag = std::max(score_mag, mag * shape_.softmax_scale);
              }
              double sum = 0;
              for (double& x : sc) sum += (x = std::exp(x - s_max));
              for (int32_t j = 0; j < d; ++j) {
                double o = 0, mag = 0;
                for (int32_t t = 0; t < length; ++t) {
                  o += sc[size_t(t)] / sum * v[size_t(t * d + j)];
                  mag += sc[size_t(t)] / sum * std::abs(v[size_t(t * d + j)]);
                }
                const size_t at = size_t(first + r * d + j);
                o_ref[at] = o;
                // The widened K and V are rounded to T once more (r = 4: K, V, P, partials).
                o_tol[at] = tolerance(act, act, {.roundings = 4, .reduction = length + d}, o, mag * (1 + score_mag));
              }
            }
          }
        }
      }
    }
    report_.within("layer " + std::to_string(l) + " attention out", out, o_ref, o_tol);
  }

  KvQuant quant_;
  attention::AttentionShape shape_;
  bool hadamard_;
  Report report_{""};
  Backend* backend_ = nullptr;
  std::optional<cpu::QuantizedKvCache> reference_;
  std::vector<Sequence> seqs_;
  std::vector<float> inv_freq_;
  int steps_ = 0;
};

}  // namespace pagoda::backend_ops
