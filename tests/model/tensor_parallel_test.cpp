// Tensor parallelism on the CPU: the shards cover the model exactly once, a model split over
// N = 2, 3 and 4 ranks gives transformers' logits and greedy continuations on the tiny Hugging
// Face fixtures (tools/make_hf_fixtures.py: GQA, tied and untied embeddings, Qwen2's qkv bias,
// even and uneven splits, kv heads replicated when the ranks outnumber them, a padded vocabulary
// shard), and a rank that fails makes the step fail with its error instead of hanging.
//
// Weights load as f32, as in hf_checkpoint_test.cpp: a split model only sums the row-parallel
// products in another order (per rank, then across ranks), so the tolerance is that test's, 1e-4
// of the logit range, whose greedy margins are >= 20x it.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include "model_runner.h"
#include "pagoda/backend/cpu/cpu_backend.h"
#include "pagoda/core/error.h"
#include "pagoda/kv/block_pool.h"
#include "pagoda/kv/block_table.h"
#include "pagoda/model/shard.h"
#include "pagoda/model/tensor_parallel_model.h"

namespace pagoda {
namespace {

const std::string kFixtures = std::string(PAGODA_SOURCE_DIR) + "/tests/model/fixtures/hf/";
constexpr double kRelTol = 1e-4;
constexpr int32_t kNumBlocks = 64, kBlockSize = 16;

ModelConfig shape(int q_heads, int kv_heads, int intermediate, int vocab) {
  ModelConfig c;
  c.num_q_heads = q_heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = 64;
  c.hidden_size = 64;
  c.intermediate_size = intermediate;
  c.vocab_size = vocab;
  return c;
}

// Every q head, SwiGLU row and vocabulary id belongs to exactly one rank; each rank's q heads
// read kv heads it holds, in uniform GQA groups, as the attention kernels require.
TEST(ShardLayout, CoversTheModelOnceWithUniformGroups) {
  for (const ModelConfig& c : {shape(9, 3, 1536, 49152), shape(4, 2, 96, 256), shape(32, 8, 14336, 128256),
                               shape(64, 8, 28672, 128256), shape(12, 12, 3072, 50257), shape(6, 1, 100, 7)}) {
    for (int n = 1; n <= std::min(c.num_q_heads, 16); ++n) {
      check_tensor_parallel(c, n);
      std::vector<int> q_owner(size_t(c.num_q_heads), -1);
      int ffn = 0, vocab = 0;
      for (int r = 0; r < n; ++r) {
        const ShardLayout s = shard_layout(c, {r, n});
        ASSERT_GT(s.num_q_heads, 0);
        ASSERT_GT(s.num_kv_heads, 0);
        ASSERT_EQ(s.num_q_heads % s.num_kv_heads, 0);
        const int local_group = s.num_q_heads / s.num_kv_heads, group = c.num_q_heads / c.num_kv_heads;
        for (int h = 0; h < s.num_q_heads; ++h) {
          const int q = s.q_head_begin + h;
          ASSERT_EQ(q_owner[size_t(q)], -1) << "q head " << q << " on two ranks";
          q_owner[size_t(q)] = r;
          EXPECT_EQ(q / group, s.kv_head_begin + h / local_group) << "q head " << q << " reads the wrong kv head";
        }
        EXPECT_EQ(s.ffn_begin, ffn);
        EXPECT_GT(s.ffn_size, 0);
        ffn += s.ffn_size;
        EXPECT_EQ(s.vocab_rows, (c.vocab_size + n - 1) / n);
        EXPECT_EQ(s.vocab_begin, r * s.vocab_rows);
        vocab += s.vocab_stored;
      }
      EXPECT_EQ(std::count(q_owner.begin(), q_owner.end(), -1), 0);
      EXPECT_EQ(ffn, c.intermediate_size);
      EXPECT_EQ(vocab, c.vocab_size);
    }
  }
}

TEST(ShardLayout, BadRankCountsAreRefused) {
  const ModelConfig c = shape(9, 3, 1536, 49152);
  for (int n : {0, -1, 10, 65}) EXPECT_THROW(check_tensor_parallel(c, n), Error) << n;
}

struct Golden {
  explicit Golden(const std::string& name) : folder(kFixtures + name) {
    std::ifstream in(folder + "/golden.json");
    if (!in) throw std::runtime_error("missing fixture " + folder);
    const nlohmann::json json = nlohmann::json::parse(in);
    ids = json.at("prompt_ids").get<std::vector<int32_t>>();
    greedy = json.at("greedy_ids").get<std::vector<int32_t>>();
    logits = testing::read_f32(folder + "/" + json.at("logits_file").get<std::string>());
    vocab = json.at("logits_shape").at(1).get<size_t>();
  }
  std::span<const float> at(size_t pos) const { return std::span(logits).subspan(pos * vocab, vocab); }

