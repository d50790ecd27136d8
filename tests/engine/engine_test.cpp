// The engine on the real default model: greedy output equals Hugging Face's, batching,
// preemption and prefix-cache hits do not change any request's tokens, and bad requests are
// refused cleanly.
#include "pagoda/engine/engine.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/format/gguf.h"
#include "pagoda/core/default_model.h"

namespace pagoda {
namespace {

struct Golden {
  std::string name;
  std::vector<int32_t> ids, greedy;
};

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/smollm2_golden.json");
    ASSERT_TRUE(in);
    const nlohmann::json fixture = nlohmann::json::parse(in);  // named: it must outlive the loop
    for (const auto& p : fixture.at("prompts"))
      golden_.push_back({p.at("name").get<std::string>(), p.at("token_ids").get<std::vector<int32_t>>(),
                         p.at("greedy_ids").get<std::vector<int32_t>>()});
    checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(default_model_path()));
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*checkpoint_->gguf()));
    backend_ = std::make_unique<CpuBackend>();
    model_ = std::make_unique<Model>(*checkpoint_, *backend_, LoadOptions{.show_progress = false});
  }
  static void TearDownTestSuite() {
    model_.reset();
    backend_.reset();
    tokenizer_.reset();
    checkpoint_.reset();
  }

  static std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // Every block is free or held by the prefix cache alone: no request holds any.
  static void expect_only_cached_blocks_remain(const Engine& engine) {
    EXPECT_EQ(engine.num_free_blocks() + engine.num_cached_blocks(), engine.num_kv_blocks());
    EXPECT_EQ(engine.num_evictable_blocks(), engine.num_cached_blocks());
  }

  static SamplingParams greedy(int32_t max_tokens) {
    return SamplingParams{.temperature = 0.f, .max_tokens = max_tokens, .ignore_eos = true};
  }

  // Runs every request to completion; returns each one's generated tokens, in submit order.
  static std::vector<std::vector<int32_t>> run_all(Engine& engine, const std::vector<Request>& requests) {
    std::vector<RequestId> ids;
    for (const Request& r : requests) ids.push_back(engine.submit(r));
    std::map<RequestId, std::vector<int32_t>> tokens;
    for (int guard = 0; engine.has_work(); ++guard) {
      EXPECT_LT(guard, 10000) << "engine does not finish";
      if (guard >= 10000) break;
      for (const TokenEvent& e : engine.step())
        if (e.token >= 0) tokens[e.request].push_back(e.token);
    }
    std::vector<std::vector<int32_t>> out;
    for (RequestId id : ids) out.push_back(tokens[id]);
    return out;
  }

  static inline std::vector<Golden> golden_;
  static inline std::unique_ptr<Checkpoint> checkpoint_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::unique_ptr<CpuBackend> backend_;
  static inline std::unique_ptr<Model> model_;
};

TEST_F(EngineTest, GreedyContinuationMatchesTransformers) {
  ASSERT_GE(golden_.size(), 4u);
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  for (const Golden& g : golden_) {
    const auto out = run_all(engine, {{.prompt = g.ids, .params = greedy(int32_t(g.greedy.size()))}});
    EXPECT_EQ(out[0], g.greedy) << g.name;
  }
}

// Four different prompts decoded in one batch produce, token for token, what each produces alone.
TEST_F(EngineTest, BatchedDecodeEqualsDecodingAlone) {
  ASSERT_GE(golden_.size(), 4u);
  std::vector<Request> requests;
  for (size_t i = 0; i < 4; ++i) requests.push_back({.prompt = golden_[i].ids, .params = greedy(24)});
  Engine alone_engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 1});
  std::vector<std::vector<int32_t>> alone;
  for (const Request& r : requests) alone.push_back(run_all(alone_engine, {r})[0]);
  Engine batch_engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4});
  EXPECT_EQ(run_all(batch_engine, requests), alone);
}

// Chunked prefill (a small step budget) and preemption (a KV cache too small for all four
// sequences) recompute KV but must not change any output, with the prefix cache off or on.
TEST_F(EngineTest, ChunkedPrefillAndPreemptionKeepOutputs) {
  std::vector<Request> requests;
  for (size_t i = 0; i < 4; ++i) requests.push_back({.prompt = golden_[i].ids, .params = greedy(40)});
  std::vector<std::vector<int32_t>> expected;
  {
    Engine roomy(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4, .prefix_caching = false});
    expected = run_all(roomy, requests);
  }
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching on" : "prefix caching off");
    Engine tight(*model_, *tokenizer_,
                 {.num_kv_blocks = 10, .max_batch = 4, .max_step_tokens = 7, .prefix_caching = caching});
    EXPECT_EQ(run_all(tight, requests), expected);
    EXPECT_GT(tight.stats().preemptions, 0);
    expect_only_cached_blocks_remain(tight);
    if (!caching) {
      EXPECT_EQ(tight.num_cached_blocks(), 0);
    }
  }
}

