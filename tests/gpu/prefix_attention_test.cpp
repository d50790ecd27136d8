// Prefix-aware decode attention on the GPU (backend/cuda/prefix_attention.h) against the CPU:
//   - every batch of bench/workloads/README.md x the four head configurations, fp16, head_dim
//     128, against the exact double-precision attention of up to 16 queries of each batch (the
//     largest batches hold 17 GB of KV: the pool is filled on the device and only the sampled
//     queries' blocks are copied back);
//   - random prefix forests (partial last blocks, empty sequences, shuffled query order, GQA
//     groups 1-8, head_dim 64 and 128, f16 and bf16, HND and NHD, block sizes 16-64) against the
//     CPU executor running the same plan, and against the exact reference;
//   - forests whose scores climb along each sequence, so that the online softmax's reference
//     maximum moves (at every step, and lazily) and O is rescaled.
//   - on the host: kernel_units (pairs, cuts, tail tiles) and prefix_schedule (every item once,
//     balanced).
// Tolerances are decode_attention_test.cpp's (attention_inputs.h): the kernels round P and the
// output to the KV dtype as the decode kernel does. Outputs are poisoned with NaN bytes first.
#include "gpu_test.h"
#include "pagoda/backend/cuda/prefix_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention_inputs.h"
#include "pagoda/backend/cpu/decode_attention.h"
#include "pagoda/attention/prefix_plan.h"
#include "pagoda/bench/tree_batch.h"
#include "pagoda/bench/cuda_support.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

using namespace ::pagoda::cuda::testing;
using attention::PrefixPlan;

struct DeviceOutputs {
  std::vector<float> out, lse;
};

// Runs `plan` on the device over pool `kv` and q (device pointers); returns out (as float) and lse.
// It runs twice on one workspace and expects the same bits the second time. Then once more on a
// workspace that every earlier call of the test binary uploaded its plan to, as for a CUDA graph
// of the batch's rows (a grid of every worker, the merge tasks padded to one per sequence), as the
// engine's graph steps reuse theirs: slots and partial states' stride left larger by earlier
// plans must change nothing, and a merge of the same warps per row gives the same bits.
DeviceOutputs run_prefix_gpu(const PrefixPlan& plan, const attention::DecodeBatch& batch,
                             const AttentionShape& shape, const PrefixTiles& tiles, const PagedKv& kv,
                             const void* q, bool with_lse = true) {
  PrefixWorkspace workspace;
  workspace.upload(plan, batch, shape, tiles);
  const KvTensorMaps maps = kv_tensor_maps(kv);
  const size_t rows = size_t(batch.num_seqs()) * size_t(shape.num_q_heads);
  DeviceArray<uint16_t> out(rows * size_t(shape.head_dim));
  DeviceArray<float> lse(rows);
  std::vector<uint16_t> bits, first_bits;
  auto launch_on = [&](PrefixWorkspace& w) {
    check_cuda(cudaMemset(out.data(), 0xff, out.bytes()), "cudaMemset out");  // NaN in every dtype
    check_cuda(cudaMemset(lse.data(), 0xff, lse.bytes()), "cudaMemset lse");
    prefix_attention(w, shape, kv, maps, q, out.data(), with_lse ? lse.data() : nullptr);
    check_cuda(cudaDeviceSynchronize(), "prefix_attention");
    first_bits = std::exchange(bits, out.download());
  };
  launch_on(workspace);
  launch_on(workspace);
  EXPECT_EQ(bits, first_bits) << "a second launch on the same workspace";
  static PrefixWorkspace reused;
  reused.upload(plan, batch, shape, tiles, nullptr, batch.num_seqs());
  const std::vector<float> fresh_lse = with_lse ? lse.download() : std::vector<float>{};
  launch_on(reused);
  if (reused.graph_shape() == workspace.graph_shape()) {
    EXPECT_EQ(bits, first_bits) << "the reused workspace";
  } else {  // the merge's sums in another order
    float worst = 0.f;
    for (size_t i = 0; i < bits.size(); ++i) {
      const float a = from_bits(kv.dtype, first_bits[i]), b = from_bits(kv.dtype, bits[i]);
      const float d = std::fabs(a - b) / (1.f + std::fabs(a));
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);  // an unwritten output is NaN
      if (std::isnan(d)) break;
    }
    EXPECT_LE(worst, 1e-2f) << "the reused workspace";
  }
  if (with_lse) {
    const std::vector<float> reused_lse = lse.download();
    float worst = 0.f;
    for (size_t i = 0; i < reused_lse.size(); ++i) {
      if (reused_lse[i] == fresh_lse[i]) continue;  // -inf of an empty row included
      const float d = std::fabs(reused_lse[i] - fresh_lse[i]);
      worst = std::isnan(d) ? INFINITY : std::max(worst, d);
      if (std::isnan(d)) break;
    }
    EXPECT_LE(worst, 1e-4f) << "the reused workspace's lse";
  }
  DeviceOutputs r;  // the fresh workspace's
  r.out.resize(first_bits.size());
  for (size_t i = 0; i < first_bits.size(); ++i) r.out[i] = from_bits(kv.dtype, first_bits[i]);
  r.lse = fresh_lse;
  return r;
}

// ---- The listed batches (bench/workloads/README.md) and the other trees of the PAT artifact.

struct TreeCase {
  const char* tree;
  int32_t q_heads, kv_heads;
};

class GpuPrefixTree : public GpuTestWithParam<TreeCase> {};

