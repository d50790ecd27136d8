// Thin wrappers over the PTX instructions the decode kernels are built from, each named after
// its instruction. sm_80+ unless noted; the L2 prefetch needs sm_90.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace pagoda::cuda::ptx {

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// An L2 policy that marks lines evict_first: streamed KV is read once per step, so it should be
// the first to leave L2 and not push out what is still to be read.
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// 16-byte global -> shared copy, bypassing L1. src_bytes < 16 zero-fills the rest (0: all zeros,
// src is not read).
__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_16_hint(uint32_t dst, const void* src, uint32_t src_bytes,
                                                 uint64_t policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst),
               "l"(src), "r"(src_bytes), "l"(policy)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Fetches the line holding src into this SM's L1 for a load that comes later: unlike a load, it
// holds no register while it is in flight.
__device__ __forceinline__ void prefetch_l1(const void* src) { asm volatile("prefetch.global.L1 [%0];" ::"l"(src)); }

// Small global -> shared copies through L1 (4 or 8 bytes: metadata such as block ids).
template <int kBytes>
__device__ __forceinline__ void cp_async_small(uint32_t dst, const void* src) {
  static_assert(kBytes == 4 || kBytes == 8);
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(dst), "l"(src), "n"(kBytes) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// mbarriers (sm_80+; the counted arrive sm_90): a phase completes when `count` arrivals have
// come; waiters name the phase by its parity. Producer/consumer pipelines use one "full" and one
// "empty" barrier per stage.
__device__ __forceinline__ void mbarrier_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbarrier_arrive(uint32_t bar, uint32_t count = 1) {
  [[maybe_unused]] uint64_t state;  // the phase arrived on; unused
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 %0, [%1], %2;" : "=l"(state) : "r"(bar), "r"(count) : "memory");
}
// An arrival on `bar` once every cp.async this thread has issued so far has landed; it does not
// raise the phase's expected count (the barrier's init count includes it).
__device__ __forceinline__ void cp_async_mbarrier_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbarrier_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Adds `bytes` to the transactions the current phase of `bar` waits for (sm_90): the bytes of the
// tensor copies that will complete on it.
__device__ __forceinline__ void mbarrier_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// The tensor memory accelerator (sm_90): one instruction copies a box of a 5-d tensor, described
// by a CUtensorMap kernel parameter (__grid_constant__), into shared memory, and completes its
// bytes on mbarrier `bar`. The box lands swizzled as its map says. The L2 policy is part of the
// instruction text, one function each: ptxas 13.0 miscompiled a policy register chosen between
// two (cp.async: an illegal instruction), so no call site ever selects one.
// evict_last: other CTAs of the launch read these bytes too, so they should outlive the streamed
// rest; evict_first: read once, the first lines L2 gives up.
#define PAGODA_TMA_LOAD_5D(policy)                                                                           \
  asm volatile(                                                                                             \
      "{\n.reg .b64 policy;\n"                                                                              \
      "createpolicy.fractional.L2::" policy ".b64 policy, 1.0;\n"                                           \
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"      \
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7], policy;\n}" ::"r"(dst),                                     \
      "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)                                      \
      : "memory")
__device__ __forceinline__ void tma_load_5d_evict_last(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                                       int c4, uint32_t bar) {
  PAGODA_TMA_LOAD_5D("evict_last");
}
__device__ __forceinline__ void tma_load_5d_evict_first(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                                        int c4, uint32_t bar) {
  PAGODA_TMA_LOAD_5D("evict_first");
}
#undef PAGODA_TMA_LOAD_5D

// Fetches a tensor map (a __grid_constant__ parameter) into the descriptor cache ahead of its
// first copy.
__device__ __forceinline__ void prefetch_tensor_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(map) : "memory");
}

// Moves registers between warpgroups (sm_90a): every warp of a warpgroup executes the same one,
// the kernel's register count is fixed at compile time (__launch_bounds__ with a minimum of
// blocks), and the warpgroups' counts sum to at most that count times their number.
template <int kRegisters>
__device__ __forceinline__ void grow_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}
template <int kRegisters>
__device__ __forceinline__ void shrink_registers() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
#endif
}

// A barrier among `threads` threads (a multiple of 32) of the CTA, numbered `id` (1-15; 0 is
// __syncthreads): the warps of one role synchronize without the others.
__device__ __forceinline__ void named_barrier(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Asynchronous prefetch of [src, src + bytes) into L2 (sm_90). bytes: a multiple of 16, src
// 16-byte aligned. Nothing waits for it: a later load simply hits L2.
__device__ __forceinline__ void prefetch_l2(const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}

// Global loads through the non-coherent path with an L2 eviction policy. Not volatile: the
// compiler may batch them like plain loads.
__device__ __forceinline__ uint4 load_16_hint(const void* src, uint64_t policy) {
  uint4 v;
  asm("ld.global.nc.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(src), "l"(policy));
  return v;
}
__device__ __forceinline__ uint32_t load_4_hint(const void* src, uint64_t policy) {
  uint32_t v;
  asm("ld.global.nc.L2::cache_hint.u32 %0, [%1], %2;" : "=r"(v) : "l"(src), "l"(policy));
  return v;
}
__device__ __forceinline__ uint2 load_8_hint(const void* src, uint64_t policy) {
  uint2 v;
  asm("ld.global.nc.L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;"
               : "=r"(v.x), "=r"(v.y)
               : "l"(src), "l"(policy));
  return v;
}

// Four 8x8 b16 matrices from shared memory; lanes 8i..8i+7 give the row addresses of matrix i,
// and register i receives the lane's fragment of matrix i (row lane/4, columns 2(lane%4), +1).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}
// The same, each matrix transposed: the lane receives rows 2(lane%4), +1 of column lane/4.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(address));
}

// Programmatic dependent launch (sm_90): the next kernel in the stream, launched with the
// programmatic-serialization attribute, may start once every CTA of this one has called
// launch_dependents; it must call wait_prerequisite_grid before reading this kernel's results,
// which returns when this grid has finished and its memory is visible.
__device__ __forceinline__ void launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void wait_prerequisite_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// 2^x on the SFU, a subnormal result flushed to 0: one MUFU.EX2, where exp2f (ex2.approx.f32)
// wraps it in instructions that keep subnormal results. The softmax weights are exp2 of x <= 8,
// summed into sums of at least 1 (online_softmax.cuh): a weight below 2^-126 changes nothing.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Transposes one 8x8 b16 matrix held as a fragment across the warp.
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// d += a * b on the tensor cores: a 16x16 (row), b 16x8 (col), d 16x8 fp32. T: __half or
// __nv_bfloat16.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                            uint32_t b1) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats rounded to T and packed (lo in the low half), as the mma operands want them.
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

// The two T in x as floats.
template <typename T>
__device__ __forceinline__ float2 unpack2(uint32_t x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half22float2(*reinterpret_cast<const __half2*>(&x));
  } else {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(x);
  } else {
    return __float2bfloat16_rn(x);
  }
}

template <typename T>
__device__ __forceinline__ float to_float(T x) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(x);
  } else {
    return __bfloat162float(x);
  }
}

}  // namespace pagoda::cuda::ptx
