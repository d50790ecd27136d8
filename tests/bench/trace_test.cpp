// The trace reader behind `pagoda bench throughput --trace`: parsing Mooncake JSON lines (and
// naming the line of a malformed one), scaling times and lengths, and turning hash ids into
// token blocks that are the same wherever the same id appears, so that prefixes are really shared.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "pagoda/bench/trace.h"
#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

const std::string kTrace =
    R"({"timestamp": 0, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]})"
    "\n\n"
    R"({"timestamp": 250, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]})"
    "\n"
    R"({"timestamp": 1500.5, "input_length": 600, "output_length": 1, "hash_ids": [9, 1]})"
    "\n";

// The message of the Error that f throws (kind checked), or "" when it does not throw.
template <typename F>
std::string error_of(F f, ErrorKind kind) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    return e.what();
  }
  return "";
}

std::vector<int32_t> slice(const std::vector<int32_t>& v, size_t begin, size_t count) {
  return {v.begin() + ptrdiff_t(begin), v.begin() + ptrdiff_t(begin + count)};
}

TEST(Trace, ParsesEveryLineAndSkipsBlankOnes) {
  const auto trace = parse_trace(kTrace, "t.jsonl");
  ASSERT_EQ(trace.size(), 3u);
  EXPECT_EQ(trace[0].timestamp_ms, 0);
  EXPECT_EQ(trace[1].timestamp_ms, 250);
  EXPECT_EQ(trace[2].timestamp_ms, 1500.5);
  EXPECT_EQ(trace[1].input_length, 1100);
  EXPECT_EQ(trace[1].output_length, 7);
  EXPECT_EQ(trace[1].hash_ids, (std::vector<int64_t>{1, 2, 3}));
}

TEST(Trace, MalformedLinesNameTheLineAndTheField) {
  const std::string good = R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]})";
  auto error = [&](const std::string& second_line) {
    return error_of([&] { parse_trace(good + "\n" + second_line + "\n" + good, "w.jsonl"); }, ErrorKind::kCorrupt);
  };
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 10,)").find("w.jsonl:2: not valid JSON"), std::string::npos);
  EXPECT_NE(error("[1, 2]").find("w.jsonl:2: not a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "output_length": 1, "hash_ids": [0]})").find("w.jsonl:2: \"input_length\""),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]})")
                .find("\"input_length\" is missing or not a positive integer"),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]})").find("timestamp"),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 1e300, "input_length": 10, "output_length": 1, "hash_ids": [0]})").find("timestamp"),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 10, "output_length": 1.5, "hash_ids": [0]})")
                .find("\"output_length\""),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": []})").find("hash_ids"),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0, -3]})")
                .find("holds -3"),
            std::string::npos);
  EXPECT_NE(error(R"({"timestamp": 0, "input_length": 1025, "output_length": 1, "hash_ids": [0, 1]})")
                .find("w.jsonl:2: input_length 1025 needs more than the 2 blocks"),
            std::string::npos);
  EXPECT_NE(error_of([&] { parse_trace("\n  \n", "empty.jsonl"); }, ErrorKind::kCorrupt).find("no request"),
            std::string::npos);
  // Blank lines count: the error names the line in the file.
  EXPECT_NE(error_of([&] { parse_trace(good + "\n\n\nnope", "b.jsonl"); }, ErrorKind::kCorrupt).find("b.jsonl:4:"),
            std::string::npos);
}

TEST(Trace, MissingFile) {
  EXPECT_NE(error_of([] { read_trace_file("/nonexistent/trace.jsonl"); }, ErrorKind::kNotFound)
                .find("/nonexistent/trace.jsonl"),
            std::string::npos);
}

TEST(Trace, UnscaledReplayBuildsPromptsFromSharedBlocks) {
  const Replay replay = build_replay(parse_trace(kTrace, "t"), {}, 1000, 7);
  ASSERT_EQ(replay.requests.size(), 3u);
  EXPECT_EQ(replay.block_tokens, 512);
  EXPECT_EQ(replay.requests_in_trace, 3);
  const auto& r = replay.requests;
  EXPECT_EQ(r[0].prompt.size(), 1000u);
  EXPECT_EQ(r[1].prompt.size(), 1100u);
  EXPECT_EQ(r[2].prompt.size(), 600u);
  EXPECT_EQ(r[0].max_tokens, 10);
  EXPECT_DOUBLE_EQ(r[2].arrival_s, 1.5005);
  const auto block1 = trace_block_tokens(1, 512, 1000, 7), block2 = trace_block_tokens(2, 512, 1000, 7);
  const auto block9 = trace_block_tokens(9, 512, 1000, 7);
  // Requests 0 and 1 share blocks 1 and 2 (request 0 holds 1000 of its 1024 tokens).
  EXPECT_EQ(slice(r[0].prompt, 0, 512), block1);
  EXPECT_EQ(slice(r[0].prompt, 512, 488), slice(block2, 0, 488));
  EXPECT_EQ(slice(r[1].prompt, 0, 1000), r[0].prompt);
  EXPECT_EQ(slice(r[1].prompt, 512, 512), block2);
  // Request 2 holds block 1 second: the same tokens at another position.
  EXPECT_EQ(slice(r[2].prompt, 0, 512), block9);
  EXPECT_EQ(slice(r[2].prompt, 512, 88), slice(block1, 0, 88));
  // Different ids, different tokens; every id within the vocabulary.
  EXPECT_NE(block1, block2);
  EXPECT_NE(block1, block9);
  for (const auto& q : r)
    for (int32_t id : q.prompt) ASSERT_TRUE(id >= 0 && id < 1000);
  // The seed changes the tokens, not the sharing.
  EXPECT_NE(trace_block_tokens(1, 512, 1000, 8), block1);
}

