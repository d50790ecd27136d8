#include "pagoda/engine/sampling_params.h"

#include <gtest/gtest.h>

#include <functional>
#include <limits>
#include <string>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct BadCase {
  std::string label;
  std::function<void(SamplingParams&)> spoil;
  std::string parameter;  // the message must name it
};

class SamplingParamsRejects : public testing::TestWithParam<BadCase> {};

TEST_P(SamplingParamsRejects, WithInvalidArgumentNamingTheParameter) {
  SamplingParams p;
  GetParam().spoil(p);
  try {
    validate(p);
    FAIL() << "accepted " << GetParam().label;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    const std::string message = e.what();
    EXPECT_NE(message.find(GetParam().parameter), std::string::npos) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryBadParameter, SamplingParamsRejects,
    testing::Values(
        BadCase{"temperature_negative", [](auto& p) { p.temperature = -0.1f; }, "temperature"},
        BadCase{"temperature_nan", [](auto& p) { p.temperature = kNaN; }, "temperature"},
        BadCase{"temperature_inf", [](auto& p) { p.temperature = kInf; }, "temperature"},
        BadCase{"top_k_negative", [](auto& p) { p.top_k = -1; }, "top_k"},
        BadCase{"top_p_zero", [](auto& p) { p.top_p = 0.0f; }, "top_p"},
        BadCase{"top_p_negative", [](auto& p) { p.top_p = -0.5f; }, "top_p"},
        BadCase{"top_p_above_one", [](auto& p) { p.top_p = 1.0001f; }, "top_p"},
        BadCase{"top_p_nan", [](auto& p) { p.top_p = kNaN; }, "top_p"},
        BadCase{"min_p_negative", [](auto& p) { p.min_p = -0.01f; }, "min_p"},
        BadCase{"min_p_above_one", [](auto& p) { p.min_p = 1.5f; }, "min_p"},
        BadCase{"min_p_nan", [](auto& p) { p.min_p = kNaN; }, "min_p"},
        BadCase{"repetition_zero", [](auto& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty"},
        BadCase{"repetition_negative", [](auto& p) { p.repetition_penalty = -1.0f; }, "repetition_penalty"},
        BadCase{"repetition_inf", [](auto& p) { p.repetition_penalty = kInf; }, "repetition_penalty"},
        BadCase{"repetition_tiny", [](auto& p) { p.repetition_penalty = 1e-3f; }, "repetition_penalty"},
        BadCase{"repetition_huge", [](auto& p) { p.repetition_penalty = 1e3f; }, "repetition_penalty"},
        BadCase{"presence_low", [](auto& p) { p.presence_penalty = -2.01f; }, "presence_penalty"},
        BadCase{"presence_high", [](auto& p) { p.presence_penalty = 2.01f; }, "presence_penalty"},
        BadCase{"presence_nan", [](auto& p) { p.presence_penalty = kNaN; }, "presence_penalty"},
        BadCase{"frequency_low", [](auto& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty"},
        BadCase{"frequency_high", [](auto& p) { p.frequency_penalty = 2.5f; }, "frequency_penalty"},
        BadCase{"frequency_inf", [](auto& p) { p.frequency_penalty = -kInf; }, "frequency_penalty"},
        BadCase{"max_tokens_zero", [](auto& p) { p.max_tokens = 0; }, "max_tokens"},
        BadCase{"max_tokens_negative", [](auto& p) { p.max_tokens = -5; }, "max_tokens"},
        BadCase{"logprobs_negative", [](auto& p) { p.logprobs = -1; }, "logprobs"},
        BadCase{"logprobs_too_many", [](auto& p) { p.logprobs = kMaxLogprobs + 1; }, "logprobs"},
        BadCase{"stop_empty", [](auto& p) { p.stop = {"ok", ""}; }, "stop"},
        BadCase{"stop_token_negative", [](auto& p) { p.stop_token_ids = {2, -1}; }, "stop_token_ids"}),
    [](const auto& info) { return info.param.label; });

TEST(SamplingParams, DefaultsAreValid) { EXPECT_NO_THROW(validate(SamplingParams{})); }

TEST(SamplingParams, RangeEndsThatAreInsideAreAccepted) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 1.0f;
  p.repetition_penalty = 0.01f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.max_tokens = 1;
  p.logprobs = kMaxLogprobs;
  p.stop = {"\n\n"};
  p.stop_token_ids = {0};
  EXPECT_NO_THROW(validate(p));

  p.top_p = std::numeric_limits<float>::min();  // the smallest positive top_p
  p.min_p = 0.0f;
  p.presence_penalty = 2.0f;
  p.frequency_penalty = -2.0f;
  p.temperature = 100.0f;
  p.top_k = 1 << 30;  // larger than any vocabulary: off
  EXPECT_NO_THROW(validate(p));
}

TEST(SamplingParams, MessageGivesTheRangeAndTheValue) {
  SamplingParams p;
  p.max_tokens = 0;
  try {
    validate(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "max_tokens must be >= 1, got 0");
  }
  p = {};
  p.top_p = 1.5f;
  try {
    validate(p);
    FAIL();
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "top_p must be in (0, 1] (1 = off), got 1.5");
  }
}

}  // namespace
}  // namespace pagoda
