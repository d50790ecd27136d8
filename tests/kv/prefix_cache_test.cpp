#include "pagoda/kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "pagoda/core/error.h"

namespace pagoda::kv {
namespace {

constexpr int32_t kBlock = 4;

// Allocates ceil(tokens / block) blocks, as a sequence that computed `tokens` tokens holds.
std::vector<BlockId> allocate_for(int32_t tokens, BlockPool& pool) {
  std::vector<BlockId> ids;
  for (int32_t i = 0; i < (tokens + kBlock - 1) / kBlock; ++i) ids.push_back(pool.allocate());
  return ids;
}

void release_all(const std::vector<BlockId>& ids, BlockPool& pool) {
  for (BlockId id : ids) pool.release(id);
}

TEST(PrefixCache, InsertThenMatchReturnsTheBlocks) {
  BlockPool pool(16, kBlock);
  PrefixCache cache(pool);
  const std::vector<int32_t> tokens = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};  // 2 full blocks and a tail
  const std::vector<BlockId> ids = allocate_for(10, pool);
  EXPECT_EQ(cache.insert(tokens, ids), (std::vector<BlockId>{ids[0], ids[1]}));
  EXPECT_EQ(cache.num_cached_blocks(), 2) << "the partial tail block is never cached";
  EXPECT_EQ(pool.refcount(ids[0]), 2);
  EXPECT_EQ(pool.refcount(ids[1]), 2);
  EXPECT_EQ(pool.refcount(ids[2]), 1);

  EXPECT_EQ(cache.match(tokens), (std::vector<BlockId>{ids[0], ids[1]}));
  EXPECT_EQ(cache.match(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7}), (std::vector<BlockId>{ids[0]}))
      << "only whole blocks match";
  EXPECT_TRUE(cache.match(std::vector<int32_t>{1, 2, 3}).empty());
  EXPECT_TRUE(cache.match(std::vector<int32_t>{2, 2, 3, 4, 5, 6, 7, 8}).empty());

  release_all(ids, pool);
  EXPECT_EQ(pool.num_free(), 16 - 2) << "the cache keeps its two blocks";
  EXPECT_EQ(cache.num_evictable_blocks(), 2);
}

TEST(PrefixCache, DivergenceInsideABlockMatchesOnlyTheBlocksBefore) {
  BlockPool pool(16, kBlock);
  PrefixCache cache(pool);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<BlockId> ids = allocate_for(12, pool);
  cache.insert(a, ids);
  std::vector<int32_t> b = a;
  b[6] = 99;  // second block differs in its third token
  EXPECT_EQ(cache.match(b), (std::vector<BlockId>{ids[0]}));
  b = a;
  b[11] = 99;  // last token of the third block
  EXPECT_EQ(cache.match(b), (std::vector<BlockId>{ids[0], ids[1]}));
}

TEST(PrefixCache, DuplicatePrefixKeepsTheCachedBlocks) {
  BlockPool pool(16, kBlock);
  PrefixCache cache(pool);
  const std::vector<int32_t> a = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<int32_t> b = {1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 9, 9};
  const std::vector<BlockId> first = allocate_for(8, pool);
  const std::vector<BlockId> second = allocate_for(12, pool);  // computed the same prefix again
  cache.insert(a, first);
  EXPECT_EQ(cache.insert(b, second), (std::vector<BlockId>{first[0], first[1], second[2]}));
  EXPECT_EQ(cache.num_cached_blocks(), 3);
  EXPECT_EQ(pool.refcount(second[0]), 1) << "the duplicate stays the caller's alone";
  EXPECT_EQ(pool.refcount(second[2]), 2);
  EXPECT_EQ(cache.match(b), (std::vector<BlockId>{first[0], first[1], second[2]}));

  // The caller holds second[2] under the cached first[0..1], which it does not hold: those
  // cannot go while second[2] is held, since a block is useless without its prefix.
  release_all(first, pool);
  EXPECT_EQ(cache.num_evictable_blocks(), 0);
  EXPECT_EQ(cache.evict(3), 0);
  release_all(second, pool);
  EXPECT_EQ(cache.num_evictable_blocks(), 3);
  EXPECT_EQ(cache.evict(10), 3);
  EXPECT_EQ(pool.num_free(), 16);
}

