// Gemm (cuBLASLt) against a host dot product in double over the same rounded inputs.
//
// Tolerance: the products of f16/bf16 inputs are exact in fp32; the fp32 accumulation of k of
// them in some order errs by about sqrt(k) * 2^-24 * sum_j |x_j w_j| (random-walk rounding;
// 8x margin), and an f16/bf16 output adds half an ulp of the result. So
// |got - ref| <= u_out |ref| + 8 sqrt(k) 2^-24 sum_j |x_j w_j| + 1e-6, with u_out 2^-11 (f16),
// 2^-8 (bf16), 0 (f32). With x ~ N(0, 1) and w ~ N(0, 1/k) outputs are O(1): a transposed
// operand, a dropped bias (~0.5) or a wrong row is off by O(1).
#include "gpu_test.h"
#include "pagoda/backend/cuda/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::cuda {
namespace {

float to_f32(DType dtype, uint16_t bits) { return dtype == DType::kF16 ? f16_to_f32(bits) : bf16_to_f32(bits); }
uint16_t from_f32(DType dtype, float x) { return dtype == DType::kF16 ? f32_to_f16(x) : f32_to_bf16(x); }

std::vector<uint16_t> random_values(DType dtype, size_t count, float scale, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<uint16_t> bits(count);
  for (auto& b : bits) b = from_f32(dtype, normal(rng));
  return bits;
}

// The output element (row, col) as a double, whatever out_dtype holds it.
double output_at(const std::vector<uint8_t>& out, DType out_dtype, int64_t n, int64_t row, int64_t col) {
  const size_t index = size_t(row * n + col);
  if (out_dtype == DType::kF32) {
    float value;
    std::memcpy(&value, &out[index * 4], 4);
    return value;
  }
  uint16_t bits;
  std::memcpy(&bits, &out[index * 2], 2);
  return to_f32(out_dtype, bits);
}

// The rows and columns checked against the host: all of them when few, else a spread that
// includes both ends (a full host GEMM of 300 x 11008 x 4096 would take minutes).
std::vector<int64_t> sample(int64_t count, int64_t all_below, int64_t stride) {
  std::vector<int64_t> picked;
  if (count <= all_below) {
    for (int64_t i = 0; i < count; ++i) picked.push_back(i);
    return picked;
  }
  for (int64_t i = 0; i < count; i += stride) picked.push_back(i);
  picked.push_back(count - 1);
  return picked;
}

struct OutputCase {
  DType out_dtype;  // kF32: the dtype's logits case
  bool bias;
};

class GpuGemm : public GpuTest {};

TEST_F(GpuGemm, MatchesHostForModelShapesAndRepeatsBitForBit) {
  std::mt19937 rng(11);
  Gemm gemm;  // one for every shape, as the backend holds one: plans accumulate in its cache
  const std::pair<int64_t, int64_t> weight_shapes[] = {{4096, 4096}, {11008, 4096}, {512, 64}};
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (const auto& [n, k] : weight_shapes) {
      const std::vector<uint16_t> w = random_values(dtype, size_t(n * k), float(1.0 / std::sqrt(double(k))), rng);
      const std::vector<uint16_t> bias = random_values(dtype, size_t(n), 0.5f, rng);
      DeviceArray<uint16_t> d_w, d_bias;
      d_w.upload(w);
      d_bias.upload(bias);
      for (int64_t m : {1, 7, 64, 300}) {
        const std::vector<uint16_t> x = random_values(dtype, size_t(m * k), 1.f, rng);
        DeviceArray<uint16_t> d_x;
        d_x.upload(x);
        for (const OutputCase& c : {OutputCase{dtype, false}, OutputCase{dtype, true}, OutputCase{DType::kF32, false}}) {
          SCOPED_TRACE(testing::Message() << "m " << m << " n " << n << " k " << k << " " << dtype_name(dtype) << " -> "
                                          << dtype_name(c.out_dtype) << (c.bias ? " + bias" : ""));
          const size_t out_bytes = size_t(m * n) * dtype_size(c.out_dtype);
          DeviceArray<uint8_t> d_first(out_bytes), d_second(out_bytes);
          const void* bias_ptr = c.bias ? d_bias.data() : nullptr;
          gemm.run(d_x.data(), d_w.data(), bias_ptr, d_first.data(), m, n, k, dtype, c.out_dtype, nullptr);
          gemm.run(d_x.data(), d_w.data(), bias_ptr, d_second.data(), m, n, k, dtype, c.out_dtype, nullptr);
          check_cuda(cudaDeviceSynchronize(), "sync");
          const std::vector<uint8_t> first = d_first.download();
          ASSERT_EQ(first, d_second.download()) << "second call (cached algorithm) differs";

          const double u_out = c.out_dtype == DType::kF16 ? 0x1p-11 : c.out_dtype == DType::kBF16 ? 0x1p-8 : 0.0;
          const double accumulation = 8.0 * std::sqrt(double(k)) * 0x1p-24;
          for (int64_t row : sample(m, 8, 61)) {
            for (int64_t col : sample(n, 512, 37)) {
              double ref = c.bias ? to_f32(dtype, bias[size_t(col)]) : 0.0, magnitude = 0.0;
              for (int64_t j = 0; j < k; ++j) {
                const double product =
                    double(to_f32(dtype, x[size_t(row * k + j)])) * to_f32(dtype, w[size_t(col * k + j)]);
                ref += product;
                magnitude += std::abs(product);
              }
              const double tolerance = u_out * std::abs(ref) + accumulation * magnitude + 1e-6;
              ASSERT_NEAR(output_at(first, c.out_dtype, n, row, col), ref, tolerance) << "row " << row << " col " << col;
            }
          }
        }
      }
    }
  }
}

