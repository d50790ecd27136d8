// Beam search in the engine: the hypotheses equal transformers' generate(num_beams=W, ...) on the
// default model and on the tiny random checkpoints (tests/engine/fixtures/beam_search.json, from
// tools/make_beam_fixtures.py), the beams share the prompt's KV blocks (the bound of
// docs/beam-search.md holds at every step, every block comes back), and batching with other
// requests or preemption changes no output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <memory>
#include <set>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/core/error.h"
#include "pagoda/engine/engine.h"
#include "pagoda/format/gguf.h"

namespace pagoda {
namespace {

const std::string kSource = PAGODA_SOURCE_DIR;

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path);
  return nlohmann::json::parse(in);
}

EarlyStopping parse_early_stopping(const std::string& s) {
  return s == "true" ? EarlyStopping::kTrue : s == "never" ? EarlyStopping::kNever : EarlyStopping::kFalse;
}

SamplingParams beam_params(int32_t width, int32_t max_tokens, int32_t num_return = 1, float length_penalty = 1.f,
                           EarlyStopping early_stopping = EarlyStopping::kFalse) {
  return {.temperature = 0.f, .max_tokens = max_tokens, .beam_width = width, .length_penalty = length_penalty,
          .early_stopping = early_stopping, .num_return = num_return};
}

// Runs every request to completion; returns each one's last event (a beam search's results).
std::vector<TokenEvent> run_all(Engine& engine, const std::vector<Request>& requests) {
  std::vector<RequestId> ids;
  for (const Request& r : requests) ids.push_back(engine.submit(r));
  std::map<RequestId, TokenEvent> last;
  std::map<RequestId, std::vector<int32_t>> tokens;
  for (int guard = 0; engine.has_work(); ++guard) {
    EXPECT_LT(guard, 10000) << "engine does not finish";
    if (guard >= 10000) break;
    for (TokenEvent& e : engine.step()) {
      if (e.token >= 0) tokens[e.request].push_back(e.token);
      last[e.request] = std::move(e);
    }
  }
  std::vector<TokenEvent> out;
  for (RequestId id : ids) {
    out.push_back(last[id]);
    if (out.back().beams.empty()) out.back().beams.push_back({.tokens = tokens[id]});  // an ordinary request
  }
  return out;
}

std::vector<std::vector<int32_t>> hypothesis_tokens(const TokenEvent& e) {
  std::vector<std::vector<int32_t>> out;
  for (const BeamOutput& b : e.beams) out.push_back(b.tokens);
  return out;
}

int32_t blocks_held(const Engine& engine) {
  return engine.num_kv_blocks() - engine.num_free_blocks() - engine.num_evictable_blocks();
}

// Compares one fixture case; `score_tolerance` bounds the difference of the scores (pagoda's
// logits are not transformers' to the last bit).
void expect_case(Engine& engine, const nlohmann::json& c, double score_tolerance) {
  const std::string label = c.at("prompt").get<std::string>() + " W=" +
                            std::to_string(c.at("beam_width").get<int>()) +
                            " early_stopping=" + c.at("early_stopping").get<std::string>();
  SCOPED_TRACE(label);
  const Request request{
      .prompt = c.at("prompt_ids").get<std::vector<int32_t>>(),
      .params = beam_params(c.at("beam_width"), c.at("max_tokens"), c.at("num_return"), c.at("length_penalty"),
                            parse_early_stopping(c.at("early_stopping")))};
  const TokenEvent result = run_all(engine, {request})[0];
  const nlohmann::json& expected = c.at("hypotheses");
  ASSERT_EQ(result.beams.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(result.beams[i].tokens, expected[i].at("tokens").get<std::vector<int32_t>>()) << "hypothesis " << i;
    EXPECT_NEAR(result.beams[i].score, expected[i].at("score").get<double>(), score_tolerance) << "hypothesis " << i;
    EXPECT_NEAR(result.beams[i].cumulative_logprob, expected[i].at("cumulative_logprob").get<double>(),
                score_tolerance * double(result.beams[i].tokens.size()))
        << "hypothesis " << i;
  }
  for (size_t i = 1; i < result.beams.size(); ++i) EXPECT_GE(result.beams[i - 1].score, result.beams[i].score);
  EXPECT_EQ(blocks_held(engine), 0);  // every beam's blocks came back
}

class BeamSearchTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = read_json(kSource + "/tests/engine/fixtures/beam_search.json");
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

  static std::vector<int32_t> story() { return tokenizer_->encode("Once upon a time, in a small village by the sea,", false); }
  // Four different prompts of 6 to 30 tokens.
  static std::vector<int32_t> any_prompt(size_t i) {
    static const char* const kTexts[] = {
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "In the beginning of the twentieth century, the small fishing town on the northern coast saw",
        "Q: What is the boiling point of water at sea level?\nA:",
    };
    return tokenizer_->encode(kTexts[i % 4], false);
  }

  static inline nlohmann::json fixture_;
  static inline std::unique_ptr<Checkpoint> checkpoint_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::unique_ptr<CpuBackend> backend_;
  static inline std::unique_ptr<Model> model_;
};