TEST(PrefixCache, EvictsLeastRecentlyUsedLeavesFirst) {
  BlockPool pool(16, kBlock);
  PrefixCache cache(pool);
  // Three sequences sharing block {0,0,0,0}: x = [P, X1], y = [P, Y1, Y2], z = [Z1].
  const std::vector<int32_t> x = {0, 0, 0, 0, 1, 1, 1, 1};
  const std::vector<int32_t> y = {0, 0, 0, 0, 2, 2, 2, 2, 3, 3, 3, 3};
  const std::vector<int32_t> z = {4, 4, 4, 4};
  const std::vector<BlockId> xi = allocate_for(8, pool), yi = allocate_for(12, pool), zi = allocate_for(4, pool);
  cache.insert(x, xi);
  cache.insert(y, yi);  // P stays xi[0]; yi[0] stays the caller's
  cache.insert(z, zi);
  release_all(xi, pool);
  release_all(yi, pool);
  release_all(zi, pool);
  ASSERT_EQ(cache.num_cached_blocks(), 5);
  ASSERT_EQ(pool.num_free(), 16 - 5);

  cache.match(x);  // x's path is now the most recent; y's leaf Y2 the oldest, then Z1
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.refcount(yi[2]), 0) << "Y2 goes first";
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.refcount(yi[1]), 0) << "then Y1, a leaf now and older than Z1";
  EXPECT_EQ(cache.evict(1), 1);
  EXPECT_EQ(pool.refcount(zi[0]), 0);
  EXPECT_EQ(cache.match(x), (std::vector<BlockId>{xi[0], xi[1]}));
  EXPECT_EQ(cache.evict(5), 2) << "only two are left";
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  EXPECT_EQ(pool.num_free(), 16);
}

TEST(PrefixCache, EvictSkipsBlocksASequenceHolds) {
  BlockPool pool(8, kBlock);
  PrefixCache cache(pool);
  const std::vector<int32_t> held = {1, 1, 1, 1, 2, 2, 2, 2};
  const std::vector<int32_t> done = {3, 3, 3, 3};
  const std::vector<BlockId> held_ids = allocate_for(8, pool);
  const std::vector<BlockId> done_ids = allocate_for(4, pool);
  cache.insert(held, held_ids);
  cache.insert(done, done_ids);
  release_all(done_ids, pool);
  cache.match(done);  // the most recent, yet the only one that may go
  EXPECT_EQ(cache.num_evictable_blocks(), 1);
  EXPECT_EQ(cache.evict(8), 1);
  EXPECT_EQ(pool.refcount(done_ids[0]), 0);
  EXPECT_EQ(pool.refcount(held_ids[0]), 2);
  EXPECT_EQ(pool.refcount(held_ids[1]), 2);
  EXPECT_EQ(cache.match(held), held_ids);
}

TEST(PrefixCache, ClearAndDestructionReleaseEveryReference) {
  BlockPool pool(8, kBlock);
  const std::vector<BlockId> ids = allocate_for(8, pool);
  {
    PrefixCache cache(pool);
    cache.insert(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, ids);
    cache.clear();
    EXPECT_EQ(cache.num_cached_blocks(), 0);
    EXPECT_EQ(pool.refcount(ids[0]), 1);
    EXPECT_TRUE(cache.match(std::vector<int32_t>{1, 2, 3, 4}).empty());
    cache.insert(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8}, ids);
  }
  EXPECT_EQ(pool.refcount(ids[0]), 1);
  EXPECT_EQ(pool.refcount(ids[1]), 1);
}

TEST(PrefixCache, InsertOfAFreeBlockIsAnInternalError) {
  BlockPool pool(4, kBlock);
  PrefixCache cache(pool);
  try {
    cache.insert(std::vector<int32_t>{1, 2, 3, 4}, std::vector<BlockId>{2});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
  }
  EXPECT_EQ(cache.num_cached_blocks(), 0);
  EXPECT_THROW(cache.insert(std::vector<int32_t>{1, 2, 3, 4}, std::vector<BlockId>{}), Error);
}

