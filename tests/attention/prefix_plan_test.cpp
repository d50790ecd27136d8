// The prefix-aware planner: on random multi-level batches, shapes and options every (query, kv
// head, KV token) is read exactly once, units fit their M tiles, partial slots and merges match,
// and packing moves no more bytes than one unit per query; on hand-built trees, the packing,
// row-chunking and long-KV split decisions the byte model implies; cascade batches; and the
// lazy PrefixPlanner, which must give what planning from scratch gives.
#include "pagoda/attention/prefix_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pagoda/bench/tree_batch.h"
#include "pagoda/core/error.h"
#include "prefix_batches.h"
#include "reference.h"

namespace pagoda::attention {
namespace {

using bench::parse_prefix_tree;
using bench::tree_num_blocks;
using bench::make_tree_batch;

using testing::Random;

AttentionShape shape_of(int32_t group, int32_t num_kv_heads, int32_t block_size = 16, int32_t head_dim = 128) {
  return {group * num_kv_heads, num_kv_heads, head_dim, block_size, 0.125f};
}

int32_t blocks_for(int32_t tokens, int32_t bs) { return (tokens + bs - 1) / bs; }

// A run of one query's KV that one unit reads (tail: the query's own, after the unit's).
struct Segment {
  int32_t token_begin, token_end;
  int32_t unit, piece;
  bool tail = false;
};

// Per sequence, the KV runs the plan's units read for it, in token order. Checks on the way that
// a unit reads the query's own blocks: its ids are the query's table at the same positions.
// `ok` turns false on the first unit that does not.
std::vector<std::vector<Segment>> segments_of(const PrefixPlan& plan, const DecodeBatch& batch, int32_t bs, bool& ok) {
  std::vector<std::vector<Segment>> segments(size_t(batch.num_seqs()));
  ok = true;
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const PrefixUnit& unit = plan.units[u];
    const int32_t blocks = blocks_for(unit.num_tokens, bs);
    EXPECT_GE(unit.block_begin, 0);
    EXPECT_LE(size_t(unit.block_begin) + size_t(blocks), batch.block_ids.size()) << "unit " << u;
    if (unit.block_begin < 0 || size_t(unit.block_begin) + size_t(blocks) > batch.block_ids.size()) {
      ok = false;
      continue;
    }
    for (int32_t j = 0; j < unit.num_queries; ++j) {
      const UnitQuery& uq = plan.unit_queries[size_t(unit.query_begin + j)];
      const auto table = batch.blocks_of(uq.seq);
      const int32_t length = batch.kv_lengths[size_t(uq.seq)];
      // Ids are unique per block in these batches, so the first id fixes the position.
      const auto used_end = table.begin() + blocks_for(length, bs);
      const auto at = std::find(table.begin(), used_end, batch.block_ids[size_t(unit.block_begin)]);
      EXPECT_NE(at, used_end) << "unit " << u << " reads a block seq " << uq.seq << " does not hold";
      if (at == used_end) {
        ok = false;
        continue;
      }
      const int32_t p0 = int32_t(at - table.begin());
      EXPECT_LE(p0 * bs + unit.num_tokens, length) << "unit " << u << " reads past the end of seq " << uq.seq;
      ok = ok && p0 * bs + unit.num_tokens <= length;
      for (int32_t k = 0; k < blocks && p0 + k < int32_t(table.size()); ++k) {
        EXPECT_EQ(table[size_t(p0 + k)], batch.block_ids[size_t(unit.block_begin + k)])
            << "unit " << u << " block " << k << " is not seq " << uq.seq << "'s";
        ok = ok && table[size_t(p0 + k)] == batch.block_ids[size_t(unit.block_begin + k)];
      }
      segments[size_t(uq.seq)].push_back({p0 * bs, p0 * bs + unit.num_tokens, int32_t(u), uq.piece});
      for (int32_t t = unit.tail_begin; t < unit.tail_begin + unit.num_tails; ++t) {
        const UnitTail& tail = plan.unit_tails[size_t(t)];
        if (j < tail.query_begin || j >= tail.query_end) continue;
        // A tail is a run of the query's own blocks.
        const auto tail_at = std::find(table.begin(), used_end, batch.block_ids[size_t(tail.block_begin)]);
        const int32_t t0 = int32_t(tail_at - table.begin());
        EXPECT_NE(tail_at, used_end) << "unit " << u << ": a tail seq " << uq.seq << " does not hold";
        EXPECT_LE(t0 * bs + tail.num_tokens, length) << "unit " << u << ": a tail past the end of seq " << uq.seq;
        ok = ok && tail_at != used_end && t0 * bs + tail.num_tokens <= length;
        for (int32_t k = 0; ok && k < blocks_for(tail.num_tokens, bs); ++k) {
          EXPECT_EQ(table[size_t(t0 + k)], batch.block_ids[size_t(tail.block_begin + k)]);
          ok = table[size_t(t0 + k)] == batch.block_ids[size_t(tail.block_begin + k)];
        }
        if (ok) segments[size_t(uq.seq)].push_back({t0 * bs, t0 * bs + tail.num_tokens, int32_t(u), uq.piece, true});
      }
    }
  }
  for (auto& s : segments) {
    std::sort(s.begin(), s.end(), [](const Segment& a, const Segment& b) { return a.token_begin < b.token_begin; });
  }
  return segments;
}

// Everything a plan must satisfy whatever the batch and options.
void check_plan(const PrefixPlan& plan, const DecodeBatch& batch, const AttentionShape& shape,
                const PrefixPlanOptions& options) {
  const int32_t bs = shape.block_size, group = shape.group_size(), heads = shape.num_kv_heads;
  ASSERT_EQ(plan.num_kv_heads, heads);
  ASSERT_EQ(plan.group, group);

  // Units: rows fit the smallest tile that holds them; each unit_queries entry is one unit's.
  std::vector<int32_t> owner(plan.unit_queries.size(), 0);
  for (size_t u = 0; u < plan.units.size(); ++u) {
    const PrefixUnit& unit = plan.units[u];
    SCOPED_TRACE("unit " + std::to_string(u));
    ASSERT_GT(unit.num_tokens, 0);
    ASSERT_GT(unit.num_queries, 0);
    ASSERT_LE(size_t(unit.query_begin) + size_t(unit.num_queries), plan.unit_queries.size());
    for (int32_t j = 0; j < unit.num_queries; ++j) ++owner[size_t(unit.query_begin + j)];
    if (unit.num_tails > 0) {
      ASSERT_GT(options.max_tail_tokens, 0);
      ASSERT_LE(size_t(unit.tail_begin) + size_t(unit.num_tails), plan.unit_tails.size());
      for (int32_t t = unit.tail_begin; t < unit.tail_begin + unit.num_tails; ++t) {
        const UnitTail& tail = plan.unit_tails[size_t(t)];
        EXPECT_GT(tail.num_tokens, 0);
        EXPECT_LE(0, tail.query_begin);
        EXPECT_LT(tail.query_begin, tail.query_end);
        EXPECT_LE(tail.query_end, unit.num_queries);
      }
    }
    const int32_t rows = unit.num_queries * group;
    ASSERT_LE(rows, unit.m_tile);
    const auto tile =
        std::find_if(options.m_tiles.begin(), options.m_tiles.end(), [&](int32_t m) { return m >= rows; });
    ASSERT_NE(tile, options.m_tiles.end());
    EXPECT_EQ(unit.m_tile, *tile);
    EXPECT_TRUE(unit.kv_shared == 0 || unit.kv_shared == 1);
  }
  for (int32_t n : owner) ASSERT_EQ(n, 1);

  // Items: item i is unit i / kv heads for kv head i % kv heads, so every (unit, kv head) is one.
  ASSERT_EQ(plan.num_items(), int64_t(plan.units.size()) * heads);

  // Launch order: the longest units first.
  for (size_t u = 1; u < plan.units.size(); ++u) ASSERT_GE(plan.units[u - 1].num_tokens, plan.units[u].num_tokens);

  // Coverage: with every (unit, kv head) an item, each (query, kv head, token) is read exactly
  // once iff the units' runs of each query tile [0, length).
  bool own_blocks = false;
  const auto segments = segments_of(plan, batch, bs, own_blocks);
  ASSERT_TRUE(own_blocks);
  // Merges: one task per sequence, standing for all its kv heads.
  std::map<int32_t, MergeTask> merges;
  for (const MergeTask& m : plan.merges) {
    ASSERT_TRUE(merges.emplace(m.seq, m).second) << "two merges of seq " << m.seq;
    ASSERT_EQ(m.kv_head, 0);
  }
  size_t expected_merges = 0;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    SCOPED_TRACE("seq " + std::to_string(s));
    auto segs = segments[size_t(s)];
    const int32_t length = batch.kv_lengths[size_t(s)];
    int32_t next = 0;
    for (const Segment& seg : segs) {
      ASSERT_EQ(seg.token_begin, next) << "gap or overlap";
      next = seg.token_end;
    }
    ASSERT_EQ(next, length);
    segs.erase(std::remove_if(segs.begin(), segs.end(), [](const Segment& seg) { return seg.tail; }), segs.end());
    if (length == 0) {
      ASSERT_EQ(merges.count(s), 1u);
      EXPECT_EQ(merges[s].num_partials, 0);
      ++expected_merges;
    } else if (segs.size() == 1) {
      EXPECT_EQ(segs[0].piece, -1);
      EXPECT_EQ(merges.count(s), 0u);
    } else {
      std::vector<int32_t> pieces;
      for (const Segment& seg : segs) pieces.push_back(seg.piece);
      std::sort(pieces.begin(), pieces.end());
      ASSERT_GE(pieces[0], 0);
      for (size_t i = 1; i < pieces.size(); ++i) {
        ASSERT_EQ(pieces[i], pieces[0] + int32_t(i)) << "pieces not contiguous";
      }
      ASSERT_LE(pieces.back(), plan.num_pieces - 1);
      // Kv head h folds slots h * num_pieces + partial_begin + [0, num_partials).
      ASSERT_EQ(merges.count(s), 1u);
      EXPECT_EQ(merges[s].partial_begin, pieces[0]);
      EXPECT_EQ(merges[s].num_partials, int32_t(segs.size()));
      ++expected_merges;
    }
  }
  EXPECT_EQ(plan.merges.size(), expected_merges);

