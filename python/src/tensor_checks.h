// DLPack tensors as the ops take them: nanobind's nb::ndarray<> views whatever a caller passes
// (torch, numpy, CuPy, JAX) without a copy; these checks turn a wrong shape, dtype, device or
// stride into one clear ValueError before any kernel sees the pointer.
#pragma once

#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor.h"

namespace pagoda::python {

using Array = nanobind::ndarray<>;

// f32, f16 or bf16; anything else throws naming the tensor.
DType dtype_of(const Array& a, const char* name);
// kCpu or kCuda; anything else throws.
Device device_of(const Array& a, const char* name);
// "[4, 32, 128]"
std::string shape_string(const Array& a);

struct TensorRule {
  const char* name;
  const char* dims;  // what the dimensions are, for the message: "[num_seqs, num_q_heads, head_dim]"
  std::initializer_list<int64_t> shape;  // -1: any size
  DType dtype;
  Device device;
  int device_id;
};

// Throws Error(kInvalidArgument) unless a has the rule's rank, sizes, dtype and device and is
// row-major contiguous (dimensions of size 1 may have any stride).
void check_tensor(const Array& a, const TensorRule& rule);

// Names as the Python API spells dtypes and devices.
DType parse_dtype(const std::string& name);
Device parse_device(const std::string& name);
const char* device_name(Device device);

}  // namespace pagoda::python
