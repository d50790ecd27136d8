// The backend-op table (tests/backend/backend_ops.h) on the CUDA backend, in f16 and bf16, with
// CUDA graphs and without; skipped without a GPU. `gpu_tests --perf` prints the perf table
// instead (f16), against the device-to-device copy bandwidth measured in the same run and the
// tensor cores' dense f16 peak from the device's clock and SM count. This file's main() is
// gpu_tests' (it replaces gtest_main's, to take --perf).
#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "../backend/backend_ops.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/backend/cuda/device_array.h"

namespace pagoda::backend_ops {
namespace {

TEST(BackendOps, CudaF16) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(DType::kF16);
  test_every_op(backend, "f16");
}

TEST(BackendOps, CudaBf16) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(DType::kBF16);
  test_every_op(backend, "bf16");
}

// Every op launched eagerly: run_graph just runs the step.
TEST(BackendOps, CudaF16WithoutGraphs) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  CudaBackend backend(DType::kF16, CudaBackendOptions{.graphs = false});
  test_every_op(backend, "eager");
}

// A device array's generation moves exactly when its data() does, which is what a CUDA graph
// holding data() needs to know (graph_table.h).
TEST(DeviceArrayGeneration, MovesWithTheAddress) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  cuda::DeviceArray<int32_t> a;
  a.resize(16);
  const uint64_t first = a.generation();
  a.resize(8);
  a.resize(16);
  a.reserve(16);
  a.make_room(16);
  EXPECT_EQ(a.generation(), first) << "within capacity: data() stays";
  a.make_room(17);  // grows to twice the capacity
  EXPECT_EQ(a.generation(), first + 1);
  EXPECT_EQ(a.capacity(), 32u);
  a.upload_grown(std::vector<int32_t>(32, 1));
  EXPECT_EQ(a.generation(), first + 1);
  cuda::DeviceArray<int32_t> b(4);
  const uint64_t before = std::max(a.generation(), b.generation());
  a = std::move(b);  // both arrays' data() change
  EXPECT_GT(a.generation(), before);
  EXPECT_GT(b.generation(), before);
}

// The streaming bound: a 1 GiB device-to-device copy (read + write), best of 5.
Roofline measure_gpu() {
  const size_t bytes = size_t(1) << 30;
  void *src = nullptr, *dst = nullptr;
  cuda::check_cuda(cudaMalloc(&src, bytes), "cudaMalloc");
  cuda::check_cuda(cudaMalloc(&dst, bytes), "cudaMalloc");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  float best_ms = 1e30f;
  for (int i = 0; i < 6; ++i) {
    cudaEventRecord(start);
    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cuda::check_cuda(cudaEventSynchronize(stop), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i > 0) best_ms = std::min(best_ms, ms);  // the first is a warm-up
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  int device = 0, sms = 0, clock_khz = 0, major = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  // Dense f16/bf16 tensor-core FLOP per clock per SM: 4096 on Hopper (989 TFLOP/s on an H100
  // SXM's 132 SMs at 1.83 GHz), 2048 on Ampere.
  const double per_sm_clock = major >= 9 ? 4096 : 2048;
  return {.bytes_per_second = 2.0 * double(bytes) / (double(best_ms) * 1e-3),
          .flops_per_second = per_sm_clock * sms * clock_khz * 1e3,
          .bandwidth_from = "cudaMemcpy device to device of 1 GiB, measured",
          .flops_from = "dense f16 tensor cores: " + std::to_string(int(per_sm_clock)) + " FLOP/clock/SM x " +
                        std::to_string(sms) + " SMs x " + std::to_string(clock_khz / 1000) + " MHz"};
}

}  // namespace
}  // namespace pagoda::backend_ops

int main(int argc, char** argv) {
  return pagoda::backend_ops::main_with_perf(argc, argv, [] {
    if (!pagoda::cuda::device_available()) {
      std::printf("no CUDA device\n");
      return;
    }
    pagoda::CudaBackend backend(pagoda::DType::kF16);
    pagoda::backend_ops::run_perf(backend, "cuda f16", pagoda::backend_ops::measure_gpu());
  });
}
