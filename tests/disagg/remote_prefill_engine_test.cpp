// Remote prefill on the real default model, in one process: a prefill engine computes each
// prompt's KV and first token, the pages travel through TcpKvTransport over a socket pair into
// a decode engine's blocks, and the decode engine's greedy output equals Hugging Face's (the
// golden fixture) and the colocated engine's. Prefix-cache hits on the decode side skip their
// blocks; a transport frame that lies about its size is refused; a failed remote prefill falls
// back to local prefill; cancelling frees the blocks.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <fstream>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/default_model.h"
#include "pagoda/disagg/tcp_kv_transport.h"
#include "pagoda/engine/engine.h"
#include "pagoda/format/gguf.h"

namespace pagoda::disagg {
namespace {

struct Golden {
  std::vector<int32_t> ids, greedy;
};

struct Side {
  explicit Side(const Checkpoint& checkpoint, const LoadOptions& options = {.show_progress = false})
      : model(checkpoint, backend, options) {}
  CpuBackend backend;
  Model model;
};

class RemotePrefillEngine : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::ifstream in(std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/smollm2_golden.json");
    ASSERT_TRUE(in);
    const nlohmann::json fixture = nlohmann::json::parse(in);
    for (const auto& p : fixture.at("prompts"))
      golden_.push_back({p.at("token_ids").get<std::vector<int32_t>>(), p.at("greedy_ids").get<std::vector<int32_t>>()});
    checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(default_model_path()));
    tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*checkpoint_->gguf()));
    prefill_ = std::make_unique<Side>(*checkpoint_);
    decode_ = std::make_unique<Side>(*checkpoint_);
  }
  static void TearDownTestSuite() {
    decode_.reset();
    prefill_.reset();
    tokenizer_.reset();
    checkpoint_.reset();
  }

  void SetUp() override {
    int fds[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    sender_ = std::make_unique<PeerLink>(Socket(fds[0]), "prefill", std::chrono::seconds(10));
    receiver_ = std::make_unique<PeerLink>(Socket(fds[1]), "decode", std::chrono::seconds(10));
  }

  static SamplingParams greedy(int32_t max_tokens) {
    return SamplingParams{.temperature = 0.f, .max_tokens = max_tokens, .ignore_eos = true};
  }

  static std::vector<int32_t> run(Engine& engine, RequestId id, std::vector<int32_t> tokens = {}) {
    for (int guard = 0; engine.has_work() && guard < 1000; ++guard)
      for (const TokenEvent& e : engine.step())
        if (e.request == id && e.token >= 0) tokens.push_back(e.token);
    return tokens;
  }

  // The prefill server's part: the prompt's first token, and its KV pages sent (all but the
  // decode side's `skip` leading blocks).
  int32_t prefill_and_send(Engine& prefill, TcpKvTransport& tx, uint64_t wire_id, const std::vector<int32_t>& prompt,
                           int32_t skip) {
    const RequestId id = prefill.submit({.prompt = prompt, .params = greedy(1), .keep_kv = true});
    const std::vector<int32_t> first = run(prefill, id);
    EXPECT_EQ(first.size(), 1u);
    const kv::BlockTable* kept = prefill.kept_kv(id);
    EXPECT_NE(kept, nullptr);
    const auto last_block_tokens = int32_t(prompt.size() - (kept->block_ids.size() - 1) * 16);
    tx.send(wire_id, std::span(kept->block_ids).subspan(size_t(skip)), last_block_tokens, 0,
            prefill_->model.config().num_layers);
    prefill.release_kept_kv(id);
    return first.at(0);
  }

  // Submits prompt to the decode engine for remote prefill, moves its KV from the prefill
  // engine and returns its whole output.
  std::vector<int32_t> disaggregated(Engine& prefill, Engine& decode, const std::vector<int32_t>& prompt,
                                     int32_t max_tokens, int32_t* cached_blocks = nullptr) {
    TcpKvTransport tx(*sender_), rx(*receiver_);
    tx.register_pool(prefill_->backend, prefill_->model.config().num_layers);
    rx.register_pool(decode_->backend, decode_->model.config().num_layers);
    const RequestId id = decode.submit({.prompt = prompt, .params = greedy(max_tokens), .prefill_remotely = true});
    const std::vector<Engine::RemotePrefill> started = decode.start_remote_prefills();
    EXPECT_EQ(started.size(), 1u);
    const Engine::RemotePrefill& r = started.at(0);
    if (cached_blocks) *cached_blocks = r.cached_blocks;
    const auto blocks = std::span(r.block_ids).subspan(size_t(r.cached_blocks));
    rx.receive(uint64_t(id), blocks, int32_t(prompt.size() - (r.block_ids.size() - 1) * 16), 0,
               decode_->model.config().num_layers);
    const int32_t first = prefill_and_send(prefill, tx, uint64_t(id), prompt, r.cached_blocks);
    rx.read_frame(receiver_->read_header(), std::chrono::steady_clock::now() + std::chrono::seconds(10));
    const std::vector<TransferEvent> events = rx.poll();
    EXPECT_EQ(events.size(), 1u);
    EXPECT_TRUE(events.at(0).ok);
    EXPECT_EQ(events.at(0).bytes, blocks.size() * 2 * decode_->model.config().num_layers * decode_->backend.kv_page_bytes());
    EXPECT_TRUE(decode.complete_remote_prefill(id, first));
    return run(decode, id);
  }

  static inline std::vector<Golden> golden_;
  static inline std::unique_ptr<Checkpoint> checkpoint_;
  static inline std::unique_ptr<Tokenizer> tokenizer_;
  static inline std::unique_ptr<Side> prefill_, decode_;
  std::unique_ptr<PeerLink> sender_, receiver_;
};