// A prompt computed once is served from the prefix cache the next time, alone, extended or
// cut to whole blocks, and the greedy output is the one computed without the cache.
TEST_F(EngineTest, PrefixCacheHitKeepsGreedyOutput) {
  const std::vector<int32_t> a = concat(golden_[1].ids, golden_[2].ids);  // 78 tokens: 4 full blocks
  const std::vector<int32_t> a_longer = concat(a, golden_[3].ids);
  ASSERT_EQ(a.size(), 78u);
  const Request request_a{.prompt = a, .params = greedy(12)};
  const Request request_longer{.prompt = a_longer, .params = greedy(12)};
  // Entirely cached: its last block is computed again anyway, for the logits of its last token.
  const Request request_aligned{.prompt = std::vector<int32_t>(a.begin(), a.begin() + 64), .params = greedy(12)};
  std::vector<int32_t> expected_a, expected_longer, expected_aligned;
  {
    Engine uncached(*model_, *tokenizer_, {.num_kv_blocks = 64, .prefix_caching = false});
    expected_a = run_all(uncached, {request_a})[0];
    expected_longer = run_all(uncached, {request_longer})[0];
    expected_aligned = run_all(uncached, {request_aligned})[0];
    EXPECT_EQ(uncached.num_cached_blocks(), 0);
    EXPECT_EQ(uncached.stats().prefix_hit_tokens, 0);
  }
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  EXPECT_EQ(run_all(engine, {request_a})[0], expected_a);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 0);
  // 78 prompt + 11 generated tokens computed (the 12th is sampled, never fed back): 5 blocks.
  EXPECT_EQ(engine.num_cached_blocks(), 5);

  const auto again = run_all(engine, {request_a, request_longer});
  EXPECT_EQ(again[0], expected_a);
  EXPECT_EQ(again[1], expected_longer);
  // Each finds a's first 4 blocks (64 tokens); the 5th block of the first run holds generated
  // tokens that neither prompt has there.
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 2 * 64);
  EXPECT_EQ(engine.stats().prompt_tokens, int64_t(a.size() + (a.size() - 64) + (a_longer.size() - 64)));

  EXPECT_EQ(run_all(engine, {request_aligned})[0], expected_aligned);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 2 * 64 + 48);
  expect_only_cached_blocks_remain(engine);
}

// Requests in flight together share the blocks of their common prompt prefix: the first one's
// computed blocks serve the others as they are admitted.
TEST_F(EngineTest, ConcurrentRequestsShareAPrefix) {
  std::vector<int32_t> shared = concat(golden_[1].ids, golden_[2].ids);
  shared.resize(48);  // 3 blocks
  std::vector<Request> requests;
  for (size_t k = 0; k < 4; ++k) {
    const auto suffix = golden_[3].ids.begin() + ptrdiff_t(4 * k);
    requests.push_back({.prompt = concat(shared, std::vector<int32_t>(suffix, suffix + 20)), .params = greedy(10)});
  }
  std::vector<std::vector<int32_t>> expected;
  {
    Engine uncached(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4, .prefix_caching = false});
    expected = run_all(uncached, requests);
  }
  // A 64-token budget: step 1 computes 64 of the first request's 68 prompt tokens; step 2 its
  // last 4 and admits the other three, each finding the 3 shared blocks in the cache.
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4, .max_step_tokens = 64});
  EXPECT_EQ(run_all(engine, requests), expected);
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 3 * 48);
  expect_only_cached_blocks_remain(engine);
}

