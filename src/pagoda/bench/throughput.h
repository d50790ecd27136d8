// `pagoda bench throughput`: the engine under a workload, end to end, as a serving system sees it
// (an offline batch or a replayed trace; throughput.cpp says what it measures and its bound).
#pragma once

#include <cstdint>
#include <string>

#include "pagoda/bench/trace.h"
#include "pagoda/engine/session.h"

namespace pagoda::bench {

struct ThroughputBenchOptions {
  ModelFlags model;
  int batch = 0;  // offline workload
  int input = 0;
  int output = 0;
  int shared_prefix = 0;
  std::string trace;  // replay workload
  TraceScaling scaling;
  uint64_t seed = 0;
  bool no_prefix_cache = false;
  std::string json_path;
  int beam_width = 0;  // offline: beam searches against independent sequences (beam_search.h)
  // --tensor-parallel N > 1: the N = 1 output tokens/s that efficiency compares with. Unless one
  // is given (baseline_given) or none is wanted (no_baseline), the same workload runs unsplit in
  // the same process after the split run (which a model too large for one device cannot).
  double baseline_tokens_per_s = 0;
  bool baseline_given = false;
  bool no_baseline = false;
  // --tensor-parallel N > 1, offline: microseconds per all-reduce of a decode step's activation
  // for the per-rank bound (e.g. `pagoda bench allreduce`'s graph-replayed figure at that size);
  // unless given, measured on the ranks' communicators before the run.
  double allreduce_us = 0;
  bool allreduce_given = false;
  // Which flags were given: --batch, --input or --output choose the offline workload, which then
  // runs every request at once with a KV cache that holds them all unless --max-batch or
  // --kv-memory-mb say otherwise.
  bool offline = false;
  bool max_batch_given = false;
  bool kv_memory_given = false;
};

// Runs it, prints its table and writes json_path when set. Throws Error(kInvalidArgument) for
// options out of range or a workload that does not fit the model's context.
void run_throughput_bench(const ThroughputBenchOptions& options);

}  // namespace pagoda::bench