TEST_F(RemotePrefillEngine, GreedyOutputEqualsHuggingFace) {
  Engine prefill(prefill_->model, *tokenizer_, {.num_kv_blocks = 64});
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64});
  // The first 8 tokens of each: the decode steps after the first are the colocated engine's,
  // which tests/engine checks in full; what is new here is the KV they attend to.
  for (const Golden& g : golden_) {
    const std::vector<int32_t> expected(g.greedy.begin(), g.greedy.begin() + 8);
    EXPECT_EQ(disaggregated(prefill, decode, g.ids, 8), expected);
  }
  EXPECT_EQ(decode.stats().prompt_tokens, 0);  // nothing was prefilled on the decode side
  EXPECT_EQ(decode.num_free_blocks() + decode.num_cached_blocks(), decode.num_kv_blocks());
}

// The KV storage formats on the wire: f16 and int2 pools move their pages as stored (codes and
// metadata; fp8 is tests/server/disagg_test.py's), layer by layer as the prefill engine's forward pass stores each (its layer hook,
// as the prefill server sends them), and the decode engine's greedy output equals the colocated
// engine's on the same storage. Prompt lengths: 60 (an int2 V partition still in its f16 tail,
// which the decode side fills and seals at token 64) and 128 (two int2 blocks of whole
// partitions). Bytes are checked against page sizes computed by hand, and int2's against f16's
// for the same tokens.
TEST_F(RemotePrefillEngine, KvTravelsAsStoredLayerByLayer) {
  struct Storage {
    const char* name;
    LoadOptions options;
    int32_t block_size;
    uint64_t page_bytes;  // by hand: SmolLM2 has 3 KV heads of 64
  };
  const Storage storages[] = {
      {"f16", {.show_progress = false, .kv_dtype = DType::kF16}, 16, 16 * 3 * 64 * 2},
      // K: 2-bit codes, and per token and head one partition's f16 min, f16 scale and 1-byte sum;
      // V: the same bytes, partitioned along the block's 64 tokens
      {"int2", {.show_progress = false, .kv_quant = KvQuant::kInt2, .kv_partition = 64, .kv_hadamard = true}, 64,
       3 * 64 * (64 / 4 + 5)},
  };
  std::vector<int32_t> text;
  for (int i = 0; int32_t(text.size()) < 128; ++i) {
    const std::vector<int32_t> more = tokenizer_->encode(fmt::format("Item {} of the inventory is a box of {} apples. ",
                                                                     i, i * 7 % 13), i == 0);
    text.insert(text.end(), more.begin(), more.end());
  }
  const std::vector<std::vector<int32_t>> prompts = {{text.begin(), text.begin() + 60},
                                                     {text.begin(), text.begin() + 128}};
  const int32_t layers = prefill_->model.config().num_layers;
  std::map<std::string, uint64_t> bytes_for_128;
  for (const Storage& storage : storages) {
    SCOPED_TRACE(storage.name);
    Side prefill_side(*checkpoint_, storage.options), decode_side(*checkpoint_, storage.options);
    // No prefix caching: the prompts share their first 60 tokens, and every block must travel.
    const EngineOptions options{.block_size = storage.block_size, .num_kv_blocks = 32, .prefix_caching = false};
    std::vector<std::vector<int32_t>> expected;
    {
      Engine colocated(decode_side.model, *tokenizer_, options);
      for (const auto& prompt : prompts)
        expected.push_back(run(colocated, colocated.submit({.prompt = prompt, .params = greedy(8)})));
    }
    Engine prefill(prefill_side.model, *tokenizer_, options);
    Engine decode(decode_side.model, *tokenizer_, options);
    EXPECT_EQ(decode_side.backend.kv_page_bytes(), storage.page_bytes);
    TcpKvTransport tx(*sender_), rx(*receiver_);
    tx.register_pool(prefill_side.backend, layers);
    rx.register_pool(decode_side.backend, layers);
    for (size_t i = 0; i < prompts.size(); ++i) {
      const std::vector<int32_t>& prompt = prompts[i];
      const RequestId id = decode.submit({.prompt = prompt, .params = greedy(8), .prefill_remotely = true});
      const std::vector<Engine::RemotePrefill> started = decode.start_remote_prefills();
      ASSERT_EQ(started.size(), 1u);
      const auto blocks = std::span(started[0].block_ids).subspan(size_t(started[0].cached_blocks));
      const auto last_block_tokens = int32_t(prompt.size() - (started[0].block_ids.size() - 1) * size_t(storage.block_size));
      rx.receive(uint64_t(id), blocks, last_block_tokens, 0, layers);

      const RequestId prefill_id = prefill.submit({.prompt = prompt, .params = greedy(1), .keep_kv = true});
      int32_t layers_sent = 0;
      prefill.set_kept_kv_layer_hook([&](int32_t layer, std::span<const Engine::KeptKvLayer> requests) {
        ASSERT_EQ(requests.size(), 1u);
        EXPECT_EQ(requests[0].id, prefill_id);
        EXPECT_EQ(layer, layers_sent);
        tx.send(uint64_t(id), requests[0].block_ids.subspan(size_t(started[0].cached_blocks)), last_block_tokens, layer, 1);
        ++layers_sent;
      });
      const std::vector<int32_t> first = run(prefill, prefill_id);
      prefill.release_kept_kv(prefill_id);
      EXPECT_EQ(layers_sent, layers);
      ASSERT_EQ(first.size(), 1u);
      for (int32_t l = 0; l < layers; ++l)  // one frame per layer
        rx.read_frame(receiver_->read_header(), std::chrono::steady_clock::now() + std::chrono::seconds(10));
      const std::vector<TransferEvent> events = rx.poll();
      ASSERT_EQ(events.size(), 1u);
      ASSERT_TRUE(events[0].ok);
      // int2: the V rows of the last block's unsealed partition travel in f16 (3 heads x 64 x 2 B).
      const uint64_t tail = storage.options.kv_quant == KvQuant::kInt2 ? uint64_t(last_block_tokens % 64) * 3 * 64 * 2 : 0;
      EXPECT_EQ(events[0].bytes, uint64_t(layers) * (blocks.size() * 2 * storage.page_bytes + tail));
      if (prompt.size() == 128) bytes_for_128[storage.name] = events[0].bytes;
      EXPECT_TRUE(decode.complete_remote_prefill(id, first[0]));
      EXPECT_EQ(run(decode, id), expected[i]) << prompt.size() << " tokens";
    }
    EXPECT_EQ(decode.stats().prompt_tokens, 0);
  }
  // The same 128 tokens: int2 moves 16.4% of f16's bytes (the bound: 17%).
  EXPECT_LE(double(bytes_for_128["int2"]), 0.17 * double(bytes_for_128["f16"]));
  EXPECT_EQ(bytes_for_128["int2"] * 2048, bytes_for_128["f16"] * 336);
}

