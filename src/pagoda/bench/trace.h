// Request traces for replay benchmarks, in the Mooncake format (bench/workloads/README.md):
// one JSON object per line, {"timestamp": ms, "input_length": tokens, "output_length": tokens,
// "hash_ids": [...]}, where each hash id names one 512-token block of the prompt. A replay turns
// every hash id into the same block of token ids wherever it appears, so requests whose hash ids
// start alike share a real prompt prefix, and scales times and lengths to fit the hardware.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda::bench {

// Tokens a trace's hash id stands for.
inline constexpr int32_t kTraceBlockTokens = 512;

struct TraceEntry {
  double timestamp_ms = 0;  // arrival, from the start of the trace
  int32_t input_length = 0;
  int32_t output_length = 0;
  std::vector<int64_t> hash_ids;  // ceil(input_length / 512) of them (more are allowed, unused)
};

// Parses JSON lines; blank lines are skipped. Throws Error(kCorrupt) naming origin:line and what
// is wrong for the first malformed line.
std::vector<TraceEntry> parse_trace(std::string_view text, const std::string& origin);
// Throws Error(kNotFound) when the file cannot be read, else as parse_trace.
std::vector<TraceEntry> read_trace_file(const std::string& path);

// How a trace is fitted to the hardware; the defaults replay it as recorded.
struct TraceScaling {
  double time_scale = 1;    // arrival times are multiplied by this (0: every request at once)
  double length_scale = 1;  // input and output lengths and the block size are multiplied by this
  // Output lengths are multiplied by this instead, when it is not 0: a replay whose prompts are
  // scaled down to fit can keep the trace's outputs, so that decode steps are most of its time.
  double output_scale = 0;
  int32_t max_requests = 0;  // replay only the first N (0: all)
  int32_t max_input = 0;     // caps on the scaled lengths (0: none)
  int32_t max_output = 0;

  // What output lengths are multiplied by.
  double output_factor() const { return output_scale > 0 ? output_scale : length_scale; }
};

struct ReplayRequest {
  double arrival_s = 0;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;  // generated past end-of-sequence: the trace fixes the output length
};

struct Replay {
  std::vector<ReplayRequest> requests;  // in arrival order
  int32_t block_tokens = 0;             // tokens per hash id after length scaling
  int32_t inputs_capped = 0;            // requests whose scaled input was cut to max_input
  int32_t outputs_capped = 0;           // requests whose scaled output was cut to max_output
  int32_t requests_in_trace = 0;
};

// The tokens of one hash id: block_tokens ids in [0, vocab), a function of (seed, hash_id) only.
std::vector<int32_t> trace_block_tokens(int64_t hash_id, int32_t block_tokens, int32_t vocab, uint64_t seed);

// Scales and caps each entry (scaled lengths round to nearest, at least 1 token; the prompt is
// the concatenated blocks of its hash ids, the last one cut short) and builds its token ids.
// Throws Error(kInvalidArgument) for a scaling out of range.
Replay build_replay(const std::vector<TraceEntry>& trace, const TraceScaling& scaling, int32_t vocab, uint64_t seed);

}  // namespace pagoda::bench