  // Partial slots: every one written by exactly one (item, query).
  std::vector<int32_t> slot_writes(size_t(std::max(plan.num_partials(), 0)), 0);
  for (int64_t i = 0; i < plan.num_items(); ++i) {
    const PrefixUnit& unit = plan.units[size_t(i / heads)];
    const int64_t kv_head = i % heads;
    for (int32_t j = 0; j < unit.num_queries; ++j) {
      const UnitQuery& uq = plan.unit_queries[size_t(unit.query_begin + j)];
      if (uq.piece < 0) continue;
      ASSERT_LT(uq.piece, plan.num_pieces);
      ++slot_writes[size_t(kv_head * plan.num_pieces + uq.piece)];
    }
  }
  for (size_t slot = 0; slot < slot_writes.size(); ++slot) ASSERT_EQ(slot_writes[slot], 1) << "slot " << slot;
}

int64_t kv_bytes_of_tokens(int64_t tokens, const AttentionShape& shape, int32_t bytes) {
  return tokens * 2 * shape.head_dim * bytes * shape.num_kv_heads;
}

struct RandomCase {
  testing::RandomTreeBatch tree;
  AttentionShape shape;
  PrefixPlanOptions options;
  DeviceInfo device;
};

RandomCase random_case(Random& rng, bool forks = true) {
  RandomCase c;
  testing::RandomTreeOptions tree;
  tree.forks = forks;
  tree.block_size = rng.next(2) ? 16 : 32;
  c.tree = testing::random_tree_batch(rng, tree);
  const int32_t groups[] = {1, 2, 4, 7, 8};
  c.shape = shape_of(groups[rng.next(5)], 1 + int32_t(rng.next(4)), tree.block_size, rng.next(2) ? 64 : 128);
  c.options.pack = rng.next(4) != 0;
  c.options.split = rng.next(2) != 0;
  if (rng.next(2)) c.options.m_tiles = {16, 32};
  c.options.min_kv_tokens_per_unit = 16 + int32_t(rng.next(241));
  c.device.num_workers = 1 + int32_t(rng.next(300));
  if (c.device.num_workers % 2) {  // no draw: the seeds' batches stay as they were
    // Tails, with few workers, whose rounds their items fill (else the planner keeps the leaves).
    c.options.max_tail_tokens = 32;
    c.device.num_workers = 1 + c.device.num_workers % 4;
  }
  return c;
}

std::string describe(const RandomCase& c) {
  return "group " + std::to_string(c.shape.group_size()) + " kv heads " + std::to_string(c.shape.num_kv_heads) +
         " bs " + std::to_string(c.shape.block_size) + " pack " + std::to_string(c.options.pack) + " split " +
         std::to_string(c.options.split) + " max tile " + std::to_string(c.options.m_tiles.back()) +
         " min tokens " + std::to_string(c.options.min_kv_tokens_per_unit) + " workers " +
         std::to_string(c.device.num_workers) + " tails " + std::to_string(c.options.max_tail_tokens);
}

TEST(PrefixPlan, RandomPlansReadEveryTokenOnceAndMergeEveryPiece) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Random rng(seed);
    const RandomCase c = random_case(rng);
    const DecodeBatch& batch = c.tree.batch;
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
    const PrefixPlan plan = plan_prefix(batch, c.shape, c.device, c.options);
    ASSERT_NO_FATAL_FAILURE(check_plan(plan, batch, c.shape, c.options));
    ASSERT_FALSE(HasFailure());
  }
}

// Bytes: packing without the split never moves more than one unit per query does; with the split
// its KV reads still do not exceed those, and no plan reads less KV than the batch holds.
TEST(PrefixPlan, PackingMovesNoMoreBytesThanOneUnitPerQuery) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Random rng(seed);
    RandomCase c = random_case(rng);
    const DecodeBatch& batch = c.tree.batch;
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
    const int32_t bytes = c.options.kv_bytes_per_element;
    PrefixPlanOptions unpacked = c.options, packed = c.options;
    unpacked.pack = false;
    unpacked.split = false;
    packed.pack = true;
    packed.split = false;
    const PrefixPlan base_plan = plan_prefix(batch, c.shape, c.device, unpacked);
    const PlanTraffic base = plan_traffic(base_plan, c.shape, unpacked);
    const PlanTraffic whole = plan_traffic(plan_prefix(batch, c.shape, c.device, packed), c.shape, packed);
    packed.split = true;
    const PlanTraffic split = plan_traffic(plan_prefix(batch, c.shape, c.device, packed), c.shape, packed);
    // Without packing every query is read by one unit over its whole KV (identical sequences
    // may share it), so no partial state is written.
    ASSERT_NO_FATAL_FAILURE(check_plan(base_plan, batch, c.shape, unpacked));
    for (const PrefixUnit& unit : base_plan.units) {
      for (int32_t j = 0; j < unit.num_queries; ++j) {
        const UnitQuery& uq = base_plan.unit_queries[size_t(unit.query_begin + j)];
        EXPECT_EQ(uq.piece, -1);
        EXPECT_EQ(unit.num_tokens, batch.kv_lengths[size_t(uq.seq)]);
      }
    }
    EXPECT_EQ(base_plan.num_pieces, 0);
    EXPECT_EQ(base.partial, 0);
    EXPECT_LE(whole.total(), base.total());
    EXPECT_LE(split.kv, base.kv);
    const int64_t unique = kv_bytes_of_tokens(unique_kv_tokens(batch, c.shape.block_size), c.shape, bytes);
    EXPECT_GE(whole.kv, unique);
    EXPECT_GE(split.kv, unique);
    ASSERT_FALSE(HasFailure());
  }
}

