// `pagoda perplexity` and the KV cache flags: the scoring math against hand-computed values, a
// run against its own saved base (KL 0, agreement 1), and bad flags refused with one line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "pagoda/cli/perplexity.h"
#include "pagoda/core/error.h"
#include "pagoda_process.h"

namespace pagoda::cli {
namespace {

TEST(PerplexityMath, LogSoftmaxTopTokensAndKl) {
  const std::vector<float> logits{0.f, std::log(3.f), std::log(6.f)};
  const std::vector<double> lp = log_softmax(logits);
  // The logits are floats: log 3 and log 6 to a relative 6e-8.
  EXPECT_NEAR(lp[0], std::log(0.1), 1e-6);
  EXPECT_NEAR(lp[1], std::log(0.3), 1e-6);
  EXPECT_NEAR(lp[2], std::log(0.6), 1e-6);
  const TopTokens top = top_tokens(lp, 2);
  ASSERT_EQ(top.ids, (std::vector<int32_t>{2, 1}));
  // Against itself: 0.
  EXPECT_NEAR(top_k_kl(top_tokens(lp, 3), lp), 0.0, 1e-6);
  // Base (0.1, 0.3, 0.6) against test (0.2, 0.2, 0.6), full vocabulary:
  // 0.1 ln(0.5) + 0.3 ln(1.5) + 0.6 ln(1).
  const std::vector<double> test{std::log(0.2), std::log(0.2), std::log(0.6)};
  EXPECT_NEAR(top_k_kl(top_tokens(lp, 3), test), 0.1 * std::log(0.5) + 0.3 * std::log(1.5), 1e-6);
  // Top 2 of the base and a bucket for the rest: 0.6 ln 1 + 0.3 ln 1.5 + 0.1 ln(0.1 / 0.2).
  EXPECT_NEAR(top_k_kl(top_tokens(lp, 2), test), 0.3 * std::log(1.5) + 0.1 * std::log(0.5), 1e-6);
}

TEST(PerplexityMath, BaseFileRoundTripsAndCorruptOnesAreRefused) {
  const auto dir = std::filesystem::temp_directory_path();
  const std::string path = (dir / "pagoda_perplexity_base.json").string();
  const PerplexityBase base{.window = 8, .targets = {3, 4}, .positions = {{{1, 2}, {-0.5f, -1.f}}, {{4}, {-0.1f}}}};
  save_perplexity_base(path, base);
  const PerplexityBase loaded = load_perplexity_base(path);
  EXPECT_EQ(loaded.window, 8);
  EXPECT_EQ(loaded.targets, base.targets);
  ASSERT_EQ(loaded.positions.size(), 2u);
  EXPECT_EQ(loaded.positions[0].ids, base.positions[0].ids);
  EXPECT_EQ(loaded.positions[1].logprobs, base.positions[1].logprobs);
  for (const std::string& bad : {std::string("{\"format\": 1"), std::string("[]"),
                                 std::string("{\"format\":\"pagoda-perplexity-base-1\",\"window\":8,\"targets\":[1],"
                                             "\"positions\":[]}")}) {
    std::ofstream(path) << bad;
    EXPECT_THROW(load_perplexity_base(path), Error) << bad;
  }
  EXPECT_THROW(load_perplexity_base((dir / "pagoda_no_such_base.json").string()), Error);
}

const std::string kText = std::string(PAGODA_SOURCE_DIR) + "/tests/cli/fixtures/declaration_of_independence.txt";

TEST(PerplexityCommand, Int2RunAgainstItsOwnBaseHasKlZero) {
  const std::string base = (std::filesystem::temp_directory_path() / "pagoda_cli_ppl_base.json").string();
  const std::string args = "perplexity -f " + kText + " -c 32 --chunks 1 --kv-cache-dtype int2 --kv-partition 32";
  const auto first = pagoda::testing::run_pagoda(args + " --save-base " + base);
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("perplexity "), std::string::npos) << first.output;
  const auto again = pagoda::testing::run_pagoda(args + " --kl-base " + base);
  ASSERT_EQ(again.exit_code, 0) << again.output;
  EXPECT_NE(again.output.find("mean KL divergence from the base 0.000000, top-1 agreement 1.0000"), std::string::npos)
      << again.output;
  // Another window size does not match the base.
  pagoda::testing::expect_pagoda_error("perplexity -f " + kText + " -c 16 --chunks 1 --kl-base " + base, "windows of");
}

TEST(PerplexityCommand, KvCacheFlagsRefusedWithOneLine) {
  using pagoda::testing::expect_pagoda_error;
  expect_pagoda_error("generate -p hi --kv-cache-dtype q4", "--kv-cache-dtype must be");
  expect_pagoda_error("generate -p hi --kv-partition 48", "--kv-partition must be 32, 64 or 128");
  expect_pagoda_error("generate -p hi --kv-cache-dtype int2 --kv-partition 128",
                      "--kv-partition 128 does not divide the model's head_dim 64");
  expect_pagoda_error("generate -p hi --kv-key-dtype fp8", "--kv-key-dtype applies to --kv-cache-dtype int2");
  expect_pagoda_error("generate -p hi --kv-cache-dtype int2 --kv-key-dtype int4",
                      "--kv-key-dtype must be auto, int2 or fp8, not 'int4'");
  expect_pagoda_error("generate -p hi --kv-cache-dtype int2 --kv-sink-tokens 64",
                      "--kv-sink-tokens must be in [0, 64) (below --kv-partition), not 64");
  expect_pagoda_error("generate -p hi --kv-cache-dtype int2 --kv-sink-tokens -2", "--kv-sink-tokens must be in [0, 64)");
  expect_pagoda_error("generate -p hi --kv-cache-dtype fp8 --kv-sink-tokens 1",
                      "--kv-sink-tokens applies to --kv-cache-dtype int2");
  expect_pagoda_error("generate -p hi --kv-cache-dtype int2 --kv-rounding up",
                      "--kv-rounding must be auto, nearest or stochastic, not 'up'");
  expect_pagoda_error("generate -p hi --kv-rounding nearest", "--kv-rounding applies to --kv-cache-dtype int2");
  expect_pagoda_error("perplexity -f /nonexistent/text.txt", "cannot read");
  expect_pagoda_error("perplexity -f " + kText + " -c 4096", "fewer than one window");
}

// fp8 keeps the answer; int2 runs to the end (its accuracy: docs/experiments/kv-quantization.md).
TEST(PerplexityCommand, GenerateRunsOnInt2AndFp8) {
  for (const std::string dtype : {"int2", "fp8"}) {
    const auto r = pagoda::testing::run_pagoda("generate -p \"The capital of France is\" -n 4 --temp 0 --kv-cache-dtype " + dtype);
    EXPECT_EQ(r.exit_code, 0) << dtype << "\n" << r.output;
    EXPECT_NE(r.output.find("decode: 3 tokens"), std::string::npos) << dtype << "\n" << r.output;
    if (dtype == "fp8") {
      EXPECT_NE(r.output.find("Paris"), std::string::npos) << r.output;
    }
  }
}

}  // namespace
}  // namespace pagoda::cli