TEST_P(GpuPrefixTree, MatchesExactAttention) {
  const TreeCase c = GetParam();
  const DType dtype = DType::kF16;
  const AttentionShape shape{.num_q_heads = c.q_heads, .num_kv_heads = c.kv_heads, .head_dim = 128,
                             .block_size = 16, .softmax_scale = 1.f / std::sqrt(128.f)};
  const bench::PrefixTreeSpec spec = bench::parse_prefix_tree(c.tree);
  const attention::DecodeBatch batch = bench::make_tree_batch(spec, shape.block_size, 7);
  const int32_t num_blocks = int32_t(bench::tree_num_blocks(spec, shape.block_size));
  const size_t page = size_t(shape.block_size) * size_t(shape.num_kv_heads) * size_t(shape.head_dim);
  DeviceArray<uint16_t> k(size_t(num_blocks) * page), v(size_t(num_blocks) * page);
  const size_t q_elements = size_t(batch.num_seqs()) * size_t(shape.num_q_heads) * size_t(shape.head_dim);
  DeviceArray<uint16_t> q(q_elements);
  bench::fill_uniform(k.data(), k.size(), dtype, 1);
  bench::fill_uniform(v.data(), v.size(), dtype, 2);
  bench::fill_uniform(q.data(), q.size(), dtype, 3);
  const PagedKv kv = make_paged_kv(k.data(), v.data(), dtype, KvLayout::kHnd, num_blocks, shape.block_size,
                                   shape.num_kv_heads, shape.head_dim, Device::kCuda);

  const PrefixTiles tiles = prefix_tiles(shape, dtype);
  const PrefixPlan plan =
      attention::plan_prefix(batch, shape, prefix_device_info(tiles), prefix_plan_options(tiles));
  const DeviceOutputs got = run_prefix_gpu(plan, batch, shape, tiles, kv, q.data());

  // Up to 16 queries, spread over the batch, against the exact attention over their own blocks.
  const std::vector<uint16_t> q_bits = q.download();
  const int32_t num_checked = std::min(batch.num_seqs(), 16);
  const size_t head_dim = size_t(shape.head_dim), kv_row = size_t(shape.num_kv_heads) * head_dim;
  double out_error = 0, lse_error = 0;
  size_t bad = 0;
  std::vector<uint16_t> page_bits(page);
  for (int32_t i = 0; i < num_checked; ++i) {
    const int32_t s = int32_t(int64_t(i) * batch.num_seqs() / num_checked);
    ref::HostSequence seq;
    seq.length = batch.kv_lengths[size_t(s)];
    seq.k.resize(size_t(seq.length) * kv_row);
    seq.v.resize(seq.k.size());
    const auto blocks = batch.blocks_of(s);
    for (int32_t b = 0; b * shape.block_size < seq.length; ++b) {
      for (const bool is_v : {false, true}) {
        const uint16_t* src = (is_v ? v.data() : k.data()) + size_t(blocks[size_t(b)]) * page;
        check_cuda(cudaMemcpy(page_bits.data(), src, page * 2, cudaMemcpyDeviceToHost), "cudaMemcpy page");
        for (int32_t slot = 0; slot < shape.block_size && b * shape.block_size + slot < seq.length; ++slot) {
          for (int32_t h = 0; h < shape.num_kv_heads; ++h) {
            for (size_t d = 0; d < head_dim; ++d) {  // HND page: [head][slot][d]
              const float x = from_bits(dtype, page_bits[(size_t(h) * size_t(shape.block_size) + size_t(slot)) * head_dim + d]);
              (is_v ? seq.v : seq.k)[(size_t(b * shape.block_size + slot)) * kv_row + size_t(h) * head_dim + d] = x;
            }
          }
        }
      }
    }
    for (int32_t h = 0; h < shape.num_q_heads; ++h) {
      const size_t row = size_t(s) * size_t(shape.num_q_heads) + size_t(h);
      std::vector<float> q_row(head_dim);
      for (size_t d = 0; d < head_dim; ++d) q_row[d] = from_bits(dtype, q_bits[row * head_dim + d]);
      const ref::ReferenceState want = ref::reference_attention(q_row.data(), seq, h / shape.group_size(),
                                                                shape.num_kv_heads, shape.head_dim,
                                                                double(shape.softmax_scale), 0, seq.length);
      for (size_t d = 0; d < head_dim; ++d) {
        const float g = got.out[row * head_dim + d];
        if (!std::isfinite(g)) ++bad;
        else out_error = std::max(out_error, std::abs(double(g) - want.o[d]));
      }
      if (!std::isfinite(got.lse[row])) ++bad;
      else lse_error = std::max(lse_error, std::abs(double(got.lse[row]) - want.lse) / std::max(1.0, std::abs(want.lse)));
    }
  }
  EXPECT_EQ(bad, 0u) << "unwritten or non-finite elements";
  EXPECT_LE(out_error, out_tolerance(dtype)) << c.tree << " " << c.q_heads << "/" << c.kv_heads;
  EXPECT_LE(lse_error, kLseTolerance) << c.tree << " " << c.q_heads << "/" << c.kv_heads;
}

std::vector<TreeCase> head_cases(const std::vector<const char*>& trees) {
  std::vector<TreeCase> cases;
  for (const char* tree : trees) {
    for (auto [hq, hkv] : {std::pair{32, 32}, {16, 8}, {32, 8}, {64, 8}}) cases.push_back({tree, hq, hkv});
  }
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<TreeCase>& info) {
  std::string name = std::string(info.param.tree) + "_h" + std::to_string(info.param.q_heads) + "_" +
                     std::to_string(info.param.kv_heads);
  std::replace(name.begin(), name.end(), ',', 'x');
  return name;
}

// The listed batches, then the other trees of the PAT artifact's kernel benchmark: among them
// trees of up to seven levels and a 2048-token root over 1024 queries.
std::vector<const char*> benchmark_trees(bool listed) {
  std::vector<const char*> trees;
  for (const bench::BenchmarkTree& tree : bench::kPatBenchmarkTrees) {
    if (tree.listed == listed) trees.push_back(tree.text);
  }
  return trees;
}