// The units of a plan that read a query's KV from token `begin` on, by the run's first block.
std::vector<const PrefixUnit*> units_starting_at(const PrefixPlan& plan, const DecodeBatch& batch, int32_t seq,
                                                 int32_t token, int32_t bs) {
  const int32_t block = batch.block_offsets[size_t(seq)] + token / bs;
  std::vector<const PrefixUnit*> out;
  for (const PrefixUnit& unit : plan.units) {
    if (batch.block_ids[size_t(unit.block_begin)] == batch.block_ids[size_t(block)]) out.push_back(&unit);
  }
  return out;
}

// Two requests sharing one 16-token block, group 4, head_dim 64. The byte model alone keeps each
// child apart (its one partial state, 2 x 4 x 65 x 4 = 2080 bytes, is below re-reading the root,
// 16 x 256 = 4096 bytes), but a query split from one unit into two writes two partial states and
// has its q rows read twice: packed that way, 66688 bytes against 61440 unpacked. The packer
// keeps the cheaper of the two for every tree.
TEST(PrefixPlan, PackingNeverMovesMoreBytesOnSmallTrees) {
  const AttentionShape shape = shape_of(4, 1, 16, 64);
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2_16,100"), 16);
  const DeviceInfo device{.num_workers = 8};
  const PlanTraffic unpacked =
      plan_traffic(plan_prefix(batch, shape, device, PrefixPlanOptions{.pack = false, .split = false}), shape, {});
  const PlanTraffic packed =
      plan_traffic(plan_prefix(batch, shape, device, PrefixPlanOptions{.split = false}), shape, {});
  EXPECT_EQ(unpacked.total(), 59392 + 1024 + 1024);  // 2 x 116 tokens x 256 bytes, q, out
  EXPECT_LE(packed.total(), unpacked.total());
}

// The byte model (prefix_plan.cpp): a child is merged into its parent's unit iff
//   child queries x partial bytes > parent KV tokens x 2 x head_dim x KV bytes x row chunks.
// At group 1, head_dim 128: a partial state is 2 x 1 x 129 x 4 = 1032 bytes, a KV token 512.
// A 16-token root costs 8192 bytes to read again: 8 queries' partials (8256) pay for it, 7
// (7224) do not.
TEST(PrefixPlan, ShortRootIsMergedIntoAChildOfManyQueries) {
  const AttentionShape shape = shape_of(1, 1);
  const PrefixPlanOptions options{.split = false};
  {
    // 1,2,16_16,16,40: each child of the root has 8 queries: both merged; the root needs no unit
    // of its own, every query reads [0, 32) with its sibling queries and then its own 40 tokens.
    const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2,16_16,16,40"), 16, 3);
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 8}, options);
    check_plan(plan, batch, shape, options);
    ASSERT_EQ(plan.units.size(), 2u + 16u);
    int32_t of_32 = 0, of_40 = 0;
    for (const PrefixUnit& unit : plan.units) {
      if (unit.num_tokens == 32) {
        ++of_32;
        EXPECT_EQ(unit.num_queries, 8);
        EXPECT_EQ(unit.m_tile, 16);
      } else {
        EXPECT_EQ(unit.num_tokens, 40);
        EXPECT_EQ(unit.num_queries, 1);
        ++of_40;
      }
    }
    EXPECT_EQ(of_32, 2);
    EXPECT_EQ(of_40, 16);
    EXPECT_EQ(plan.num_pieces, 16 * 2);
  }
  {
    // 1,2,14_16,16,40: 7 queries per child: both kept; the root is read once for all 14.
    const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2,14_16,16,40"), 16, 3);
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 8}, options);
    check_plan(plan, batch, shape, options);
    ASSERT_EQ(plan.units.size(), 1u + 2u + 14u);
    const auto root_units = units_starting_at(plan, batch, 0, 0, 16);
    ASSERT_EQ(root_units.size(), 1u);
    EXPECT_EQ(root_units[0]->num_tokens, 16);
    EXPECT_EQ(root_units[0]->num_queries, 14);
    EXPECT_EQ(plan.num_pieces, 14 * 3);
  }
}

// The row-chunk terms: group 8 with a 128-row tile holds 16 queries. Merging a child costs the
// node's KV (from the first token its pack reads) once per row chunk of the child, less the
// node's chunks it frees; a KV token is 512 bytes, a query's partial state 8256.
TEST(PrefixPlan, MergeCostCountsRowChunks) {
  const AttentionShape shape = shape_of(8, 1);
  const PrefixPlanOptions options{.split = false};
  struct Case {
    const char* tree;
    std::vector<int32_t> root_unit_tokens;  // of the units that read the root, ascending
  };
  for (const Case& c : {
           // 32 queries: each child of 16 fills a chunk of the root; merged at no extra read.
           Case{"1,2,32_144,16,40", {160, 160}},
           // 34: the first child of 17 costs 2 - (3 - 2) = 1 read of the root, 73728 bytes, and
           // saves 17 partial states, 140352; the second then frees both chunks left. In each
           // child, 16 queries fill one chunk and the first leaf frees the other: it reads the
           // whole path, root to its own 40 tokens.
           Case{"1,2,34_144,16,40", {160, 160, 200, 200}},
           // A 400-token root: 204800 bytes, more than the partials saved: the root is read alone,
           // by 3 row chunks of 11 or 12 queries.
           Case{"1,2,34_400,16,40", {400, 400, 400}},
       }) {
    SCOPED_TRACE(c.tree);
    const DecodeBatch batch = make_tree_batch(parse_prefix_tree(c.tree), 16, 5);
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 8}, options);
    check_plan(plan, batch, shape, options);
    std::vector<int32_t> tokens;
    for (const PrefixUnit* u : units_starting_at(plan, batch, 0, 0, 16)) {
      tokens.push_back(u->num_tokens);
      EXPECT_EQ(u->kv_shared, 1);  // row chunks of the root, or merged children (that read it too)
    }
    std::sort(tokens.begin(), tokens.end());
    EXPECT_EQ(tokens, c.root_unit_tokens);
  }
}

// 1,10_4096,416: single-query leaves never pay for reading 4096 tokens again; the root is read
// once, by one unit for all ten queries.
TEST(PrefixPlan, LongRootIsReadOnceForItsLeaves) {
  for (int32_t group : {1, 4, 8}) {
    const AttentionShape shape = shape_of(group, 2);
    const PrefixPlanOptions options{.split = false};
    const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,10_4096,416"), 16, 11);
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 132}, options);
    check_plan(plan, batch, shape, options);
    ASSERT_EQ(plan.units.size(), 11u);
    const PrefixUnit& root = plan.units[0];  // the longest runs first
    EXPECT_EQ(root.num_tokens, 4096);
    EXPECT_EQ(root.num_queries, 10);
    EXPECT_EQ(root.m_tile, group == 1 ? 16 : group == 4 ? 64 : 128);
    EXPECT_EQ(root.kv_shared, 0);
    const PlanTraffic t = plan_traffic(plan, shape, options);
    EXPECT_EQ(t.kv, kv_bytes_of_tokens(4096 + 10 * 416, shape, 2));
    EXPECT_EQ(t.kv, kv_bytes_of_tokens(unique_kv_tokens(batch, 16), shape, 2));
    EXPECT_EQ(plan.num_pieces, 20);
    EXPECT_EQ(plan.merges.size(), 10u);
  }
}

