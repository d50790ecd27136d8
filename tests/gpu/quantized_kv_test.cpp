// The CUDA backend's fp8 and int2 KV cache against the CPU's, byte for byte: the same K and V rows
// (f16 values, RoPE the identity so both backends quantize the same fp32 numbers) appended through
// rope_append_kv in a prefill, chunks and decode steps that cross V partition boundaries, and a
// copy on write of a partial block. Every code, min, scale, sum and fp8 scale, and the f16 tail of
// each open int2 partition, must be equal: the GPU's rounding, generator and packing are the
// CPU's (kernels/kv_quantize.cuh against backend/cpu/kv_quantize.cpp).
#include <cuda_runtime.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "gpu_test.h"
#include "pagoda/backend/cpu/hadamard.h"
#include "pagoda/backend/cpu/quantized_kv_cache.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/core/half.h"

namespace pagoda::cuda {
namespace {

struct Format {
  KvQuant quant;
  int32_t head_dim;
  int32_t block_size;
  bool hadamard;
};

class QuantizedKvBytes : public GpuTestWithParam<Format> {};

std::vector<uint8_t> device_bytes(const void* p, size_t bytes) {
  std::vector<uint8_t> host(bytes);
  check_cuda(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), "download");
  return host;
}

TEST_P(QuantizedKvBytes, EqualTheCpuCacheByteForByte) {
  const Format f = GetParam();
  const int32_t q_heads = 4, kv_heads = 2, d = f.head_dim, bs = f.block_size, layers = 2, num_blocks = 24;
  const kv::KvCacheConfig config{.num_layers = layers, .num_blocks = num_blocks, .block_size = bs,
                                 .num_kv_heads = kv_heads, .head_dim = d, .dtype = DType::kF16,
                                 .layout = KvLayout::kHnd, .quant = f.quant, .partition = 64, .seed = 99,
                                 .hadamard = f.hadamard, .stochastic_rounding = true};
  CudaBackend gpu(DType::kF16, CudaBackendOptions{.graphs = false});
  gpu.allocate_kv_cache(config);
  cpu::QuantizedKvCache cpu(config);
  const std::vector<float> inv_freq(size_t(d / 2), 0.f);
  const attention::AttentionShape shape{.num_q_heads = q_heads, .num_kv_heads = kv_heads, .head_dim = d,
                                        .block_size = bs, .softmax_scale = 0.125f};
  const int64_t width = int64_t(q_heads + 2 * kv_heads) * d, kv_width = int64_t(kv_heads) * d;
  // Sequence a in blocks 0.., b in blocks 10..; chunks of (sequence, tokens).
  std::vector<std::vector<int32_t>> tables(2, std::vector<int32_t>(10));
  std::iota(tables[0].begin(), tables[0].end(), 0);
  std::iota(tables[1].begin(), tables[1].end(), 10);
  std::vector<int32_t> lengths = {0, 0};
  uint32_t state = 7;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return f16_to_f32(f32_to_f16(float(int32_t(state >> 8) - (1 << 23)) * 0x1p-23f * 3.f));
  };
  auto buffer = gpu.allocate(size_t(200 * width * 2));
  auto q_out = gpu.allocate(size_t(200 * q_heads * d * 2));
  auto append = [&](const std::vector<std::pair<int, int32_t>>& chunks) {
    StepBatch step;
    step.shape = shape;
    step.rope_inv_freq = inv_freq;
    for (const auto& [seq, n] : chunks) {
      step.sequences.push_back({tables[size_t(seq)], lengths[size_t(seq)], n, int32_t(step.tokens.size())});
      for (int32_t t = 0; t < n; ++t) {
        const int32_t pos = lengths[size_t(seq)] + t;
        step.tokens.push_back(0);
        step.positions.push_back(pos);
        step.slot_blocks.push_back(tables[size_t(seq)][size_t(pos / bs)]);
      }
    }
    const auto rows = int64_t(step.tokens.size());
    std::vector<float> values(size_t(rows * width));
    for (float& v : values) v = next();
    std::vector<uint16_t> halves(values.size());
    for (size_t i = 0; i < values.size(); ++i) halves[i] = f32_to_f16(values[i]);
    gpu.upload(buffer->data(), halves.data(), halves.size() * 2);
    gpu.begin_step(step);
    for (int l = 0; l < layers; ++l) {
      gpu.rope_append_kv(l, step, Tensor::contiguous(buffer->data(), DType::kF16, {rows, width}, Device::kCuda),
                         Tensor::contiguous(q_out->data(), DType::kF16, {rows, q_heads, d}, Device::kCuda));
      for (const SequenceStep& s : step.sequences) {
        std::vector<float> k(size_t(s.num_new * kv_width)), v(k.size());
        for (int32_t i = 0; i < s.num_new; ++i) {
          const float* row = &values[size_t((s.row_begin + i) * width + q_heads * d)];
          std::copy(row, row + kv_width, &k[size_t(i * kv_width)]);
          std::copy(row + kv_width, row + 2 * kv_width, &v[size_t(i * kv_width)]);
        }
        if (f.hadamard) cpu::hadamard_rotate(k.data(), int64_t(s.num_new) * kv_heads, d);
        cpu.write(l, s.block_ids, s.start_pos, Tensor::contiguous(k.data(), DType::kF32, {s.num_new, kv_heads, d}),
                  Tensor::contiguous(v.data(), DType::kF32, {s.num_new, kv_heads, d}));
      }
    }
    for (const auto& [seq, n] : chunks) lengths[size_t(seq)] += n;
    check_cuda(cudaDeviceSynchronize(), "append");
  };
  append({{0, 100}, {1, 3}});
  for (int i = 0; i < 30; ++i) append({{0, 1}, {1, 1}});  // a crosses 128
  append({{1, 70}});                                       // b crosses 64 in a chunk
  // Copy on write of a's partial last block into block 22 (unused).
  const int32_t a_last = tables[0][size_t(lengths[0] / bs)];
  gpu.copy_kv_block(a_last, 22);
  cpu.copy_block(a_last, 22);
  // What was written is defined: every block of both sequences, and the copy; (block, tokens).
  std::vector<std::pair<int32_t, int32_t>> written_blocks;
  for (int seq = 0; seq < 2; ++seq)
    for (int32_t i = 0; i * bs < lengths[size_t(seq)]; ++i)
      written_blocks.push_back({tables[size_t(seq)][size_t(i)], std::min(bs, lengths[size_t(seq)] - i * bs)});
  written_blocks.push_back({22, lengths[0] % bs});

