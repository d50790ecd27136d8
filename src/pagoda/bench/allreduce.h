// `pagoda bench allreduce`: the GPU all-reduce at decode's message sizes, NCCL against the one-shot
// kernel (parallel/cuda/one_shot_all_reduce.h), one rank per GPU (allreduce.cpp says how it is
// measured and against which bound).
#pragma once

#include <string>
#include <vector>

namespace pagoda::bench {

struct AllReduceBenchOptions {
  // Message sizes in bytes; K and M suffixes are KiB and MiB. Decode's hidden state is
  // batch x hidden x 2 bytes: 8 KiB at batch 1 and hidden 4096, 1 MiB at batch 128.
  std::vector<std::string> sizes{"8K", "16K", "32K", "64K", "128K", "256K", "512K", "1M", "4M"};
  int ranks = 0;              // 0: every GPU present
  std::string dtype = "bf16";  // f32, f16 or bf16
  int calls = 50;             // all-reduces back to back in one captured graph
  int runs = 20;              // timed replays of that graph (the median is reported)
  int warmup = 5;
  double link_gb_s = 450;     // NVLink bandwidth per direction per GPU for the bound (H200 SXM: 18 links, 900 GB/s both ways)
  std::string out;            // empty: bench/results/<device slug>/allreduce.json (and .md)
};

// Runs the sweep, prints its table and writes its JSON and markdown. Throws
// Error(kInvalidArgument) for options out of range, Error(kUnsupported) in a build without CUDA
// and NCCL.
void run_allreduce_bench(const AllReduceBenchOptions& options);

}  // namespace pagoda::bench