TEST_F(RemotePrefillEngine, DecodePrefixCacheHitSkipsItsBlocks) {
  const std::vector<int32_t> prompt = golden_.at(1).ids;  // 39 tokens: two full blocks
  std::vector<int32_t> expected;
  {  // one engine per model at a time: an engine allocates its model's KV cache
    Engine colocated(decode_->model, *tokenizer_, {.num_kv_blocks = 64});
    expected = run(colocated, colocated.submit({.prompt = prompt, .params = greedy(8)}));
  }
  Engine prefill(prefill_->model, *tokenizer_, {.num_kv_blocks = 64});
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64});
  int32_t cached = -1;
  EXPECT_EQ(disaggregated(prefill, decode, prompt, 8, &cached), expected);
  EXPECT_EQ(cached, 0);
  EXPECT_EQ(disaggregated(prefill, decode, prompt, 8, &cached), expected);  // again: blocks 0 and 1 are cached
  EXPECT_EQ(cached, 2);
}

TEST_F(RemotePrefillEngine, FrameThatLiesAboutItsBlocksIsRefused) {
  // The engines allocate their models' KV pools.
  Engine prefill(prefill_->model, *tokenizer_, {.num_kv_blocks = 64});
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64});
  TcpKvTransport tx(*sender_), rx(*receiver_);
  tx.register_pool(prefill_->backend, prefill_->model.config().num_layers);
  rx.register_pool(decode_->backend, decode_->model.config().num_layers);
  const std::vector<int32_t> two_blocks = {0, 1};
  rx.receive(5, std::span(two_blocks).first(1), 16, 0, 30);
  tx.send(5, two_blocks, 16, 0, 30);  // one block more than asked for
  EXPECT_THROW(rx.read_frame(receiver_->read_header(), std::nullopt), ProtocolError);
  rx.fail_all("refused");
  const std::vector<TransferEvent> events = rx.poll();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_FALSE(events[0].ok);
  // Pages for a request never asked for are refused too.
  tx.send(6, std::span(two_blocks).first(1), 16, 0, 30);
  EXPECT_THROW(rx.read_frame(receiver_->read_header(), std::nullopt), ProtocolError);
}