// The reference model: the cache as a map from a prefix of whole blocks to its block, with the
// LRU rule written the slow, obvious way. Live sequences hold their blocks as the engine's do.
struct Model {
  struct Entry {
    BlockId block;
    uint64_t last_access;
  };
  std::map<std::vector<int32_t>, Entry> cached;
  uint64_t clock = 0;
  std::map<BlockId, int32_t> holders;  // references held by live sequences

  static std::vector<int32_t> prefix(const std::vector<int32_t>& tokens, size_t blocks) {
    return {tokens.begin(), tokens.begin() + ptrdiff_t(blocks * kBlock)};
  }
  std::vector<BlockId> match(const std::vector<int32_t>& tokens) {
    ++clock;
    std::vector<BlockId> ids;
    for (size_t b = 1; b * kBlock <= tokens.size(); ++b) {
      auto it = cached.find(prefix(tokens, b));
      if (it == cached.end()) break;
      it->second.last_access = clock;
      ids.push_back(it->second.block);
    }
    return ids;
  }
  std::vector<BlockId> insert(const std::vector<int32_t>& tokens, const std::vector<BlockId>& ids) {
    ++clock;
    std::vector<BlockId> out;
    for (size_t b = 1; b * kBlock <= tokens.size(); ++b) {
      auto [it, inserted] = cached.try_emplace(prefix(tokens, b), Entry{ids[b - 1], 0});
      it->second.last_access = clock;
      out.push_back(it->second.block);
    }
    return out;
  }
  bool is_leaf(const std::vector<int32_t>& key) const {
    auto next = cached.upper_bound(key);  // extensions of key, if any, sort right after it
    return next == cached.end() || next->first.size() <= key.size() ||
           !std::equal(key.begin(), key.end(), next->first.begin());
  }
  bool only_cache_holds(BlockId id) const { return !holders.contains(id) || holders.at(id) == 0; }
  int32_t evict(int32_t n) {
    int32_t freed = 0;
    for (; freed < n; ++freed) {
      auto victim = cached.end();
      for (auto it = cached.begin(); it != cached.end(); ++it) {
        if (!is_leaf(it->first) || !only_cache_holds(it->second.block)) continue;
        if (victim == cached.end() ||
            std::pair(it->second.last_access, it->second.block) < std::pair(victim->second.last_access, victim->second.block))
          victim = it;
      }
      if (victim == cached.end()) break;
      cached.erase(victim);
    }
    return freed;
  }
  int32_t evictable() const {
    int32_t count = 0;
    for (const auto& [key, entry] : cached) {
      bool ok = true;  // this block and every cached extension of it held by the cache alone
      for (auto it = cached.find(key); ok && it != cached.end() && it->first.size() >= key.size() &&
                                       std::equal(key.begin(), key.end(), it->first.begin());
           ++it)
        ok = only_cache_holds(it->second.block);
      count += ok;
    }
    return count;
  }
};

