#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>

#include "pagoda/bench/cuda_support.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/kernels/ptx.cuh"

namespace pagoda::bench {

using cuda::check_cuda;
using cuda::DeviceArray;
namespace ptx = cuda::ptx;
namespace {

constexpr int kStreamThreads = 512;
constexpr int kFillThreads = 256;

// Every thread keeps four loads in flight per iteration (one per independent xor accumulator):
// with a CTA per SM slot that is enough outstanding bytes to saturate HBM. kEvictFirst: __ldcs
// marks the lines evict-first, as the decode kernels do for streamed KV (the bandwidth probe);
// otherwise plain loads leave the lines resident (the L2 flush). The conditional store depends on
// every load, so none can be removed, and it never happens: the buffer holds one repeated byte,
// so every accumulator ends as 0 or as that byte repeated.
template <bool kEvictFirst>
__global__ void __launch_bounds__(kStreamThreads)
    stream_read_kernel(const uint4* __restrict__ data, size_t count, uint4* __restrict__ sink) {
  auto load = [](const uint4* p) { return kEvictFirst ? __ldcs(p) : __ldg(p); };
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  uint4 a0 = make_uint4(0, 0, 0, 0), a1 = a0, a2 = a0, a3 = a0;
  auto fold = [](uint4& acc, uint4 x) {
    acc.x ^= x.x;
    acc.y ^= x.y;
    acc.z ^= x.z;
    acc.w ^= x.w;
  };
  for (; i + 3 * stride < count; i += 4 * stride) {
    const uint4 x0 = load(data + i);
    const uint4 x1 = load(data + i + stride);
    const uint4 x2 = load(data + i + 2 * stride);
    const uint4 x3 = load(data + i + 3 * stride);
    fold(a0, x0);
    fold(a1, x1);
    fold(a2, x2);
    fold(a3, x3);
  }
  for (; i < count; i += stride) fold(a0, load(data + i));
  fold(a0, a1);
  fold(a2, a3);
  fold(a0, a2);
  if (a0.x == 0x9e3779b9u && a0.y == 0x7f4a7c15u && a0.z == 0xf39cc060u && a0.w == 0x5cedc834u) *sink = a0;
}

constexpr int kMmaThreads = 256;
constexpr int kMmaChains = 8;  // independent accumulators per warp: enough to hide the mma latency

// kIterations x kMmaChains mma per warp on operands that never change; the conditional store
// keeps the accumulators (and so every mma) alive and never happens for these inputs.
template <int kIterations>
__global__ void __launch_bounds__(kMmaThreads) mma_peak_kernel(float* sink) {
  const uint32_t a[4] = {threadIdx.x, threadIdx.x + 1, threadIdx.x + 2, threadIdx.x + 3};
  const uint32_t b0 = 0x3c003c00u, b1 = 0x00010001u;  // small finite halves
  float acc[kMmaChains][4] = {};
#pragma unroll 1
  for (int i = 0; i < kIterations; ++i) {
#pragma unroll
    for (int c = 0; c < kMmaChains; ++c) ptx::mma_16x8x16<__half>(acc[c], a, b0, b1);
  }
  float total = 0.f;
#pragma unroll
  for (int c = 0; c < kMmaChains; ++c) total += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  if (total == 1.2345f) *sink = total;
}

__global__ void sleep_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// splitmix64's finalizer: a cheap, well-mixed hash of (seed, index).
__device__ __forceinline__ uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// 24 random bits -> [-1, 1), exact in fp32. Converting toward zero keeps the fp16/bf16 value in
// [-1, 1): rounding to nearest could turn 1 - 2^-23 into 1.
__device__ __forceinline__ float unit_interval(uint32_t bits24) { return float(bits24) * (1.f / 8388608.f) - 1.f; }

template <typename T>
__device__ __forceinline__ T from_float_toward_zero(float x);
template <>
__device__ __forceinline__ __half from_float_toward_zero<__half>(float x) { return __float2half_rz(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float_toward_zero<__nv_bfloat16>(float x) {
  return __float2bfloat16_rz(x);
}
template <>
__device__ __forceinline__ float from_float_toward_zero<float>(float x) { return x; }

// Each thread writes 16-byte chunks (two values per 64-bit hash); a partial last chunk, or a
// buffer not 16-byte aligned, is written element by element.
template <typename T>
__global__ void __launch_bounds__(kFillThreads)
    fill_uniform_kernel(T* __restrict__ data, size_t count, uint64_t seed, bool aligned16) {
  constexpr int kPerChunk = int(16 / sizeof(T));
  const size_t chunks = (count + kPerChunk - 1) / kPerChunk;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const uint64_t key = mix64(seed + 0x9e3779b97f4a7c15ull);
  for (size_t c = size_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += stride) {
    const size_t base = c * kPerChunk;
    uint4 packed;
    T* values = reinterpret_cast<T*>(&packed);
#pragma unroll
    for (int j = 0; j < kPerChunk; j += 2) {
      const uint64_t h = mix64(key ^ (base + size_t(j)));
      values[j] = from_float_toward_zero<T>(unit_interval(uint32_t(h) & 0xffffffu));
      values[j + 1] = from_float_toward_zero<T>(unit_interval(uint32_t(h >> 40)));
    }
    if (aligned16 && base + kPerChunk <= count) {
      *reinterpret_cast<uint4*>(data + base) = packed;
    } else {
      for (int j = 0; j < kPerChunk && base + size_t(j) < count; ++j) data[base + size_t(j)] = values[j];
    }
  }
}

template <typename T>
void launch_fill(void* data, size_t count, uint64_t seed, cudaStream_t stream) {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  constexpr size_t kPerChunk = 16 / sizeof(T);
  const size_t chunks = (count + kPerChunk - 1) / kPerChunk;
  const size_t blocks = std::clamp<size_t>((chunks + kFillThreads - 1) / kFillThreads, 1, size_t(sms) * 16);
  const bool aligned16 = reinterpret_cast<uintptr_t>(data) % 16 == 0;
  fill_uniform_kernel<T><<<unsigned(blocks), kFillThreads, 0, stream>>>(static_cast<T*>(data), count, seed, aligned16);
  check_cuda(cudaGetLastError(), "fill_uniform launch");
}

// Enough CTAs of stream_read_kernel to fill every SM.
template <bool kEvictFirst>
unsigned stream_read_grid() {
  int device = 0, sms = 0, ctas_per_sm = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas_per_sm, stream_read_kernel<kEvictFirst>,
                                                           kStreamThreads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return unsigned(sms * std::max(ctas_per_sm, 1));
}

}  // namespace

DeviceSummary describe_current_device() {
  int device = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  DeviceSummary summary;
  summary.name = prop.name;
  summary.sm_count = prop.multiProcessorCount;
  summary.cc_major = prop.major;
  summary.cc_minor = prop.minor;
  summary.l2_bytes = prop.l2CacheSize;
  check_cuda(cudaMemGetInfo(&summary.free_bytes, &summary.total_bytes), "cudaMemGetInfo");
  return summary;
}

double measure_stream_read_bandwidth(int passes) {
  size_t free_bytes = 0, total_bytes = 0;
  check_cuda(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  const size_t bytes = std::min(size_t(4) << 30, free_bytes / 4) / 4096 * 4096;
  DeviceArray<uint4> buffer(bytes / sizeof(uint4));
  DeviceArray<uint4> sink(1);
  check_cuda(cudaMemset(buffer.data(), 0x5a, buffer.bytes()), "cudaMemset");

  const unsigned grid = stream_read_grid<true>();

  passes = std::max(passes, 1);
  EventTimings timings(passes);
  // Warm-up long enough (a few hundred ms) for the clocks to leave their idle state, or the first
  // pass reads a GPU slower than it is.
  for (int i = 0; i < 300; ++i) stream_read_kernel<true><<<grid, kStreamThreads>>>(buffer.data(), buffer.size(), sink.data());
  check_cuda(cudaGetLastError(), "stream_read_kernel launch");
  for (int pass = 0; pass < passes; ++pass) {
    timings.start(pass);
    stream_read_kernel<true><<<grid, kStreamThreads>>>(buffer.data(), buffer.size(), sink.data());
    timings.stop(pass);
  }
  check_cuda(cudaGetLastError(), "stream_read_kernel launch");
  const std::vector<double> us = timings.elapsed_us();
  const double best_us = *std::min_element(us.begin(), us.end());
  return double(buffer.bytes()) / (best_us * 1e-6);
}

double measure_mma_peak_flops(int passes) {
  constexpr int kIterations = 4096;
  int device = 0, sms = 0, ctas = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check_cuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&ctas, mma_peak_kernel<kIterations>, kMmaThreads, 0),
             "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  const unsigned grid = unsigned(sms * std::max(ctas, 1));
  DeviceArray<float> sink(1);
  passes = std::max(passes, 1);
  EventTimings timings(passes);
  for (int i = 0; i < 20; ++i) mma_peak_kernel<kIterations><<<grid, kMmaThreads>>>(sink.data());  // clocks up
  for (int pass = 0; pass < passes; ++pass) {
    timings.start(pass);
    mma_peak_kernel<kIterations><<<grid, kMmaThreads>>>(sink.data());
    timings.stop(pass);
  }
  check_cuda(cudaGetLastError(), "mma_peak_kernel launch");
  const std::vector<double> us = timings.elapsed_us();
  const double best_us = *std::min_element(us.begin(), us.end());
  const double flops = double(grid) * (kMmaThreads / 32) * kIterations * kMmaChains * (2.0 * 16 * 8 * 16);
  return flops / (best_us * 1e-6);
}

L2Flusher::L2Flusher() {
  int device = 0, l2_bytes = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&l2_bytes, cudaDevAttrL2CacheSize, device), "cudaDeviceGetAttribute");
  buffer_.resize(std::max<size_t>(size_t(l2_bytes) * 2, 1 << 20) / sizeof(uint4));
  sink_.resize(1);
  check_cuda(cudaMemset(buffer_.data(), 0x5a, buffer_.bytes()), "cudaMemset (L2 flush buffer)");
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  grid_ = stream_read_grid<false>();
}

void L2Flusher::flush(cudaStream_t stream) {
  stream_read_kernel<false><<<grid_, kStreamThreads, 0, stream>>>(buffer_.data(), buffer_.size(), sink_.data());
  check_cuda(cudaGetLastError(), "stream_read_kernel launch (L2 flush)");
}

void gpu_sleep(double us, cudaStream_t stream) {
  sleep_kernel<<<1, 1, 0, stream>>>(uint64_t(us * 1e3));
  check_cuda(cudaGetLastError(), "sleep_kernel launch");
}

void fill_uniform(void* data, size_t count, DType dtype, uint64_t seed, cudaStream_t stream) {
  if (count == 0) return;
  switch (dtype) {
    case DType::kF16: return launch_fill<__half>(data, count, seed, stream);
    case DType::kBF16: return launch_fill<__nv_bfloat16>(data, count, seed, stream);
    case DType::kF32: return launch_fill<float>(data, count, seed, stream);
    default: check_cuda(cudaErrorInvalidValue, "fill_uniform (dtype must be f16, bf16 or f32)");
  }
}

EventTimings::EventTimings(int runs) {
  starts_.reserve(size_t(runs));
  stops_.reserve(size_t(runs));
  try {
    for (int i = 0; i < runs; ++i) {
      cudaEvent_t start = nullptr, stop = nullptr;
      check_cuda(cudaEventCreate(&start), "cudaEventCreate");
      starts_.push_back(start);
      check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
      stops_.push_back(stop);
    }
  } catch (...) {
    for (cudaEvent_t e : starts_) cudaEventDestroy(e);
    for (cudaEvent_t e : stops_) cudaEventDestroy(e);
    throw;
  }
}

EventTimings::~EventTimings() {
  for (cudaEvent_t e : starts_) cudaEventDestroy(e);
  for (cudaEvent_t e : stops_) cudaEventDestroy(e);
}

void EventTimings::start(int run, cudaStream_t stream) {
  check_cuda(cudaEventRecord(starts_.at(size_t(run)), stream), "cudaEventRecord");
}

void EventTimings::stop(int run, cudaStream_t stream) {
  check_cuda(cudaEventRecord(stops_.at(size_t(run)), stream), "cudaEventRecord");
}

std::vector<double> EventTimings::elapsed_us() {
  std::vector<double> us;
  if (stops_.empty()) return us;
  check_cuda(cudaEventSynchronize(stops_.back()), "cudaEventSynchronize");
  us.reserve(stops_.size());
  for (size_t i = 0; i < stops_.size(); ++i) {
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, starts_[i], stops_[i]), "cudaEventElapsedTime");
    us.push_back(double(ms) * 1e3);
  }
  return us;
}

}  // namespace pagoda::bench