INSTANTIATE_TEST_SUITE_P(Batches, GpuPrefixTree, ::testing::ValuesIn(head_cases(benchmark_trees(true))), case_name);
INSTANTIATE_TEST_SUITE_P(PatBenchmark, GpuPrefixTree, ::testing::ValuesIn(head_cases(benchmark_trees(false))),
                         case_name);

// ---- The kernel's units (host only: runs without a GPU too).

// Pairs: consecutive units of <= 32 tokens, with <= 64 rows together, with blocks of <= 32
// tokens; every plan unit appears once, as a kernel unit or one half of a pair, with its queries
// in order.
TEST(PrefixKernelUnits, PairsShortUnitsAndKeepsEveryUnit) {
  struct Case {
    const char* tree;
    int32_t group, block_size, pairs;
  };
  // 1,6_256,20: the root and six 20-token leaves (three pairs, none with 64-token blocks);
  // 1,5_256,48: leaves over 32 tokens; 1,2,10_64,64,30: five pairs; 1,4,8_256,32,32: 4 shared
  // 32-token nodes of 8 rows and 8 leaves of 4, six pairs.
  for (const Case& c : {Case{"1,6_256,20", 4, 16, 3}, Case{"1,6_256,20", 8, 32, 3}, Case{"1,6_256,20", 4, 64, 0},
                        Case{"1,5_256,48", 1, 16, 0}, Case{"1,2,10_64,64,30", 2, 16, 5},
                        Case{"1,4,8_256,32,32", 4, 16, 6}}) {
    SCOPED_TRACE(std::string(c.tree) + " group " + std::to_string(c.group) + " block " + std::to_string(c.block_size));
    const bench::PrefixTreeSpec spec = bench::parse_prefix_tree(c.tree);
    const attention::DecodeBatch batch = bench::make_tree_batch(spec, c.block_size, 3);
    const AttentionShape shape{.num_q_heads = 2 * c.group, .num_kv_heads = 2, .head_dim = 128, .block_size = c.block_size};
    const PrefixPlan plan = attention::plan_prefix(batch, shape, {.num_workers = 132}, {.split = false, .m_tiles = {16, 32, 64}});
    const KernelUnits k = kernel_units(plan, batch.block_ids, c.block_size, 64);
    EXPECT_EQ(k.units.size() + size_t(c.pairs), plan.units.size());
    size_t next = 0;  // the plan unit each kernel unit must start with, in order
    for (const KernelUnit& u : k.units) {
      ASSERT_LT(next, plan.units.size());
      const attention::PrefixUnit& first = plan.units[next++];
      EXPECT_EQ(u.block_begin, first.block_begin);
      EXPECT_EQ(u.num_tokens, first.num_tokens);
      EXPECT_EQ(u.first_rows, first.num_queries * c.group);
      std::vector<attention::UnitQuery> expected(plan.unit_queries.begin() + first.query_begin,
                                                 plan.unit_queries.begin() + first.query_begin + first.num_queries);
      if (u.second_tokens > 0) {
        ASSERT_LT(next, plan.units.size());
        const attention::PrefixUnit& second = plan.units[next++];
        EXPECT_EQ(u.second_block_begin, second.block_begin);
        EXPECT_EQ(u.second_tokens, second.num_tokens);
        EXPECT_LE(first.num_tokens, 32);
        EXPECT_LE(second.num_tokens, 32);
        EXPECT_LE(u.first_rows + second.num_queries * c.group, 64);
        expected.insert(expected.end(), plan.unit_queries.begin() + second.query_begin,
                        plan.unit_queries.begin() + second.query_begin + second.num_queries);
      }
      ASSERT_EQ(u.rows, int32_t(expected.size()) * c.group);
      for (size_t j = 0; j < expected.size(); ++j) {
        EXPECT_EQ(k.queries[size_t(u.query_begin) + j].seq, expected[j].seq);
        EXPECT_EQ(k.queries[size_t(u.query_begin) + j].piece, expected[j].piece);
      }
    }
    EXPECT_EQ(next, plan.units.size());
  }
  // Rows: 48 + 32 > 64 stays apart, 32 + 32 pairs, and a 33-token unit is never half a tile.
  PrefixPlan plan;
  plan.group = 16;
  for (int32_t queries : {3, 2, 2, 1}) {
    plan.units.push_back({.block_begin = int32_t(plan.units.size()) * 2, .num_tokens = 32,
                          .query_begin = int32_t(plan.unit_queries.size()), .num_queries = queries, .m_tile = 64});
    for (int32_t q = 0; q < queries; ++q) plan.unit_queries.push_back({.seq = int32_t(plan.unit_queries.size()), .piece = -1});
  }
  plan.units.push_back({.block_begin = 8, .num_tokens = 33, .query_begin = 0, .num_queries = 1, .m_tile = 16});
  const KernelUnits k = kernel_units(plan, {}, 16, 64);
  ASSERT_EQ(k.units.size(), 4u);
  EXPECT_EQ(k.units[0].second_tokens, 0);
  EXPECT_EQ(k.units[1].second_tokens, 32);
  EXPECT_EQ(k.units[1].rows, 64);
  EXPECT_EQ(k.units[1].first_rows, 32);
  EXPECT_EQ(k.queries[size_t(k.units[1].query_begin) + 2].seq, 5);
  EXPECT_EQ(k.units[2].second_tokens, 0);
  EXPECT_EQ(k.units[3].second_tokens, 0);
}

