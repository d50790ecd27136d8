// pagoda bench throughput --beam-width W: beam search against W independent sequences per request.
#pragma once

#include <string>
#include <vector>

#include "pagoda/bench/trace.h"
#include "pagoda/engine/session.h"

namespace pagoda::bench {

// Runs the offline workload twice on fresh engines, each request's prompt in the prefix cache
// first: as beam searches of width W (past end-of-sequence, so every beam decodes the request's
// max_tokens), and as W independent sequences per request (sampled at temperature 1, a
// seed each, as n = W choices are). Prints output tokens/s and the
// KV blocks held at the peak of each, against the beam bound (docs/beam-search.md); writes JSON to
// json_path when it is not empty.
void run_beam_search_bench(Session& session, EngineOptions options, const std::vector<ReplayRequest>& workload,
                           int32_t width, const std::string& device, const std::string& command, const std::string& json_path);

}  // namespace pagoda::bench