  std::string folder;
  std::vector<int32_t> ids, greedy;
  std::vector<float> logits;
  size_t vocab;
};

std::vector<std::unique_ptr<Backend>> cpu_backends(int n) {
  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < n; ++r) backends.push_back(std::make_unique<CpuBackend>(1));
  return backends;
}

int32_t argmax(std::span<const float> v) { return int32_t(std::max_element(v.begin(), v.end()) - v.begin()); }

class SplitHfCheckpoint : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(SplitHfCheckpoint, LogitsAndGreedyMatchTransformers) {
  const auto& [name, ranks] = GetParam();
  const Golden g(name);
  const Checkpoint checkpoint = Checkpoint::open(g.folder);
  TensorParallelModel model(checkpoint, cpu_backends(ranks),
                            LoadOptions{.weight_dtype = DType::kF32, .show_progress = false});
  model.allocate_kv_cache(kNumBlocks, kBlockSize);

  double worst = 0;
  const auto decode = testing::run_chunks(model, g.ids, 1, kNumBlocks, kBlockSize);
  for (size_t pos = 0; pos < g.ids.size(); ++pos) {
    ASSERT_EQ(decode[pos].size(), g.vocab);
    const double rel = testing::relative_max_diff(decode[pos], g.at(pos));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kRelTol) << "token by token, position " << pos;
  }
  const auto chunked = testing::run_chunks(model, g.ids, 7, kNumBlocks, kBlockSize);
  for (size_t s = 0; s < chunked.size(); ++s) {
    const size_t pos = std::min((s + 1) * 7, g.ids.size()) - 1;
    const double rel = testing::relative_max_diff(chunked[s], g.at(pos));
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kRelTol) << "chunks of 7, position " << pos;
  }
  std::printf("  %-14s N = %d: max |diff| / logit range %.1e\n", name.c_str(), ranks, worst);

  kv::BlockPool pool(kNumBlocks, kBlockSize);
  kv::BlockTable table;
  std::vector<int32_t> seq = g.ids, generated;
  int32_t done = 0;
  while (generated.size() < g.greedy.size()) {
    const int32_t n = int32_t(seq.size()) - done;
    kv::append_tokens(table, n, pool);
    const SequenceChunk c{.tokens = std::span(seq).subspan(size_t(done), size_t(n)),
                          .start_pos = done,
                          .block_ids = table.block_ids,
                          .want_logits = true};
    generated.push_back(argmax(model.forward({&c, 1})));
    done = int32_t(seq.size());
    seq.push_back(generated.back());
  }
  EXPECT_EQ(generated, g.greedy);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SplitHfCheckpoint,
                         ::testing::Combine(::testing::Values("llama", "llama3_scaled", "qwen2"),
                                            ::testing::Values(2, 3, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_N" + std::to_string(std::get<1>(info.param));
                         });

// A CPU backend whose matmuls fail, or stall, once armed: one rank's fault.
class FaultyBackend final : public Backend {
 public:
  enum class Fault { kNone, kThrow, kStall };
  std::atomic<Fault> fault{Fault::kNone};

