#include "pagoda/attention/prefix_plan.h"

#include <algorithm>
#include <unordered_map>

#include "pagoda/core/error.h"

namespace pagoda::attention {
namespace {

void validate_options(const PrefixPlanOptions& options) {
  if (options.m_tiles.empty()) fail(ErrorKind::kInvalidArgument, "prefix plan: no M tile to plan for");
  for (size_t i = 0; i < options.m_tiles.size(); ++i) {
    if (options.m_tiles[i] <= 0 || options.m_tiles[i] % 16 != 0 || (i > 0 && options.m_tiles[i] <= options.m_tiles[i - 1])) {
      fail(ErrorKind::kInvalidArgument, "prefix plan: M tiles must be ascending multiples of 16 (got {})",
           options.m_tiles[i]);
    }
  }
  if (options.min_kv_tokens_per_unit <= 0 || options.kv_bytes_per_element <= 0 ||
      options.partial_o_bytes_per_element <= 0) {
    fail(ErrorKind::kInvalidArgument,
         "prefix plan: min tokens per unit {} and bytes per element {} (KV) and {} (partial o) must be positive",
         options.min_kv_tokens_per_unit, options.kv_bytes_per_element, options.partial_o_bytes_per_element);
  }
  if (options.max_tail_tokens < 0) {
    fail(ErrorKind::kInvalidArgument, "prefix plan: max tail tokens {} must not be negative (0: no tails)",
         options.max_tail_tokens);
  }
}

// Bytes one query's partial state costs per kv head: o and fp32 lse of its group rows, written by
// a unit and read back by the merge.
int64_t partial_bytes(const AttentionShape& shape, const PrefixPlanOptions& options) {
  return 2 * int64_t(shape.group_size()) * (int64_t(shape.head_dim) * options.partial_o_bytes_per_element + 4);
}

// A run of KV read by a set of queries: the packer's output before row chunking and splitting.
struct Pack {
  int32_t block_begin;  // DecodeBatch::block_ids index
  int32_t num_tokens;
  int32_t query_begin;  // Packer::pack_queries_
  int32_t num_queries;
  bool shared;  // other packs read some of its KV too: its merged children, or it is merged
};

class Packer {
 public:
  Packer(const PrefixForest& forest, const DecodeBatch& batch, const AttentionShape& shape,
         const PrefixPlanOptions& options)
      : forest_(forest), batch_(batch), shape_(shape), options_(options),
        max_queries_(std::max(1, options.m_tiles.back() / shape.group_size())),
        token_bytes_(2 * int64_t(shape.head_dim) * options.kv_bytes_per_element),
        q_bytes_(int64_t(shape.group_size()) * shape.head_dim * options.kv_bytes_per_element) {}

  // Packs every tree by the byte model, and keeps for each the cheaper of that and no packing
  // at all (every query merged down to one unit over its whole KV): the model decides child by
  // child, and on a small tree the sum of its choices can cost more bytes than not sharing.
  void run() {
    pieces_.assign(size_t(batch_.num_seqs()), 0);
    merged_.assign(forest_.nodes.size(), 0);
    for (int32_t root : forest_.roots) {
      const int32_t block = forest_.nodes[size_t(root)].block_begin;
      const size_t packed_begin = packs.size(), packed_queries = pack_queries.size();
      pack(root, block);
      if (!options_.pack) continue;
      if (bytes(packed_begin, packs.size()) <= unshared_bytes(root, block)) continue;
      packs.resize(packed_begin);  // not sharing moves fewer bytes: pack that instead
      pack_queries.resize(packed_queries);
      merge_all_ = true;
      pack(root, block);
      merge_all_ = false;
    }
  }

  std::vector<Pack> packs;
  std::vector<int32_t> pack_queries;

 private:
  int32_t chunks(int32_t queries) const { return (queries + max_queries_ - 1) / max_queries_; }

  // Bytes one pack of `queries` over `tokens` moves per kv head: its KV once per row chunk, and
  // its q rows.
  int64_t pack_bytes(int32_t queries, int64_t tokens) const {
    return int64_t(chunks(queries)) * tokens * token_bytes_ + queries * q_bytes_;
  }

