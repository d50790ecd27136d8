// The engine thread behind the server, on the real default model: requests from several threads
// share its steps and get the tokens they would get alone; a cancelled request frees its blocks;
// a full queue and a request the engine refuses are reported as the API's errors.
#include "pagoda/server/engine_service.h"

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <memory>
#include <thread>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/format/gguf.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {
namespace {

using namespace std::chrono_literals;

class EngineServiceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
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

  static Request greedy(const std::string& text, int32_t max_tokens) {
    return {.prompt = tokenizer_->encode(text, tokenizer_->add_bos_by_default()),
            .params = {.temperature = 0.f, .max_tokens = max_tokens, .ignore_eos = true}};
  }

  // Every event of a stream until it is done: the tokens of each choice.
  static std::map<int32_t, std::vector<int32_t>> drain(GenerationStream& stream) {
    std::map<int32_t, std::vector<int32_t>> tokens;
    const auto deadline = std::chrono::steady_clock::now() + 120s;
    while (!stream.done() && std::chrono::steady_clock::now() < deadline) {
      for (const ChoiceEvent& e : stream.wait(50ms))
        if (e.event.token >= 0) tokens[e.choice].push_back(e.event.token);
    }
    EXPECT_TRUE(stream.done()) << "the stream did not finish in 120 s";
    return tokens;
  }

  static inline std::unique_ptr<Checkpoint> checkpoint_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::unique_ptr<CpuBackend> backend_;
  static inline std::unique_ptr<Model> model_;
};

// Reference: each request alone on a plain engine, stepped by hand.
std::vector<int32_t> alone(Model& model, const Tokenizer& tokenizer, const Request& request) {
  Engine engine(model, tokenizer, {.num_kv_blocks = 64, .max_batch = 1});
  const RequestId id = engine.submit(request);
  std::vector<int32_t> tokens;
  while (engine.has_work())
    for (const TokenEvent& e : engine.step())
      if (e.request == id && e.token >= 0) tokens.push_back(e.token);
  return tokens;
}

TEST_F(EngineServiceTest, ConcurrentRequestsGetTheirOwnTokens) {
  const std::vector<Request> requests = {greedy("The capital of France is", 12), greedy("1, 2, 3, 4,", 9),
                                         greedy("def fibonacci(n):", 14)};
  std::vector<std::vector<int32_t>> expected;
  for (const Request& r : requests) expected.push_back(alone(*model_, *tokenizer_, r));

  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4});
  Metrics metrics;
  EngineService service(engine, metrics, 16);
  std::vector<std::vector<int32_t>> got(requests.size());
  std::vector<std::thread> clients;
  for (size_t i = 0; i < requests.size(); ++i) {
    clients.emplace_back([&, i] {
      auto stream = service.submit({requests[i]});
      got[i] = drain(*stream)[0];
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(got, expected);
  // The gauges are published after the step whose events finished the streams: wait for them.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (metrics.gauges().kv_blocks_used != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  const std::string text = metrics.render();
  EXPECT_NE(text.find("pagoda_generation_tokens_total 35\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pagoda_time_to_first_token_seconds_count 3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("pagoda_time_per_output_token_seconds_count 3\n"), std::string::npos) << text;
  EXPECT_EQ(metrics.gauges().kv_blocks_used, 0);
}

TEST_F(EngineServiceTest, ChoicesOfOneRequestAreIndexed) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4});
  Metrics metrics;
  EngineService service(engine, metrics, 16);
  auto stream = service.submit({greedy("Once upon a time", 5), greedy("Hello", 7)});
  const auto tokens = drain(*stream);
  ASSERT_EQ(tokens.size(), 2u);
  EXPECT_EQ(tokens.at(0).size(), 5u);
  EXPECT_EQ(tokens.at(1).size(), 7u);
}

TEST_F(EngineServiceTest, CancelFreesTheBlocks) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 4});
  Metrics metrics;
  EngineService service(engine, metrics, 16);
  auto stream = service.submit({greedy("Tell me a long story about a dragon.", 2000)});
  // Wait for a few tokens: the request holds blocks now.
  int tokens = 0;
  for (int i = 0; i < 2000 && tokens < 3; ++i) tokens += int(stream->wait(50ms).size());
  ASSERT_GE(tokens, 3);
  EXPECT_GT(metrics.gauges().kv_blocks_used, 0);
  service.cancel(stream);
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while ((metrics.gauges().kv_blocks_used != 0 || metrics.gauges().running_requests != 0) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(metrics.gauges().kv_blocks_used, 0);
  EXPECT_EQ(metrics.gauges().running_requests, 0);
  service.stop();
  // Stopped, not run to the end and then freed.
  EXPECT_LT(engine.stats().generated_tokens, 200);
}

TEST_F(EngineServiceTest, FullQueueIs429) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 1});
  Metrics metrics;
  EngineService service(engine, metrics, 2);
  auto running = service.submit({greedy("Tell me a long story.", 2000)});
  while (running->wait(50ms).empty()) {}  // it has the one batch slot now
  auto waiting = service.submit({greedy("a", 4), greedy("b", 4)});  // the queue is full
  try {
    service.submit({greedy("c", 4)});
    FAIL() << "no 429";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 429);
    EXPECT_NE(std::string(e.what()).find("retry"), std::string::npos) << e.what();
  }
  service.cancel(running);
  EXPECT_EQ(drain(*waiting).size(), 2u);  // the queued request runs once the slot is free
}

TEST_F(EngineServiceTest, RefusalsAre400AndRunNothing) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 1});
  Metrics metrics;
  EngineService service(engine, metrics, 2);
  // Three choices can never fit a queue of two: 400, not a 429 that invites a retry.
  try {
    service.submit({greedy("a", 4), greedy("b", 4), greedy("c", 4)});
    FAIL() << "no 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("--max-queue"), std::string::npos) << e.what();
  }
  // An out-of-vocabulary token: the engine refuses it, and the valid choice beside it is withdrawn.
  Request bad = greedy("x", 4);
  bad.prompt.push_back(1 << 30);
  try {
    service.submit({greedy("fine", 4), bad});
    FAIL() << "no 400";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_NE(std::string(e.what()).find("vocabulary"), std::string::npos) << e.what();
  }
  auto stream = service.submit({greedy("still serving", 3)});
  EXPECT_EQ(drain(*stream).at(0).size(), 3u);
  service.stop();
  EXPECT_EQ(engine.stats().generated_tokens, 3);  // only the last request's: nothing refused ran
}

TEST_F(EngineServiceTest, StopFailsWhatStillWaits) {
  Engine engine(*model_, *tokenizer_, {.num_kv_blocks = 64, .max_batch = 1});
  Metrics metrics;
  auto service = std::make_unique<EngineService>(engine, metrics, 16);
  auto stream = service->submit({greedy("Tell me a long story.", 2000)});
  service->stop();
  stream->wait(0ms);  // whatever tokens came before the stop
  EXPECT_TRUE(stream->done());
  EXPECT_NE(stream->error().find("shutting down"), std::string::npos);
  EXPECT_THROW(service->submit({greedy("late", 2)}), ApiError);
}

}  // namespace
}  // namespace pagoda::server
