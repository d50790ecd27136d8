// What CPU benchmarks share: the host's streaming-read bandwidth (the bound of a decode step on
// the CPU backend) and the CPU's name for result files. The GPU's counterparts are in
// cuda_support.h.
#pragma once

#include <chrono>
#include <string>

namespace pagoda::bench {

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Streaming-read bandwidth of main memory with all threads, in bytes/s: the best of several
// passes over a buffer far larger than the caches.
double measure_host_read_bandwidth();

// /proc/cpuinfo's model name, e.g. "AMD EPYC 9654 96-Core Processor" ("unknown CPU" elsewhere).
std::string cpu_name();

}  // namespace pagoda::bench