  std::string name() const override { return inner_.name(); }
  Device device() const override { return inner_.device(); }
  DType activation_dtype() const override { return inner_.activation_dtype(); }
  std::shared_ptr<Buffer> allocate(size_t bytes) override { return inner_.allocate(bytes); }
  void upload(void* dst, const void* src, size_t bytes) override { inner_.upload(dst, src, bytes); }
  void download(void* dst, const void* src, size_t bytes) override { inner_.download(dst, src, bytes); }
  void begin_step(const StepBatch& step) override { inner_.begin_step(step); }
  void embed(const Tensor& table, const StepBatch& step, Tensor out) override { inner_.embed(table, step, out); }
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor out) override { inner_.rms_norm(x, w, eps, out); }
  void rms_norm_logit_rows(const Tensor& x, const StepBatch& step, const Tensor& w, float eps, Tensor out) override {
    inner_.rms_norm_logit_rows(x, step, w, eps, out);
  }
  void add_rms_norm(Tensor x, const Tensor& y, const Tensor& w, float eps, Tensor out) override {
    inner_.add_rms_norm(x, y, w, eps, out);
  }
  void matmul(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor out) override {
    if (fault == Fault::kThrow) fail(ErrorKind::kInternal, "injected fault");
    if (fault == Fault::kStall) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    inner_.matmul(x, w, bias, out);
  }
  void silu_mul(const Tensor& gate_up, Tensor out) override { inner_.silu_mul(gate_up, out); }
  void add(Tensor x, const Tensor& y) override { inner_.add(x, y); }
  size_t allocate_kv_cache(const kv::KvCacheConfig& config) override { return inner_.allocate_kv_cache(config); }
  void copy_kv_block(int32_t src, int32_t dst) override { inner_.copy_kv_block(src, dst); }
  size_t kv_page_bytes() const override { return inner_.kv_page_bytes(); }
  void read_kv_pages(int layer, std::span<const int32_t> blocks, std::byte* dst) override {
    inner_.read_kv_pages(layer, blocks, dst);
  }
  void write_kv_pages(int layer, std::span<const int32_t> blocks, const std::byte* src) override {
    inner_.write_kv_pages(layer, blocks, src);
  }
  void rope_append_kv(int layer, const StepBatch& step, const Tensor& qkv, Tensor q) override {
    inner_.rope_append_kv(layer, step, qkv, q);
  }
  void attention(int layer, const StepBatch& step, const Tensor& q, Tensor out) override {
    inner_.attention(layer, step, q, out);
  }
  attention::DeviceInfo device_info() const override { return inner_.device_info(); }

 private:
  CpuBackend inner_{1};
};

class RankFault : public ::testing::Test {
 protected:
  // Three ranks, rank 1 faulty; one good step first, so the fault strikes mid-run.
  void load(std::chrono::milliseconds timeout) {
    checkpoint_ = std::make_unique<Checkpoint>(Checkpoint::open(kFixtures + "llama"));
    std::vector<std::unique_ptr<Backend>> backends = cpu_backends(3);
    auto faulty = std::make_unique<FaultyBackend>();
    faulty_ = faulty.get();
    backends[1] = std::move(faulty);
    model_ = std::make_unique<TensorParallelModel>(*checkpoint_, std::move(backends),
                                                   LoadOptions{.weight_dtype = DType::kF32, .show_progress = false},
                                                   timeout);
    model_->allocate_kv_cache(kNumBlocks, kBlockSize);
    step(0);
  }
  void step(int32_t pos) {
    const SequenceChunk c{.tokens = std::span(ids_).subspan(size_t(pos), 1),
                          .start_pos = pos,
                          .block_ids = blocks_,
                          .want_logits = true};
    model_->run({&c, 1});
  }
  // The error a failing step throws, and how long it took.
  std::pair<std::string, double> failing_step(int32_t pos) {
    const auto start = std::chrono::steady_clock::now();
    std::string what;
    try {
      step(pos);
    } catch (const Error& e) {
      what = e.what();
    }
    return {what, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
  }

  std::vector<int32_t> ids_ = {1, 2, 3, 4};
  std::vector<int32_t> blocks_ = {0};
  std::unique_ptr<Checkpoint> checkpoint_;
  FaultyBackend* faulty_ = nullptr;
  std::unique_ptr<TensorParallelModel> model_;
};

// The others are waiting in a collective when rank 1 throws: abort wakes them at once (the
// timeout is a minute), and the step fails with rank 1's error; so does every later call.
TEST_F(RankFault, ARankThatThrowsFailsTheStepWithItsError) {
  load(std::chrono::seconds(60));
  faulty_->fault = FaultyBackend::Fault::kThrow;
  const auto [what, seconds] = failing_step(1);
  EXPECT_NE(what.find("tensor-parallel rank 1: injected fault"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0);
  faulty_->fault = FaultyBackend::Fault::kNone;
  EXPECT_EQ(failing_step(2).first, what);
  EXPECT_THROW(model_->download_logits(), Error);
}

// A rank that stalls past the collective timeout: the others stop with an error naming it.
TEST_F(RankFault, ARankThatStallsIsNamedAfterTheTimeout) {
  load(std::chrono::milliseconds(200));
  faulty_->fault = FaultyBackend::Fault::kStall;
  const auto [what, seconds] = failing_step(1);
  EXPECT_NE(what.find("for rank(s) 1, which never came"), std::string::npos) << what;
  EXPECT_LT(seconds, 10.0);
}

}  // namespace
}  // namespace pagoda