TEST_F(BeamSearchTest, StopIdsAreTheFixtures) {
  EXPECT_EQ(tokenizer_->stop_ids(), fixture_.at("stop_ids").get<std::vector<int32_t>>());
}

TEST_F(BeamSearchTest, MatchesTransformersOnSmolLM2) {
  const auto& cases = fixture_.at("smollm2").at("cases");
  ASSERT_GE(cases.size(), 7u);
  std::set<int> widths;
  for (const auto& c : cases) widths.insert(c.at("beam_width").get<int>());
  EXPECT_EQ(widths, (std::set<int>{1, 2, 4, 8}));
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 256, .prefix_caching = false});
  for (const auto& c : cases) expect_case(engine, c, 0.02);
}

TEST_F(BeamSearchTest, MatchesTransformersOnRandomCheckpoints) {
  ASSERT_EQ(fixture_.at("random").size(), 3u);
  for (const auto& [name, entry] : fixture_.at("random").items()) {
    ASSERT_EQ(entry.at("cases").size(), 4u);
    SCOPED_TRACE(name);
    Checkpoint checkpoint = Checkpoint::open(kSource + "/tests/model/fixtures/hf/" + name);
    CpuBackend backend;
    Model model(checkpoint, backend, LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
    // The SmolLM2 tokenizer only gives the stop ids (the same as the fixture's) and text.
    Engine engine(model, *tokenizer_, {.num_kv_blocks = 128, .max_batch = 8, .prefix_caching = true});
    for (const auto& c : entry.at("cases")) expect_case(engine, c, 2e-3);
  }
}

// transformers' generate(num_beams=1) is greedy search; so is a beam width of 1.
TEST_F(BeamSearchTest, WidthOneIsGreedy) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<int32_t> p = any_prompt(i);
    const auto out = run_all(engine, {{.prompt = p, .params = {.temperature = 0.f, .max_tokens = 20}},
                                      {.prompt = p, .params = beam_params(1, 20)}});
    EXPECT_EQ(out[1].beams.at(0).tokens, out[0].beams.at(0).tokens);
  }
}

// The prompt's blocks are held once for all beams: after the prompt step the request holds the
// prompt's blocks alone; after the first beam tokens, the full prompt blocks plus one copy of the
// partly filled last block per beam; and at every step no more than
// prompt blocks + W x ceil(generated / block) + W.
TEST_F(BeamSearchTest, BeamsShareThePromptBlocks) {
  constexpr int32_t kWidth = 4, kBlock = 16;
  std::vector<int32_t> p = story();
  while (p.size() % kBlock == 0 || p.size() % kBlock == kBlock - 1) p.pop_back();  // a partly filled last block
  const int32_t prompt_blocks = int32_t((p.size() + kBlock - 1) / kBlock), full = int32_t(p.size() / kBlock);
  Engine engine(*model_, *tokenizer_, {.block_size = kBlock, .num_kv_blocks = 64, .prefix_caching = false});
  engine.submit({.prompt = p, .params = beam_params(kWidth, 24, kWidth, 1.f, EarlyStopping::kNever)});
  engine.step();
  EXPECT_EQ(blocks_held(engine), prompt_blocks);
  engine.step();
  // Each beam wrote its first token after the prompt: a parent's partly filled block was copied
  // for every child but the last, and a childless parent's was freed.
  EXPECT_LE(blocks_held(engine), full + kWidth);
  EXPECT_GT(blocks_held(engine), full);
  int32_t generated = 2, max_held = 0;
  while (engine.has_work()) {
    const std::vector<TokenEvent> events = engine.step();
    if (!events.empty()) break;
    ++generated;
    const int32_t bound = prompt_blocks + kWidth * ((generated + kBlock - 1) / kBlock) + kWidth;
    EXPECT_LE(blocks_held(engine), bound) << "after " << generated << " tokens";
    max_held = std::max(max_held, blocks_held(engine));
  }
  EXPECT_GT(max_held, full + kWidth);  // the beams did grow into blocks of their own
  EXPECT_EQ(blocks_held(engine), 0);
  EXPECT_EQ(engine.num_free_blocks(), engine.num_kv_blocks());
}