  // Bytes packs [begin, end) move per kv head, before the long-KV split: KV of every row chunk,
  // q rows, and the partial states of the queries they cut into several pieces.
  int64_t bytes(size_t begin, size_t end) {
    int64_t total = 0;
    for (size_t i = begin; i < end; ++i) {
      const Pack& pack = packs[i];
      total += pack_bytes(pack.num_queries, pack.num_tokens);
      for (int32_t j = 0; j < pack.num_queries; ++j) ++pieces_[size_t(pack_queries[size_t(pack.query_begin + j)])];
    }
    for (size_t i = begin; i < end; ++i) {
      const Pack& pack = packs[i];
      for (int32_t j = 0; j < pack.num_queries; ++j) {
        int32_t& pieces = pieces_[size_t(pack_queries[size_t(pack.query_begin + j)])];
        if (pieces > 1) total += pieces * partial_bytes(shape_, options_);
        pieces = 0;  // counted once, and reset for the next call
      }
    }
    return total;
  }

  // Bytes node's subtree moves per kv head packed with merge_all_ (no partial states): each
  // node's ending queries read all their KV from block position kv_block in one pack.
  int64_t unshared_bytes(int32_t node_index, int32_t kv_block) const {
    const PrefixNode& node = forest_.nodes[size_t(node_index)];
    const int64_t kv_tokens = node.token_end - int64_t(kv_block) * shape_.block_size;
    int64_t total = pack_bytes(node.num_ending, kv_tokens);
    for (int32_t c = node.first_child; c >= 0; c = forest_.nodes[size_t(c)].next_sibling) total += unshared_bytes(c, kv_block);
    return total;
  }

  // Packs node's subtree, whose queries read KV from block position kv_block (<= the node's
  // first block when ancestors were merged into it).
  void pack(int32_t node_index, int32_t kv_block) {
    const PrefixNode& node = forest_.nodes[size_t(node_index)];
    const int64_t kv_tokens = node.token_end - int64_t(kv_block) * shape_.block_size;
    const int32_t* q = forest_.queries.data();
    // Merging a child reads this pack's KV once more per row chunk of the child's queries, less
    // the chunks this pack no longer needs without them, and saves each of them a partial state
    // (the scheme comparison of the paper, §5.1, with row chunks: under a node wider than the
    // largest tile, a child that fills whole chunks reads the node's KV no more often merged
    // than kept, so the node's KV and the child's are read in one unit). Children are decided in
    // order, each against the queries the ones before it left to this pack.
    int32_t remaining = node.num_queries();
    for (int32_t c = node.first_child; c >= 0; c = forest_.nodes[size_t(c)].next_sibling) {
      const int32_t child_queries = forest_.nodes[size_t(c)].num_queries();
      bool merged = merge_all_ || !options_.pack;
      if (!merged) {
        const int64_t saved = child_queries * partial_bytes(shape_, options_);
        const int64_t freed = chunks(remaining) - chunks(remaining - child_queries);
        const int64_t extra = kv_tokens * token_bytes_ * (chunks(child_queries) - freed);
        merged = saved > extra;
      }
      merged_[size_t(c)] = merged;
      if (merged) remaining -= child_queries;
    }
    auto merge = [&](int32_t child) { return merged_[size_t(child)] != 0; };
    for (int32_t c = node.first_child; c >= 0; c = forest_.nodes[size_t(c)].next_sibling) {
      if (merge(c)) pack(c, kv_block);
    }
    // This pack: the queries that end here and those of the children kept apart, recorded after
    // the merged children's packs and before the kept children's, so that they are contiguous.
    const size_t own_begin = pack_queries.size();
    pack_queries.insert(pack_queries.end(), q + node.query_begin, q + node.query_begin + node.num_ending);
    for (int32_t c = node.first_child; c >= 0; c = forest_.nodes[size_t(c)].next_sibling) {
      const PrefixNode& child = forest_.nodes[size_t(c)];
      if (!merge(c)) pack_queries.insert(pack_queries.end(), q + child.query_begin, q + child.query_end);
    }
    const int32_t num_queries = int32_t(pack_queries.size() - own_begin);
    if (num_queries > 0) {
      packs.push_back({.block_begin = batch_.block_offsets[size_t(pack_queries[own_begin])] + kv_block,
                       .num_tokens = int32_t(kv_tokens),
                       .query_begin = int32_t(own_begin),
                       .num_queries = num_queries,
                       .shared = kv_block < node.block_begin || remaining < node.num_queries()});
    }
    for (int32_t c = node.first_child; c >= 0; c = forest_.nodes[size_t(c)].next_sibling) {
      if (!merge(c)) pack(c, forest_.nodes[size_t(c)].block_begin);
    }
  }