TEST(PrefixKernelUnits, CutsOneTileUnitsOfMoreRowsThanAStage) {
  // Group 8: 16 queries are 128 rows. Over 32 tokens (one tile) the unit becomes two of 64 rows,
  // both marked shared; over 65 tokens (two tiles) it stays whole.
  PrefixPlan plan;
  plan.group = 8;
  for (int32_t tokens : {32, 65}) {
    plan.units.push_back({.block_begin = int32_t(plan.units.size()) * 8, .num_tokens = tokens,
                          .query_begin = int32_t(plan.unit_queries.size()), .num_queries = 16, .m_tile = 128});
    for (int32_t q = 0; q < 16; ++q) plan.unit_queries.push_back({.seq = int32_t(plan.unit_queries.size()), .piece = -1});
  }
  const KernelUnits k = kernel_units(plan, {}, 16, 64);
  ASSERT_EQ(k.units.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(k.units[size_t(i)].block_begin, 0);
    EXPECT_EQ(k.units[size_t(i)].num_tokens, 32);
    EXPECT_EQ(k.units[size_t(i)].rows, 64);
    EXPECT_EQ(k.units[size_t(i)].kv_shared, 1);
    EXPECT_EQ(k.units[size_t(i)].second_tokens, 0);
    EXPECT_EQ(k.queries[size_t(k.units[size_t(i)].query_begin)].seq, 8 * i);
  }
  EXPECT_EQ(k.units[2].rows, 128);
  EXPECT_EQ(k.units[2].num_tokens, 65);
  EXPECT_EQ(k.queries[size_t(k.units[2].query_begin) + 15].seq, 31);

  // Group 5: 25 queries (125 rows) over 32 tokens are 12 + 12 + 1 queries of at most 64 rows.
  PrefixPlan odd;
  odd.group = 5;
  odd.units.push_back({.block_begin = 0, .num_tokens = 32, .query_begin = 0, .num_queries = 25, .m_tile = 128});
  for (int32_t q = 0; q < 25; ++q) odd.unit_queries.push_back({.seq = q, .piece = -1});
  const KernelUnits cut = kernel_units(odd, {}, 16, 64);
  ASSERT_EQ(cut.units.size(), 3u);
  EXPECT_EQ(cut.units[0].rows, 60);
  EXPECT_EQ(cut.units[1].rows, 60);
  EXPECT_EQ(cut.units[2].rows, 5);
  EXPECT_EQ(cut.queries[size_t(cut.units[2].query_begin)].seq, 24);
}

