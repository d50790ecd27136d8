#include "pagoda/cli/generation.h"

#include <chrono>

namespace pagoda::cli {

GenerationResult run_request(Engine& engine, Request request, const std::function<void(const std::string&)>& on_text) {
  using Clock = std::chrono::steady_clock;
  GenerationResult result;
  const auto start = Clock::now();
  Clock::time_point first_token{};
  const RequestId id = engine.submit(std::move(request));
  while (engine.has_work() && result.finish == FinishReason::kNone) {
    for (const TokenEvent& event : engine.step()) {
      if (event.request != id) continue;
      if (result.generated_tokens == 0 && event.generated_tokens > 0) first_token = Clock::now();
      result.prompt_tokens = event.prompt_tokens;
      result.generated_tokens = event.generated_tokens;
      if (!event.text.empty()) {
        result.text += event.text;
        on_text(event.text);
      }
      result.finish = event.finish;
      if (!event.beams.empty()) result.beams = event.beams;
    }
  }
  const auto end = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(first_token - start).count();
  result.decode_seconds = std::chrono::duration<double>(end - first_token).count();
  return result;
}

void print_speed(const GenerationResult& r) {
  const int decoded = r.generated_tokens > 0 ? r.generated_tokens - 1 : 0;  // the first came from prefill
  std::fprintf(stderr, "\n[prefill: %d tokens, %.1f tok/s | decode: %d tokens, %.1f tok/s | finish: %s]\n",
               r.prompt_tokens, r.prefill_seconds > 0 ? r.prompt_tokens / r.prefill_seconds : 0.0, decoded,
               r.decode_seconds > 0 ? decoded / r.decode_seconds : 0.0, finish_reason_name(r.finish));
}

}  // namespace pagoda::cli