  const QuantizedKvCache* cache = gpu.quantized_kv_cache();
  ASSERT_NE(cache, nullptr);
  for (int l = 0; l < layers; ++l) {
    const QuantizedPagedKv g = cache->layer(l), c = cpu.layer(l);
    auto expect_same = [&](const char* what, const void* gp, const void* cp, size_t bytes) {
      const std::vector<uint8_t> got = device_bytes(gp, bytes);
      const auto* want = static_cast<const uint8_t*>(cp);
      size_t differ = 0, first = bytes;
      for (size_t i = 0; i < bytes; ++i)
        if (got[i] != want[i] && differ++ == 0) first = i;
      EXPECT_EQ(differ, 0u) << "layer " << l << " " << what << ": " << differ << " of " << bytes
                            << " bytes differ, the first at " << first;
    };
    for (const auto& [block, written] : written_blocks) {
      auto at = [&](const void* base, int64_t block_elements, size_t element) {
        return static_cast<const uint8_t*>(base) + size_t(block) * size_t(block_elements) * element;
      };
      const auto rows = size_t(written);
      for (int32_t h = 0; h < kv_heads; ++h) {
        const size_t head_code = size_t(h) * size_t(g.k_codes_head());
        const size_t row_code = size_t(g.code_bytes_per_row());
        expect_same("k codes", at(g.k_codes, g.k_codes_block(), 1) + head_code, at(c.k_codes, c.k_codes_block(), 1) + head_code,
                    rows * row_code);
        if (f.quant == KvQuant::kFp8) {
          expect_same("v codes", at(g.v_codes, g.v_codes_block(), 1) + head_code,
                      at(c.v_codes, c.v_codes_block(), 1) + head_code, rows * row_code);
          const size_t scale = size_t(h) * size_t(g.fp8_scale_head()) * 4;
          expect_same("k scales", at(g.k_fp8_scale, g.fp8_scale_block(), 4) + scale,
                      at(c.k_fp8_scale, c.fp8_scale_block(), 4) + scale, rows * 4);
          expect_same("v scales", at(g.v_fp8_scale, g.fp8_scale_block(), 4) + scale,
                      at(c.v_fp8_scale, c.fp8_scale_block(), 4) + scale, rows * 4);
          continue;
        }
        const size_t meta = size_t(h) * size_t(g.k_meta_head());
        const size_t meta_rows = rows * size_t(g.k_parts());
        expect_same("k min", at(g.k_min, g.k_meta_block(), 2) + 2 * meta, at(c.k_min, c.k_meta_block(), 2) + 2 * meta, 2 * meta_rows);
        expect_same("k scale", at(g.k_scale, g.k_meta_block(), 2) + 2 * meta, at(c.k_scale, c.k_meta_block(), 2) + 2 * meta, 2 * meta_rows);
        expect_same("k sums", at(g.k_sums, g.k_meta_block(), 1) + meta, at(c.k_sums, c.k_meta_block(), 1) + meta, meta_rows);
        if (written >= bs) {  // the block's (one) V partition sealed
          const size_t v_head = size_t(h) * size_t(g.v_codes_head()), v_meta = size_t(h) * size_t(g.v_meta_head());
          expect_same("v codes", at(g.v_codes, g.v_codes_block(), 1) + v_head, at(c.v_codes, c.v_codes_block(), 1) + v_head,
                      size_t(g.v_codes_head()));
          expect_same("v min", at(g.v_min, g.v_meta_block(), 2) + 2 * v_meta, at(c.v_min, c.v_meta_block(), 2) + 2 * v_meta,
                      2 * size_t(g.v_meta_head()));
          expect_same("v scale", at(g.v_scale, g.v_meta_block(), 2) + 2 * v_meta,
                      at(c.v_scale, c.v_meta_block(), 2) + 2 * v_meta, 2 * size_t(g.v_meta_head()));
          expect_same("v sums", at(g.v_sums, g.v_meta_block(), 1) + v_meta, at(c.v_sums, c.v_meta_block(), 1) + v_meta,
                      size_t(g.v_meta_head()));
        } else {  // open: the tail, in each cache's own slot
          const int32_t g_slot = cache->tail_slot_table()[size_t(block)], c_slot = c.tail_slot[block];
          ASSERT_GE(g_slot, 0) << "block " << block;
          ASSERT_GE(c_slot, 0) << "block " << block;
          const size_t head = size_t(h) * size_t(g.tail_head());
          expect_same("tail", reinterpret_cast<const uint8_t*>(g.tail) + 2 * (size_t(g_slot) * size_t(g.tail_slot_stride()) + head),
                      reinterpret_cast<const uint8_t*>(c.tail) + 2 * (size_t(c_slot) * size_t(c.tail_slot_stride()) + head),
                      2 * size_t(written) * size_t(d));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantizedKvBytes,
                         ::testing::Values(Format{KvQuant::kFp8, 64, 16, false}, Format{KvQuant::kFp8, 128, 64, true},
                                           Format{KvQuant::kInt2, 64, 64, false}, Format{KvQuant::kInt2, 128, 64, true}),
                         [](const auto& info) {
                           const Format& f = info.param;
                           return std::string(kv_quant_name(f.quant)) + "_d" + std::to_string(f.head_dim) +
                                  (f.hadamard ? "_hadamard" : "");
                         });

}  // namespace
}  // namespace pagoda::cuda