TEST(Trace, ScalingAndCaps) {
  const auto trace = parse_trace(kTrace, "t");
  // Lengths x 0.25: blocks of 128 tokens, inputs 250 / 275 / 150, outputs round(2.5) = 3 /
  // round(1.75) = 2 / at least 1; times x 2.
  const Replay scaled = build_replay(trace, {.time_scale = 2, .length_scale = 0.25}, 500, 0);
  ASSERT_EQ(scaled.requests.size(), 3u);
  EXPECT_EQ(scaled.block_tokens, 128);
  EXPECT_EQ(scaled.requests[0].prompt.size(), 250u);
  EXPECT_EQ(scaled.requests[1].prompt.size(), 275u);
  EXPECT_EQ(scaled.requests[2].prompt.size(), 150u);
  EXPECT_EQ(scaled.requests[0].max_tokens, 3);
  EXPECT_EQ(scaled.requests[1].max_tokens, 2);
  EXPECT_EQ(scaled.requests[2].max_tokens, 1);
  EXPECT_EQ(scaled.requests[1].arrival_s, 0.5);
  EXPECT_DOUBLE_EQ(scaled.requests[2].arrival_s, 3.001);
  EXPECT_EQ(slice(scaled.requests[0].prompt, 0, 128), trace_block_tokens(1, 128, 500, 0));
  EXPECT_EQ(slice(scaled.requests[1].prompt, 0, 250), scaled.requests[0].prompt);
  EXPECT_EQ(slice(scaled.requests[2].prompt, 128, 22), slice(trace_block_tokens(1, 128, 500, 0), 0, 22));

  const Replay capped = build_replay(trace, {.max_requests = 2, .max_input = 1050, .max_output = 8}, 500, 0);
  ASSERT_EQ(capped.requests.size(), 2u);
  EXPECT_EQ(capped.requests_in_trace, 3);
  EXPECT_EQ(capped.requests[0].prompt.size(), 1000u);
  EXPECT_EQ(capped.requests[1].prompt.size(), 1050u);
  EXPECT_EQ(capped.requests[0].max_tokens, 8);
  EXPECT_EQ(capped.requests[1].max_tokens, 7);
  EXPECT_EQ(capped.inputs_capped, 1);
  EXPECT_EQ(capped.outputs_capped, 1);

  // Outputs scaled apart from the prompts: x 2 keeps the x 0.25 prompts, 20 / 14 / 2 tokens.
  const Replay long_outputs = build_replay(trace, {.length_scale = 0.25, .output_scale = 2}, 500, 0);
  ASSERT_EQ(long_outputs.requests.size(), 3u);
  EXPECT_EQ(long_outputs.requests[0].prompt, scaled.requests[0].prompt);
  EXPECT_EQ(long_outputs.requests[0].max_tokens, 20);
  EXPECT_EQ(long_outputs.requests[1].max_tokens, 14);
  EXPECT_EQ(long_outputs.requests[2].max_tokens, 2);

  const Replay at_once = build_replay(trace, {.time_scale = 0}, 500, 0);
  for (const auto& q : at_once.requests) EXPECT_EQ(q.arrival_s, 0);
}

TEST(Trace, BadScalingIsRefused) {
  const auto trace = parse_trace(kTrace, "t");
  EXPECT_NE(error_of([&] { build_replay(trace, {.time_scale = -1}, 500, 0); }, ErrorKind::kInvalidArgument)
                .find("--time-scale"),
            std::string::npos);
  EXPECT_NE(error_of([&] { build_replay(trace, {.length_scale = 0}, 500, 0); }, ErrorKind::kInvalidArgument)
                .find("--length-scale"),
            std::string::npos);
  for (double bad : {-1.0, 17.0, std::nan("")}) {
    EXPECT_NE(error_of([&] { build_replay(trace, {.output_scale = bad}, 500, 0); }, ErrorKind::kInvalidArgument)
                  .find("--output-scale"),
              std::string::npos);
  }
  EXPECT_NE(error_of([&] { build_replay(trace, {.max_input = -2}, 500, 0); }, ErrorKind::kInvalidArgument)
                .find("--max-input"),
            std::string::npos);
}

}  // namespace
}  // namespace pagoda::bench
