// DeviceArray<T>: an owned cudaMalloc'd array of trivially copyable T, with host <-> device
// copies. The one owner of device memory in tests, benchmarks and the decode workspace. It
// counts its reallocations (generation()): a CUDA graph that captured data() is valid while the
// count stays the same (graph_table.h).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "pagoda/backend/cuda/check.h"

namespace pagoda::cuda {

template <typename T>
class DeviceArray {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t size) { resize(size); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)), generation_(++other.generation_) {}
  // Both arrays' data() change: both move on to a generation neither had (a generation only grows).
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(capacity_, other.capacity_);
    generation_ = other.generation_ = std::max(generation_, other.generation_) + 1;
    return *this;
  }
  ~DeviceArray() { cudaFree(data_); }

  // Discards the contents; reallocates only to grow.
  void resize(size_t size) {
    if (size > capacity_) {
      cudaFree(data_);
      data_ = nullptr;
      capacity_ = 0;
      ++generation_;
      check_cuda(cudaMalloc(&data_, size * sizeof(T)), "cudaMalloc");
      capacity_ = size;
    }
    size_ = size;
  }

  // Room for `capacity` elements without changing the size (so later resizes up to it keep
  // data() where it is: a captured CUDA graph holds that pointer).
  void reserve(size_t capacity) {
    if (capacity <= capacity_) return;
    const size_t size = size_;
    resize(capacity);
    size_ = size;
  }

  // Room for `size` elements, grown to at least twice the old capacity when it must grow, so
  // that an array uploaded every step with a changing size rarely moves.
  void make_room(size_t size) {
    if (size > capacity_) reserve(std::max(size, 2 * capacity_));
  }

  // upload(), growing as make_room() does: for arrays uploaded every step, whose address a
  // captured CUDA graph holds.
  void upload_grown(std::span<const T> host, cudaStream_t stream = nullptr) {
    make_room(host.size());
    upload(host, stream);
  }

  // Resizes to host.size() and copies host in (asynchronous on `stream` for pinned host memory,
  // synchronous with respect to the host otherwise).
  void upload(std::span<const T> host, cudaStream_t stream = nullptr) {
    resize(host.size());
    if (!host.empty()) {
      check_cuda(cudaMemcpyAsync(data_, host.data(), host.size_bytes(), cudaMemcpyHostToDevice, stream),
                 "cudaMemcpyAsync to device");
    }
  }

  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ > 0) check_cuda(cudaMemcpy(host.data(), data_, size_ * sizeof(T), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return host;
  }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  size_t bytes() const { return size_ * sizeof(T); }
  // How many times data() has moved.
  uint64_t generation() const { return generation_; }

 private:
  T* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
  uint64_t generation_ = 0;
};

}  // namespace pagoda::cuda