  const PrefixForest& forest_;
  const DecodeBatch& batch_;
  const AttentionShape& shape_;
  const PrefixPlanOptions& options_;
  const int32_t max_queries_;
  const int64_t token_bytes_;  // K and V of one token of one kv head
  const int64_t q_bytes_;      // the group rows of one query
  bool merge_all_ = false;      // pack() merges every child: no sharing below the root
  std::vector<int32_t> pieces_;  // per sequence, bytes()'s count of the packs holding it
  std::vector<uint8_t> merged_;  // per node: merged into its parent's pack (decided by pack())
};

// The long-KV split's piece length. The paper cuts units longer than the batch mean; here only
// units longer than a worker's fair share of the batch (KV tokens of all items, tails included,
// / workers) are cut, because each cut adds a partial state per row, written and merged: at GQA
// groups of 4-8 those outweigh the KV of trees made mostly of short tails (the mean of such a
// batch is about the tail length). Cut units leave some number of rounds of items over the
// workers; the piece is then the shortest that keeps that number of rounds (a longer one would
// leave the last round mostly idle: 144 items on 132 workers take two rounds of the longest
// item). Never below the minimum; 0 when no unit is longer.
//
// Units of one length that are no longer than a fair share are dealt out in whole rounds as
// well: 256 sequences of 4096 tokens at 8 kv heads are 2048 items, 16 rounds on 132 workers for
// 15.5 rounds of work. Then each is cut into the fewest equal pieces whose rounds are 99% full,
// if no piece is then shorter than the minimum; units of many lengths are balanced by the
// schedule instead. Those 2048 units, though, fill 16 whole rounds of 128 workers, which is
// faster still (below); 8192 at 32 kv heads take 63 rounds of 132 and are cut in 2 (125 rounds
// for 124.1).
int32_t split_length(const std::vector<PrefixUnit>& units, int64_t tail_tokens, const AttentionShape& shape,
                     const DeviceInfo& device, const PrefixPlanOptions& options) {
  if (!options.split || units.empty()) return 0;
  int64_t total = tail_tokens, longest = 0;
  bool one_length = true;
  for (const PrefixUnit& u : units) {
    total += u.num_tokens;
    longest = std::max<int64_t>(longest, u.num_tokens);
    one_length = one_length && u.num_tokens == units[0].num_tokens;
  }
  const int64_t workers = std::max(device.num_workers, 1);
  const int64_t fair = total * shape.num_kv_heads / workers;
  const int64_t bs = shape.block_size;
  const int64_t floor = (options.min_kv_tokens_per_unit + bs - 1) / bs * bs;
  int64_t length = std::max(floor, (fair + bs - 1) / bs * bs);
  auto items = [&](int64_t piece) {
    int64_t n = 0;
    for (const PrefixUnit& u : units) n += (u.num_tokens + piece - 1) / piece;
    return n * shape.num_kv_heads;
  };
  if (length >= longest) {
    if (!one_length) return 0;
    // Uncut units that fill whole rounds of fewer workers run on those (prefix_schedule) and stay
    // whole: the few idle SMs cost less than the cut's partial states, its merge and its static
    // schedule over pieces (docs/experiments/prefix-attention.md).
    const int64_t uncut = items(longest), uncut_rounds = (uncut + workers - 1) / workers;
    if (uncut % uncut_rounds == 0) return 0;
    for (int64_t cut = 1; cut <= 8; ++cut) {
      const int64_t piece = ((longest + cut - 1) / cut + bs - 1) / bs * bs;  // whole blocks
      if (piece < floor) return 0;
      const int64_t n = items(piece), rounds = (n + workers - 1) / workers;
      if (100 * n < 99 * rounds * workers) continue;
      return piece < longest ? int32_t(piece) : 0;
    }
    return 0;
  }
  const int64_t slots = (items(length) + workers - 1) / workers * workers;
  for (int64_t lo = floor, hi = length; lo < hi;) {  // items() falls as the piece grows
    const int64_t mid = (lo + hi) / 2 / bs * bs;
    if (items(mid) <= slots) {
      hi = length = mid;
    } else {
      lo = mid + bs;
    }
  }
  // Pieces longer than the units left whole come first in the schedule, a round or two of them,
  // and the whole units fill the rest unevenly (1,10_4096,416 at 32 kv heads cuts its root into 6
  // pieces of 688 tokens beside 416-token leaves, and its busiest worker gets more than its share).
  // Cut to the longest whole unit instead (10 pieces of 416: items of one length) where that is at
  // least half the piece and fills the last round as well (docs/experiments/prefix-attention.md).
  int64_t whole = 0;  // in whole blocks
  for (const PrefixUnit& u : units) {
    if (u.num_tokens < length) whole = std::max<int64_t>(whole, (u.num_tokens + bs - 1) / bs * bs);
  }
  if (whole >= floor && whole < length && 2 * whole >= length) {
    const int64_t n = items(whole), rounds = (n + workers - 1) / workers;
    if (100 * n >= 95 * rounds * workers) return int32_t(whole);
  }
  return int32_t(length);
}

int32_t select_m_tile(int32_t rows, const std::vector<int32_t>& m_tiles) {
  for (int32_t m : m_tiles)
    if (m >= rows) return m;
  return m_tiles.back();
}

// Tails (options.max_tail_tokens): a chunk whose queries all sit in the chunk of an ancestor's KV
// (a query's private leaf; a node below a chain unit, with its own tails) joins it as a tail of
// those queries. The packs come parents first, so the last chunk that held a chunk's first query
// before it is its nearest ancestor's, and a kept child's queries are a run of its parent's; a
// chunk that joins brings the ones that joined it along, to the outermost chunk they all join.
//
// Tails lengthen their units, and the schedule deals the items to the workers in rounds. When the
// units with tails give fewer items than there are workers, each one's queries are dealt into
// more row chunks (each reading the node's KV again, from L2: they are kv_shared, and a tail
// cut by a chunk boundary is read by both), as many as keep those items within one round and at
// least 32 rows (the smallest chunk the kernel's tensor copies keep fed; 64-row chunks left the
// tree batches untailed, with thousands of items and their merges). Then, if the items do not
// fill their last round to 95%, no chunk joins another: with items this long, a mostly idle last
// round costs more than the partial states and merges the tails save
// (docs/experiments/prefix-attention.md).
struct Tails {
  // Chunk c's tails: list[begin[c], begin[c + 1]), query ranges from the chunk's first query.
  std::vector<UnitTail> list;
  std::vector<int32_t> begin;  // empty: no tails
  int64_t tokens = 0;          // of all tails
};

Tails take_tails(std::vector<PrefixUnit>& chunks, const std::vector<int32_t>& pack_queries, int32_t num_seqs,
                 const AttentionShape& shape, const DeviceInfo& device, const PrefixPlanOptions& options) {
  if (options.max_tail_tokens <= 0 || shape.block_size > options.max_tail_tokens) return {};
  // Each chunk's nearest ancestor chunk holding all its queries, and through it the outermost
  // one it joins (top) and where its queries start in that one (base); ancestors come first.
  const size_t n = chunks.size();
  std::vector<int32_t> top(n), base(n, 0), count(n + 1, 0);
  std::vector<int32_t> last_slot(size_t(num_seqs), -1), last_chunk(size_t(num_seqs), -1);
  int64_t tokens = 0;
  for (size_t c = 0; c < n; ++c) {
    const PrefixUnit& u = chunks[c];
    const int32_t first = pack_queries[size_t(u.query_begin)], p = last_chunk[size_t(first)];
    top[c] = int32_t(c);
    if (p >= 0) {
      const PrefixUnit& a = chunks[size_t(p)];
      const int32_t at = last_slot[size_t(first)];
      bool inside = at + u.num_queries <= a.query_begin + a.num_queries;
      for (int32_t j = 1; inside && j < u.num_queries; ++j) {
        inside = pack_queries[size_t(at + j)] == pack_queries[size_t(u.query_begin + j)];
      }
      if (inside) {
        top[c] = top[size_t(p)];
        base[c] = base[size_t(p)] + at - a.query_begin;
        ++count[size_t(top[c])];
        tokens += u.num_tokens;
      }
    }
    for (int32_t j = 0; j < u.num_queries; ++j) {
      const int32_t s = pack_queries[size_t(u.query_begin + j)];
      last_slot[size_t(s)] = u.query_begin + j;
      last_chunk[size_t(s)] = int32_t(c);
    }
  }
  if (tokens == 0) return {};

  const int64_t workers = std::max(device.num_workers, 1), heads = std::max(shape.num_kv_heads, 1);
  const int32_t group = shape.group_size();
  int64_t tail_units = 0;
  for (size_t c = 0; c < n; ++c) tail_units += count[c] > 0;
  const int64_t per_unit = workers / (tail_units * heads);
  std::vector<int32_t> parts(n, 1);  // of each top chunk
  int64_t units = 0;
  for (size_t c = 0; c < n; ++c) {
    if (top[c] != int32_t(c)) continue;
    const PrefixUnit& u = chunks[c];
    if (count[c] > 0) {  // within one round of items, chunks of at least 32 rows and 2 queries
      const int64_t most = std::min<int64_t>({per_unit, u.num_queries / 2, u.num_queries * group / 32});
      parts[c] = int32_t(std::max<int64_t>(most, 1));
    }
    units += parts[c];
  }
  const int64_t items = units * heads, rounds = (items + workers - 1) / workers;
  if (100 * items < 95 * rounds * workers) return {};

  // The joining chunks as tails of their top chunk, grouped by it.
  std::vector<int32_t> at(n + 1, 0);
  for (size_t c = 0; c < n; ++c) at[c + 1] = at[c] + count[c];
  std::vector<UnitTail> joined(static_cast<size_t>(at[n]));
  std::vector<int32_t> next(at.begin(), at.end() - 1);
  for (size_t c = 0; c < n; ++c) {
    if (top[c] == int32_t(c)) continue;
    const PrefixUnit& u = chunks[c];
    joined[size_t(next[size_t(top[c])]++)] = {
        .query_begin = base[c], .query_end = base[c] + u.num_queries, .block_begin = u.block_begin,
        .num_tokens = u.num_tokens};
  }
  // The top chunks, each dealt into its parts; a part's tails are those of its queries.
  Tails tails{.tokens = tokens};
  std::vector<PrefixUnit> dealt;
  dealt.reserve(size_t(units));
  tails.begin.reserve(size_t(units) + 1);
  for (size_t c = 0; c < n; ++c) {
    if (top[c] != int32_t(c)) continue;
    const PrefixUnit& u = chunks[c];
    for (int32_t k = 0; k < parts[c]; ++k) {
      PrefixUnit part = u;
      const int32_t first = u.num_queries * k / parts[c], end = u.num_queries * (k + 1) / parts[c];
      tails.begin.push_back(int32_t(tails.list.size()));
      for (int32_t i = at[c]; i < at[c + 1]; ++i) {
        UnitTail t = joined[size_t(i)];
        t.query_begin = std::max(t.query_begin, first) - first;
        t.query_end = std::min(t.query_end, end) - first;
        if (t.query_begin < t.query_end) tails.list.push_back(t);
      }
      if (parts[c] > 1) {
        part.query_begin = u.query_begin + first;
        part.num_queries = end - first;
        part.m_tile = select_m_tile(part.num_queries * group, options.m_tiles);
        part.kv_shared = 1;
      }
      dealt.push_back(part);
    }
  }
  tails.begin.push_back(int32_t(tails.list.size()));
  chunks = std::move(dealt);
  return tails;
}
}  // namespace

PrefixPlan plan_prefix(const DecodeBatch& batch, const AttentionShape& shape, const DeviceInfo& device,
                       const PrefixPlanOptions& options) {
  validate_decode_batch(batch, shape);
  return plan_prefix(build_prefix_forest(batch, shape.block_size), batch, shape, device, options);
}

PrefixPlan plan_prefix(const PrefixForest& forest, const DecodeBatch& batch, const AttentionShape& shape,
                       const DeviceInfo& device, const PrefixPlanOptions& options) {
  validate_decode_batch(batch, shape);
  validate_options(options);
  const int32_t group = shape.group_size();
  const int32_t max_queries = std::max(1, options.m_tiles.back() / group);
  if (int64_t(group) > options.m_tiles.back()) {
    fail(ErrorKind::kInvalidArgument, "prefix plan: a GQA group of {} rows exceeds the largest M tile {}", group,
         options.m_tiles.back());
  }
  Packer packer(forest, batch, shape, options);
  packer.pack_queries.reserve(forest.queries.size() * 4);
  packer.packs.reserve(forest.nodes.size());
  packer.run();

  PrefixPlan plan;
  plan.num_kv_heads = shape.num_kv_heads;
  plan.group = group;
  // Row chunks: a pack of n queries becomes ceil(n / max_queries) units of near-equal size.
  std::vector<PrefixUnit> chunks;
  chunks.reserve(packer.packs.size() * 2);
  for (const Pack& pack : packer.packs) {
    const int32_t num_chunks = (pack.num_queries + max_queries - 1) / max_queries;
    for (int32_t c = 0; c < num_chunks; ++c) {
      const int32_t begin = pack.num_queries * c / num_chunks;
      const int32_t end = pack.num_queries * (c + 1) / num_chunks;
      chunks.push_back({.block_begin = pack.block_begin,
                        .num_tokens = pack.num_tokens,
                        .query_begin = pack.query_begin + begin,
                        .num_queries = end - begin,
                        .m_tile = select_m_tile((end - begin) * group, options.m_tiles),
                        .kv_shared = num_chunks > 1 || pack.shared});
    }
  }

  const Tails tails = take_tails(chunks, packer.pack_queries, batch.num_seqs(), shape, device, options);

  // The long-KV split: a unit longer than the piece length becomes equal whole-block pieces, none
  // shorter than the minimum but the last (a unit just over the piece length is not halved).
  plan.split_tokens = split_length(chunks, tails.tokens, shape, device, options);
  const int32_t bs = shape.block_size;
  const int32_t min_piece_blocks = (options.min_kv_tokens_per_unit + bs - 1) / bs;
  std::vector<int32_t> pieces_of(size_t(batch.num_seqs()), 0);
  plan.units.reserve(chunks.size() * 2);
  plan.unit_queries.reserve(packer.pack_queries.size() * 2);
  for (const PrefixUnit& chunk : chunks) {
    const int64_t tokens = chunk.num_tokens;
    const int64_t num_pieces = plan.split_tokens > 0 ? (tokens + plan.split_tokens - 1) / plan.split_tokens : 1;
    const int32_t piece_blocks =
        std::max<int32_t>(min_piece_blocks, int32_t(((tokens + num_pieces - 1) / num_pieces + bs - 1) / bs));
    for (int64_t begin = 0; begin < chunk.num_tokens; begin += int64_t(piece_blocks) * bs) {
      PrefixUnit unit = chunk;
      unit.block_begin += int32_t(begin / bs);
      unit.num_tokens = int32_t(std::min<int64_t>(chunk.num_tokens - begin, int64_t(piece_blocks) * bs));
      unit.query_begin = int32_t(plan.unit_queries.size());
      for (int32_t i = 0; i < chunk.num_queries; ++i) {
        const int32_t seq = packer.pack_queries[size_t(chunk.query_begin + i)];
        plan.unit_queries.push_back({.seq = seq, .piece = pieces_of[size_t(seq)]++});
      }
      unit.tail_begin = int32_t(plan.unit_tails.size());
      if (!tails.begin.empty() && begin + unit.num_tokens == chunk.num_tokens) {  // with the last piece
        const size_t c = size_t(&chunk - chunks.data());
        plan.unit_tails.insert(plan.unit_tails.end(), tails.list.begin() + tails.begin[c],
                               tails.list.begin() + tails.begin[c + 1]);
      }
      unit.num_tails = int32_t(plan.unit_tails.size()) - unit.tail_begin;
      plan.units.push_back(unit);
    }
  }

  // Partial slots: each sequence read by several units owns a contiguous run of pieces; one read
  // by a single unit gets its output from it directly.
  std::vector<int32_t> piece_begin(size_t(batch.num_seqs()), -1);
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    if (pieces_of[size_t(s)] > 1) {
      piece_begin[size_t(s)] = plan.num_pieces;
      plan.num_pieces += pieces_of[size_t(s)];
    }
  }
  for (UnitQuery& uq : plan.unit_queries) {
    uq.piece = piece_begin[size_t(uq.seq)] < 0 ? -1 : piece_begin[size_t(uq.seq)] + uq.piece;
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t pieces = pieces_of[size_t(s)];
    if (pieces == 1) continue;  // written by its unit
    plan.merges.push_back({.seq = s, .kv_head = 0, .partial_begin = pieces > 1 ? piece_begin[size_t(s)] : 0,
                           .num_partials = pieces});
  }