// 1,4,32_64,128,24 at group 8: each 128-token node's 8 queries read the 64-token root again (a
// partial state of 8 x 129 x 8 bytes a query saves more than the root's 32 KB costs), and their
// 24-token leaves. As units of their own the leaves leave each query two partial states; as tails
// of the node's unit, the query is read by one unit and needs no merge.
TEST(PrefixPlan, ShortLeavesAreTailsOfTheirParentsUnit) {
  const AttentionShape shape = shape_of(8, 2);
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,4,32_64,128,24"), 16, 5);
  const DeviceInfo device{.num_workers = 8};  // as many as the 4 units' items: none dealt further
  const PrefixPlanOptions without{.split = false}, with{.split = false, .max_tail_tokens = 32};
  const PrefixPlan apart = plan_prefix(batch, shape, device, without);
  check_plan(apart, batch, shape, without);
  EXPECT_EQ(apart.units.size(), 4u + 32u);
  EXPECT_EQ(apart.num_pieces, 64);
  EXPECT_EQ(apart.merges.size(), 32u);

  const PrefixPlan plan = plan_prefix(batch, shape, device, with);
  check_plan(plan, batch, shape, with);
  ASSERT_EQ(plan.units.size(), 4u);
  for (const PrefixUnit& u : plan.units) {
    EXPECT_EQ(u.num_tokens, 64 + 128);
    EXPECT_EQ(u.num_queries, 8);
    ASSERT_EQ(u.num_tails, 8);
    std::vector<int32_t> tail_of(8, -1);
    for (int32_t t = u.tail_begin; t < u.tail_begin + u.num_tails; ++t) {
      const UnitTail& tail = plan.unit_tails[size_t(t)];
      ASSERT_EQ(tail.query_end, tail.query_begin + 1);
      tail_of[size_t(tail.query_begin)] = t;
    }
    for (int32_t j = 0; j < u.num_queries; ++j) {
      const UnitQuery& uq = plan.unit_queries[size_t(u.query_begin + j)];
      ASSERT_GE(tail_of[size_t(j)], 0);
      const UnitTail& tail = plan.unit_tails[size_t(tail_of[size_t(j)])];
      EXPECT_EQ(uq.piece, -1);
      EXPECT_EQ(tail.num_tokens, 24);
      EXPECT_EQ(tail.block_begin, batch.block_offsets[size_t(uq.seq)] + (64 + 128) / 16);
    }
  }
  EXPECT_EQ(plan.num_pieces, 0);
  EXPECT_TRUE(plan.merges.empty());
  // The same KV read, without the 64 partial states.
  const PlanTraffic t = plan_traffic(plan, shape, with), t_apart = plan_traffic(apart, shape, without);
  EXPECT_EQ(t.kv, t_apart.kv);
  EXPECT_EQ(t.kv, kv_bytes_of_tokens(4 * 192 + 32 * 24, shape, 2));
  EXPECT_EQ(t.partial, 0);
  EXPECT_GT(t_apart.partial, 0);

  // 8 items of 64 rows for 132 workers, which a deal into chunks of at least 32 rows takes only to
  // 16: a round mostly idle, so the leaves stay apart.
  const PrefixPlan idle = plan_prefix(batch, shape, DeviceInfo{.num_workers = 132}, with);
  check_plan(idle, batch, shape, with);
  EXPECT_EQ(idle.units.size(), apart.units.size());
  EXPECT_TRUE(std::none_of(idle.units.begin(), idle.units.end(), [](const PrefixUnit& u) { return u.num_tails > 0; }));

  // At group 8 with 16 workers, 1,4,64_64,128,24's 4 nodes of 16 queries (128 rows) give 8
  // items: each is dealt into 2 chunks of 64 rows, reading the node again (kv_shared), 16 items.
  const DecodeBatch wide = make_tree_batch(parse_prefix_tree("1,4,64_64,128,24"), 16, 5);
  const PrefixPlan dealt = plan_prefix(wide, shape, DeviceInfo{.num_workers = 16}, with);
  check_plan(dealt, wide, shape, with);
  ASSERT_EQ(dealt.units.size(), 8u);
  for (const PrefixUnit& u : dealt.units) {
    EXPECT_EQ(u.num_queries, 8);
    EXPECT_EQ(u.m_tile, 64);
    EXPECT_EQ(u.kv_shared, 1);
    EXPECT_EQ(u.num_tails, 8);
  }
  EXPECT_TRUE(dealt.merges.empty());

  // 1,4,256_32,256,32 at group 2 on 132 workers: each 256-token node's 64 queries (128 rows, which
  // read the root too) are dealt into 4 chunks of 16 queries, the fewest rows a chunk takes (32):
  // 128 items with the leaves as tails, one round, where chunks of 64 rows would give 64 items and
  // no tails.
  const DecodeBatch node = make_tree_batch(parse_prefix_tree("1,4,256_32,256,32"), 16, 5);
  const AttentionShape group_2 = shape_of(2, 8);
  const PrefixPlan rounds = plan_prefix(node, group_2, DeviceInfo{.num_workers = 132}, with);
  check_plan(rounds, node, group_2, with);
  int32_t node_units = 0;
  for (const PrefixUnit& u : rounds.units) {
    if (u.num_tails == 0) continue;
    ++node_units;
    EXPECT_EQ(u.num_queries, 16);
    EXPECT_EQ(u.m_tile, 32);
    EXPECT_EQ(u.num_tails, 16);
  }
  EXPECT_EQ(node_units, 16);
  EXPECT_TRUE(rounds.merges.empty());

  // Blocks of 64 tokens would put two tails in one block's rows: none.
  const DecodeBatch big_blocks = make_tree_batch(parse_prefix_tree("1,4,32_64,128,24"), 64, 5);
  const PrefixPlan no_tails = plan_prefix(big_blocks, shape_of(8, 2, 64), device, with);
  EXPECT_TRUE(std::none_of(no_tails.units.begin(), no_tails.units.end(), [](const PrefixUnit& u) { return u.num_tails > 0; }));
}

// 1,2,8_256,32,24 at group 1: the two 32-token children are kept apart from the 256-token root (a
// partial state of 1032 bytes for each of their 4 queries is less than reading the root again),
// so without tails a query has three pieces. With them the children join the root's unit for
// their 4 queries each, and the leaves join through them: one unit, no merge.
TEST(PrefixPlan, InnerNodesAndLeavesAreTailsOfOneUnit) {
  const AttentionShape shape = shape_of(1, 2);
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2,8_256,32,24"), 16, 3);
  const DeviceInfo device{.num_workers = 2};
  const PrefixPlanOptions without{.split = false}, with{.split = false, .max_tail_tokens = 32};
  const PrefixPlan apart = plan_prefix(batch, shape, device, without);
  check_plan(apart, batch, shape, without);
  EXPECT_EQ(apart.units.size(), 1u + 2u + 8u);
  EXPECT_EQ(apart.num_pieces, 8 * 3);

  const PrefixPlan plan = plan_prefix(batch, shape, device, with);
  check_plan(plan, batch, shape, with);
  ASSERT_EQ(plan.units.size(), 1u);
  const PrefixUnit& root = plan.units[0];
  EXPECT_EQ(root.num_tokens, 256);
  EXPECT_EQ(root.num_queries, 8);
  ASSERT_EQ(root.num_tails, 2 + 8);
  int32_t children = 0, leaves = 0;
  for (int32_t t = root.tail_begin; t < root.tail_begin + root.num_tails; ++t) {
    const UnitTail& tail = plan.unit_tails[size_t(t)];
    if (tail.query_end - tail.query_begin == 4) {
      EXPECT_EQ(tail.query_begin % 4, 0);
      EXPECT_EQ(tail.num_tokens, 32);
      ++children;
    } else {
      EXPECT_EQ(tail.query_end - tail.query_begin, 1);
      EXPECT_EQ(tail.num_tokens, 24);
      ++leaves;
    }
  }
  EXPECT_EQ(children, 2);
  EXPECT_EQ(leaves, 8);
  EXPECT_EQ(plan.num_pieces, 0);
  EXPECT_TRUE(plan.merges.empty());
  EXPECT_EQ(plan_traffic(plan, shape, with).kv, kv_bytes_of_tokens(256 + 2 * 32 + 8 * 24, shape, 2));
}

