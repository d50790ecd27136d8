// run_prefix_cpu against the exact reference, on random multi-level prefix batches planned with
// random options, f32/f16/bf16 pools in both layouts, and on cascade batches; and against
// run_decode_cpu, which reads the same batch without sharing.
//
// Tolerance as for decode (decode_test.cpp): the reference sees the pool's rounded values, so
// every dtype is held to the fp32 error of the executor, |o - ref| <= 2e-5 and
// |lse - ref| <= 2e-5 * max(1, |ref|). The prefix and decode executors agree to 1e-5 relative.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/attention/plan.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/bench/tree_batch.h"
#include "pagoda/core/error.h"
#include "../attention/prefix_batches.h"
#include "../attention/reference.h"

namespace pagoda::attention {
namespace {

using bench::parse_prefix_tree;
using bench::tree_num_blocks;
using bench::make_tree_batch;
using bench::PrefixTreeSpec;

using cpu::run_prefix_cpu;
using cpu::run_decode_cpu;

using testing::HostPool;
using testing::HostSequence;
using testing::Random;

constexpr double kTolerance = 2e-5;
constexpr double kAgreement = 1e-5;

// Tokens two sequences hold in the same pool slots: their leading positions with the same block
// id, up to the fewer tokens either reads.
int32_t common_tokens(const DecodeBatch& batch, int32_t a, int32_t b, int32_t bs) {
  const auto ta = batch.blocks_of(a), tb = batch.blocks_of(b);
  const int32_t length = std::min(batch.kv_lengths[size_t(a)], batch.kv_lengths[size_t(b)]);
  int32_t p = 0;
  while (p * bs < length && ta[size_t(p)] == tb[size_t(p)]) ++p;
  return std::min(length, p * bs);
}

// Random K/V for every token of the batch, each pool slot written once: a sequence copies what
// it shares with the earlier sequence it shares most with (whose copy holds every slot written
// so far in the shared blocks) and draws the rest.
std::vector<HostSequence> fill_batch(HostPool& pool, const DecodeBatch& batch, Random& rng) {
  const size_t row = size_t(pool.num_kv_heads) * size_t(pool.head_dim);
  std::vector<HostSequence> seqs(size_t(batch.num_seqs()));
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    HostSequence& seq = seqs[size_t(s)];
    seq.blocks.assign(batch.blocks_of(s).begin(), batch.blocks_of(s).end());
    int32_t shared = 0, donor = -1;
    for (int32_t d = 0; d < s; ++d) {
      const int32_t common = common_tokens(batch, s, d, pool.block_size);
      if (common > shared) shared = common, donor = d;
    }
    if (donor >= 0) {
      seq.k.assign(seqs[size_t(donor)].k.begin(), seqs[size_t(donor)].k.begin() + long(size_t(shared) * row));
      seq.v.assign(seqs[size_t(donor)].v.begin(), seqs[size_t(donor)].v.begin() + long(size_t(shared) * row));
      seq.length = shared;
    }
    testing::fill_tokens(pool, seq, shared, batch.kv_lengths[size_t(s)], rng);
  }
  return seqs;
}

struct Errors {
  double o = 0, lse = 0;
};

// out/lse of every row against the exact reference; a sequence with no KV must get o = 0 and
// lse = -inf exactly.
Errors compare_with_reference(const DecodeBatch& batch, const AttentionShape& shape,
                              const std::vector<HostSequence>& seqs, const std::vector<float>& q,
                              const std::vector<float>& out, const std::vector<float>& lse) {
  Errors e;
  const size_t d = size_t(shape.head_dim);
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    for (int32_t h = 0; h < shape.num_q_heads; ++h) {
      const size_t row = size_t(s) * size_t(shape.num_q_heads) + size_t(h);
      if (batch.kv_lengths[size_t(s)] == 0) {
        for (size_t i = 0; i < d; ++i) EXPECT_EQ(out[row * d + i], 0.f) << "seq " << s;
        EXPECT_EQ(lse[row], -std::numeric_limits<float>::infinity()) << "seq " << s;
        continue;
      }
      const auto ref = testing::reference_attention(&q[row * d], seqs[size_t(s)], h / shape.group_size(),
                                                    shape.num_kv_heads, shape.head_dim, shape.softmax_scale, 0,
                                                    batch.kv_lengths[size_t(s)]);
      for (size_t i = 0; i < d; ++i) e.o = std::max(e.o, std::abs(double(out[row * d + i]) - ref.o[i]));
      e.lse = std::max(e.lse, std::abs(double(lse[row]) - ref.lse) / std::max(1.0, std::abs(ref.lse)));
    }
  }
  return e;
}

