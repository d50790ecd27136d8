// The fixture of every test that needs a CUDA device: on a machine without one (CI compiles the
// CUDA code and has no GPU) the test skips itself with "no CUDA device", which ctest's
// SKIP_REGULAR_EXPRESSION for the gpu suite reports as Skipped. Host-only tests use plain TEST.
#pragma once

#include <gtest/gtest.h>

#include "pagoda/backend/cuda/check.h"

namespace pagoda::cuda {

template <typename Base>
class NeedsDevice : public Base {
 protected:
  void SetUp() override {
    if (!device_available()) GTEST_SKIP() << "no CUDA device";
  }
};

using GpuTest = NeedsDevice<::testing::Test>;
template <typename Param>
using GpuTestWithParam = NeedsDevice<::testing::TestWithParam<Param>>;

}  // namespace pagoda::cuda
