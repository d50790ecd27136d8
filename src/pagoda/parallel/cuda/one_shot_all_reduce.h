// One-shot all-reduce for small messages between the GPUs of one process (the ranks are threads,
// so every rank's device memory is reachable through peer access, no IPC handles needed).
//
// Each rank stages its input in its own buffer, the ranks meet at a barrier of flags written
// across GPUs with system-scope release stores and read with acquire loads, and then every rank
// reads the staged inputs of all ranks and sums them in fp32 in rank order (so every rank rounds
// the same sum once and all get identical bits). One kernel, one barrier: its latency is a
// launch, one round trip over NVLink and (N - 1) x bytes of peer reads, against NCCL's ring or tree
// that needs several dependent steps; for the few-KB hidden states of a decode step the latency
// is what matters (as in vLLM's and TensorRT-LLM's custom all-reduce).
//
// Bytes per call and rank: reads x twice (staging it, then summing; 2 x bytes) and the N - 1 peers'
// staging over NVLink ((N - 1) x bytes), writes 2 x bytes (staging, output) and N flags.
// FLOPs: (N - 1) x elements adds.
//
// Reuse without a second barrier: the staging buffer alternates between two halves by call
// parity. A rank writes half (c & 1) in call c only after passing the barrier of call c - 1,
// which every peer reached only after finishing call c - 2 (the last reader of that half): its
// kernels run in stream order. Every call uses the same grid, so block b of every rank makes the
// same calls and its flags and call counter stay in step.
//
// Graph capture: the kernel's arguments are fixed pointers and the message size; the call
// counter lives in device memory, so a captured launch replays correctly. No host sync.
//
// Faults: a peer that does not arrive within `timeout_ns` (dead or stalled rank), or the clique's
// abort word set by the host, makes the kernel store a non-zero status in host-mapped memory and
// return without summing; the host turns that status into an error.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>

#include "pagoda/core/dtype.h"

namespace pagoda::parallel::cuda {

constexpr int kMaxRanks = 8;
constexpr int kOneShotBlocks = 32;  // fixed for every call (see above); 32 x 512 threads x 16 B per pass
constexpr int kOneShotThreads = 512;

// The status a failed call leaves in OneShotArgs::status.
enum OneShotStatus : int { kOneShotOk = 0, kOneShotPeerTimeout = 1, kOneShotAborted = 2 };

// One rank's device memory for the kernel (allocated on that rank's GPU).
struct OneShotBuffers {
  std::byte* staging = nullptr;  // 2 x capacity bytes: the halves of even and odd calls
  uint32_t* flags = nullptr;     // [kOneShotBlocks][kMaxRanks]: flags[b][p] = the last call whose block b rank p staged
  uint32_t* calls = nullptr;     // [kOneShotBlocks]: calls made by each block of this rank
};

// The bytes of OneShotBuffers for messages of at most `capacity` bytes, and their layout in one
// allocation (zeroed before first use).
size_t one_shot_buffer_bytes(size_t capacity);
OneShotBuffers one_shot_buffers_at(std::byte* base, size_t capacity);

struct OneShotArgs {
  std::array<std::byte*, kMaxRanks> staging{};  // every rank's, as this rank's GPU addresses them
  std::array<uint32_t*, kMaxRanks> flags{};
  uint32_t* calls = nullptr;     // this rank's
  size_t capacity = 0;           // bytes of each staging half
  int rank = 0;
  int world = 1;
  int* status = nullptr;         // host-mapped, this rank's: OneShotStatus of the last failure
  const volatile int* abort = nullptr;  // host-mapped, the clique's: non-zero once it aborted
  uint64_t timeout_ns = 0;
};

// x (bytes = count x dtype size, a multiple of 16 and at most args.capacity; x 16-byte aligned)
// = the sum over ranks of x, in place, f32 / f16 / bf16. Enqueues one kernel on `stream`.
void one_shot_all_reduce(const OneShotArgs& args, void* x, size_t bytes, DType dtype, cudaStream_t stream);

}  // namespace pagoda::parallel::cuda
