// Tensor: a non-owning, strided view of up to 4 dimensions. Ownership lives elsewhere (a Buffer,
// an mmap'd file, a KV pool); a view is cheap to copy and is what the Backend ops take.
#pragma once

#include <array>
#include <cassert>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "pagoda/core/dtype.h"

namespace pagoda {

enum class Device : uint8_t { kCpu, kCuda };

struct Tensor {
  static constexpr int kMaxDims = 4;

  void* data = nullptr;
  DType dtype = DType::kF32;
  Device device = Device::kCpu;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<int64_t, kMaxDims> strides{};  // in elements

  // A contiguous row-major view.
  static Tensor contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                           Device device = Device::kCpu) {
    Tensor t;
    t.data = data;
    t.dtype = dtype;
    t.device = device;
    t.ndim = int(shape.size());
    assert(t.ndim <= kMaxDims);
    int i = 0;
    for (int64_t s : shape) t.shape[i++] = s;
    int64_t stride = 1;
    for (int d = t.ndim - 1; d >= 0; --d) {
      t.strides[d] = stride;
      stride *= t.shape[d];
    }
    return t;
  }

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  int64_t size(int d) const { return shape[d < 0 ? d + ndim : d]; }
  size_t nbytes() const { return dtype_bytes(dtype, numel()); }
  bool is_contiguous() const {
    int64_t stride = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != stride) return false;
      stride *= shape[d];
    }
    return true;
  }
  template <typename T>
  T* ptr() const {
    return static_cast<T*>(data);
  }
  // Rows [begin, end) of the leading dimension.
  Tensor rows(int64_t begin, int64_t end) const {
    Tensor t = *this;
    t.data = static_cast<char*>(data) + dtype_bytes(dtype, begin * strides[0]);
    t.shape[0] = end - begin;
    return t;
  }
  std::string shape_string() const;
};

}  // namespace pagoda
