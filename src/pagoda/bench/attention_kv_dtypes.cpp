// pagoda bench attention --kv-cache-dtype f16,fp8,int2: the same decode step (batch x context x
// heads, pages scattered, L2 flushed before every timed run, median of --runs) with the KV cache
// stored in each dtype, each kernel against the streaming bound of its own bytes: every K and V
// code and every metadata byte of the batch once (int2: codes, f16 mins and scales, code sums;
// fp8: codes and f32 scales), plus q and out, over the streaming-read bandwidth measured in the
// same run. The speedup is f16's median over the dtype's, side by side in one run.
//
// The pools hold random codes and metadata (only the time is measured; a random e4m3 byte may
// be a NaN, which costs the kernels nothing). Contexts that are multiples of 64 keep every int2
// partition sealed, as in a long-running batch; the open partition is at most 63 tokens a
// sequence either way.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "pagoda/bench/attention.h"
#include "pagoda/core/error.h"

#if PAGODA_HAVE_CUDA
#include <numeric>
#include <random>
#include <span>

#include "pagoda/attention/decode_batch.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/quantized_kv.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/cuda_support.h"
#include "pagoda/bench/head_spec.h"
#include "pagoda/core/paged_kv.h"
#include "pagoda/core/quantized_paged_kv.h"
#endif