  // Launch order: the longest units first, a run's row chunks together (stable: they are
  // consecutive already; units of one length by first block, or a split run's chunks would
  // interleave with their other pieces).
  std::stable_sort(plan.units.begin(), plan.units.end(), [](const PrefixUnit& x, const PrefixUnit& y) {
    return x.num_tokens != y.num_tokens ? x.num_tokens > y.num_tokens : x.block_begin < y.block_begin;
  });
  return plan;
}

DecodeBatch cascade_batch(const std::vector<int32_t>& shared_blocks, int32_t shared_tokens,
                          const std::vector<std::vector<int32_t>>& suffix_blocks,
                          const std::vector<int32_t>& suffix_tokens, int32_t block_size) {
  if (block_size <= 0 || shared_tokens < 0 || int64_t(shared_blocks.size()) * block_size != shared_tokens) {
    fail(ErrorKind::kInvalidArgument, "cascade: a shared prefix of {} tokens does not fill {} blocks of {}",
         shared_tokens, shared_blocks.size(), block_size);
  }
  if (suffix_blocks.size() != suffix_tokens.size()) {
    fail(ErrorKind::kInvalidArgument, "cascade: {} suffix block lists for {} suffix lengths", suffix_blocks.size(),
         suffix_tokens.size());
  }
  DecodeBatch batch;
  std::vector<int32_t> table;
  for (size_t r = 0; r < suffix_blocks.size(); ++r) {
    table = shared_blocks;
    table.insert(table.end(), suffix_blocks[r].begin(), suffix_blocks[r].end());
    batch.add_sequence(table, shared_tokens + suffix_tokens[r]);
  }
  return batch;
}