// Largest |a - b| / max(1, |b|) over both arrays (-inf against -inf counts as equal).
double disagreement(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == b[i]) continue;
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])) / std::max(1.0, std::abs(double(b[i]))));
  }
  return worst;
}

std::vector<float> random_q(const DecodeBatch& batch, const AttentionShape& shape, Random& rng) {
  std::vector<float> q(size_t(batch.num_seqs()) * size_t(shape.num_q_heads) * size_t(shape.head_dim));
  for (float& x : q) x = rng.uniform(-4, 4);  // peaked softmax: the running max moves
  return q;
}

// Random trees as in prefix_plan_test.cpp, smaller: every query is checked against the double
// reference, which dominates the time.
TEST(PrefixExecutor, RandomTreesMatchReferenceAndDecode) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kBF16};
  const int32_t groups[] = {1, 2, 4, 7, 8};
  int32_t with_merges = 0, with_empty = 0, with_tails = 0;
  for (uint64_t seed = 1; seed <= 150; ++seed) {
    Random rng(seed);
    testing::RandomTreeOptions tree{.block_size = rng.next(2) ? 16 : 32, .max_roots = 2, .max_depth = 2,
                                    .max_fanout = 4, .max_inner_blocks = 3, .max_leaf_tokens = 80};
    const auto [batch, num_blocks] = testing::random_tree_batch(rng, tree);
    const int32_t group = groups[rng.next(5)], kv_heads = 1 + int32_t(rng.next(3));
    const int32_t head_dim = rng.next(2) ? 32 : 64;
    const AttentionShape shape{group * kv_heads, kv_heads, head_dim, tree.block_size, 1.f / std::sqrt(float(head_dim))};
    PrefixPlanOptions options{.pack = rng.next(4) != 0, .split = rng.next(2) != 0};
    if (rng.next(2)) options.m_tiles = {16, 32};
    options.min_kv_tokens_per_unit = 16 + int32_t(rng.next(241));
    DeviceInfo device{.num_workers = 1 + int32_t(rng.next(300))};
    if (device.num_workers % 2) {  // no draw: the seeds' batches stay as they were
      // Tails, with few workers, whose rounds their items fill (else the planner keeps the leaves).
      options.max_tail_tokens = 32;
      device.num_workers = 1 + device.num_workers % 4;
    }
    const DType dtype = dtypes[seed % 3];
    const KvLayout layout = rng.next(2) ? KvLayout::kHnd : KvLayout::kNhd;
    SCOPED_TRACE("seed " + std::to_string(seed) + " " + std::string(dtype_name(dtype)) + " group " +
                 std::to_string(group) + " kv heads " + std::to_string(kv_heads) + " pack " +
                 std::to_string(options.pack) + " split " + std::to_string(options.split) + " tails " +
                 std::to_string(options.max_tail_tokens));

    HostPool pool(dtype, layout, num_blocks, tree.block_size, kv_heads, head_dim);
    const std::vector<HostSequence> seqs = fill_batch(pool, batch, rng);
    const std::vector<float> q = random_q(batch, shape, rng);
    const size_t rows = size_t(batch.num_seqs()) * size_t(shape.num_q_heads);

    const PrefixPlan plan = plan_prefix(batch, shape, device, options);
    with_merges += plan.num_pieces > 0;
    with_tails += std::any_of(plan.units.begin(), plan.units.end(), [](const PrefixUnit& u) { return u.num_tails > 0; });
    with_empty += std::count(batch.kv_lengths.begin(), batch.kv_lengths.end(), 0) > 0;
    std::vector<float> out(rows * size_t(head_dim), std::nanf("")), lse(rows, std::nanf(""));
    run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), out.data(), lse.data());
    const Errors e = compare_with_reference(batch, shape, seqs, q, out, lse);
    EXPECT_LE(e.o, kTolerance);
    EXPECT_LE(e.lse, kTolerance);

    std::vector<float> decode_out(out.size(), std::nanf("")), decode_lse(lse.size(), std::nanf(""));
    run_decode_cpu(plan_decode(batch, shape, device), batch, shape, pool.view(), q.data(), decode_out.data(),
                   decode_lse.data());
    EXPECT_LE(disagreement(out, decode_out), kAgreement);
    EXPECT_LE(disagreement(lse, decode_lse), kAgreement);
    ASSERT_FALSE(HasFailure());
  }
  // The seeds cover merged queries, empty sequences and tails.
  EXPECT_GT(with_merges, 60);
  EXPECT_GT(with_empty, 60);
  EXPECT_GT(with_tails, 10);
}

