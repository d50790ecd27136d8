// DLPack tensors as the ops take them, viewed without a copy, and the checks that turn a wrong
// shape, dtype, device or stride into one clear ValueError before any kernel sees the pointer.
//
// A tensor is viewed through its framework's DLPack C exchange API when its type has one
// (`__dlpack_c_exchange_api__`, DLPack 1.2: torch 2.9 and later): a C call that fills a DLTensor
// in about 0.1 µs, where `__dlpack__` makes and consumes a capsule in about 2-4 µs, three times per
// run(). Anything else (numpy, CuPy, JAX, older torch) goes through nanobind's import.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <string>

#include "pagoda/core/dtype.h"
#include "pagoda/core/tensor.h"

namespace pagoda::python {

using Array = nanobind::ndarray<>;

// The stream argument that means "the framework's current stream" (torch's current stream for a
// torch tensor; the legacy default stream, 0, for one whose framework does not say).
inline constexpr int64_t kCurrentStream = -1;

class TensorArg {
 public:
  // Throws Error(kInvalidArgument) naming the argument when obj is not a DLPack tensor.
  TensorArg(nanobind::handle obj, const char* name);

  const char* name() const { return name_; }
  void* data() const { return static_cast<char*>(t_.data) + t_.byte_offset; }
  size_t ndim() const { return size_t(t_.ndim); }
  int64_t shape(size_t d) const { return t_.shape[d]; }
  // In elements; a DLTensor without strides is row-major.
  int64_t stride(size_t d) const;
  int device_type() const { return int(t_.device.device_type); }
  int device_id() const { return int(t_.device.device_id); }
  const nanobind::dlpack::dtype& dtype() const { return t_.dtype; }
  // `stream` as a CUDA stream handle: kCurrentStream asks the tensor's framework for its current
  // stream on the tensor's device.
  uintptr_t stream(int64_t stream) const;

 private:
  const char* name_;
  nanobind::dlpack::dltensor t_{};
  const void* exchange_api_ = nullptr;
  Array held_;  // the nanobind import, kept for as long as the view
};

// f32, f16 or bf16; anything else throws naming the tensor.
DType dtype_of(const TensorArg& a);
// kCpu or kCuda; anything else throws.
Device device_of(const TensorArg& a);
// "[4, 32, 128]"
std::string shape_string(const TensorArg& a);

struct TensorRule {
  const char* dims;  // what the dimensions are, for the message: "[num_seqs, num_q_heads, head_dim]"
  std::initializer_list<int64_t> shape;  // -1: any size
  DType dtype;
  Device device;
  int device_id;
};

// Throws Error(kInvalidArgument) unless a has the rule's rank, sizes, dtype and device and is
// row-major contiguous (dimensions of size 1 may have any stride).
void check_tensor(const TensorArg& a, const TensorRule& rule);

// Names as the Python API spells dtypes and devices.
DType parse_dtype(const std::string& name);
Device parse_device(const std::string& name);
const char* device_name(Device device);

}  // namespace pagoda::python