// A decode step is replayed from a CUDA graph: once its plan is cached, run() must be capturable
// (no heuristic query, no allocation, the fixed workspace) and the replay give the same bits.
TEST_F(GpuGemm, CapturedInCudaGraphMatchesEager) {
  std::mt19937 rng(12);
  const int64_t m = 7, n = 512, k = 64;
  const DType dtype = DType::kBF16;
  DeviceArray<uint16_t> d_x, d_w, d_bias, d_eager(size_t(m * n)), d_replayed(size_t(m * n));
  d_x.upload(random_values(dtype, size_t(m * k), 1.f, rng));
  d_w.upload(random_values(dtype, size_t(n * k), 0.125f, rng));
  d_bias.upload(random_values(dtype, size_t(n), 0.5f, rng));
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  Gemm gemm;
  gemm.run(d_x.data(), d_w.data(), d_bias.data(), d_eager.data(), m, n, k, dtype, dtype, stream);  // warm-up
  check_cuda(cudaStreamSynchronize(stream), "sync");

  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
  gemm.run(d_x.data(), d_w.data(), d_bias.data(), d_replayed.data(), m, n, k, dtype, dtype, stream);
  check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
  check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
  check_cuda(cudaStreamSynchronize(stream), "sync");
  EXPECT_EQ(d_replayed.download(), d_eager.download());
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

TEST_F(GpuGemm, RejectsWhatItCannotRun) {
  Gemm gemm;
  DeviceArray<uint16_t> buffer(1024);
  DeviceArray<float> out(1024);
  // A bias with f32 output: cuBLASLt would read the bias as f32.
  EXPECT_THROW(gemm.run(buffer.data(), buffer.data(), buffer.data(), out.data(), 2, 8, 8, DType::kF16, DType::kF32,
                        nullptr),
               Error);
  EXPECT_THROW(gemm.run(buffer.data(), buffer.data(), nullptr, out.data(), 2, 12, 8, DType::kF16, DType::kF16, nullptr),
               Error);  // n not a multiple of 8
  EXPECT_THROW(gemm.run(buffer.data(), buffer.data(), nullptr, out.data(), 2, 8, 8, DType::kF32, DType::kF32, nullptr),
               Error);  // f32 operands
}

}  // namespace
}  // namespace pagoda::cuda