// Beam searches batched with ordinary requests, in a roomy cache and in one so small that
// requests are preempted (a beam search with all its beams), give what each gives alone.
TEST_F(BeamSearchTest, BatchingAndPreemptionKeepOutputs) {
  std::vector<Request> requests;
  for (size_t i = 0; i < 4; ++i) {
    requests.push_back({.prompt = any_prompt(i), .params = {.temperature = 0.f, .max_tokens = 20, .ignore_eos = true}});
    requests.push_back({.prompt = any_prompt(i + 1), .params = beam_params(i % 2 ? 4 : 2, 16, 2, 1.f,
                                                                           EarlyStopping::kNever)});
  }
  std::vector<std::vector<std::vector<int32_t>>> alone;
  {
    Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128, .prefix_caching = false});
    for (const Request& r : requests) alone.push_back(hypothesis_tokens(run_all(engine, {r})[0]));
  }
  for (const bool caching : {false, true}) {
    SCOPED_TRACE(caching ? "prefix caching on" : "prefix caching off");
    Engine roomy(*model_, *tokenizer_, {.num_kv_blocks = 256, .max_batch = 16, .prefix_caching = caching});
    std::vector<std::vector<std::vector<int32_t>>> batched;
    for (const TokenEvent& e : run_all(roomy, requests)) batched.push_back(hypothesis_tokens(e));
    EXPECT_EQ(batched, alone);
    EXPECT_EQ(roomy.stats().preemptions, 0);

    Engine tight(*model_, *tokenizer_, {.num_kv_blocks = 12, .max_batch = 8, .max_step_tokens = 40,
                                        .prefix_caching = caching});
    std::vector<std::vector<std::vector<int32_t>>> squeezed;
    for (const TokenEvent& e : run_all(tight, requests)) squeezed.push_back(hypothesis_tokens(e));
    EXPECT_EQ(squeezed, alone);
    EXPECT_GT(tight.stats().preemptions, 0);
    EXPECT_EQ(blocks_held(tight), 0);
  }
}

// Usage counts every token of every beam; stop strings cut the text of each hypothesis.
TEST_F(BeamSearchTest, UsageAndStopStrings) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 128});
  SamplingParams params = beam_params(4, 12, 4, 1.f, EarlyStopping::kNever);
  params.ignore_eos = true;
  const TokenEvent plain = run_all(engine, {{.prompt = story(), .params = params}})[0];
  ASSERT_EQ(plain.beams.size(), 4u);
  EXPECT_EQ(plain.beams[0].tokens.size(), 12u);
  EXPECT_EQ(plain.generated_tokens, 4 * 12);  // each of 12 steps appends one token to each of 4 beams
  EXPECT_EQ(plain.beams[0].text, tokenizer_->decode(plain.beams[0].tokens, /*skip_special=*/true));

  // A stop string taken from the best hypothesis' own text ends that hypothesis before it.
  const std::string& text = plain.beams[0].text;
  const size_t cut = text.find(' ', 6);
  ASSERT_NE(cut, std::string::npos);
  params.stop = {text.substr(cut, 3)};
  const TokenEvent stopped = run_all(engine, {{.prompt = story(), .params = params}})[0];
  for (const BeamOutput& b : stopped.beams) {
    EXPECT_EQ(b.text.find(params.stop[0]), std::string::npos) << b.text;
    EXPECT_LE(b.tokens.size(), 12u);
  }
  EXPECT_TRUE(std::any_of(stopped.beams.begin(), stopped.beams.end(),
                          [](const BeamOutput& b) { return b.finish == FinishReason::kStop; }));
}

TEST_F(BeamSearchTest, RejectsBadRequests) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 8});
  const std::vector<int32_t> p = any_prompt(0);
  auto refused = [&](SamplingParams params, const std::string& words) {
    try {
      engine.submit({.prompt = p, .params = params});
      ADD_FAILURE() << "accepted; expected an error saying " << words;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  refused(beam_params(65, 8), "beam_width must be in [1, 64]");
  refused(beam_params(-1, 8), "beam_width");
  refused(beam_params(4, 8, 5), "num_return must be in [1, beam_width = 4]");
  refused(beam_params(4, 8, 0), "num_return");
  SamplingParams hot = beam_params(4, 8);
  hot.temperature = 0.7f;
  refused(hot, "temperature must be 0");
  SamplingParams penalized = beam_params(4, 8);
  penalized.repetition_penalty = 1.2f;
  refused(penalized, "penalties");
  SamplingParams logprobs = beam_params(4, 8);
  logprobs.logprobs = 2;
  refused(logprobs, "logprobs");
  SamplingParams nan_penalty = beam_params(4, 8);
  nan_penalty.length_penalty = NAN;
  refused(nan_penalty, "length_penalty");
  refused(beam_params(16, 8), "a beam width of 16 needs 16 batch slots");
  SamplingParams many_stops = beam_params(8, 8);  // K = (1 + 600) x 8 candidates per beam > 4096
  for (int32_t t = 0; t < 600; ++t) many_stops.stop_token_ids.push_back(t);
  refused(many_stops, "candidates per beam; at most 4096");
  SamplingParams returns_many{.temperature = 0.f, .num_return = 2};
  refused(returns_many, "num_return");
  EXPECT_FALSE(engine.has_work());
}

}  // namespace
}  // namespace pagoda
