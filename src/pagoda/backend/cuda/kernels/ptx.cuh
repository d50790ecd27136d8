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
// two (cp.async, illegal instruction on an H100), so no call site ever selects one.
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

// Warpgroup MMA (sm_90a). The four warps of a warpgroup issue one m64nNk16 product together:
// warp w's A rows are the product's rows [16 w, 16 w + 16), in mma.sync m16n8k16's A fragment,
// and its accumulators are those rows in mma.sync's C layout, n-tile after n-tile. B comes from
// shared memory through a descriptor. The product runs asynchronously: wgmma_fence orders the
// registers' earlier writes before it, wgmma_commit_and_wait waits for every product issued.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_and_wait() {
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// Orders shared memory this thread has seen written through the generic proxy (cp.async) before
// the async proxy's reads it issues next (wgmma's B operands).
__device__ __forceinline__ void fence_proxy_async_shared() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// The descriptor of a B operand in the 128-byte swizzle, starting at shared address `start`
// inside a pattern that repeats from a 1024-byte boundary. K-major (B's N rows, each along K):
// `stride` is the distance between groups of 8 rows, `leading` unused. MN-major (transposed):
// `leading` is the distance between blocks of 64 columns, `stride` between groups of 8 rows of K.
__device__ __forceinline__ uint64_t wgmma_descriptor_128b(uint32_t start, uint32_t leading, uint32_t stride) {
  return uint64_t((start & 0x3FFFF) >> 4) | uint64_t(leading >> 4) << 16 | uint64_t(stride >> 4) << 32 |
         uint64_t(1) << 62;
}

// d (64 x 16: two n-tiles) = a (64 x 16) * b (16 x 16, K-major), plus d if kAccumulate. The
// first product of a chain writes d without reading it: zeroing d beforehand would be a write by
// other instructions, for which ptxas serializes every wgmma of the kernel.
template <typename T, bool kAccumulate>
__device__ __forceinline__ void wgmma_64x16x16(float (&d0)[4], float (&d1)[4], const uint32_t (&a)[4], uint64_t b) {
#define PAGODA_WGMMA_64X16(types, accumulate, d_constraint)                                          \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"                                         \
               "wgmma.mma_async.sync.aligned.m64n16k16.f32." types                                  \
               " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}"         \
               : d_constraint(d0[0]), d_constraint(d0[1]), d_constraint(d0[2]), d_constraint(d0[3]), \
                 d_constraint(d1[0]), d_constraint(d1[1]), d_constraint(d1[2]), d_constraint(d1[3])  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"(accumulate))
  constexpr bool kHalf = std::is_same_v<T, __half>;
  if constexpr (kHalf && kAccumulate) {
    PAGODA_WGMMA_64X16("f16.f16", 1, "+f");
  } else if constexpr (kHalf) {
    PAGODA_WGMMA_64X16("f16.f16", 0, "=f");
  } else if constexpr (kAccumulate) {
    PAGODA_WGMMA_64X16("bf16.bf16", 1, "+f");
  } else {
    PAGODA_WGMMA_64X16("bf16.bf16", 0, "=f");
  }
#undef PAGODA_WGMMA_64X16
}

// d (64 x 128: sixteen n-tiles) += a (64 x 16) * b (16 x 128, MN-major: each of b's rows along N).
template <typename T>
__device__ __forceinline__ void wgmma_64x128x16_b_transposed(float (&d)[16][4], const uint32_t (&a)[4], uint64_t b) {
#define PAGODA_WGMMA_64X128(types)                                                                  \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"                                           \
               "wgmma.mma_async.sync.aligned.m64n128k16.f32." types " {"                            \
               "%0, %1, %2, %3, %4, %5, %6, %7, "                                                  \
               "%8, %9, %10, %11, %12, %13, %14, %15, "                                            \
               "%16, %17, %18, %19, %20, %21, %22, %23, "                                          \
               "%24, %25, %26, %27, %28, %29, %30, %31, "                                          \
               "%32, %33, %34, %35, %36, %37, %38, %39, "                                          \
               "%40, %41, %42, %43, %44, %45, %46, %47, "                                          \
               "%48, %49, %50, %51, %52, %53, %54, %55, "                                          \
               "%56, %57, %58, %59, %60, %61, %62, %63}, "                                         \
               "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"                                         \
               : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]),                       \
                 "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]), "+f"(d[1][3]),                       \
                 "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),                       \
                 "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]),                       \
                 "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]),                       \
                 "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),                       \
                 "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),                       \
                 "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3]),                       \
                 "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),                       \
                 "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]),                       \
                 "+f"(d[10][0]), "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]),                   \
                 "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]), "+f"(d[11][3]),                   \
                 "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),                   \
                 "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),                   \
                 "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]),                   \
                 "+f"(d[15][0]), "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])                    \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b))
  if constexpr (std::is_same_v<T, __half>) {
    PAGODA_WGMMA_64X128("f16.f16");
  } else {
    PAGODA_WGMMA_64X128("bf16.bf16");
  }
#undef PAGODA_WGMMA_64X128
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