// 300 queries under one 256-token root: a 128-row tile holds 128 of them at group 1, so the
// root is read by 3 units of 100 queries, marked kv_shared, side by side in the item order.
TEST(PrefixPlan, RowChunksSplitAWideNodeEvenly) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,300_256,32"), 16, 2);
  struct Case {
    int32_t group;
    std::vector<int32_t> m_tiles;
    int32_t max_queries, num_chunks;
  };
  for (const Case& c : {Case{1, {16, 32, 64, 128}, 128, 3}, Case{4, {16, 32}, 8, 38}, Case{7, {16, 32}, 4, 75},
                        Case{8, {16}, 2, 150}}) {
    SCOPED_TRACE("group " + std::to_string(c.group));
    const AttentionShape shape = shape_of(c.group, 2);
    const PrefixPlanOptions options{.split = false, .m_tiles = c.m_tiles};
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 64}, options);
    check_plan(plan, batch, shape, options);
    const auto root = units_starting_at(plan, batch, 0, 0, 16);
    ASSERT_EQ(int32_t(root.size()), c.num_chunks);
    int32_t total = 0;
    for (const PrefixUnit* u : root) {
      EXPECT_EQ(u->num_tokens, 256);
      EXPECT_EQ(u->kv_shared, 1);
      EXPECT_LE(u->num_queries, c.max_queries);
      EXPECT_GE(u->num_queries, 300 / c.num_chunks);      // near-equal: floor or ceil of the mean
      EXPECT_LE(u->num_queries, (300 + c.num_chunks - 1) / c.num_chunks);
      total += u->num_queries;
    }
    EXPECT_EQ(total, 300);
    for (const PrefixUnit& u : plan.units) {
      if (u.num_tokens == 32) {
        EXPECT_EQ(u.kv_shared, 0);
      }
    }
    // Launch order: the root's chunks first (the longest run), side by side.
    for (int32_t i = 0; i < c.num_chunks; ++i) EXPECT_EQ(&plan.units[size_t(i)], root[size_t(i)]);
  }
}

// Units that read the same KV run (row chunks, and with the split their pieces) launch side by
// side, so that the run is read from L2 after the first of them.
TEST(PrefixPlan, UnitsOfOneKvRunLaunchTogether) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Random rng(seed);
    const RandomCase c = random_case(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
    const PrefixPlan plan = plan_prefix(c.tree.batch, c.shape, c.device, c.options);
    std::set<std::pair<int32_t, int32_t>> done;
    for (size_t u = 0; u < plan.units.size(); ++u) {
      const std::pair run{plan.units[u].block_begin, plan.units[u].num_tokens};
      if (u > 0 && run == std::pair{plan.units[u - 1].block_begin, plan.units[u - 1].num_tokens}) continue;
      ASSERT_TRUE(done.insert(run).second) << "unit " << u << " reads a run launched before, apart";
    }
  }
}

// The long-KV split of a plan, against the same plan unsplit (its units are the split's input):
// each unsplit unit becomes whole-block pieces of at most split_tokens that tile its run, all
// but the last at least min_kv_tokens_per_unit rounded up to blocks, with the unit's queries and
// tile. A piece is found by its queries and its first block inside the unsplit unit's run.
void check_split(const PrefixPlan& split, const PrefixPlan& whole, const PrefixPlanOptions& options, int32_t bs) {
  const int32_t floor = (options.min_kv_tokens_per_unit + bs - 1) / bs * bs;
  int32_t longest = 0;
  for (const PrefixUnit& u : whole.units) longest = std::max(longest, u.num_tokens);
  if (split.split_tokens == 0) {
    ASSERT_EQ(split.units.size(), whole.units.size());
  } else {
    ASSERT_EQ(split.split_tokens % bs, 0);
    ASSERT_GE(split.split_tokens, floor);
    ASSERT_LT(split.split_tokens, longest);
  }
  const auto seqs = [](const PrefixPlan& plan, const PrefixUnit& u) {
    std::vector<int32_t> out;
    for (int32_t j = 0; j < u.num_queries; ++j) out.push_back(plan.unit_queries[size_t(u.query_begin + j)].seq);
    return out;
  };
  std::vector<int32_t> claimed(split.units.size(), 0);
  for (const PrefixUnit& w : whole.units) {
    const std::vector<int32_t> w_seqs = seqs(whole, w);
    std::vector<size_t> pieces;
    for (size_t i = 0; i < split.units.size(); ++i) {
      const PrefixUnit& p = split.units[i];
      if (p.block_begin >= w.block_begin && p.block_begin < w.block_begin + blocks_for(w.num_tokens, bs) &&
          seqs(split, p) == w_seqs) {
        pieces.push_back(i);
        ++claimed[i];
      }
    }
    std::sort(pieces.begin(), pieces.end(),
              [&](size_t a, size_t b) { return split.units[a].block_begin < split.units[b].block_begin; });
    int32_t tokens = 0;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const PrefixUnit& piece = split.units[pieces[k]];
      ASSERT_EQ(piece.block_begin, w.block_begin + tokens / bs);
      ASSERT_EQ(piece.m_tile, w.m_tile);
      ASSERT_EQ(piece.kv_shared, w.kv_shared);
      if (split.split_tokens > 0) {
        ASSERT_LE(piece.num_tokens, split.split_tokens);
      }
      tokens += piece.num_tokens;
      if (k + 1 < pieces.size()) {
        ASSERT_EQ(piece.num_tokens % bs, 0);
        ASSERT_GE(piece.num_tokens, floor) << "piece " << k << " of a " << w.num_tokens << "-token unit";
      }
    }
    ASSERT_EQ(tokens, w.num_tokens);
    if (split.split_tokens > 0) {
      // As few pieces as split_tokens allows.
      ASSERT_EQ(pieces.size(), size_t((w.num_tokens + split.split_tokens - 1) / split.split_tokens));
    }
  }
  for (int32_t n : claimed) ASSERT_EQ(n, 1);
}

// `batch` planned with `options` on `workers` workers, checked, and its split checked
// against the same plan unsplit.
PrefixPlan checked_split_plan(const DecodeBatch& batch, const AttentionShape& shape, int32_t workers,
                              const PrefixPlanOptions& options = {}) {
  PrefixPlanOptions unsplit = options;
  unsplit.split = false;
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = workers}, options);
  check_plan(plan, batch, shape, options);
  check_split(plan, plan_prefix(batch, shape, DeviceInfo{.num_workers = workers}, unsplit), options,
              shape.block_size);
  return plan;
}

// One long root read by two queries, on a device of 132 workers: the fair share of the device is
// below the minimum, so the root is cut into min-sized pieces: 32 of 128 tokens.
TEST(PrefixPlan, LongKvSplitCutsALongRootIntoEqualPieces) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2_4096,100"), 16, 9);
  const AttentionShape shape = shape_of(4, 2);
  const PrefixPlanOptions options;  // pack, split, min 128
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 132}, options);
  check_plan(plan, batch, shape, options);
  PrefixPlanOptions unsplit = options;
  unsplit.split = false;
  check_split(plan, plan_prefix(batch, shape, DeviceInfo{.num_workers = 132}, unsplit), options, 16);
  EXPECT_EQ(plan.split_tokens, 128);
  ASSERT_EQ(plan.units.size(), 32u + 2u);
  int32_t pieces = 0;
  for (const PrefixUnit& u : plan.units) {
    if (u.num_queries == 2) {
      EXPECT_EQ(u.num_tokens, 128);
      ++pieces;
    } else {
      EXPECT_EQ(u.num_tokens, 100);  // shorter than the pieces: left whole
    }
  }
  EXPECT_EQ(pieces, 32);
  EXPECT_EQ(plan.num_pieces, 2 * 33);
  // One worker: its fair share is the whole batch, so nothing is cut.
  const PrefixPlan one = plan_prefix(batch, shape, DeviceInfo{.num_workers = 1}, options);
  check_plan(one, batch, shape, options);
  EXPECT_EQ(one.split_tokens, 0);
  std::vector<int32_t> lengths;
  for (const PrefixUnit& u : one.units) lengths.push_back(u.num_tokens);
  std::sort(lengths.begin(), lengths.end());
  EXPECT_EQ(lengths, (std::vector<int32_t>{100, 100, 4096}));
  // Four workers: a fair share is (4096 + 2 x 100) x 2 heads / 4 = 2148 tokens (2160 in blocks);
  // the root's 2 pieces and the 2 tails make 8 items, two rounds, which pieces of 2048 keep.
  const PrefixPlan four = plan_prefix(batch, shape, DeviceInfo{.num_workers = 4}, options);
  check_plan(four, batch, shape, options);
  check_split(four, plan_prefix(batch, shape, DeviceInfo{.num_workers = 4}, unsplit), options, 16);
  EXPECT_EQ(four.split_tokens, 2048);
}

