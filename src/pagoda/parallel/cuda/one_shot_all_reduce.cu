#include "pagoda/parallel/cuda/one_shot_all_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "pagoda/backend/cuda/check.h"

namespace pagoda::parallel::cuda {
namespace {

__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ uint64_t global_timer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
template <typename T>
__device__ __forceinline__ T from_f32(float v);
template <>
__device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

template <typename T>
__global__ void __launch_bounds__(kOneShotThreads) one_shot_kernel(OneShotArgs a, uint4* x, size_t packs) {
  constexpr int kLanes = 16 / sizeof(T);
  __shared__ uint32_t call;
  __shared__ int failed;
  const int b = blockIdx.x;
  const int t = threadIdx.x;
  if (t == 0) {
    call = a.calls[b] + 1;
    a.calls[b] = call;
    failed = kOneShotOk;
  }
  __syncthreads();
  const uint32_t c = call;
  const size_t half = (c & 1) ? a.capacity : 0;
  const size_t first = size_t(b) * kOneShotThreads + t;
  const size_t stride = size_t(kOneShotBlocks) * kOneShotThreads;

  uint4* mine = reinterpret_cast<uint4*>(a.staging[a.rank] + half);
  for (size_t i = first; i < packs; i += stride) mine[i] = x[i];
  __syncthreads();

  // The barrier of block b: thread p tells rank p that this rank's share is staged, then waits
  // for rank p's. The system-scope fence orders the whole block's staging stores (before the
  // __syncthreads) ahead of the flag for a reader on another GPU.
  if (t < a.world) {
    __threadfence_system();
    store_release_sys(&a.flags[t][b * kMaxRanks + a.rank], c);
    const uint32_t* flag = &a.flags[a.rank][b * kMaxRanks + t];
    const uint64_t start = global_timer_ns();
    for (uint32_t spins = 1; int32_t(load_acquire_sys(flag) - c) < 0; ++spins) {
      if (spins % 1024 == 0) {  // the abort word is host memory: read it rarely
        if (*a.abort) {
          failed = kOneShotAborted;
          break;
        }
        if (global_timer_ns() - start > a.timeout_ns) {
          failed = kOneShotPeerTimeout;
          break;
        }
      }
    }
  }
  __syncthreads();
  if (failed != kOneShotOk) {
    if (t == 0) {
      *a.status = failed;
      __threadfence_system();
    }
    return;
  }

  // Every rank's share in rank order (this rank's from x, still unmodified at index i), loads
  // first so that the N round trips overlap. Peers' staging is read through L2 (.cg): it was
  // written by another GPU since this SM last looked.
  for (size_t i = first; i < packs; i += stride) {
    uint4 v[kMaxRanks];
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < a.world) v[r] = r == a.rank ? x[i] : __ldcg(reinterpret_cast<const uint4*>(a.staging[r] + half) + i);
    }
    float acc[kLanes] = {};
#pragma unroll
    for (int r = 0; r < kMaxRanks; ++r) {
      if (r < a.world) {
        const T* e = reinterpret_cast<const T*>(&v[r]);
#pragma unroll
        for (int k = 0; k < kLanes; ++k) acc[k] += to_f32(e[k]);
      }
    }
    uint4 out;
    T* o = reinterpret_cast<T*>(&out);
#pragma unroll
    for (int k = 0; k < kLanes; ++k) o[k] = from_f32<T>(acc[k]);
    x[i] = out;
  }
}

constexpr size_t kFlagsBytes = sizeof(uint32_t) * kOneShotBlocks * kMaxRanks;
constexpr size_t kCallsBytes = sizeof(uint32_t) * kOneShotBlocks;

}  // namespace

size_t one_shot_buffer_bytes(size_t capacity) { return 2 * capacity + kFlagsBytes + kCallsBytes; }

OneShotBuffers one_shot_buffers_at(std::byte* base, size_t capacity) {
  return {.staging = base,
          .flags = reinterpret_cast<uint32_t*>(base + 2 * capacity),
          .calls = reinterpret_cast<uint32_t*>(base + 2 * capacity + kFlagsBytes)};
}

void one_shot_all_reduce(const OneShotArgs& args, void* x, size_t bytes, DType dtype, cudaStream_t stream) {
  if (bytes % 16 != 0 || bytes > args.capacity || reinterpret_cast<uintptr_t>(x) % 16 != 0 || args.world < 1 ||
      args.world > kMaxRanks) {
    pagoda::cuda::check_cuda(cudaErrorInvalidValue, "one_shot_all_reduce (size, alignment or ranks)");
  }
  if (bytes == 0) return;
  auto* packs = static_cast<uint4*>(x);
  const size_t n = bytes / 16;
  switch (dtype) {
    case DType::kF32:
      one_shot_kernel<float><<<kOneShotBlocks, kOneShotThreads, 0, stream>>>(args, packs, n);
      break;
    case DType::kF16:
      one_shot_kernel<__half><<<kOneShotBlocks, kOneShotThreads, 0, stream>>>(args, packs, n);
      break;
    case DType::kBF16:
      one_shot_kernel<__nv_bfloat16><<<kOneShotBlocks, kOneShotThreads, 0, stream>>>(args, packs, n);
      break;
    default:
      pagoda::cuda::check_cuda(cudaErrorInvalidValue, "one_shot_all_reduce (dtype)");
  }
  pagoda::cuda::check_cuda(cudaGetLastError(), "one_shot_all_reduce");
}

}  // namespace pagoda::parallel::cuda
