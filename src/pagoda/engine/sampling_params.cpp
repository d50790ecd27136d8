#include "pagoda/engine/sampling_params.h"

#include <cmath>

#include "pagoda/core/error.h"

namespace pagoda {

namespace {

// NaN fails every comparison, so each range check below also asks for a finite value first:
// "temperature = nan" must be an error, not a silently greedy request.
void check_finite(const char* name, float value) {
  if (!std::isfinite(value)) fail(ErrorKind::kInvalidArgument, "{} must be a finite number, got {}", name, value);
}

}  // namespace

void validate(const SamplingParams& p) {
  const auto bad = [](const char* name, const char* range, auto value) {
    fail(ErrorKind::kInvalidArgument, "{} must be {}, got {}", name, range, value);
  };

  check_finite("temperature", p.temperature);
  if (p.temperature < 0) bad("temperature", ">= 0 (0 = greedy)", p.temperature);

  if (p.top_k < 0) bad("top_k", ">= 0 (0 = off)", p.top_k);

  check_finite("top_p", p.top_p);
  if (!(p.top_p > 0 && p.top_p <= 1)) bad("top_p", "in (0, 1] (1 = off)", p.top_p);

  check_finite("min_p", p.min_p);
  if (!(p.min_p >= 0 && p.min_p <= 1)) bad("min_p", "in [0, 1] (0 = off)", p.min_p);

  check_finite("repetition_penalty", p.repetition_penalty);
  // Bounded away from 0 and infinity: logits are divided or multiplied by it and must stay finite.
  if (!(p.repetition_penalty >= 0.01f && p.repetition_penalty <= 100)) {
    bad("repetition_penalty", "in [0.01, 100] (1 = off)", p.repetition_penalty);
  }

  check_finite("presence_penalty", p.presence_penalty);
  if (!(p.presence_penalty >= -2 && p.presence_penalty <= 2)) {
    bad("presence_penalty", "in [-2, 2] (0 = off)", p.presence_penalty);
  }
  check_finite("frequency_penalty", p.frequency_penalty);
  if (!(p.frequency_penalty >= -2 && p.frequency_penalty <= 2)) {
    bad("frequency_penalty", "in [-2, 2] (0 = off)", p.frequency_penalty);
  }

  if (p.max_tokens < 1) bad("max_tokens", ">= 1", p.max_tokens);

  if (p.logprobs < 0 || p.logprobs > kMaxLogprobs) {
    fail(ErrorKind::kInvalidArgument, "logprobs must be in [0, {}] (0 = none), got {}", kMaxLogprobs,
         p.logprobs);
  }

  // An empty stop string would match before the first character and end every completion empty.
  for (const std::string& s : p.stop) {
    if (s.empty()) fail(ErrorKind::kInvalidArgument, "stop strings must not be empty");
  }
  for (int32_t id : p.stop_token_ids) {
    if (id < 0) bad("stop_token_ids", "token ids >= 0", id);
  }

  if (p.beam_width < 0 || p.beam_width > kMaxBeamWidth) {
    fail(ErrorKind::kInvalidArgument, "beam_width must be in [1, {}] (0 = no beam search), got {}", kMaxBeamWidth,
         p.beam_width);
  }
  check_finite("length_penalty", p.length_penalty);
  if (p.beam_width == 0) {
    if (p.num_return != 1) bad("num_return", "1 without beam search", p.num_return);
    return;
  }
  if (p.num_return < 1 || p.num_return > p.beam_width) {
    fail(ErrorKind::kInvalidArgument, "num_return must be in [1, beam_width = {}], got {}", p.beam_width,
         p.num_return);
  }
  // Beam search keeps the most likely continuations: there is nothing to sample.
  if (p.temperature >= kGreedyBelowTemperature) {
    fail(ErrorKind::kInvalidArgument, "beam search is deterministic: temperature must be 0, got {}", p.temperature);
  }
  if (p.repetition_penalty != 1.f || p.presence_penalty != 0.f || p.frequency_penalty != 0.f) {
    fail(ErrorKind::kInvalidArgument, "beam search does not apply repetition, presence or frequency penalties");
  }
  if (p.logprobs != 0) {
    fail(ErrorKind::kInvalidArgument,
         "beam search reports each hypothesis' cumulative log-probability, not per-token logprobs");
  }
}

const char* early_stopping_name(EarlyStopping e) {
  switch (e) {
    case EarlyStopping::kFalse: return "false";
    case EarlyStopping::kTrue: return "true";
    case EarlyStopping::kNever: return "never";
  }
  return "?";
}

}  // namespace pagoda