// The same requests decoded with prefix-aware attention (forced on, and chosen by auto because
// the cached prefix is shared) and with paged attention give the same greedy tokens.
TEST_F(EngineTest, PrefixAttentionKeepsGreedyOutputs) {
  std::vector<int32_t> shared = concat(golden_[0].ids, golden_[2].ids);
  shared.resize(40);  // 2 whole blocks and half of a third
  std::vector<Request> requests;
  for (size_t k = 0; k < 5; ++k) {
    const auto suffix = golden_[3].ids.begin() + ptrdiff_t(3 * k);
    requests.push_back({.prompt = concat(shared, std::vector<int32_t>(suffix, suffix + 7 + k)), .params = greedy(12)});
  }
  auto run_with = [&](LoadOptions::Attention attention) {
    Model model(*checkpoint_, *backend_, LoadOptions{.show_progress = false, .attention = attention});
    Engine engine(model, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 5, .max_step_tokens = 64});
    std::vector<std::vector<int32_t>> tokens = run_all(engine, requests);
    expect_only_cached_blocks_remain(engine);
    return std::pair{tokens, model.prefix_steps()};
  };
  const auto [paged, paged_steps] = run_with(LoadOptions::Attention::kPaged);
  const auto [prefix, prefix_steps] = run_with(LoadOptions::Attention::kPrefix);
  const auto [automatic, auto_steps] = run_with(LoadOptions::Attention::kAuto);
  EXPECT_EQ(paged_steps, 0);
  EXPECT_GE(prefix_steps, 11);  // every decode step
  EXPECT_GE(auto_steps, 1);     // the steps whose sequences share the cached blocks
  EXPECT_EQ(prefix, paged);
  EXPECT_EQ(automatic, paged);
}

// More requests than the pool could hold at once, with a few cached prefixes among them: cached
// blocks are evicted to make room (else admission would stall), every request finishes with
// the output it has alone, and no request's block is left behind.
TEST_F(EngineTest, EvictionUnderATinyPoolKeepsOutputs) {
  std::vector<Request> requests;
  for (size_t i = 0; i < 4; ++i) requests.push_back({.prompt = golden_[i].ids, .params = greedy(16)});
  requests.push_back({.prompt = concat(golden_[1].ids, golden_[0].ids), .params = greedy(16)});
  requests.push_back({.prompt = concat(golden_[2].ids, golden_[3].ids), .params = greedy(16)});
  std::vector<std::vector<int32_t>> expected;
  {
    Engine uncached(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 2, .prefix_caching = false});
    expected = run_all(uncached, requests);
  }
  Engine tiny(*model_, *tokenizer_, {.num_kv_blocks = 8, .max_batch = 2});
  EXPECT_EQ(run_all(tiny, requests), expected);
  EXPECT_GT(tiny.num_cached_blocks(), 0);
  expect_only_cached_blocks_remain(tiny);
}

TEST_F(EngineTest, SeededSamplingIsReproducibleAcrossBatching) {
  SamplingParams params{.temperature = 0.9f, .top_p = 0.9f, .seed = 1234, .max_tokens = 20, .ignore_eos = true};
  Engine a(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 1});
  Engine b(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4});
  const Request r{.prompt = golden_[0].ids, .params = params};
  const Request other{.prompt = golden_[1].ids, .params = params};
  EXPECT_EQ(run_all(a, {r})[0], run_all(b, {other, r, other})[1]);
}

TEST_F(EngineTest, StopsAtEosStopTokenAndMaxTokens) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  const Golden& g = golden_[0];
  // The third greedy token as a stop token: generation ends on it, and it is reported.
  SamplingParams params = greedy(32);
  params.stop_token_ids = {g.greedy[2]};
  auto out = run_all(engine, {{.prompt = g.ids, .params = params}});
  ASSERT_GE(out[0].size(), 1u);
  EXPECT_EQ(out[0].back(), g.greedy[2]);
  EXPECT_LE(out[0].size(), 3u);
  out = run_all(engine, {{.prompt = g.ids, .params = greedy(5)}});
  EXPECT_EQ(out[0].size(), 5u);
}

TEST_F(EngineTest, StopStringCutsTheText) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  const Golden& g = golden_[0];
  const std::string full = tokenizer_->decode(g.greedy);
  ASSERT_GE(full.size(), 12u);
  const std::string stop = full.substr(8, 3);
  SamplingParams params = greedy(32);
  params.stop = {stop};
  engine.submit({.prompt = g.ids, .params = params});
  std::string text;
  FinishReason finish = FinishReason::kNone;
  while (engine.has_work())
    for (const TokenEvent& e : engine.step()) {
      text += e.text;
      if (e.finish != FinishReason::kNone) finish = e.finish;
    }
  EXPECT_EQ(finish, FinishReason::kStop);
  EXPECT_EQ(text, full.substr(0, full.find(stop)));
}

