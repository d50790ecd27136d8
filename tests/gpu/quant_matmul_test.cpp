// GGUF block-quantized weights on the GPU (backend/cuda/quant_matmul.h): the dequantization is
// bit for bit format/dequantize.cpp's (itself bit-exact with gguf-py), on every type, for rows
// whose starts fall at every alignment the types produce, with scales anywhere in fp16's finite
// range (subnormals included) and a matrix whose size is not a multiple of 16 bytes (its last
// bytes are staged one by one). The matmuls are checked against the dequantized f32 reference in
// the backend-op table (tests/backend/backend_ops.h); here, what the table cannot show: the GEMV
// of a row equals the same row's GEMV in a batch (a decode row's result does not depend on the
// rows beside it, up to the rows one GEMV takes), on both kernels.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../backend/backend_ops.h"
#include "gpu_test.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/backend/cuda/quant_matmul.h"

namespace pagoda::cuda {
namespace {

using backend_ops::ggml_of;
using backend_ops::random_blocks;
using backend_ops::Random;

constexpr DType kTypes[] = {DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                            DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

class QuantDequantize : public GpuTestWithParam<DType> {};

TEST_P(QuantDequantize, BitExactWithTheCpuDequantizer) {
  const DType t = GetParam();
  // 7 rows of 5 super-blocks (or 40 blocks): two chunks per row, the second partial; then rows of
  // 3 blocks (32-element types), shorter than one chunk.
  for (const int64_t k : {int64_t(1280), int64_t(96)}) {
    if (k % block_elements(t) != 0) continue;
    const int64_t rows = 7;
    for (const bool wild : {false, true}) {
      Random rng(uint64_t(t) * 31 + uint64_t(k) + (wild ? 7 : 0));
      const std::vector<uint8_t> bytes = random_blocks(t, size_t(rows * k / block_elements(t)), rng, wild);
      std::vector<float> want(size_t(rows * k));
      dequantize_row(ggml_of(t), bytes.data(), want.data(), rows * k);
      DeviceArray<uint8_t> w;
      w.upload(bytes);
      const std::vector<int32_t> ids = {6, 0, 3, 6, 1, 2, 4, 5};
      DeviceArray<int32_t> device_ids;
      device_ids.upload(ids);
      DeviceArray<float> out(ids.size() * size_t(k));
      dequantize_rows(w.data(), t, rows, k, device_ids.data(), int64_t(ids.size()), DType::kF32, out.data(), nullptr);
      check_cuda(cudaDeviceSynchronize(), "dequantize_rows");
      const std::vector<float> got = out.download();
      int64_t differ = 0;
      for (size_t i = 0; i < ids.size(); ++i)
        for (int64_t c = 0; c < k; ++c) {
          const float a = got[i * size_t(k) + size_t(c)], b = want[size_t(ids[i] * k + c)];
          if (std::memcmp(&a, &b, 4) != 0 && differ++ < 5)
            ADD_FAILURE() << dtype_name(t) << " k=" << k << (wild ? " wild" : "") << " row " << ids[i] << " col "
                          << c << ": " << a << ", the CPU " << b;
        }
      EXPECT_EQ(differ, 0) << dtype_name(t) << " k=" << k << (wild ? " wild" : "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(EveryType, QuantDequantize, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

class QuantGemv : public GpuTestWithParam<DType> {};

void expect_batch_invariant(DType t, QuantGemvKernel kernel, int64_t n);

// Each row of a batch of n gets exactly what it gets alone: the GEMV's sum over a row's pieces
// is the same whatever n is.
TEST_P(QuantGemv, ARowsResultDoesNotDependOnTheBatch) {
  for (const QuantGemvKernel kernel : {QuantGemvKernel::kTensorCores, QuantGemvKernel::kSimt}) {
    SCOPED_TRACE(kernel == QuantGemvKernel::kTensorCores ? "tensor cores" : "simt");
    expect_batch_invariant(GetParam(), kernel,
                           kernel == QuantGemvKernel::kTensorCores ? kQuantGemvTensorCoreMaxRows : kQuantGemvMaxRows);
  }
}

void expect_batch_invariant(DType t, QuantGemvKernel kernel, int64_t n) {
  const int64_t m = 70, k = 2048;
  Random rng(uint64_t(t) + 5);
  const std::vector<uint8_t> bytes = random_blocks(t, size_t(m * k / block_elements(t)), rng);
  std::vector<uint16_t> x(size_t(n * k));
  for (uint16_t& v : x) v = f32_to_f16(rng.uniform(-1.f, 1.f));
  DeviceArray<uint8_t> w;
  w.upload(bytes);
  DeviceArray<uint16_t> device_x;
  device_x.upload(x);
  DeviceArray<uint16_t> batch_out{size_t(n * m)}, row_out{size_t(m)};
  quant_gemv(device_x.data(), w.data(), t, nullptr, batch_out.data(), n, m, k, DType::kF16, DType::kF16, nullptr,
             kernel);
  const std::vector<uint16_t> batched = batch_out.download();
  for (const int64_t row : {int64_t(0), int64_t(5), int64_t(13), n - 1}) {
    quant_gemv(device_x.data() + row * k, w.data(), t, nullptr, row_out.data(), 1, m, k, DType::kF16, DType::kF16,
               nullptr, kernel);
    const std::vector<uint16_t> alone = row_out.download();
    for (int64_t j = 0; j < m; ++j)
      ASSERT_EQ(alone[size_t(j)], batched[size_t(row * m + j)]) << dtype_name(t) << " row " << row << " out " << j;
  }
}

INSTANTIATE_TEST_SUITE_P(EveryType, QuantGemv, ::testing::ValuesIn(kTypes),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

}  // namespace
}  // namespace pagoda::cuda