// Tails: 1,4,32_64,128,24 at group 4 holds 8 queries in each unit of a 128-token node (and the
// root, read again), 32 rows: two row blocks of 4 queries, two pairs of 24-token leaves each, and
// two warps splitting each block's tokens (block b: warps b and b + 2). The tiles take the blocks
// in turn and a block's warps in turn: queries (0, 1) on warp 0, (4, 5) on 1, (2, 3) on 2, (6, 7)
// on 3; each carries its queries' blocks in its halves.
TEST(PrefixKernelUnits, TailTilesTakeTheRowBlocksInTurn) {
  const bench::PrefixTreeSpec spec = bench::parse_prefix_tree("1,4,32_64,128,24");
  const attention::DecodeBatch batch = bench::make_tree_batch(spec, 16, 3);
  const AttentionShape shape{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  const PrefixPlan plan = attention::plan_prefix(batch, shape, {.num_workers = 8},  // no units dealt further
                                                 {.split = false, .max_tail_tokens = 32});
  const KernelUnits k = kernel_units(plan, batch.block_ids, 16, 64);
  ASSERT_EQ(k.units.size(), 4u);
  ASSERT_EQ(plan.units.size(), 4u);
  for (size_t i = 0; i < k.units.size(); ++i) {
    const KernelUnit& u = k.units[i];
    const attention::PrefixUnit& unit = plan.units[i];
    EXPECT_EQ(u.second_tokens, 0);
    ASSERT_EQ(u.rows, 32);
    ASSERT_EQ(u.num_tokens, 192);
    ASSERT_EQ(u.tail_tiles, 4);
    const int32_t warps[] = {0, 1, 2, 3}, firsts[] = {0, 4, 2, 6};
    for (int32_t t = 0; t < 4; ++t) {
      const PrefixTailTile& tile = k.tail_tiles[size_t(u.tail_begin + t)];
      EXPECT_EQ(tile.warps, 1 << warps[t]);
      EXPECT_EQ(tile.first_begin, firsts[t]);
      EXPECT_EQ(tile.first_end, firsts[t] + 1);
      EXPECT_EQ(tile.second_begin, firsts[t] + 1);
      EXPECT_EQ(tile.second_end, firsts[t] + 2);
      EXPECT_EQ(tile.first_tokens, 24);
      EXPECT_EQ(tile.second_tokens, 24);
      for (int32_t half = 0; half < 2; ++half) {
        const int32_t seq = plan.unit_queries[size_t(unit.query_begin + firsts[t] + half)].seq;
        const int32_t leaf = batch.block_offsets[size_t(seq)] + 192 / 16;
        EXPECT_EQ(tile.ids[2 * half], batch.block_ids[size_t(leaf)]);
        EXPECT_EQ(tile.ids[2 * half + 1], batch.block_ids[size_t(leaf + 1)]);
      }
    }
    EXPECT_EQ(prefix_item_cost(u), 3 * 4 + 4 * 4 + 4);  // 192 tokens of 32 rows; 4 tail tiles; the ⊕
  }
}

// The workspace checks a plan's tails before anything reaches the device (host only): tails at a
// shape the kernel reads none at, a unit's tail list past the plan's, a tail for queries the
// unit does not have or over blocks past the batch's.
TEST(PrefixKernelUnits, RejectsTailsTheKernelCannotRead) {
  const attention::DecodeBatch batch = bench::make_tree_batch(bench::parse_prefix_tree("1,4,32_64,128,24"), 16, 3);
  const AttentionShape shape{.num_q_heads = 8, .num_kv_heads = 2, .head_dim = 128, .block_size = 16};
  const PrefixPlan plan = attention::plan_prefix(batch, shape, {.num_workers = 8}, {.split = false, .max_tail_tokens = 32});
  ASSERT_GT(plan.units[0].num_tails, 0);
  PrefixTiles tiles{.m_tiles = {16, 32, 64, 128}, .kv_tile_tokens = 64, .one_tile_rows = 64,
                    .max_tail_tokens = prefix_max_tail_tokens(shape.group_size(), shape.block_size)};
  const auto expect_rejected = [&](const PrefixPlan& p, const PrefixTiles& t) {
    PrefixWorkspace workspace;
    try {
      workspace.upload(p, batch, shape, t);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  };
  PrefixTiles no_tails = tiles;
  no_tails.max_tail_tokens = 0;
  expect_rejected(plan, no_tails);
  PrefixPlan past = plan;
  past.units[0].num_tails = int32_t(plan.unit_tails.size()) + 1;
  expect_rejected(past, tiles);
  PrefixPlan queries = plan;
  queries.unit_tails[size_t(plan.units[0].tail_begin)].query_end = plan.units[0].num_queries + 1;
  expect_rejected(queries, tiles);
  PrefixPlan blocks = plan;
  blocks.unit_tails[size_t(plan.units[0].tail_begin)].block_begin = int32_t(batch.block_ids.size());
  expect_rejected(blocks, tiles);
}

TEST(PrefixSchedule, RunsEveryItemOnceLongestFirstOnTheFewestCtas) {
  // 3 CTAs. Unit 0: 256 tokens of 128 rows (cost 4 x 6); then eight one-tile units of 8 rows
  // (cost 4 each), one kv head. A round-robin would give CTA 0 the long unit and two of the
  // short ones (32); the schedule gives it the long one alone, the short ones to CTAs 1 and 2
  // (4 each: 16).
  std::vector<KernelUnit> units;
  units.push_back({.block_begin = 0, .num_tokens = 256, .query_begin = 0, .rows = 128, .first_rows = 128});
  for (int i = 0; i < 8; ++i) units.push_back({.block_begin = 0, .num_tokens = 48, .query_begin = 0, .rows = 8, .first_rows = 8});
  EXPECT_EQ(prefix_item_cost(units[0]), 24);
  EXPECT_EQ(prefix_item_cost(units[1]), 4);
  EXPECT_EQ(prefix_item_cost({.num_tokens = 65, .rows = 64, .first_rows = 64}), 10);
  EXPECT_EQ(prefix_item_cost({.num_tokens = 32, .rows = 40, .second_tokens = 20, .first_rows = 20}), 5);  // a pair: one tile
  EXPECT_EQ(prefix_item_cost({.num_tokens = 128, .rows = 16, .first_rows = 16}), 2 * 4 + 4);  // two tiles and the ⊕
  EXPECT_EQ(prefix_item_cost({.num_tokens = 128, .rows = 33, .first_rows = 33}), 2 * 5);      // 64 rows: four warps, no ⊕
  const PrefixSchedule schedule = prefix_schedule(units, 1, 3);
  ASSERT_EQ(schedule.ctas, 3);
  ASSERT_EQ(schedule.slots.size(), 12u);  // 4 rounds
  EXPECT_EQ(schedule.slots[0], 0);
  for (size_t n = 1; n < 4; ++n) EXPECT_EQ(schedule.slots[n * 3], -1);
  for (int cta = 1; cta < 3; ++cta) {
    for (size_t n = 0; n < 4; ++n) EXPECT_GE(schedule.slots[size_t(cta) + n * 3], 1);
  }

  // Random units x 4 kv heads over 132 CTAs: every item once, each CTA's items before its -1s,
  // and the most loaded CTA within one unit's cost of the mean (list scheduling's bound).
  std::mt19937 rng(7);
  units.clear();
  int64_t total = 0, largest = 0;
  for (int i = 0; i < 500; ++i) {
    const int32_t tokens = 1 + int32_t(rng() % 700), rows = 1 + int32_t(rng() % 128);
    const bool pair = tokens <= 32 && rows <= 64 && rng() % 2;
    units.push_back({.block_begin = 0, .num_tokens = tokens, .query_begin = 0, .rows = rows,
                     .second_tokens = pair ? 16 : 0, .first_rows = rows});
    const int64_t cost = (pair ? 1 : (tokens + 63) / 64) * (rows > 64 ? 6 : rows > 32 ? 5 : 4) +
                         (!pair && tokens > 64 && rows <= 32 ? 4 : 0);
    total += 4 * cost;
    largest = std::max(largest, cost);
  }
  const PrefixSchedule random = prefix_schedule(units, 4, 132);
  ASSERT_LE(random.ctas, 132);
  std::vector<int> seen(units.size() * 4, 0);
  int64_t most = 0;
  for (int cta = 0; cta < random.ctas; ++cta) {
    bool ended = false;
    int64_t load = 0;
    for (size_t slot = size_t(cta); slot < random.slots.size(); slot += size_t(random.ctas)) {
      const int32_t item = random.slots[slot];
      if (item < 0) {
        ended = true;
        continue;
      }
      EXPECT_FALSE(ended) << "CTA " << cta << " has an item after its end";
      ASSERT_LT(size_t(item), seen.size());
      ++seen[size_t(item)];
      const KernelUnit& u = units[size_t(item / 4)];
      load += prefix_item_cost(u);
    }
    most = std::max(most, load);
  }
  for (size_t i = 0; i < seen.size(); ++i) EXPECT_EQ(seen[i], 1) << "item " << i;
  EXPECT_LE(most, total / 132 + largest);

  EXPECT_EQ(prefix_schedule({}, 8, 132).ctas, 0);
  EXPECT_EQ(prefix_schedule(std::vector<KernelUnit>(2, units[0]), 8, 132).ctas, 16);  // fewer items than workers

  // 256 items of one cost take two rounds on 132 CTAs as on 128: 128 CTAs of two items each.
  const PrefixSchedule even = prefix_schedule(std::vector<KernelUnit>(8, units[0]), 32, 132);
  ASSERT_EQ(even.ctas, 128);
  ASSERT_EQ(even.slots.size(), 256u);
  std::vector<int32_t> items = even.slots;
  std::ranges::sort(items);
  for (int32_t i = 0; i < 256; ++i) EXPECT_EQ(items[size_t(i)], i);
  // 264 of them fill 132 CTAs: no fewer finish as early.
  EXPECT_EQ(prefix_schedule(std::vector<KernelUnit>(33, units[0]), 8, 132).ctas, 132);
}

// The schedule's rule the plain way, as a reference: units stably by falling cost, each unit's kv
// heads in order, each item to the least loaded CTA (the lowest index among equals) found by a
// scan; then the same on num_items / rounds CTAs where those fill whole rounds and finish no later.
PrefixSchedule scanned_schedule(const std::vector<KernelUnit>& units, int32_t heads, int32_t workers) {
  std::vector<int32_t> order(units.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::ranges::stable_sort(order, [&](int32_t a, int32_t b) {
    return prefix_item_cost(units[size_t(a)]) > prefix_item_cost(units[size_t(b)]);
  });
  const int64_t num_items = int64_t(units.size()) * heads;
  // Each CTA's items in order, and the most loaded CTA's cost.
  auto deal = [&](int32_t ctas, std::vector<std::vector<int32_t>>& items) {
    std::vector<int64_t> load(size_t(ctas), 0);
    items.assign(size_t(ctas), {});
    for (int32_t u : order) {
      for (int32_t h = 0; h < heads; ++h) {
        const size_t least = size_t(std::ranges::min_element(load) - load.begin());
        load[least] += prefix_item_cost(units[size_t(u)]);
        items[least].push_back(u * heads + h);
      }
    }
    return load.empty() ? 0 : *std::ranges::max_element(load);
  };
  auto rounds_of = [](const std::vector<std::vector<int32_t>>& items) {
    size_t rounds = 0;
    for (const auto& cta : items) rounds = std::max(rounds, cta.size());
    return int64_t(rounds);
  };
  PrefixSchedule schedule;
  schedule.ctas = int32_t(std::min<int64_t>(num_items, workers));
  std::vector<std::vector<int32_t>> items, fewer;
  const int64_t makespan = deal(schedule.ctas, items);
  const int64_t rounds = rounds_of(items);
  if (rounds > 0 && num_items % rounds == 0 && num_items / rounds < schedule.ctas &&
      deal(int32_t(num_items / rounds), fewer) <= makespan) {
    schedule.ctas = int32_t(num_items / rounds);
    items.swap(fewer);
  }
  schedule.slots.assign(size_t(rounds_of(items) * schedule.ctas), -1);
  for (int32_t cta = 0; cta < schedule.ctas; ++cta) {
    for (size_t n = 0; n < items[size_t(cta)].size(); ++n) {
      schedule.slots[size_t(cta) + n * size_t(schedule.ctas)] = items[size_t(cta)][n];
    }
  }
  return schedule;
}

TEST(PrefixSchedule, DealsAsAScanForTheLeastLoadedCta) {
  // Units of few distinct costs (many ties among the loads) and of many, some of cost 0 (no
  // token), over worker counts that do and do not divide the items.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 60; ++trial) {
    const bool few_costs = trial % 2 == 0;
    const int32_t heads = std::array{1, 4, 8, 32}[size_t(trial / 2 % 4)];
    const int32_t workers = std::array{3, 7, 128, 132}[size_t(trial / 8 % 4)];
    std::vector<KernelUnit> units(1 + rng() % 200);
    for (KernelUnit& u : units) {
      const int32_t tokens = few_costs ? 64 * int32_t(1 + rng() % 3) : int32_t(rng() % 3000);
      const int32_t rows = few_costs ? 16 : 1 + int32_t(rng() % 128);
      u = {.block_begin = 0, .num_tokens = tokens, .query_begin = 0, .rows = rows, .first_rows = rows,
           .tail_tiles = few_costs || tokens == 0 ? 0 : int32_t(rng() % 5)};
    }
    const PrefixSchedule expected = scanned_schedule(units, heads, workers);
    const PrefixSchedule schedule = prefix_schedule(units, heads, workers);
    ASSERT_EQ(schedule.ctas, expected.ctas) << "trial " << trial;
    ASSERT_EQ(schedule.slots, expected.slots) << "trial " << trial;
  }
}

// ---- Random forests, small enough for the CPU executor over the whole batch.

// A random forest: roots with random fan-out, inner lengths whole blocks, leaf tails any length
// (some 0: sequences with no KV unless an ancestor has some), sequences in a shuffled order.
Inputs make_forest_inputs(const Config& c, uint64_t seed) {
  ref::Random rng(seed);
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> lengths;
  int32_t next_block = 0;
  auto blocks_for = [&](int32_t tokens) {
    std::vector<int32_t> ids;
    for (int32_t t = 0; t < tokens; t += c.block_size) ids.push_back(next_block++);
    return ids;
  };
  // Depth-first: a node's table prefix and length so far.
  auto grow = [&](auto&& self, std::vector<int32_t> table, int32_t length, int depth) -> void {
    const int children = depth == 0 ? 1 + int(rng.next(3)) : depth < 3 ? int(rng.next(4)) : 0;
    if (children == 0 || tables.size() > 40) {
      const int32_t tail = int32_t(rng.next(3 * uint64_t(c.block_size) + 1)) - (depth == 0 ? 0 : 4);
      const int32_t tokens = std::max(tail, 0);
      const std::vector<int32_t> own = blocks_for(tokens);
      table.insert(table.end(), own.begin(), own.end());
      tables.push_back(table);
      lengths.push_back(length + tokens);
      return;
    }
    for (int i = 0; i < children; ++i) {
      const int32_t tokens = c.block_size * int32_t(1 + rng.next(depth == 0 ? 12 : 4));
      std::vector<int32_t> child = table;
      const std::vector<int32_t> own = blocks_for(tokens);
      child.insert(child.end(), own.begin(), own.end());
      self(self, child, length + tokens, depth + 1);
    }
  };
  const int roots = 1 + int(rng.next(3));
  for (int r = 0; r < roots; ++r) grow(grow, {}, 0, 0);
  // Shuffle the query order and the block ids (block 0 lands anywhere).
  std::vector<int32_t> order(tables.size()), ids(size_t(next_block) + 2);
  std::iota(order.begin(), order.end(), 0);
  std::iota(ids.begin(), ids.end(), 0);
  for (size_t i = order.size() - 1; i > 0; --i) std::swap(order[i], order[rng.next(i + 1)]);
  for (size_t i = ids.size() - 1; i > 0; --i) std::swap(ids[i], ids[rng.next(i + 1)]);
  std::vector<std::vector<int32_t>> blocks;
  std::vector<int32_t> shuffled_lengths;
  for (int32_t s : order) {
    std::vector<int32_t> mapped;
    for (int32_t b : tables[size_t(s)]) mapped.push_back(ids[size_t(b)]);
    blocks.push_back(mapped);
    shuffled_lengths.push_back(lengths[size_t(s)]);
  }
  // Odd seeds leave the rest of each last block NaN: the kernel copies whole blocks, and no slot
  // past a sequence's length may reach its output.
  return make_inputs(c, int32_t(ids.size()), blocks, shuffled_lengths, seed, /*fill_tails=*/seed % 2 == 0);
}

// The GPU against the CPU executor of the same plan, and the CPU executor against exact attention.
void expect_plan_matches(const Config& c, Inputs in, const std::string& what,
                         attention::PrefixPlanOptions options = {}, int32_t workers = 0) {
  const DeviceInputs dev(in);
  const PrefixTiles tiles = prefix_tiles(in.shape, c.dtype);
  options.m_tiles = tiles.m_tiles;
  options.max_tail_tokens = tiles.max_tail_tokens;
  const PrefixPlan plan = attention::plan_prefix(
      in.batch, in.shape, {.num_workers = workers > 0 ? workers : tiles.workers}, options);
  Outputs cpu{std::vector<float>(in.q.size(), std::nanf("")), std::vector<float>(in.rows(), std::nanf(""))};
  cpu::run_prefix_cpu(plan, in.batch, in.shape, in.pool.view(), in.q_f32.data(), cpu.out.data(), cpu.lse.data());
  const DeviceOutputs gpu = run_prefix_gpu(plan, in.batch, in.shape, tiles, dev.kv, dev.q.data());
  SCOPED_TRACE(what + ", " + std::to_string(plan.units.size()) + " units, " + std::to_string(plan.num_pieces) +
               " pieces");
  expect_matches(in, Outputs{gpu.out, gpu.lse}, cpu);
  expect_matches(in, cpu, run_exact(in), kCpuExactTolerance, kCpuExactTolerance);
}

void expect_forest_matches(const Config& c, uint64_t seed, attention::PrefixPlanOptions options = {},
                           int32_t workers = 0) {
  expect_plan_matches(c, make_forest_inputs(c, seed), "seed " + std::to_string(seed), options, workers);
}

class GpuPrefix : public GpuTest {};

TEST_F(GpuPrefix, RandomForests) {
  uint64_t seed = 1;
  for (DType dtype : {DType::kF16, DType::kBF16}) {
    for (int32_t head_dim : {64, 128}) {
      for (int32_t group : {1, 2, 4, 7, 8}) {
        for (int32_t block_size : {16, 32, 64}) {
          const Config c{.dtype = dtype, .head_dim = head_dim, .block_size = block_size, .group = group,
                         .num_kv_heads = group == 7 ? 1 : 2,
                         .layout = seed % 3 == 0 ? KvLayout::kNhd : KvLayout::kHnd};
          expect_forest_matches(c, seed++);
        }
      }
    }
  }
}

TEST_F(GpuPrefix, EveryTileAndSplitChoice) {
  // Only 16-row tiles (every unit's queries chunked to fit 16 rows), no packing, no split, and a
  // split forced fine by a large worker count: the same outputs as the CPU executor each time.
  const Config c{.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = 4, .num_kv_heads = 2};
  expect_forest_matches(c, 101, {.split = false});
  expect_forest_matches(c, 102, {.pack = false});
  expect_forest_matches(c, 103, {.min_kv_tokens_per_unit = 16}, 4096);
  expect_forest_matches(c, 104, {}, 1);
}

// A unit whose KV other units read too spreads its shared tiles among its tail tiles (the
// kernel's look-ahead). 1,2,128_32,256,40 at group 2 on 8 workers: each node's 64 queries are
// dealt into two units of 64 rows, both reading the root and the node (288 tokens: 5 tiles,
// kv_shared) and 32 leaves of 40 tokens, a tail tile each. 1,2,64_16,32,40 at group 4 on 4
// workers: a 128-row unit per node over one shared tile (the root, which both read, and the
// node), so that its second tile, the one that carries Q rows 64-127, is a tail tile.
TEST_F(GpuPrefix, TailTilesAmongSharedTiles) {
  struct Case {
    const char* tree;
    int32_t group, workers, shared_tiles;
  };
  for (const Case t : {Case{"1,2,128_32,256,40", 2, 8, 5}, Case{"1,2,64_16,32,40", 4, 4, 1}}) {
    const Config c{.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = t.group, .num_kv_heads = 2};
    const bench::PrefixTreeSpec spec = bench::parse_prefix_tree(t.tree);
    const attention::DecodeBatch batch = bench::make_tree_batch(spec, c.block_size, 5);
    std::vector<std::vector<int32_t>> blocks;
    for (int32_t s = 0; s < batch.num_seqs(); ++s) {
      const auto ids = batch.blocks_of(s);
      blocks.emplace_back(ids.begin(), ids.end());
    }
    Inputs in = make_inputs(c, int32_t(bench::tree_num_blocks(spec, c.block_size)), blocks, batch.kv_lengths, 9);
    const PrefixTiles tiles = prefix_tiles(in.shape, c.dtype);
    const PrefixPlan plan = attention::plan_prefix(in.batch, in.shape, {.num_workers = t.workers},
                                                   {.split = false, .m_tiles = tiles.m_tiles,
                                                    .max_tail_tokens = tiles.max_tail_tokens});
    for (const attention::PrefixUnit& u : plan.units) {  // the shape the cases are for
      ASSERT_EQ(u.kv_shared, 1) << t.tree;
      ASSERT_EQ((u.num_tokens + 63) / 64, t.shared_tiles) << t.tree;
      ASSERT_EQ(u.num_queries * t.group, t.group == 2 ? 64 : 128) << t.tree;
      ASSERT_GT(u.num_tails, 0) << t.tree;
    }
    expect_plan_matches(c, std::move(in), t.tree, {.split = false}, t.workers);
  }
}

// Scores that climb `step` (natural log units) every 16 tokens of a sequence: every query row is
// u = (1, -1, 1, ...) and the K row at position t is u * step * (t / 16) / sqrt(head_dim), so
// q.k / sqrt(head_dim) = step * (t / 16). At step 6 (8.7 in the kernel's log2 units) a row's
// reference maximum moves at every step of online_softmax.cuh and O is rescaled each time; at
// step 1 (5.8 log2 units over 64 tokens) the reference stays where it was for a step while its P
// grow past 1, and moves at the next (the lazy rescale). V stays random: the last 16 tokens of a
// sequence weigh most, and each token of the 16 before e^-step as much.
void set_stepped_scores(Inputs& in, float step) {
  const Config& c = in.config;
  const float per_dim = step / std::sqrt(float(c.head_dim));
  std::vector<float> row(size_t(c.head_dim)), stored(size_t(c.head_dim));
  for (int32_t seq = 0; seq < in.batch.num_seqs(); ++seq) {
    const auto blocks = in.batch.blocks_of(seq);
    for (int32_t t = 0; t < in.batch.kv_lengths[size_t(seq)]; ++t) {  // slots past the length keep theirs
      for (int32_t d = 0; d < c.head_dim; ++d) {
        row[size_t(d)] = (d % 2 == 0 ? 1.f : -1.f) * per_dim * float(t / 16);
      }
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        in.pool.store_row(false, blocks[size_t(t / c.block_size)], h, t % c.block_size, row.data(), stored.data());
      }
    }
  }
  for (size_t i = 0; i < in.q.size(); ++i) {
    in.q[i] = to_bits(c.dtype, i % 2 == 0 ? 1.f : -1.f);  // head_dim is even: dim d of every row has d's sign
    in.q_f32[i] = from_bits(c.dtype, in.q[i]);
  }
}

TEST_F(GpuPrefix, SteppedScoresMoveTheSoftmaxReference) {
  uint64_t seed = 201;
  const Config configs[] = {
      {.dtype = DType::kF16, .head_dim = 128, .block_size = 16, .group = 4, .num_kv_heads = 2},
      {.dtype = DType::kBF16, .head_dim = 64, .block_size = 32, .group = 1, .num_kv_heads = 2}};
  for (const Config& c : configs) {
    for (const float step : {1.f, 6.f}) {
      Inputs in = make_forest_inputs(c, seed);
      set_stepped_scores(in, step);
      expect_plan_matches(c, std::move(in), c.name() + ", step " + std::to_string(step) + ", seed " + std::to_string(seed));
      ++seed;
    }
  }
}

TEST_F(GpuPrefix, NullLseAndRejectedInput) {
  const Config c{.dtype = DType::kBF16, .head_dim = 64, .block_size = 16, .group = 2, .num_kv_heads = 2};
  Inputs in = make_forest_inputs(c, 7);
  const DeviceInputs dev(in);
  const PrefixTiles tiles = prefix_tiles(in.shape, c.dtype);
  const PrefixPlan plan = attention::plan_prefix(in.batch, in.shape, prefix_device_info(tiles), prefix_plan_options(tiles));
  const DeviceOutputs with = run_prefix_gpu(plan, in.batch, in.shape, tiles, dev.kv, dev.q.data());
  const DeviceOutputs without = run_prefix_gpu(plan, in.batch, in.shape, tiles, dev.kv, dev.q.data(), false);
  EXPECT_EQ(with.out, without.out);

  PrefixWorkspace workspace;
  workspace.upload(plan, in.batch, in.shape, tiles);
  DeviceArray<uint16_t> out(in.q.size());
  AttentionShape other = in.shape;
  other.num_q_heads *= 2;  // another group size than the workspace's
  const KvTensorMaps maps = kv_tensor_maps(dev.kv);
  EXPECT_THROW(prefix_attention(workspace, other, dev.kv, maps, dev.q.data(), out.data(), nullptr), Error);
  PagedKv small = dev.kv;
  small.num_blocks = 1;  // the batch names blocks past it
  EXPECT_THROW(prefix_attention(workspace, in.shape, small, kv_tensor_maps(small), dev.q.data(), out.data(), nullptr),
               Error);
  PagedKv swapped = dev.kv;
  std::swap(swapped.k, swapped.v);  // the maps would read V as K
  EXPECT_THROW(prefix_attention(workspace, in.shape, swapped, maps, dev.q.data(), out.data(), nullptr), Error);
  AttentionShape wide = in.shape;
  wide.head_dim = 256;
  EXPECT_NE(prefix_unsupported_reason(wide, dev.kv), nullptr);
}

}  // namespace
}  // namespace pagoda::cuda