int64_t plan_kv_tokens(const PrefixPlan& plan) {
  int64_t tokens = 0;
  for (const PrefixUnit& u : plan.units) {
    tokens += u.num_tokens;
    for (int32_t t = u.tail_begin; t < u.tail_begin + u.num_tails; ++t) tokens += plan.unit_tails[size_t(t)].num_tokens;
  }
  return tokens;
}

PlanTraffic plan_traffic(const PrefixPlan& plan, const AttentionShape& shape, const PrefixPlanOptions& options) {
  const int64_t bytes_per_element = options.kv_bytes_per_element;
  PlanTraffic t;
  const int64_t heads = shape.num_kv_heads;
  for (const PrefixUnit& u : plan.units) {
    t.q += int64_t(u.num_queries) * shape.group_size() * shape.head_dim * bytes_per_element * heads;
  }
  t.kv = plan_kv_tokens(plan) * 2 * shape.head_dim * bytes_per_element * heads;
  t.partial = int64_t(plan.num_partials()) * partial_bytes(shape, options);
  int32_t num_seqs = 0;
  for (const UnitQuery& uq : plan.unit_queries) num_seqs = std::max(num_seqs, uq.seq + 1);
  for (const MergeTask& m : plan.merges) num_seqs = std::max(num_seqs, m.seq + 1);
  t.out = int64_t(num_seqs) * shape.num_q_heads * shape.head_dim * bytes_per_element;
  return t;
}