namespace pagoda::bench {

#if PAGODA_HAVE_CUDA
namespace {

constexpr uint64_t kSeed = 20261129;

KvQuant parse_kv_dtype(const std::string& name) {
  if (name == "f16") return KvQuant::kNone;
  if (name == "fp8") return KvQuant::kFp8;
  if (name == "int2") return KvQuant::kInt2;
  fail(ErrorKind::kInvalidArgument, "--kv-cache-dtype: '{}' is not f16, fp8 or int2", name);
}

// A device pool of `quant` for num_blocks blocks, random contents; every sequence's open int2
// partition (if any) reads tail slot 0.
struct QuantizedPool {
  cuda::DeviceArray<uint8_t> bytes;
  QuantizedPagedKv kv;
};

void make_pool(QuantizedPool& pool, KvQuant quant, int32_t num_blocks, int32_t block_size, int32_t kv_heads,
               int32_t head_dim) {
  QuantizedPagedKv kv{.quant = quant, .num_blocks = num_blocks, .block_size = block_size, .num_kv_heads = kv_heads,
                      .head_dim = head_dim, .partition = 64};
  auto round = [](size_t b) { return (b + 255) / 256 * 256; };
  const size_t blocks = size_t(num_blocks);
  const size_t k_codes = round(blocks * size_t(kv.k_codes_block())), v_codes = round(blocks * size_t(kv.v_codes_block()));
  const bool int2 = quant == KvQuant::kInt2;
  const size_t k_meta = int2 ? blocks * size_t(kv.k_meta_block()) : 0, v_meta = int2 ? blocks * size_t(kv.v_meta_block()) : 0;
  const size_t scales = int2 ? 0 : blocks * size_t(kv.fp8_scale_block());
  const size_t total = k_codes + v_codes + 3 * round(k_meta * 2) + 3 * round(v_meta * 2) + 2 * round(scales * 4) +
                       round(blocks * 4) + round(size_t(kv.tail_slot_stride()) * 2);
  pool.bytes.resize(total);
  uint8_t* at = pool.bytes.data();
  auto take = [&](size_t b) {
    uint8_t* p = at;
    at += round(b);
    return p;
  };
  // Codes random; f16 metadata uniform in [-1, 1); sums and the tail table zero.
  fill_uniform(pool.bytes.data(), total / 2, DType::kF16, kSeed);
  kv.k_codes = take(k_codes);
  kv.v_codes = take(v_codes);
  if (int2) {
    kv.k_min = reinterpret_cast<f16*>(take(k_meta * 2));
    kv.k_scale = reinterpret_cast<f16*>(take(k_meta * 2));
    kv.k_sums = take(k_meta * 2);
    cuda::check_cuda(cudaMemset(kv.k_sums, 0, k_meta), "memset");
    kv.v_min = reinterpret_cast<f16*>(take(v_meta * 2));
    kv.v_scale = reinterpret_cast<f16*>(take(v_meta * 2));
    kv.v_sums = take(v_meta * 2);
    cuda::check_cuda(cudaMemset(kv.v_sums, 0, v_meta), "memset");
    kv.tail_slot = reinterpret_cast<int32_t*>(take(blocks * 4));
    cuda::check_cuda(cudaMemset(kv.tail_slot, 0, blocks * 4), "memset");
    kv.tail = reinterpret_cast<f16*>(take(size_t(kv.tail_slot_stride()) * 2));
  } else {
    kv.k_fp8_scale = reinterpret_cast<float*>(take(scales * 4));
    kv.v_fp8_scale = reinterpret_cast<float*>(take(scales * 4));
    fill_uniform(kv.k_fp8_scale, 2 * round(scales * 4) / 4, DType::kF32, kSeed + 1);
  }
  pool.kv = kv;
}

}  // namespace

void run_attention_kv_dtype_bench(const AttentionBenchOptions& input) {
  AttentionBenchOptions flags = input;
  std::vector<KvQuant> dtypes;
  for (const std::string& name : flags.kv_cache_dtypes) dtypes.push_back(parse_kv_dtype(name));
  if (dtypes.empty() || dtypes.front() != KvQuant::kNone)
    fail(ErrorKind::kInvalidArgument, "--kv-cache-dtype: list f16 first (the other dtypes are compared with it)");
  if (flags.dtype != "fp16" && flags.dtype != "f16")
    fail(ErrorKind::kInvalidArgument, "--kv-cache-dtype: q and out are fp16 in this comparison (--dtype fp16)");
  if (flags.block_size != 64)
    fail(ErrorKind::kInvalidArgument, "--kv-cache-dtype: the comparison runs every dtype on blocks of 64 tokens "
         "(int2's Π); pass --block-size 64");
  if (flags.runs < 1) fail(ErrorKind::kInvalidArgument, "--runs: at least 1");
  std::vector<HeadSpec> heads;
  for (const std::string& spec : flags.heads) heads.push_back(parse_heads(spec));
  if (!cuda::device_available()) fail(ErrorKind::kUnsupported, "bench attention: no CUDA device");

  DeviceSummary device = describe_current_device();
  if (flags.out.empty()) flags.out = "bench/results/" + device_slug(device.name) + "/kv-quantization.json";
  const double bandwidth_before = measure_stream_read_bandwidth();
  std::fprintf(stderr, "bench attention: %s, streaming read %.1f GB/s\n", device.name.c_str(), bandwidth_before / 1e9);
  L2Flusher flusher;
  EventTimings timings(flags.runs);
  const DType dtype = DType::kF16;
  const int32_t bs = flags.block_size, dim = flags.head_dim;
  struct Row {
    std::string name;
    int32_t batch, context;
    HeadSpec heads;
    std::vector<double> us, bytes;
  };
  std::vector<Row> rows;
  cuda::DecodeWorkspace workspace;
  cuda::DeviceArray<uint16_t> q, out, f16_pool;
  QuantizedPool quantized;
  for (HeadSpec h : heads)
    for (int batch : flags.batches)
      for (int context : flags.contexts) {
        Row row{fmt::format("b{}-c{}-h{}/{}", batch, context, h.q_heads, h.kv_heads), batch, context, h, {}, {}};
        if (!flags.filter.empty() && row.name.find(flags.filter) == std::string::npos) continue;
        const attention::AttentionShape shape{.num_q_heads = h.q_heads, .num_kv_heads = h.kv_heads, .head_dim = dim,
                                              .block_size = bs, .softmax_scale = 1.f / std::sqrt(float(dim))};
        const int32_t per_seq = (context + bs - 1) / bs, num_blocks = batch * per_seq;
        std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
        std::iota(ids.begin(), ids.end(), 0);
        std::shuffle(ids.begin(), ids.end(), std::mt19937_64(kSeed + rows.size()));
        attention::DecodeBatch decode_batch;
        for (int32_t s = 0; s < batch; ++s)
          decode_batch.add_sequence(std::span(ids).subspan(size_t(s) * size_t(per_seq), size_t(per_seq)), context);
        const size_t q_elements = size_t(batch) * size_t(h.q_heads) * size_t(dim);
        q.resize(q_elements);
        out.resize(q_elements);
        fill_uniform(q.data(), q_elements, dtype, kSeed ^ rows.size());
        const double q_out_bytes = 2.0 * double(q_elements) * 2;
        for (KvQuant quant : dtypes) {
          const int64_t tokens = int64_t(batch) * context * h.kv_heads;
          double bytes = q_out_bytes + double(tokens) * double(kv_block_head_bytes(quant, 2, dim, 64, bs)) / bs;
          attention::DeviceInfo info;
          PagedKv kv;
          if (quant == KvQuant::kNone) {
            const size_t pool_elements = size_t(num_blocks) * size_t(bs) * size_t(h.kv_heads) * size_t(dim);
            f16_pool.resize(2 * pool_elements);
            fill_uniform(f16_pool.data(), 2 * pool_elements, dtype, kSeed);
            kv = make_paged_kv(f16_pool.data(), f16_pool.data() + pool_elements, dtype, KvLayout::kHnd, num_blocks, bs,
                               h.kv_heads, dim, Device::kCuda);
            info = cuda::decode_device_info(shape, dtype);
          } else {
            f16_pool = {};
            make_pool(quantized, quant, num_blocks, bs, h.kv_heads, dim);
            info = cuda::decode_quantized_device_info(quant, dtype, dim);
          }
          const attention::DecodePlan plan = attention::plan_decode(decode_batch, shape, info);
          workspace.upload(plan, decode_batch, shape);
          auto run = [&] {
            if (quant == KvQuant::kNone) {
              cuda::decode_attention(workspace, shape, kv, q.data(), out.data(), nullptr, {}, nullptr);
            } else {
              cuda::decode_attention_quantized(workspace, shape, quantized.kv, dtype, q.data(), out.data(), nullptr,
                                               nullptr);
            }
          };
          for (int w = 0; w < flags.warmup; ++w) run();
          for (int r = 0; r < flags.runs; ++r) {
            gpu_sleep(200);
            flusher.flush();
            timings.start(r);
            run();
            timings.stop(r);
          }
          cuda::check_cuda(cudaGetLastError(), "decode attention");
          std::vector<double> us = timings.elapsed_us();
          std::sort(us.begin(), us.end());
          row.us.push_back(us[us.size() / 2]);
          row.bytes.push_back(bytes);
        }
        std::fprintf(stderr, "%s:", row.name.c_str());
        for (size_t i = 0; i < dtypes.size(); ++i)
          std::fprintf(stderr, " %s %.1f us", kv_quant_name(dtypes[i]), row.us[i]);
        std::fprintf(stderr, "\n");
        rows.push_back(std::move(row));
      }
  const double bandwidth = std::max(bandwidth_before, measure_stream_read_bandwidth());
  std::printf("pagoda bench attention --kv-cache-dtype: %s, head_dim %d, block %d, streaming read %.1f GB/s (the "
              "bound of each dtype: its data + metadata + q + out bytes / that)\n",
              device.name.c_str(), dim, bs, bandwidth / 1e9);
  std::printf("| config | dtype | us | bytes MB | frac of its bound | speedup vs f16 |\n| --- | --- | --- | --- | --- | --- |\n");
  nlohmann::json list = nlohmann::json::array();
  for (const Row& row : rows)
    for (size_t i = 0; i < dtypes.size(); ++i) {
      const double frac = row.bytes[i] / (row.us[i] * 1e-6) / bandwidth;
      const double speedup = row.us[0] / row.us[i];
      const std::string name = dtypes[i] == KvQuant::kNone ? "f16" : kv_quant_name(dtypes[i]);
      std::printf("| %s | %s | %.1f | %.1f | %.3f | %.2fx |\n", row.name.c_str(), name.c_str(), row.us[i],
                  row.bytes[i] / 1e6, frac, speedup);
      list.push_back({{"config", row.name}, {"batch", row.batch}, {"context", row.context},
                      {"q_heads", row.heads.q_heads}, {"kv_heads", row.heads.kv_heads}, {"kv_dtype", name},
                      {"median_us", row.us[i]}, {"bytes", row.bytes[i]}, {"frac_of_bound", frac},
                      {"speedup_vs_f16", speedup}});
    }
  write_json_file(flags.out, {{"benchmark", "attention --kv-cache-dtype"},
                              {"device", device.name},
                              {"stream_read_gbps", bandwidth / 1e9},
                              {"bound", "each dtype's bytes (KV data + metadata of every token once, q, out) / "
                                        "stream_read_gbps, the better of the probes before and after"},
                              {"timing", fmt::format("CUDA events, {} warm-up runs, median of {} runs, L2 flushed "
                                                     "before each run", flags.warmup, flags.runs)},
                              {"head_dim", dim},
                              {"block_size", bs},
                              {"commit", git_commit()},
                              {"configs", list}});
  std::fprintf(stderr, "bench attention: wrote %s\n", flags.out.c_str());
}

#else

void run_attention_kv_dtype_bench(const AttentionBenchOptions&) {
  fail(ErrorKind::kUnsupported, "bench attention: this pagoda was built without CUDA");
}

#endif

}  // namespace pagoda::bench
