// pagoda bench quant-matmul. Every figure is the median of --runs CUDA-event timings, each run
// queued behind a GPU sleep and an L2 flush (bench/cuda_support.h), so weights come from device
// memory as in a decode step, whose previous layer evicted them. Variants per (type, shape,
// batch):
//   - quant: what CudaBackend::matmul runs: quant_gemv's kAuto up to kQuantGemvMaxRows rows (SIMT
//     for one row, tensor cores for 2-16), above that the whole matrix dequantized to f16 and
//     cuBLASLt;
//   - tensor_cores (up to 64 rows) and simt (up to 16): each GEMV kernel alone;
//   - dequant_gemm: that second path at every batch, for comparison;
//   - f16: cuBLASLt on the same shape in f16 (weights dequantized at load), its algorithm timed
//     and chosen as the backend does for decode batches.
// Bounds: quant bytes (dtype_bytes of the weights + activations + outputs) / bandwidth; f16 the
// same with f16 weights. of_bound = bound / time.
#include "pagoda/bench/quant_matmul.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/core/dtype.h"
#include "pagoda/core/error.h"

#if PAGODA_HAVE_CUDA
#include <cstring>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/gemm.h"
#include "pagoda/backend/cuda/quant_matmul.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/cuda_support.h"
#include "pagoda/core/half.h"
#endif

namespace pagoda::bench {

#if PAGODA_HAVE_CUDA
namespace {

constexpr DType kQuantTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                                 DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

DType parse_type(const std::string& name) {
  for (DType t : kQuantTypes)
    if (dtype_name(t) == name) return t;
  fail(ErrorKind::kInvalidArgument, "--types: '{}' is not one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k", name);
}

struct Shape {
  int64_t m, k;
};

Shape parse_shape(const std::string& s) {
  const size_t x = s.find('x');
  try {
    if (x != std::string::npos) {
      const Shape shape{std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))};
      if (shape.m > 0 && shape.k > 0 && shape.m % 8 == 0 && shape.k % 256 == 0 && shape.m * shape.k <= (int64_t(1) << 31))
        return shape;
    }
  } catch (const std::exception&) {
  }
  fail(ErrorKind::kInvalidArgument, "--shapes: '{}' is not MxK with m a multiple of 8, k of 256, m*k <= 2^31", s);
}

// Random quant bytes with every fp16 scale field set to a small finite value (the timing does
// not depend on the values; a NaN scale would only make the outputs useless).
std::vector<uint8_t> random_blocks(DType t, int64_t blocks, uint64_t seed) {
  std::vector<uint8_t> bytes(size_t(blocks) * block_bytes(t));
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    std::memcpy(&bytes[i], &state, 8);
  }
  const uint16_t scale = f32_to_f16(1e-3f);
  std::vector<size_t> fields = {0};
  if (t == DType::kQ4_1 || t == DType::kQ5_1 || t == DType::kQ4_K || t == DType::kQ5_K) fields.push_back(2);
  if (t == DType::kQ6_K) fields = {208};
  for (int64_t b = 0; b < blocks; ++b)
    for (size_t f : fields) std::memcpy(&bytes[size_t(b) * block_bytes(t) + f], &scale, 2);
  return bytes;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