// 1,10_4096,416 at 32 kv heads on 132 workers: the rounds' rule cuts the root into 6 pieces of
// 688 tokens beside the 416-token leaves, 512 items of two lengths; cut to the leaves' length
// instead, the root's 10 pieces and the leaves are 640 items of at most 416 tokens, 5 rounds 97%
// full. At 8 kv heads the rounds' rule cuts the leaves too (pieces of 320): nothing is left whole.
TEST(PrefixPlan, PiecesAreNoLongerThanTheUnitsLeftWhole) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,10_4096,416"), 16, 5);
  for (const auto& [kv_heads, split_tokens, units] :
       std::vector<std::tuple<int32_t, int32_t, size_t>>{{32, 416, 20}, {8, 320, 33}}) {
    SCOPED_TRACE(kv_heads);
    const PrefixPlan plan = checked_split_plan(batch, shape_of(1, kv_heads), 132);  // no unit longer than the piece
    EXPECT_EQ(plan.split_tokens, split_tokens);
    EXPECT_EQ(plan.units.size(), units);
  }
}

// 256 sequences of 4096 tokens, no sharing, on 132 workers: no unit is longer than a fair share.
// At 32 kv heads 8192 whole units take 63 rounds for 62.1 rounds of work: cut in 2 (whole
// blocks of 2048) they take 125 for 124.1. At 8 kv heads the 2048 whole units fill 16 whole rounds
// of 128 workers, 4 idle, at any GQA group, and at 1 kv head 256 fill 2: they stay whole.
TEST(PrefixPlan, UnitsOfOneLengthAreCutToFillTheirRounds) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("256_4096"), 16, 3);
  const PrefixPlanOptions f16_partials{.partial_o_bytes_per_element = 2};
  for (const auto& [group, kv_heads, split_tokens, pieces] : std::vector<std::tuple<int32_t, int32_t, int32_t, size_t>>{
           {1, 32, 2048, 2}, {4, 32, 2048, 2}, {2, 8, 0, 1}, {8, 8, 0, 1}, {4, 1, 0, 1}}) {
    SCOPED_TRACE(::testing::Message() << "group " << group << ", " << kv_heads << " kv heads");
    const PrefixPlan plan = checked_split_plan(batch, shape_of(group, kv_heads), 132, f16_partials);
    EXPECT_EQ(plan.split_tokens, split_tokens);
    EXPECT_EQ(plan.units.size(), 256 * pieces);
    EXPECT_EQ(plan.merges.size(), pieces > 1 ? 256u : 0u);
  }
}

// A unit just over the piece length is not cut into two pieces both shorter than the minimum.
TEST(PrefixPlan, LongKvSplitKeepsPiecesAtLeastTheMinimum) {
  DecodeBatch batch;
  std::vector<int32_t> ids(9);
  std::iota(ids.begin(), ids.end(), 0);
  batch.add_sequence(ids, 144);
  const AttentionShape shape = shape_of(1, 1);
  const PrefixPlanOptions options{.min_kv_tokens_per_unit = 128};
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 300}, options);
  check_plan(plan, batch, shape, options);
  EXPECT_EQ(plan.split_tokens, 128);
  ASSERT_EQ(plan.units.size(), 2u);
  EXPECT_EQ(plan.units[0].num_tokens, 128);
  EXPECT_EQ(plan.units[1].num_tokens, 16);
  // min 100 rounds up to 112 (7 blocks): a 1000-token sequence in 9 pieces, 8 of 112 and 104.
  DecodeBatch long_one;
  std::vector<int32_t> more(63);
  std::iota(more.begin(), more.end(), 0);
  long_one.add_sequence(more, 1000);
  const PrefixPlanOptions min100{.min_kv_tokens_per_unit = 100};
  const PrefixPlan p = plan_prefix(long_one, shape, DeviceInfo{.num_workers = 300}, min100);
  check_plan(p, long_one, shape, min100);
  EXPECT_EQ(p.split_tokens, 112);
  ASSERT_EQ(p.units.size(), 9u);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(p.units[i].num_tokens, 112);
  EXPECT_EQ(p.units[8].num_tokens, 104);
}

TEST(PrefixPlan, RandomSplitsAreWholeBlockPiecesOfTheUnsplitUnits) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    Random rng(seed);
    RandomCase c = random_case(rng);
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
    c.options.split = true;
    const PrefixPlan split = plan_prefix(c.tree.batch, c.shape, c.device, c.options);
    PrefixPlanOptions unsplit = c.options;
    unsplit.split = false;
    const PrefixPlan whole = plan_prefix(c.tree.batch, c.shape, c.device, unsplit);
    EXPECT_EQ(whole.split_tokens, 0);
    ASSERT_NO_FATAL_FAILURE(check_split(split, whole, c.options, c.shape.block_size));
  }
}

TEST(PrefixPlan, EmptySequencesGetEmptyMerges) {
  DecodeBatch batch;
  batch.add_sequence(std::vector<int32_t>{}, 0);
  batch.add_sequence(std::vector<int32_t>{1, 2}, 20);
  batch.add_sequence(std::vector<int32_t>{3}, 0);
  const AttentionShape shape = shape_of(2, 3);
  const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 4});
  check_plan(plan, batch, shape, PrefixPlanOptions{});
  ASSERT_EQ(plan.units.size(), 1u);
  EXPECT_EQ(plan.num_pieces, 0);
  EXPECT_EQ(plan.merges.size(), 2u);  // one per empty sequence, for all 3 kv heads
  for (const MergeTask& m : plan.merges) {
    EXPECT_NE(m.seq, 1);
    EXPECT_EQ(m.num_partials, 0);
  }
  // Nothing but empty sequences: no unit at all.
  DecodeBatch empty;
  empty.add_sequence(std::vector<int32_t>{}, 0);
  const PrefixPlan none = plan_prefix(empty, shape, DeviceInfo{});
  EXPECT_TRUE(none.units.empty());
  EXPECT_EQ(none.num_items(), 0);
  EXPECT_EQ(none.merges.size(), 1u);
}

