// What GPU benchmarks share: the device's streaming-read bandwidth (the bound decode kernels are
// compared against), an L2 flush between timed runs, fast random fill of large device buffers,
// and CUDA-event timing. Defined in cuda_support.cu (no fmt there: nvcc cannot compile it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/dtype.h"

namespace pagoda::bench {

// The current device as a benchmark result names it.
struct DeviceSummary {
  std::string name;       // cudaDeviceProp::name, e.g. "NVIDIA H200"
  int sm_count = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int64_t l2_bytes = 0;
  size_t free_bytes = 0;  // cudaMemGetInfo at the time of the call
  size_t total_bytes = 0;
};
DeviceSummary describe_current_device();

// Streaming-read bandwidth of device memory in bytes/s: a read-only kernel over a 4 GB buffer (a
// quarter of free memory when that is less), 16-byte evict-first loads, grid-stride
// with enough CTAs to fill every SM, an xor of everything read kept so the loads stay. The best
// of `passes` timed passes after 300 untimed ones. The buffer is freed before returning.
double measure_stream_read_bandwidth(int passes = 20);

// Dense fp16 tensor-core rate of mma.sync.m16n8k16 (fp32 accumulate) in FLOP/s: every SM runs
// warps of independent mma chains on register operands, no memory traffic; the best of `passes`
// timed passes. The compute bound of attention kernels built on that instruction.
double measure_mma_peak_flops(int passes = 10);

// Evicts L2 between timed runs by reading a buffer twice the L2 size, so the next run reads its
// inputs from device memory, as a real decode step whose KV was last touched a layer ago does.
// A read, not a memset: a write would leave L2 full of dirty lines whose write-back then lands
// inside the timed kernel (up to 60 MB of extra traffic, a large share of a small config).
class L2Flusher {
 public:
  L2Flusher();  // sized from the current device
  void flush(cudaStream_t stream = nullptr);
  size_t bytes() const { return buffer_.bytes(); }

 private:
  cuda::DeviceArray<uint4> buffer_;
  cuda::DeviceArray<uint4> sink_;
  unsigned grid_ = 0;
};

// Keeps the GPU busy for `us` microseconds (one thread spinning on the global timer). Queued
// before each timed run, it lets the host get ahead of the GPU, so that a host thread slowed by
// other work on the machine never leaves the GPU idle between a start event and the kernel.
void gpu_sleep(double us, cudaStream_t stream = nullptr);

// Fills count elements of dtype (f16, bf16 or f32) with values uniform in [-1, 1), a hash of
// (seed, index): the same seed gives the same contents. Runs at write bandwidth, for pools of
// tens of GB. Stream-ordered.
void fill_uniform(void* data, size_t count, DType dtype, uint64_t seed, cudaStream_t stream = nullptr);

// Timings of many runs with CUDA events, read back with one synchronization at the end so the
// host never stalls the queue between runs: start(i) and stop(i) bracket run i on the stream.
class EventTimings {
 public:
  explicit EventTimings(int runs);
  ~EventTimings();
  EventTimings(const EventTimings&) = delete;
  EventTimings& operator=(const EventTimings&) = delete;

  void start(int run, cudaStream_t stream = nullptr);
  void stop(int run, cudaStream_t stream = nullptr);
  // Waits for the last stop event; microseconds of each run, in run order.
  std::vector<double> elapsed_us();

 private:
  std::vector<cudaEvent_t> starts_;
  std::vector<cudaEvent_t> stops_;
};

}  // namespace pagoda::bench
