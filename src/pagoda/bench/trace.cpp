#include "pagoda/bench/trace.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "pagoda/bench/counter_random.h"
#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

using nlohmann::json;

// Hash-id blocks get streams of their own, apart from the offline benchmark's request streams.
constexpr uint64_t kBlockStreamTag = uint64_t(1) << 63;

int32_t positive_length(const json& entry, const char* key, const std::string& where) {
  const auto it = entry.find(key);
  if (it == entry.end() || !it->is_number_integer() || it->get<int64_t>() < 1 ||
      it->get<int64_t>() > std::numeric_limits<int32_t>::max())
    fail(ErrorKind::kCorrupt, "{}: \"{}\" is missing or not a positive integer", where, key);
  return int32_t(it->get<int64_t>());
}

TraceEntry parse_entry(std::string_view line, const std::string& where) {
  const json entry = json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (entry.is_discarded()) fail(ErrorKind::kCorrupt, "{}: not valid JSON", where);
  if (!entry.is_object()) fail(ErrorKind::kCorrupt, "{}: not a JSON object", where);
  TraceEntry e;
  const auto timestamp = entry.find("timestamp");
  // At most about 30 years: a replay sleeps until each arrival, and a clock's duration must hold it.
  if (timestamp == entry.end() || !timestamp->is_number() || !(timestamp->get<double>() >= 0) ||
      !(timestamp->get<double>() <= 1e12))
    fail(ErrorKind::kCorrupt, "{}: \"timestamp\" is missing or not a number of milliseconds in [0, 1e12]", where);
  e.timestamp_ms = timestamp->get<double>();
  e.input_length = positive_length(entry, "input_length", where);
  e.output_length = positive_length(entry, "output_length", where);
  const auto hash_ids = entry.find("hash_ids");
  if (hash_ids == entry.end() || !hash_ids->is_array() || hash_ids->empty())
    fail(ErrorKind::kCorrupt, "{}: \"hash_ids\" is missing or not a non-empty array", where);
  for (const json& id : *hash_ids) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0)
      fail(ErrorKind::kCorrupt, "{}: \"hash_ids\" holds {}, not a non-negative integer", where, id.dump());
    e.hash_ids.push_back(id.get<int64_t>());
  }
  if (int64_t(e.hash_ids.size()) * kTraceBlockTokens < e.input_length)
    fail(ErrorKind::kCorrupt, "{}: input_length {} needs more than the {} blocks of {} tokens its hash_ids name",
         where, e.input_length, e.hash_ids.size(), kTraceBlockTokens);
  return e;
}

int32_t scale_length(int32_t length, double scale) {
  return int32_t(std::max<double>(1, std::min<double>(std::round(length * scale), std::numeric_limits<int32_t>::max())));
}

}  // namespace

std::vector<TraceEntry> parse_trace(std::string_view text, const std::string& origin) {
  std::vector<TraceEntry> entries;
  size_t line_number = 0;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    const std::string_view line = text.substr(0, end);
    text.remove_prefix(std::min(end + 1, text.size()));
    ++line_number;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    entries.push_back(parse_entry(line, origin + ":" + std::to_string(line_number)));
  }
  if (entries.empty()) fail(ErrorKind::kCorrupt, "{}: the trace holds no request", origin);
  return entries;
}

std::vector<TraceEntry> read_trace_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorKind::kNotFound, "cannot open the trace '{}'", path);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_trace(text.str(), path);
}

std::vector<int32_t> trace_block_tokens(int64_t hash_id, int32_t block_tokens, int32_t vocab, uint64_t seed) {
  return synthetic_tokens(kBlockStreamTag ^ mix64(seed) ^ uint64_t(hash_id), block_tokens, vocab);
}

Replay build_replay(const std::vector<TraceEntry>& trace, const TraceScaling& s, int32_t vocab, uint64_t seed) {
  if (!(s.time_scale >= 0 && s.time_scale <= 1000))
    fail(ErrorKind::kInvalidArgument, "--time-scale must be in [0, 1000], not {}", s.time_scale);
  if (!(s.length_scale > 0) || s.length_scale > 16)
    fail(ErrorKind::kInvalidArgument, "--length-scale must be in (0, 16], not {}", s.length_scale);
  if (!(s.output_scale >= 0) || s.output_scale > 16)
    fail(ErrorKind::kInvalidArgument, "--output-scale must be in (0, 16] (0: as --length-scale), not {}", s.output_scale);
  if (s.max_requests < 0 || s.max_input < 0 || s.max_output < 0)
    fail(ErrorKind::kInvalidArgument, "--max-requests, --max-input and --max-output must be >= 0 (0: no limit)");
  if (vocab < 1) fail(ErrorKind::kInvalidArgument, "a replay needs a vocabulary of at least one token");

  Replay replay;
  replay.requests_in_trace = int32_t(trace.size());
  replay.block_tokens = scale_length(kTraceBlockTokens, s.length_scale);
  const size_t count = s.max_requests > 0 ? std::min(trace.size(), size_t(s.max_requests)) : trace.size();
  std::unordered_map<int64_t, std::vector<int32_t>> blocks;  // hash id -> its tokens, made once
  for (size_t r = 0; r < count; ++r) {
    const TraceEntry& e = trace[r];
    // The scaled blocks may round to a little less than the scaled input: never invent tokens.
    int32_t input = std::min<int64_t>(scale_length(e.input_length, s.length_scale),
                                      int64_t(e.hash_ids.size()) * replay.block_tokens);
    if (s.max_input > 0 && input > s.max_input) {
      input = s.max_input;
      ++replay.inputs_capped;
    }
    int32_t output = scale_length(e.output_length, s.output_factor());
    if (s.max_output > 0 && output > s.max_output) {
      output = s.max_output;
      ++replay.outputs_capped;
    }
    ReplayRequest request{.arrival_s = e.timestamp_ms / 1000 * s.time_scale, .max_tokens = output};
    request.prompt.reserve(size_t(input));
    for (size_t b = 0; int32_t(request.prompt.size()) < input; ++b) {
      auto [it, added] = blocks.try_emplace(e.hash_ids[b]);
      if (added) it->second = trace_block_tokens(e.hash_ids[b], replay.block_tokens, vocab, seed);
      const size_t take = std::min(it->second.size(), size_t(input) - request.prompt.size());
      request.prompt.insert(request.prompt.end(), it->second.begin(), it->second.begin() + ptrdiff_t(take));
    }
    replay.requests.push_back(std::move(request));
  }
  std::stable_sort(replay.requests.begin(), replay.requests.end(),
                   [](const ReplayRequest& a, const ReplayRequest& b) { return a.arrival_s < b.arrival_s; });
  return replay;
}

}  // namespace pagoda::bench