TEST_F(EngineTest, CancelFreesBlocksAndReports) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .prefix_caching = false});
  const RequestId id = engine.submit({.prompt = golden_[0].ids, .params = greedy(100)});
  engine.step();
  EXPECT_LT(engine.num_free_blocks(), 64);
  engine.cancel(id);
  EXPECT_EQ(engine.num_free_blocks(), 64);
  const auto events = engine.step();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);
  EXPECT_FALSE(engine.has_work());
}

// With the prefix cache on, a cancelled request's blocks go back too, except the full blocks
// it computed, which stay cached (held by nothing else) and serve the next request.
TEST_F(EngineTest, CancelWithPrefixCachingLeavesOnlyCachedBlocks) {
  const std::vector<int32_t> prompt = concat(golden_[1].ids, golden_[2].ids);  // 78 tokens
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  const RequestId id = engine.submit({.prompt = prompt, .params = greedy(100)});
  engine.step();  // the prompt
  engine.step();  // one decode step: 79 tokens computed, still 4 full blocks
  EXPECT_EQ(engine.num_kv_blocks() - engine.num_free_blocks() - engine.num_evictable_blocks(), 5)
      << "the request holds 4 full blocks and its partial fifth";
  engine.cancel(id);
  EXPECT_EQ(engine.num_cached_blocks(), 4);
  expect_only_cached_blocks_remain(engine);
  const auto events = engine.step();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].finish, FinishReason::kCancelled);

  run_all(engine, {{.prompt = prompt, .params = greedy(2)}});
  EXPECT_EQ(engine.stats().prefix_hit_tokens, 64);
  expect_only_cached_blocks_remain(engine);
}

TEST_F(EngineTest, RejectsBadRequests) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  auto kind_of = [&](Request r) {
    try {
      engine.submit(std::move(r));
    } catch (const Error& e) {
      return e.kind();
    }
    return ErrorKind::kInternal;
  };
  EXPECT_EQ(kind_of({.prompt = {}, .params = greedy(4)}), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of({.prompt = std::vector<int32_t>(8192, 1), .params = greedy(4)}), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of({.prompt = std::vector<int32_t>(2000, 1), .params = greedy(4)}), ErrorKind::kInvalidArgument)
      << "needs more KV blocks than the cache has";
  EXPECT_EQ(kind_of({.prompt = {1, 2, 49152}, .params = greedy(4)}), ErrorKind::kInvalidArgument);
  EXPECT_EQ(kind_of({.prompt = {1, 2}, .params = greedy(0)}), ErrorKind::kInvalidArgument);
  EXPECT_FALSE(engine.has_work());
}

// A forward pass that throws (here: another engine shrank the model's KV cache under this one)
// propagates the error, leaks no blocks, and leaves the request queued; once the cache is back,
// it completes with the output it would have had.
TEST_F(EngineTest, FailedStepLeaksNothingAndRecovers) {
  std::vector<int32_t> prompt;
  for (int i = 0; i < 5; ++i) prompt.insert(prompt.end(), golden_[0].ids.begin(), golden_[0].ids.end());
  const Request request{.prompt = prompt, .params = greedy(8)};
  Engine reference(*model_, *tokenizer_, {.num_kv_blocks = 64});
  const auto expected = run_all(reference, {request});

  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64});
  engine.submit(request);
  { Engine shrinker(*model_, *tokenizer_, {.num_kv_blocks = 1}); }
  EXPECT_THROW(engine.step(), Error);
  EXPECT_EQ(engine.num_free_blocks(), 64);
  EXPECT_TRUE(engine.has_work());
  model_->allocate_kv_cache(64, 16);
  std::vector<int32_t> tokens;
  while (engine.has_work())
    for (const TokenEvent& e : engine.step()) tokens.push_back(e.token);
  EXPECT_EQ(tokens, expected[0]);
}

// A request alone that fills the whole KV cache ends with finish reason length; it never spins.
TEST_F(EngineTest, KvExhaustionEndsTheRequest) {
  Engine engine(*model_, *tokenizer_, {.block_size = 16, .num_kv_blocks = 2});
  const auto out = run_all(engine, {{.prompt = golden_[0].ids, .params = greedy(100)}});
  // 32 tokens fill both blocks; the 33rd was sampled but has no room for its K/V.
  EXPECT_EQ(int(golden_[0].ids.size() + out[0].size()), 33);
  expect_only_cached_blocks_remain(engine);
}

}  // namespace
}  // namespace pagoda