void run_quant_matmul_bench(const QuantMatmulBenchOptions& options) {
  if (options.runs < 3 || options.runs > 1000) fail(ErrorKind::kInvalidArgument, "--runs must be in [3, 1000]");
  std::vector<DType> types;
  for (const std::string& name : options.types) types.push_back(parse_type(name));
  std::vector<Shape> shapes;
  for (const std::string& s : options.shapes) shapes.push_back(parse_shape(s));
  for (int b : options.batches)
    if (b < 1 || b > 4096) fail(ErrorKind::kInvalidArgument, "--batches: {} is not in [1, 4096]", b);
  if (types.empty() || shapes.empty() || options.batches.empty())
    fail(ErrorKind::kInvalidArgument, "--types, --shapes and --batches must not be empty");

  const DeviceSummary device = describe_current_device();
  const std::string out_path =
      options.out.empty() ? "bench/results/" + device_slug(device.name) + "/quantized-weights.json" : options.out;
  std::fprintf(stderr, "bench quant-matmul: %s, measuring streaming-read bandwidth...\n", device.name.c_str());
  const double bandwidth = measure_stream_read_bandwidth();
  std::fprintf(stderr, "bench quant-matmul: streaming read %.1f GB/s\n", bandwidth / 1e9);

  int64_t max_elements = 0, max_batch = 0, max_k = 0, max_m = 0;
  for (const Shape& s : shapes) {
    max_elements = std::max(max_elements, s.m * s.k);
    max_k = std::max(max_k, s.k);
    max_m = std::max(max_m, s.m);
  }
  for (int b : options.batches) max_batch = std::max<int64_t>(max_batch, b);
  const cudaStream_t stream = nullptr;
  cuda::DeviceArray<uint16_t> x{size_t(max_batch * max_k)}, out{size_t(max_batch * max_m)};
  cuda::DeviceArray<uint16_t> f16_weights{size_t(max_elements)}, scratch{size_t(max_elements)};
  fill_uniform(x.data(), x.size(), DType::kF16, 1, stream);
  fill_uniform(f16_weights.data(), f16_weights.size(), DType::kF16, 2, stream);
  cuda::DeviceArray<uint8_t> weights;
  cuda::Gemm gemm;
  L2Flusher flusher;
  EventTimings timings(options.runs);

  auto time_us = [&](const auto& op) {
    op();  // warm-up and first-use setup (cuBLASLt's algorithm choice)
    for (int run = 0; run < options.runs; ++run) {
      gpu_sleep(100, stream);
      flusher.flush(stream);
      timings.start(run, stream);
      op();
      timings.stop(run, stream);
    }
    cuda::check_cuda(cudaGetLastError(), "bench quant-matmul");
    return median(timings.elapsed_us());
  };

  nlohmann::json rows = nlohmann::json::array();
  std::printf("| type | m x k | batch | quant path | quant (us) | bound (us) | of bound | tensor cores (us) | simt (us) | "
              "dequant+gemm (us) | f16 (us) | f16 of bound | speedup vs f16 |\n"
              "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (DType t : types) {
    for (const Shape& s : shapes) {
      const std::vector<uint8_t> host = random_blocks(t, s.m * s.k / block_elements(t), uint64_t(t) * 7 + uint64_t(s.m));
      weights.upload(host);
      const double quant_weight_bytes = double(host.size()), f16_weight_bytes = 2.0 * double(s.m * s.k);
      for (int batch : options.batches) {
        const int64_t n = batch;
        const double io_bytes = 2.0 * double(n) * double(s.k + s.m);
        const double bound_us = (quant_weight_bytes + io_bytes) / bandwidth * 1e6;
        const double f16_bound_us = (f16_weight_bytes + io_bytes) / bandwidth * 1e6;
        auto dequant_gemm = [&] {
          cuda::dequantize_rows(weights.data(), t, s.m, s.k, nullptr, s.m, DType::kF16, scratch.data(), stream);
          gemm.run(x.data(), scratch.data(), nullptr, out.data(), n, s.m, s.k, DType::kF16, DType::kF16, stream, true);
        };
        const bool gemv = n <= cuda::kQuantGemvMaxRows;
        const double dequant_gemm_us = time_us(dequant_gemm);
        auto gemv_us = [&](cuda::QuantGemvKernel kernel) {
          return time_us([&] {
            cuda::quant_gemv(x.data(), weights.data(), t, nullptr, out.data(), n, s.m, s.k, DType::kF16, DType::kF16,
                             stream, kernel);
          });
        };
        const double quant_us = gemv ? gemv_us(cuda::QuantGemvKernel::kAuto) : dequant_gemm_us;
        const double simt_us = n <= cuda::kQuantGemvMaxRows ? gemv_us(cuda::QuantGemvKernel::kSimt) : 0;
        const double tensor_cores_us =
            n <= cuda::kQuantGemvTensorCoreMaxRows ? gemv_us(cuda::QuantGemvKernel::kTensorCores) : 0;
        const double f16_us = time_us([&] {
          gemm.run(x.data(), f16_weights.data(), nullptr, out.data(), n, s.m, s.k, DType::kF16, DType::kF16, stream,
                   true);
        });
        const std::string shape = fmt::format("{}x{}", s.m, s.k);
        const char* path = gemv ? "gemv" : "dequant+gemm";
        auto cell = [](double us) { return us > 0 ? fmt::format("{:.1f}", us) : std::string("-"); };
        std::printf("| %s | %s | %d | %s | %.1f | %.1f | %.2f | %s | %s | %.1f | %.1f | %.2f | %.2f |\n",
                    std::string(dtype_name(t)).c_str(), shape.c_str(), batch, path, quant_us, bound_us,
                    bound_us / quant_us, cell(tensor_cores_us).c_str(), cell(simt_us).c_str(), dequant_gemm_us, f16_us,
                    f16_bound_us / f16_us, f16_us / quant_us);
        std::fflush(stdout);
        rows.push_back({{"type", dtype_name(t)},
                        {"m", s.m},
                        {"k", s.k},
                        {"batch", batch},
                        {"quant_path", path},
                        {"quant_weight_bytes", quant_weight_bytes},
                        {"quant_us", quant_us},
                        {"quant_bound_us", bound_us},
                        {"quant_of_bound", bound_us / quant_us},
                        {"tensor_cores_us", tensor_cores_us > 0 ? nlohmann::json(tensor_cores_us) : nlohmann::json(nullptr)},
                        {"simt_us", simt_us > 0 ? nlohmann::json(simt_us) : nlohmann::json(nullptr)},
                        {"dequant_gemm_us", dequant_gemm_us},
                        {"f16_us", f16_us},
                        {"f16_bound_us", f16_bound_us},
                        {"f16_of_bound", f16_bound_us / f16_us},
                        {"speedup_vs_f16", f16_us / quant_us}});
      }
    }
  }
  const nlohmann::json j = {
      {"benchmark", "quant-matmul"},
      {"device", device.name},
      {"sm_count", device.sm_count},
      {"commit", git_commit()},
      {"stream_read_gbps", bandwidth / 1e9},
      {"bound", "(quantized weight bytes + f16 activations and outputs) / stream_read_gbps; f16: the same with f16 "
                "weights"},
      {"timing", fmt::format("CUDA events, median of {} runs, each after a GPU sleep and an L2 flush", options.runs)},
      {"results", rows}};
  write_json_file(out_path, j);
  std::fprintf(stderr, "bench quant-matmul: wrote %s\n", out_path.c_str());
}

#else

void run_quant_matmul_bench(const QuantMatmulBenchOptions&) {
  fail(ErrorKind::kUnsupported, "bench quant-matmul needs a GPU: this pagoda was built without CUDA");
}

#endif

}  // namespace pagoda::bench