// Thousands of random admissions (match, then allocate the rest, evicting when the pool is
// short), inserts of running sequences, completions (insert, then release), and evictions, on sequences from a two-letter
// alphabet so that prefixes collide and diverge inside blocks. After every operation the
// cache must agree with the model and every block's refcount must be exactly its holders.
TEST(PrefixCache, RandomOperationsAgreeWithAReferenceModel) {
  constexpr int32_t kNumBlocks = 24;
  BlockPool pool(kNumBlocks, kBlock);
  PrefixCache cache(pool);
  Model model;
  struct Live {
    std::vector<int32_t> tokens;
    std::vector<BlockId> ids;
  };
  std::vector<Live> live;
  std::mt19937 rng(20240611);
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto hold = [&](BlockId id, int delta) { model.holders[id] += delta; };
  int64_t hits = 0, evictions = 0;

  for (int op = 0; op < 5000; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    const int kind = uniform(0, 9);
    if (kind < 5 || live.empty()) {  // admit
      std::vector<int32_t> tokens(size_t(uniform(1, 5 * kBlock)));
      for (int32_t& t : tokens) t = uniform(0, 1);
      // A shared start makes long common prefixes likely.
      if (uniform(0, 1) == 0) std::fill_n(tokens.begin(), std::min<size_t>(tokens.size(), 2 * kBlock), 0);
      std::vector<BlockId> ids = cache.match(tokens);
      ASSERT_EQ(ids, model.match(tokens));
      hits += int64_t(ids.size());
      for (BlockId id : ids) {
        pool.retain(id);
        hold(id, 1);
      }
      const int32_t need = (int32_t(tokens.size()) + kBlock - 1) / kBlock - int32_t(ids.size());
      if (need > pool.num_free()) {
        const int32_t want = need - pool.num_free();
        const int32_t freed = cache.evict(want);
        ASSERT_EQ(freed, model.evict(want));
        evictions += freed;
      }
      if (need > pool.num_free()) {  // does not fit: give the matched blocks back
        for (BlockId id : ids) {
          pool.release(id);
          hold(id, -1);
        }
      } else {
        for (int32_t i = 0; i < need; ++i) {
          ids.push_back(pool.allocate());
          hold(ids.back(), 1);
        }
        live.push_back({std::move(tokens), std::move(ids)});
      }
    } else if (kind == 5) {
      // Cache a running sequence's full blocks, as the engine does after every step; half the
      // time it then switches its duplicates to the cached blocks, as the engine does, and
      // otherwise keeps them, which pins cached blocks it does not hold itself.
      Live& seq = live[size_t(uniform(0, int(live.size()) - 1))];
      const std::vector<BlockId> canonical = cache.insert(seq.tokens, seq.ids);
      ASSERT_EQ(canonical, model.insert(seq.tokens, seq.ids));
      if (uniform(0, 1) == 0) {
        for (size_t i = 0; i < canonical.size(); ++i) {
          if (canonical[i] == seq.ids[i]) continue;
          pool.retain(canonical[i]);
          hold(canonical[i], 1);
          pool.release(seq.ids[i]);
          hold(seq.ids[i], -1);
          seq.ids[i] = canonical[i];
        }
      }
    } else if (kind < 9) {  // finish: cache the full blocks, then release everything
      const size_t pick = size_t(uniform(0, int(live.size()) - 1));
      Live seq = std::move(live[pick]);
      live.erase(live.begin() + ptrdiff_t(pick));
      ASSERT_EQ(cache.insert(seq.tokens, seq.ids), model.insert(seq.tokens, seq.ids));
      for (BlockId id : seq.ids) {
        pool.release(id);
        hold(id, -1);
      }
    } else {  // evict
      const int32_t n = uniform(0, 4);
      const int32_t freed = cache.evict(n);
      ASSERT_EQ(freed, model.evict(n));
      evictions += freed;
    }

    ASSERT_EQ(cache.num_cached_blocks(), int32_t(model.cached.size()));
    ASSERT_EQ(cache.num_evictable_blocks(), model.evictable());
    std::map<BlockId, int32_t> expected_refs = model.holders;
    for (const auto& [key, entry] : model.cached) ++expected_refs[entry.block];
    int32_t expected_free = 0;
    for (BlockId id = 0; id < kNumBlocks; ++id) {
      const int32_t refs = expected_refs.contains(id) ? expected_refs[id] : 0;
      ASSERT_EQ(pool.refcount(id), refs) << "block " << id;
      expected_free += refs == 0;
    }
    ASSERT_EQ(pool.num_free(), expected_free);
  }
  // The workload must have exercised what it tests.
  EXPECT_GT(hits, 1000);
  EXPECT_GT(evictions, 100);

  for (Live& seq : live) release_all(seq.ids, pool);
  cache.clear();
  EXPECT_EQ(pool.num_free(), kNumBlocks);
}

}  // namespace
}  // namespace pagoda::kv