// The README's notation, shrunk: every level of sharing, read by a plan with row chunks (group 8
// with a 32-row tile holds 4 queries) and split pieces, without an lse output.
TEST(PrefixExecutor, SpecTreeWithRowChunksAndSplitsMatchesReference) {
  const AttentionShape shape{16, 2, 64, 16, 0.125f};
  const PrefixTreeSpec spec = parse_prefix_tree("2,4,16_256,64,23");
  const DecodeBatch batch = make_tree_batch(spec, 16, 21);
  HostPool pool(DType::kBF16, KvLayout::kNhd, int32_t(tree_num_blocks(spec, 16)), 16, 2, 64);
  Random rng(21);
  const std::vector<HostSequence> seqs = fill_batch(pool, batch, rng);
  const std::vector<float> q = random_q(batch, shape, rng);
  const PrefixPlanOptions options{.m_tiles = {16, 32}, .min_kv_tokens_per_unit = 64};
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 132}, options);
  ASSERT_GT(plan.split_tokens, 0);
  ASSERT_TRUE(std::any_of(plan.units.begin(), plan.units.end(), [](const PrefixUnit& u) { return u.kv_shared; }));
  std::vector<float> out(q.size(), std::nanf("")), lse(size_t(batch.num_seqs()) * 16, std::nanf(""));
  run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), out.data());  // no lse wanted
  std::vector<float> with_lse(q.size(), std::nanf(""));
  run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), with_lse.data(), lse.data());
  EXPECT_EQ(out, with_lse);
  const Errors e = compare_with_reference(batch, shape, seqs, q, with_lse, lse);
  EXPECT_LE(e.o, kTolerance);
  EXPECT_LE(e.lse, kTolerance);
}

// Cascade: a 64-token shared prefix, then per-request suffixes (one empty), for both packings.
TEST(PrefixExecutor, CascadeMatchesReference) {
  const AttentionShape shape{8, 2, 64, 16, 0.125f};
  Random rng(5);
  std::vector<std::vector<int32_t>> suffix_blocks;
  std::vector<int32_t> suffix_tokens;
  int32_t next_id = 4;
  for (int32_t r = 0; r < 12; ++r) {
    suffix_tokens.push_back(r == 3 ? 0 : 1 + int32_t(rng.next(70)));
    suffix_blocks.emplace_back();
    for (int32_t b = 0; b < (suffix_tokens.back() + 15) / 16; ++b) suffix_blocks.back().push_back(next_id++);
  }
  const DecodeBatch batch = cascade_batch({2, 0, 3, 1}, 64, suffix_blocks, suffix_tokens, 16);
  HostPool pool(DType::kF16, KvLayout::kHnd, next_id, 16, 2, 64);
  const std::vector<HostSequence> seqs = fill_batch(pool, batch, rng);
  const std::vector<float> q = random_q(batch, shape, rng);
  for (bool pack : {true, false}) {
    SCOPED_TRACE(pack ? "packed" : "one unit per request");
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 16}, PrefixPlanOptions{.pack = pack});
    std::vector<float> out(q.size(), std::nanf("")), lse(size_t(batch.num_seqs()) * 8, std::nanf(""));
    run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), out.data(), lse.data());
    const Errors e = compare_with_reference(batch, shape, seqs, q, out, lse);
    EXPECT_LE(e.o, kTolerance);
    EXPECT_LE(e.lse, kTolerance);
  }
}

TEST(PrefixExecutor, EmptyBatchAndEmptySequences) {
  const AttentionShape shape{4, 2, 32, 16, 0.125f};
  HostPool pool(DType::kF32, KvLayout::kHnd, 2, 16, 2, 32);
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{}, 0);
  batch.add_sequence(std::vector<int32_t>{1}, 0);
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 4});
  std::vector<float> q(2 * 4 * 32, 1.f), out(q.size(), std::nanf("")), lse(8, 0.f);
  run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), out.data(), lse.data());
  for (float x : out) EXPECT_EQ(x, 0.f);
  for (float x : lse) EXPECT_EQ(x, -std::numeric_limits<float>::infinity());
}

TEST(PrefixExecutor, RejectsPoolThatDoesNotMatch) {
  HostPool pool(DType::kF32, KvLayout::kHnd, 2, 16, 1, 64);
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{5}, 3);  // block 5 is outside the 2-block pool
  const AttentionShape shape{1, 1, 64, 16, 0.125f};
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{});
  std::vector<float> q(64), out(64);
  EXPECT_THROW(run_prefix_cpu(plan, batch, shape, pool.view(), q.data(), out.data()), Error);
  const AttentionShape other_dim{1, 1, 128, 16, 0.125f};
  EXPECT_THROW(run_prefix_cpu(plan, batch, other_dim, pool.view(), q.data(), out.data()), Error);
}

}  // namespace
}  // namespace pagoda::attention
