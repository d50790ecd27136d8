// kv_tensor_map (backend/cuda/kv_tensor_map.h): a pool it cannot describe is refused with
// Error(kUnsupported) naming why. The shape checks come before the driver is asked, so they run
// without a GPU; the driver's own refusal (an address off its 16-byte alignment) needs one.
#include "gpu_test.h"
#include "pagoda/backend/cuda/kv_tensor_map.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

// The Error kv_tensor_map(pool, kv) throws, if any.
std::optional<Error> refusal(const void* pool, const PagedKv& kv) {
  try {
    kv_tensor_map(pool, kv);
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

void expect_refused(const std::optional<Error>& e, const std::string& because) {
  ASSERT_TRUE(e.has_value()) << "accepted";
  EXPECT_EQ(e->kind(), ErrorKind::kUnsupported) << e->what();
  EXPECT_NE(std::string(e->what()).find(because), std::string::npos) << e->what();
}

TEST(KvTensorMapShapes, RefusesShapesItsBoxCannotCover) {
  struct Case {
    DType dtype;
    int32_t block_size, head_dim;
  };
  for (const Case& c : {Case{DType::kF32, 16, 128}, Case{DType::kF16, 16, 96}, Case{DType::kBF16, 8, 128}}) {
    const PagedKv kv = make_paged_kv(nullptr, nullptr, c.dtype, KvLayout::kHnd, 4, c.block_size, 2, c.head_dim,
                                     Device::kCuda);
    expect_refused(refusal(kv.k, kv), "a KV tensor map");
  }
}

class KvTensorMap : public GpuTest {};

TEST_F(KvTensorMap, RefusesAPoolOffItsAlignment) {
  const PagedKv shape = make_paged_kv(nullptr, nullptr, DType::kF16, KvLayout::kNhd, 4, 16, 2, 128, Device::kCuda);
  DeviceArray<uint16_t> pool(size_t(shape.elements_per_pool()) + 8);
  EXPECT_FALSE(refusal(pool.data(), shape).has_value());                               // cudaMalloc'd: described
  expect_refused(refusal(pool.data() + 1, shape), "cuTensorMapEncodeTiled failed");  // 2 bytes past it
}

}  // namespace
}  // namespace pagoda::cuda