TEST(PrefixPlan, RejectsBadOptionsAndBatches) {
  const DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,2_32,20"), 16);
  const AttentionShape shape = shape_of(4, 2);
  const auto expect_invalid = [&](const DecodeBatch& b, const AttentionShape& s, const PrefixPlanOptions& o) {
    try {
      plan_prefix(b, s, DeviceInfo{}, o);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  };
  expect_invalid(batch, shape, PrefixPlanOptions{.m_tiles = {}});
  expect_invalid(batch, shape, PrefixPlanOptions{.m_tiles = {16, 24}});
  expect_invalid(batch, shape, PrefixPlanOptions{.m_tiles = {32, 16}});
  expect_invalid(batch, shape, PrefixPlanOptions{.m_tiles = {0}});
  expect_invalid(batch, shape, PrefixPlanOptions{.min_kv_tokens_per_unit = 0});
  expect_invalid(batch, shape, PrefixPlanOptions{.kv_bytes_per_element = 0});
  expect_invalid(batch, shape, PrefixPlanOptions{.partial_o_bytes_per_element = 0});
  expect_invalid(batch, shape, PrefixPlanOptions{.max_tail_tokens = -1});
  expect_invalid(batch, shape_of(32, 1), PrefixPlanOptions{.m_tiles = {16}});  // a group of 32 rows
  expect_invalid(batch, AttentionShape{6, 4, 128, 16, 0.1f}, PrefixPlanOptions{});
  DecodeBatch too_few;
  too_few.add_sequence(std::vector<int32_t>{0}, 17);
  expect_invalid(too_few, shape, PrefixPlanOptions{});
}

// Cascade: every request reads the shared blocks, then its own.
TEST(CascadeBatch, BuildsSharedPrefixTables) {
  const DecodeBatch batch = cascade_batch({5, 6}, 32, {{7}, {8, 9}, {}}, {10, 20, 0}, 16);
  EXPECT_EQ(batch.block_ids, (std::vector<int32_t>{5, 6, 7, 5, 6, 8, 9, 5, 6}));
  EXPECT_EQ(batch.block_offsets, (std::vector<int32_t>{0, 3, 7, 9}));
  EXPECT_EQ(batch.kv_lengths, (std::vector<int32_t>{42, 52, 32}));
  EXPECT_EQ(unique_kv_tokens(batch, 16), 32 + 10 + 20);
  const DecodeBatch none = cascade_batch({}, 0, {{1}}, {3}, 16);  // no shared prefix
  EXPECT_EQ(none.block_ids, std::vector<int32_t>{1});
  EXPECT_EQ(none.kv_lengths, std::vector<int32_t>{3});
}

TEST(CascadeBatch, RejectsInconsistentInput) {
  const auto expect_invalid = [](auto&& make) {
    try {
      make();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  };
  expect_invalid([] { cascade_batch({5, 6}, 40, {{7}}, {1}, 16); });   // 40 tokens do not fill 2 blocks
  expect_invalid([] { cascade_batch({5, 6}, 16, {{7}}, {1}, 16); });   // 16 leave a block empty
  expect_invalid([] { cascade_batch({5}, 16, {{7}, {8}}, {1}, 16); });  // 2 suffix lists, 1 length
  expect_invalid([] { cascade_batch({5}, 16, {{7}}, {1, 2}, 16); });
  expect_invalid([] { cascade_batch({5}, 16, {{7}}, {1}, 0); });
}

// The shared prefix is a root read once per row chunk: by one unit while the requests' rows fit
// the largest tile, by ceil(requests / tile queries) kv_shared units beyond.
TEST(CascadeBatch, PlansTheSharedPrefixOncePerRowChunk) {
  for (int32_t requests : {3, 20, 32, 33, 70}) {
    SCOPED_TRACE(std::to_string(requests) + " requests");
    std::vector<std::vector<int32_t>> suffix_blocks;
    std::vector<int32_t> suffix_tokens;
    Random rng(static_cast<uint64_t>(requests));
    int32_t next_id = 4;
    for (int32_t r = 0; r < requests; ++r) {
      suffix_tokens.push_back(int32_t(rng.next(60)));  // 0 included: a request that only read the prefix
      suffix_blocks.emplace_back();
      for (int32_t b = 0; b < blocks_for(suffix_tokens.back(), 16); ++b) suffix_blocks.back().push_back(next_id++);
    }
    const DecodeBatch batch = cascade_batch({3, 0, 2, 1}, 64, suffix_blocks, suffix_tokens, 16);
    const AttentionShape shape = shape_of(4, 2);
    const PrefixPlanOptions options{.split = false};
    const PrefixPlan plan = plan_prefix(batch, shape, DeviceInfo{.num_workers = 64}, options);
    check_plan(plan, batch, shape, options);
    const auto prefix = units_starting_at(plan, batch, 0, 0, 16);
    const int32_t chunks = (requests + 31) / 32;  // 128-row tile / group 4
    ASSERT_EQ(int32_t(prefix.size()), chunks);
    int32_t readers = 0;
    for (const PrefixUnit* u : prefix) {
      // 33 requests: one of them frees the second chunk, and reads the prefix and its suffix alone.
      const int32_t first = plan.unit_queries[size_t(u->query_begin)].seq;
      EXPECT_EQ(u->num_tokens, requests == 33 && u->num_queries == 1 ? 64 + suffix_tokens[size_t(first)] : 64);
      EXPECT_EQ(u->kv_shared, chunks > 1 ? 1 : 0);
      readers += u->num_queries;
    }
    EXPECT_EQ(readers, requests);
    const PlanTraffic t = plan_traffic(plan, shape, options);
    EXPECT_EQ(t.kv, kv_bytes_of_tokens(int64_t(64) * chunks + unique_kv_tokens(batch, 16) - 64, shape, 2));
  }
}

void expect_same_plan(const PrefixPlan& a, const PrefixPlan& b) {
  const auto unit = [](const PrefixUnit& u) {
    return std::tuple{u.block_begin, u.num_tokens, u.query_begin, u.num_queries, u.m_tile, u.kv_shared};
  };
  ASSERT_EQ(a.units.size(), b.units.size());
  for (size_t i = 0; i < a.units.size(); ++i) ASSERT_EQ(unit(a.units[i]), unit(b.units[i])) << "unit " << i;
  ASSERT_EQ(a.unit_queries.size(), b.unit_queries.size());
  for (size_t i = 0; i < a.unit_queries.size(); ++i) {
    ASSERT_EQ(a.unit_queries[i].seq, b.unit_queries[i].seq) << i;
    ASSERT_EQ(a.unit_queries[i].piece, b.unit_queries[i].piece) << i;
  }
  const auto merge = [](const MergeTask& m) { return std::tuple{m.seq, m.kv_head, m.partial_begin, m.num_partials}; };
  ASSERT_EQ(a.merges.size(), b.merges.size());
  for (size_t i = 0; i < a.merges.size(); ++i) ASSERT_EQ(merge(a.merges[i]), merge(b.merges[i])) << "merge " << i;
  EXPECT_EQ(a.num_pieces, b.num_pieces);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.group, b.group);
  EXPECT_EQ(a.split_tokens, b.split_tokens);
}

// One decode step: every sequence with KV gains a token, but for one in eight that waits. A full
// last block is followed by the sequence's spare block or a fresh one; a partial last block that
// another sequence also holds is first copied to a fresh block (copy on write, as
// kv::append_tokens does).
struct Step {
  DecodeBatch batch;
  std::set<int32_t> grown;
  bool copied = false;
};

Step decode_step(const DecodeBatch& batch, int32_t bs, int32_t& next_id, Random* waits = nullptr) {
  std::map<int32_t, int32_t> holders;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const auto table = batch.blocks_of(s);
    for (int32_t p = 0; p < blocks_for(batch.kv_lengths[size_t(s)], bs); ++p) ++holders[table[size_t(p)]];
  }
  Step step;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const auto blocks = batch.blocks_of(s);
    std::vector<int32_t> table(blocks.begin(), blocks.end());
    int32_t length = batch.kv_lengths[size_t(s)];
    if (length > 0 && !(waits && waits->next(8) == 0)) {
      step.grown.insert(s);
      if (length % bs == 0) {
        if (int32_t(table.size()) * bs == length) table.push_back(next_id++);
      } else if (holders[table[size_t(length / bs)]] > 1) {
        table[size_t(length / bs)] = next_id++;
        step.copied = true;
      }
      ++length;
    }
    step.batch.add_sequence(table, length);
  }
  return step;
}

// Sequences that are the only query of a childless node: the ones whose growth keeps the forest.
std::set<int32_t> lone_leaves(const DecodeBatch& batch, int32_t bs) {
  const PrefixForest f = build_prefix_forest(batch, bs);
  std::set<int32_t> out;
  for (const PrefixNode& n : f.nodes) {
    if (n.num_queries() == 1 && n.first_child < 0) out.insert(f.queries[size_t(n.query_begin)]);
  }
  return out;
}

