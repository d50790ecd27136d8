// `pagoda bench profile`: where the time of a decode step goes, op by op (decode_profile.cpp says
// how it is measured and against which bounds).
#pragma once

#include <string>
#include <vector>

#include "pagoda/engine/session.h"

namespace pagoda::bench {

struct ProfileBenchOptions {
  ModelFlags model;
  std::vector<int> batches{1, 8, 64, 256};
  int context = 512;        // KV tokens of every sequence when its batch starts
  int steps = 20;           // graph-replayed (real) steps timed per batch
  int profile_steps = 5;    // steps profiled op by op per batch (the median of each op is reported)
  std::string json_path;
  std::string markdown_path;
};

// Runs it, prints its tables and writes json_path / markdown_path when set. Throws
// Error(kInvalidArgument) for options out of range.
void run_profile_bench(const ProfileBenchOptions& options);

}  // namespace pagoda::bench
