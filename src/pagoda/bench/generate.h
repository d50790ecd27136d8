// `pagoda bench generate`: the CPU backend's prefill, batch-1 decode and batch-N decode speed,
// each next to its bound (the host's measured read bandwidth and FMA peak).
#pragma once

#include <string>

#include "pagoda/engine/session.h"

namespace pagoda::bench {

struct GenerateBenchOptions {
  ModelFlags model;
  int prompt_tokens = 128;
  int gen_tokens = 64;
  int batch = 8;
  std::string json_path;
};

// Runs it, prints its table and writes json_path when set. Throws Error(kInvalidArgument) for
// options out of range or the CUDA backend.
void run_generate_bench(GenerateBenchOptions options);

}  // namespace pagoda::bench