TEST_F(RemotePrefillEngine, FailedRemotePrefillFallsBackToLocal) {
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64, .prefix_caching = false});
  const Golden& g = golden_.at(0);
  const RequestId id = decode.submit({.prompt = g.ids, .params = greedy(8), .prefill_remotely = true});
  ASSERT_EQ(decode.start_remote_prefills().size(), 1u);
  EXPECT_LT(decode.num_free_blocks(), decode.num_kv_blocks());
  EXPECT_FALSE(decode.has_work());  // waiting for its KV
  decode.fail_remote_prefill(id);
  EXPECT_EQ(decode.num_free_blocks(), decode.num_kv_blocks());
  EXPECT_EQ(run(decode, id), std::vector<int32_t>(g.greedy.begin(), g.greedy.begin() + 8));
  EXPECT_FALSE(decode.complete_remote_prefill(id, 1));  // a late answer changes nothing
  EXPECT_EQ(decode.num_free_blocks(), decode.num_kv_blocks());
}

TEST_F(RemotePrefillEngine, CancelWhilePrefillingFreesTheBlocks) {
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64, .prefix_caching = false});
  const RequestId id = decode.submit({.prompt = golden_.at(1).ids, .params = greedy(4), .prefill_remotely = true});
  ASSERT_EQ(decode.start_remote_prefills().size(), 1u);
  EXPECT_TRUE(decode.remote_prefill_pending(id));
  decode.cancel(id);
  EXPECT_FALSE(decode.remote_prefill_pending(id));
  EXPECT_EQ(decode.num_free_blocks(), decode.num_kv_blocks());
  EXPECT_FALSE(decode.complete_remote_prefill(id, 1));  // its answer, come late, is dropped
}

TEST_F(RemotePrefillEngine, FirstTokenOutsideTheVocabularyIsRefused) {
  Engine decode(decode_->model, *tokenizer_, {.num_kv_blocks = 64, .prefix_caching = false});
  const RequestId id = decode.submit({.prompt = golden_.at(0).ids, .params = greedy(4), .prefill_remotely = true});
  ASSERT_EQ(decode.start_remote_prefills().size(), 1u);
  EXPECT_THROW(decode.complete_remote_prefill(id, 1 << 30), Error);
  EXPECT_TRUE(decode.remote_prefill_pending(id));  // unchanged: the caller falls back
}

}  // namespace
}  // namespace pagoda::disagg