TEST(PrefixPlanner, DecodeStepsGiveThePlanFromScratch) {
  int32_t grown = 0, rebuilt = 0, reused = 0, reshaped = 0;
  for (uint64_t seed = 1; seed <= 30; ++seed) {
    Random rng(seed);
    RandomCase c = random_case(rng, /*forks=*/seed % 2 == 0);
    SCOPED_TRACE("seed " + std::to_string(seed) + ": " + describe(c));
    const int32_t bs = c.shape.block_size;
    int32_t next_id = c.tree.num_blocks;
    PrefixPlanner planner(c.shape, c.device, c.options);
    DecodeBatch batch = c.tree.batch;
    ASSERT_NO_FATAL_FAILURE(expect_same_plan(planner.plan(batch), plan_prefix(batch, c.shape, c.device, c.options)));
    EXPECT_EQ(planner.last_update(), PrefixPlanner::Update::kRebuilt);
    for (int32_t step = 0; step < 8; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      if (rng.next(4) == 0) {  // the same tables again
        const PrefixPlan* before = &planner.plan(batch);
        const PrefixPlan again = *before;
        EXPECT_EQ(&planner.plan(batch), before);
        EXPECT_EQ(planner.last_update(), PrefixPlanner::Update::kReused);
        ASSERT_NO_FATAL_FAILURE(expect_same_plan(planner.plan(batch), again));
        ++reused;
      }
      const std::set<int32_t> lone = lone_leaves(batch, bs);
      Step next = decode_step(batch, bs, next_id, &rng);
      // In place iff every grown sequence was alone in a childless node and kept its blocks.
      bool in_place = !next.copied;
      for (int32_t s : next.grown) in_place = in_place && lone.count(s) > 0;
      reshaped += !next.copied && !in_place;
      batch = std::move(next.batch);
      const PrefixPlan& plan = planner.plan(batch);
      const auto expected = next.grown.empty() ? PrefixPlanner::Update::kReused  // all waited
                            : in_place         ? PrefixPlanner::Update::kGrown
                                               : PrefixPlanner::Update::kRebuilt;
      EXPECT_EQ(planner.last_update(), expected);
      ASSERT_NO_FATAL_FAILURE(expect_same_plan(plan, plan_prefix(batch, c.shape, c.device, c.options)));
      ASSERT_NO_FATAL_FAILURE(check_plan(plan, batch, c.shape, c.options));
      (in_place ? grown : rebuilt) += 1;
    }
  }
  // The random trees exercise both paths, and steps that keep every block but still change the
  // forest (a query that ended at an inner node, or one of two identical ones, grew).
  EXPECT_GT(grown, 100);
  EXPECT_GT(rebuilt, 20);
  EXPECT_GT(reshaped, 10);
  EXPECT_GT(reused, 20);
}

// 1,4,16_128,256,1000: every query a lone leaf with a partial last block. 24 steps cross the
// 1408-token block boundary (at step 8): all grown in place.
TEST(PrefixPlanner, GrowsPrivateLeavesInPlaceAcrossBlocks) {
  const AttentionShape shape = shape_of(4, 2);
  const DeviceInfo device{.num_workers = 132};
  DecodeBatch batch = make_tree_batch(parse_prefix_tree("1,4,16_128,256,1000"), 16, 4);
  int32_t next_id = int32_t(tree_num_blocks(parse_prefix_tree("1,4,16_128,256,1000"), 16));
  PrefixPlanner planner(shape, device);
  planner.plan(batch);
  for (int32_t step = 0; step < 24; ++step) {
    batch = decode_step(batch, 16, next_id).batch;
    const PrefixPlan& plan = planner.plan(batch);
    EXPECT_EQ(planner.last_update(), PrefixPlanner::Update::kGrown) << "step " << step;
    ASSERT_NO_FATAL_FAILURE(expect_same_plan(plan, plan_prefix(batch, shape, device)));
  }
  EXPECT_EQ(batch.kv_lengths[0], 1384 + 24);
  EXPECT_EQ(batch.block_offsets[1], 8 + 16 + 63 + 1);  // one block appended on the way
}

TEST(PrefixPlanner, OtherChangesRebuild) {
  const AttentionShape shape = shape_of(2, 2);
  const DeviceInfo device{.num_workers = 16};
  const DecodeBatch base = make_tree_batch(parse_prefix_tree("1,3,6_64,32,40"), 16, 8);
  const int32_t fresh = int32_t(tree_num_blocks(parse_prefix_tree("1,3,6_64,32,40"), 16));
  const auto tables = [&](const DecodeBatch& b) {
    std::vector<std::pair<std::vector<int32_t>, int32_t>> out;
    for (int32_t s = 0; s < b.num_seqs(); ++s) {
      out.push_back({{b.blocks_of(s).begin(), b.blocks_of(s).end()}, b.kv_lengths[size_t(s)]});
    }
    return out;
  };
  const auto batch_of = [](const std::vector<std::pair<std::vector<int32_t>, int32_t>>& t) {
    DecodeBatch b;
    for (const auto& [table, length] : t) b.add_sequence(table, length);
    return b;
  };
  std::vector<DecodeBatch> changed;
  {
    auto t = tables(base);  // a sequence added: a fork of sequence 0 at its shared prefix
    t.push_back({{t[0].first.begin(), t[0].first.begin() + 6}, 96});
    changed.push_back(batch_of(t));
  }
  {
    auto t = tables(base);  // a sequence removed
    t.erase(t.begin() + 2);
    changed.push_back(batch_of(t));
  }
  {
    auto t = tables(base);  // the root's first block replaced in every table
    const int32_t old = t[0].first[0];
    for (auto& [table, length] : t) std::replace(table.begin(), table.end(), old, fresh);
    changed.push_back(batch_of(t));
  }
  {
    auto t = tables(base);  // the same sequences in another order
    std::swap(t[0], t[5]);
    changed.push_back(batch_of(t));
  }
  {
    auto t = tables(base);  // a sequence that shrank
    t[3].second -= 1;
    changed.push_back(batch_of(t));
  }
  for (size_t i = 0; i < changed.size(); ++i) {
    SCOPED_TRACE("change " + std::to_string(i));
    PrefixPlanner planner(shape, device);
    planner.plan(base);
    const PrefixPlan& plan = planner.plan(changed[i]);
    EXPECT_EQ(planner.last_update(), PrefixPlanner::Update::kRebuilt);
    ASSERT_NO_FATAL_FAILURE(expect_same_plan(plan, plan_prefix(changed[i], shape, device)));
    planner.plan(changed[i]);
    EXPECT_EQ(planner.last_update(), PrefixPlanner::Update::kReused);
  }
}

// A bad batch throws as plan_prefix does, before the planner looks at it as a step of the last
// one, and leaves the planner usable.
TEST(PrefixPlanner, RejectsBadBatchesAndStaysUsable) {
  const AttentionShape shape = shape_of(1, 1);
  PrefixPlanner planner(shape, DeviceInfo{.num_workers = 4});
  DecodeBatch good;
  good.add_sequence(std::vector<int32_t>{0, 1}, 20);
  good.add_sequence(std::vector<int32_t>{0, 2}, 30);
  planner.plan(good);
  DecodeBatch too_few = good;  // sequence 1 grew past its blocks
  too_few.kv_lengths[1] = 33;
  DecodeBatch short_offsets = good;  // a table cut off: the offsets do not cover the sequences
  short_offsets.block_offsets.pop_back();
  for (const DecodeBatch* bad : {&too_few, &short_offsets}) {
    try {
      planner.plan(*bad);
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
    }
  }
  DecodeBatch grown = good;
  grown.kv_lengths[1] = 31;
  const PrefixPlan from_scratch = plan_prefix(grown, shape, DeviceInfo{.num_workers = 4});
  ASSERT_NO_FATAL_FAILURE(expect_same_plan(planner.plan(grown), from_scratch));
}

}  // namespace
}  // namespace pagoda::attention