int64_t unique_kv_tokens(const DecodeBatch& batch, int32_t block_size) {
  std::unordered_map<int32_t, int32_t> tokens_of_block;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const auto blocks = batch.blocks_of(s);
    const int32_t length = batch.kv_lengths[size_t(s)];
    for (int32_t b = 0; int64_t(b) * block_size < length; ++b) {
      int32_t& tokens = tokens_of_block[blocks[size_t(b)]];
      tokens = std::max(tokens, std::min(block_size, length - b * block_size));
    }
  }
  int64_t total = 0;
  for (const auto& [block, tokens] : tokens_of_block) total += tokens;
  return total;
}

PrefixPlanner::PrefixPlanner(const AttentionShape& shape, const DeviceInfo& device, PrefixPlanOptions options)
    : shape_(shape), device_(device), options_(std::move(options)) {}

// The usual decode step: every sequence kept its blocks and grew by appending to the end of its
// own table. When each grown sequence is the only query of a node with no children (its private
// leaf), the forest stays the same but for that node's end.
bool PrefixPlanner::grow_in_place(const DecodeBatch& batch) {
  if (batch.num_seqs() != batch_.num_seqs()) return false;
  const int32_t bs = shape_.block_size;
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t old_length = batch_.kv_lengths[size_t(s)];
    const int32_t new_length = batch.kv_lengths[size_t(s)];
    const auto old_blocks = batch_.blocks_of(s);
    const auto new_blocks = batch.blocks_of(s);
    const int32_t old_used = (old_length + bs - 1) / bs;
    if (new_length < old_length || int64_t(new_blocks.size()) * bs < new_length) return false;
    if (!std::equal(old_blocks.begin(), old_blocks.begin() + old_used, new_blocks.begin())) return false;
    if (new_length != old_length && (old_length == 0 || leaf_of_[size_t(s)] < 0)) return false;
  }
  for (int32_t s = 0; s < batch.num_seqs(); ++s) {
    const int32_t length = batch.kv_lengths[size_t(s)];
    if (length == batch_.kv_lengths[size_t(s)]) continue;
    PrefixNode& leaf = forest_.nodes[size_t(leaf_of_[size_t(s)])];
    leaf.block_end = (length + bs - 1) / bs;
    leaf.token_end = length;
  }
  batch_ = batch;
  return true;
}

const PrefixPlan& PrefixPlanner::plan(const DecodeBatch& batch) {
  if (valid_ && batch.block_ids == batch_.block_ids && batch.block_offsets == batch_.block_offsets &&
      batch.kv_lengths == batch_.kv_lengths) {
    last_update_ = Update::kReused;
    return plan_;
  }
  validate_decode_batch(batch, shape_);  // before grow_in_place indexes the new tables
  if (valid_ && grow_in_place(batch)) {
    last_update_ = Update::kGrown;
  } else {
    batch_ = batch;
    forest_ = build_prefix_forest(batch_, shape_.block_size);
    leaf_of_.assign(size_t(batch_.num_seqs()), -1);
    for (size_t n = 0; n < forest_.nodes.size(); ++n) {
      const PrefixNode& node = forest_.nodes[n];
      if (node.num_queries() == 1 && node.first_child < 0) leaf_of_[size_t(forest_.queries[size_t(node.query_begin)])] = int32_t(n);
    }
    last_update_ = Update::kRebuilt;
  }
  valid_ = false;  // stays false if planning throws
  plan_ = plan_prefix(forest_, batch_, shape_, device_, options_);
  valid_ = true;
  return plan_;
}

}  // namespace pagoda::attention
