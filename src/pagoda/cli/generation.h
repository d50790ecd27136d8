// Running one request to completion on an engine, streaming its text, and timing it the way the
// CLI reports it: prefill (until the first token) and decode (every token after) separately.
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "pagoda/engine/engine.h"

namespace pagoda::cli {

struct GenerationResult {
  std::string text;
  FinishReason finish = FinishReason::kNone;
  int32_t prompt_tokens = 0;
  int32_t generated_tokens = 0;
  double prefill_seconds = 0;  // submit to first token
  double decode_seconds = 0;   // first token to last
  std::vector<BeamOutput> beams;  // a beam search's hypotheses, best first (its text comes only here)
};

// Calls on_text with each piece of text as it becomes safe to show.
GenerationResult run_request(Engine& engine, Request request, const std::function<void(const std::string&)>& on_text);

// "prefill: 12 tokens, 80.1 tok/s | decode: 64 tokens, 30.2 tok/s" on stderr.
void print_speed(const GenerationResult& result);

}  // namespace pagoda::cli
