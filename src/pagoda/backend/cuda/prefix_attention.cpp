#include "pagoda/backend/cuda/prefix_attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <climits>
#include <numbers>
#include <numeric>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/decode_attention.h"
#include "pagoda/backend/cuda/kernels/prefix_launch.h"
#include "pagoda/backend/cuda/kv_tensor_map.h"
#include "pagoda/backend/cuda/merge_states.h"
#include "pagoda/core/error.h"

namespace pagoda::cuda {
namespace {

// Constraint ②'s latency: what one load takes from issue to use under full load on HBM3/HBM3e.
constexpr double kMemoryLatencySeconds = 1e-6;

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&value, attribute, device), "cudaDeviceGetAttribute");
  return value;
}

}  // namespace

PrefixTiles prefix_tiles(const attention::AttentionShape& shape, DType dtype) {
  const PrefixKernelResources kernel = prefix_kernel_resources(dtype, shape.head_dim);
  const int sms = device_attribute(cudaDevAttrMultiProcessorCount);
  const int64_t smem_limit = device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin);
  const double peak_bandwidth = double(device_attribute(cudaDevAttrMemoryClockRate)) * 1e3 * 2 *
                                device_attribute(cudaDevAttrGlobalMemoryBusWidth) / 8;
  const int64_t row_bytes = int64_t(shape.head_dim) * int64_t(dtype_size(dtype));
  PrefixTiles tiles{.kv_tile_tokens = kernel.tile_tokens,
                    .one_tile_rows = kernel.one_tile_rows,
                    .max_tail_tokens = prefix_max_tail_tokens(shape.group_size(), shape.block_size),
                    .stages = kernel.stages,
                    .ctas_per_sm = kernel.ctas_per_sm};
  tiles.workers = sms * std::max(kernel.ctas_per_sm, 1);
  tiles.bytes_in_flight = int64_t(tiles.workers) * kernel.stages * 2 * kernel.tile_tokens * row_bytes;
  tiles.latency_bandwidth_bytes = int64_t(kMemoryLatencySeconds * peak_bandwidth);
  for (int32_t m : {16, 32, 64, 128}) {
    // ① The compiled kernel's shared memory (its Q slots take any of these tiles, M = 128 in two
    // stages) and registers (one m16 fragment per computing warp).
    std::string why;
    if (m > kernel.max_rows) {
      why = fmt::format("more than the kernel's {} rows: one m16 fragment per computing warp (constraint 1)",
                        kernel.max_rows);
    } else if (kernel.smem_bytes > smem_limit) {
      why = fmt::format("{} B of shared memory > {} (constraint 1)", kernel.smem_bytes, smem_limit);
    } else if (kernel.spill_bytes > 0) {
      why = fmt::format("the kernel spills {} B per thread (constraint 1)", kernel.spill_bytes);
    } else if (tiles.bytes_in_flight < tiles.latency_bandwidth_bytes) {
      why = fmt::format("{} B in flight < latency x bandwidth {} B (constraint 2)", tiles.bytes_in_flight,
                        tiles.latency_bandwidth_bytes);
    }
    if (why.empty()) {
      tiles.m_tiles.push_back(m);
    } else {
      tiles.rejected += fmt::format("{}M={}: {}", tiles.rejected.empty() ? "" : "; ", m, why);
    }
  }
  if (tiles.m_tiles.empty()) fail(ErrorKind::kUnsupported, "prefix attention: no feasible tile ({})", tiles.rejected);
  return tiles;
}

attention::PrefixPlanOptions prefix_plan_options(const PrefixTiles& tiles) {
  return {.m_tiles = tiles.m_tiles, .partial_o_bytes_per_element = 2, .max_tail_tokens = tiles.max_tail_tokens};
}

attention::DeviceInfo prefix_device_info(const PrefixTiles& tiles) { return {.num_workers = tiles.workers}; }

const char* prefix_shape_unsupported_reason(const attention::AttentionShape& shape, DType dtype) {
  if (const char* reason = decode_shape_unsupported_reason(shape, dtype)) return reason;
  if (shape.head_dim != 64 && shape.head_dim != 128) return "head_dim must be 64 or 128";
  return nullptr;
}

const char* prefix_unsupported_reason(const attention::AttentionShape& shape, const PagedKv& kv) {
  if (const char* reason = decode_unsupported_reason(shape, kv)) return reason;
  return prefix_shape_unsupported_reason(shape, kv.dtype);
}

// The kernel trusts its plan: every unit reads at least one token from blocks inside the batch's
// ids, holds at most the largest M tile of rows, and names queries and partial slots that exist;
// its tails (only where the kernel reads tails) likewise, for some of its own queries.
static void check_plan(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch,
                       const attention::AttentionShape& shape, const PrefixTiles& tiles) {
  const int64_t max_rows = tiles.m_tiles.empty() ? 0 : tiles.m_tiles.back();
  if (plan.num_kv_heads != shape.num_kv_heads || plan.group != shape.group_size()) {
    fail(ErrorKind::kInvalidArgument, "prefix attention: a plan for {} kv heads of group {}, not {} of {}",
         plan.num_kv_heads, plan.group, shape.num_kv_heads, shape.group_size());
  }
  const auto in_batch = [&](int32_t block_begin, int32_t num_tokens) {  // a run of at least one token
    const int64_t blocks = (int64_t(num_tokens) + shape.block_size - 1) / shape.block_size;
    return num_tokens >= 1 && block_begin >= 0 && block_begin + blocks <= int64_t(batch.block_ids.size());
  };
  for (const attention::PrefixUnit& u : plan.units) {
    if (!in_batch(u.block_begin, u.num_tokens) || u.num_queries < 1 ||
        int64_t(u.num_queries) * plan.group > max_rows || u.query_begin < 0 ||
        int64_t(u.query_begin) + u.num_queries > int64_t(plan.unit_queries.size())) {
      fail(ErrorKind::kInvalidArgument,
           "prefix attention: a unit of {} tokens from block index {} for {} queries from {} does not fit the "
           "batch, the plan or the kernel's {} rows",
           u.num_tokens, u.block_begin, u.num_queries, u.query_begin, max_rows);
    }
    if (u.num_tails == 0) continue;
    if (tiles.max_tail_tokens == 0) {
      fail(ErrorKind::kInvalidArgument, "prefix attention: a unit with tails, which the kernel does not read at GQA "
           "group {} and block size {}", plan.group, shape.block_size);
    }
    if (u.tail_begin < 0 || u.num_tails < 0 || int64_t(u.tail_begin) + u.num_tails > int64_t(plan.unit_tails.size())) {
      fail(ErrorKind::kInvalidArgument, "prefix attention: a unit's tails [{}, +{}) outside the plan's {}",
           u.tail_begin, u.num_tails, plan.unit_tails.size());
    }
    for (int32_t i = u.tail_begin; i < u.tail_begin + u.num_tails; ++i) {
      const attention::UnitTail& t = plan.unit_tails[size_t(i)];
      if (!in_batch(t.block_begin, t.num_tokens) || t.query_begin < 0 || t.query_begin >= t.query_end ||
          t.query_end > u.num_queries) {
        fail(ErrorKind::kInvalidArgument,
             "prefix attention: a tail of {} tokens from block index {} for queries [{}, {}) of a unit of {}",
             t.num_tokens, t.block_begin, t.query_begin, t.query_end, u.num_queries);
      }
    }
  }
  for (const attention::UnitQuery& uq : plan.unit_queries) {
    if (uq.seq < 0 || uq.seq >= batch.num_seqs() || uq.piece >= plan.num_pieces) {
      fail(ErrorKind::kInvalidArgument, "prefix attention: query {} piece {} outside the batch or the plan", uq.seq,
           uq.piece);
    }
  }
}

KernelUnits kernel_units(const attention::PrefixPlan& plan, std::span<const int32_t> block_ids, int32_t block_size,
                         int32_t one_tile_rows) {
  constexpr int32_t kTile = kPrefixTileTokens, kHalfTile = kTile / 2;
  const auto pairable = [&](const attention::PrefixUnit& u) { return block_size <= kHalfTile && u.num_tokens <= kHalfTile; };
  KernelUnits k;
  k.units.reserve(plan.units.size());
  k.queries.reserve(plan.unit_queries.size());
  size_t most_tail_tiles = 0;  // a tile per 64-token piece of a tail at most
  for (const attention::UnitTail& t : plan.unit_tails) most_tail_tiles += size_t((t.num_tokens + kTile - 1) / kTile);
  k.tail_tiles.reserve(most_tail_tiles);
  const auto append_queries = [&](const attention::PrefixUnit& u) {
    k.queries.insert(k.queries.end(), plan.unit_queries.begin() + u.query_begin,
                     plan.unit_queries.begin() + u.query_begin + u.num_queries);
  };
  const auto push_unit = [&](const attention::PrefixUnit& u) {  // alone: not (yet) a pair
    const int32_t rows = u.num_queries * plan.group;
    k.units.push_back({.block_begin = u.block_begin,
                       .num_tokens = u.num_tokens,
                       .query_begin = int32_t(k.queries.size()),
                       .rows = rows,
                       .kv_shared = u.kv_shared,
                       .second_block_begin = 0,
                       .second_tokens = 0,
                       .first_rows = rows,
                       .tail_begin = 0,
                       .tail_tiles = 0});
    append_queries(u);
  };
  // A unit's tails in tiles: pieces of at most 64 tokens, two of at most 32 with disjoint queries
  // to a tile (siblings: the tails are ordered by their queries' count first). The tiles of the
  // item's 16-row blocks are taken in turn (block 0's first, block 1's first, ...) and dealt over
  // the warps that split a block's tokens, so that consecutive stages go to different warps.
  struct TailPiece {
    int32_t query_begin, query_end, block_begin, tokens;
  };
  std::vector<TailPiece> pieces;
  std::vector<PrefixTailTile> unit_tiles;
  std::vector<int32_t> first_block, by_block;
  const auto push_tails = [&](const attention::PrefixUnit& u) {
    KernelUnit& k_unit = k.units.back();
    const int32_t group = plan.group, warps_m = prefix_m_tile(k_unit.rows) / 16;
    const int32_t warps_n = warps_m <= 4 ? 4 / warps_m : 1;
    pieces.clear();
    for (int32_t i = u.tail_begin; i < u.tail_begin + u.num_tails; ++i) {
      const attention::UnitTail& t = plan.unit_tails[size_t(i)];
      for (int32_t at = 0; at < t.num_tokens; at += kTile) {
        pieces.push_back({t.query_begin, t.query_end, t.block_begin + at / block_size, std::min(kTile, t.num_tokens - at)});
      }
    }
    const auto before = [](const TailPiece& a, const TailPiece& b) {
      return a.query_end - a.query_begin != b.query_end - b.query_begin ? a.query_end - a.query_begin < b.query_end - b.query_begin
                                                                          : a.query_begin < b.query_begin;
    };
    // Often in order already (leaves of one query each, in query order), and a stable sort
    // allocates.
    if (!std::ranges::is_sorted(pieces, before)) std::ranges::stable_sort(pieces, before);
    const auto ids_of = [&](PrefixTailTile& tile, const TailPiece& piece, int32_t from) {
      for (int32_t b = 0; b * block_size < piece.tokens; ++b) tile.ids[from + b] = block_ids[size_t(piece.block_begin + b)];
    };
    unit_tiles.clear();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const TailPiece& a = pieces[i];
      PrefixTailTile tile{.ids = {0, 0, 0, 0}, .first_tokens = a.tokens, .second_tokens = 0,
                          .first_begin = a.query_begin, .first_end = a.query_end, .second_begin = 0, .second_end = 0,
                          .warps = 0};
      ids_of(tile, a, 0);
      if (a.tokens <= kHalfTile && i + 1 < pieces.size()) {
        const TailPiece& b = pieces[i + 1];
        if (b.tokens <= kHalfTile && (b.query_begin >= a.query_end || b.query_end <= a.query_begin)) {
          tile.second_tokens = b.tokens;
          tile.second_begin = b.query_begin;
          tile.second_end = b.query_end;
          ids_of(tile, b, kHalfTile / block_size);
          ++i;
        }
      }
      unit_tiles.push_back(tile);
    }
    // Row blocks in turn: each tile's rank among the tiles of its first row block, then that block.
    // A counting sort by block lays each block's tiles out in a run, in order, and the runs are
    // read across, rank by rank.
    first_block.resize(unit_tiles.size());
    std::array<int32_t, 8> seen{};  // tiles by first row block (at most 128 rows)
    for (size_t i = 0; i < unit_tiles.size(); ++i) {
      const PrefixTailTile& t = unit_tiles[i];
      const int32_t lo = t.second_end > t.second_begin ? std::min(t.first_begin, t.second_begin) : t.first_begin;
      first_block[i] = lo * group / 16;
      ++seen[size_t(first_block[i])];
    }
    std::array<int32_t, 8> run_begin{};
    for (size_t b = 1; b < run_begin.size(); ++b) run_begin[b] = run_begin[b - 1] + seen[b - 1];
    std::array<int32_t, 8> run_end = run_begin;
    by_block.resize(unit_tiles.size());
    for (size_t i = 0; i < unit_tiles.size(); ++i) by_block[size_t(run_end[size_t(first_block[i])]++)] = int32_t(i);
    k_unit.tail_begin = int32_t(k.tail_tiles.size());
    const int32_t ranks = *std::ranges::max_element(seen);
    for (int32_t n = 0; n < ranks; ++n) {
      for (size_t b = 0; b < seen.size(); ++b) {
        if (n >= seen[b]) continue;
        PrefixTailTile tile = unit_tiles[size_t(by_block[size_t(run_begin[b] + n)])];
        const int32_t turn = n % warps_n;
        for (const auto& [lo, hi] : {std::pair{tile.first_begin, tile.first_end}, {tile.second_begin, tile.second_end}}) {
          for (int32_t block = lo * group / 16; lo < hi && block <= (hi * group - 1) / 16; ++block) {
            tile.warps |= 1 << (block + warps_m * turn);
          }
        }
        k.tail_tiles.push_back(tile);
      }
    }
    k_unit.tail_tiles = int32_t(k.tail_tiles.size()) - k_unit.tail_begin;
  };
  const int32_t one_tile_queries = std::max(one_tile_rows / std::max(plan.group, 1), 1);
  bool open_pair = false;  // the last kernel unit is a pairable unit still alone
  for (attention::PrefixUnit u : plan.units) {
    if (u.num_tails > 0) {
      push_unit(u);
      push_tails(u);
      open_pair = false;
      continue;
    }
    while (u.num_tokens <= kTile && u.num_queries * plan.group > one_tile_rows) {
      // Cut: the first one_tile_queries queries, then the rest's, each reading the tile.
      u.kv_shared = true;
      attention::PrefixUnit first = u;
      first.num_queries = one_tile_queries;
      push_unit(first);
      u.query_begin += one_tile_queries;
      u.num_queries -= one_tile_queries;
      open_pair = false;
    }
    const int32_t rows = u.num_queries * plan.group;
    if (open_pair && pairable(u) && k.units.back().rows + rows <= one_tile_rows) {
      KernelUnit& first = k.units.back();
      first.second_block_begin = u.block_begin;
      first.second_tokens = u.num_tokens;
      first.rows += rows;
      first.kv_shared |= u.kv_shared;
      append_queries(u);
      open_pair = false;
      continue;
    }
    push_unit(u);
    open_pair = pairable(u);
  }
  return k;
}

int64_t prefix_item_cost(const KernelUnit& u) {
  const int64_t span = u.second_tokens > 0 ? kPrefixTileTokens : u.num_tokens;
  const int64_t tile_cost = u.rows > 64 ? 6 : u.rows > 32 ? 5 : 4;
  // The warps that split the tokens of an item of more than one tile and at most 32 rows ⊕ their
  // states at its end (prefix_tiled.cuh's finish_item).
  const bool reduces = u.rows <= 32 && (span > kPrefixTileTokens || u.tail_tiles > 0);
  return (span + kPrefixTileTokens - 1) / kPrefixTileTokens * tile_cost + int64_t(u.tail_tiles) * 4 + (reduces ? 4 : 0);
}

PrefixSchedule prefix_schedule(const std::vector<KernelUnit>& units, int32_t num_kv_heads, int32_t workers) {
  std::vector<int64_t> costs(units.size());
  std::ranges::transform(units, costs.begin(), prefix_item_cost);
  std::vector<int32_t> order(units.size());
  std::iota(order.begin(), order.end(), 0);
  std::ranges::stable_sort(order, [&](int32_t a, int32_t b) { return costs[size_t(a)] > costs[size_t(b)]; });
  const int64_t num_items = int64_t(units.size()) * num_kv_heads;
  const int64_t max_cost = costs.empty() ? 0 : *std::ranges::max_element(costs);
  // Deals the items over `ctas` CTAs as (cta, item) in assignment order, each to the least loaded
  // CTA, the lowest index among equals (the first round is a round-robin); returns the most loaded
  // CTA's cost. The least load never falls (an item adds its cost, >= 0, to it), so the CTAs wait
  // in buckets by load: a ring of max_cost + 1 of them holds every load from the least on, and a
  // bucket's CTAs are put in order of index once the least load reaches it: a priority queue's
  // order in time linear in the items. A heap of the CTAs took several times as long, and was the
  // largest part of a prefix step's own host work in the engine (docs/experiments/engine.md).
  using Assignment = std::vector<std::pair<int32_t, int32_t>>;
  std::vector<int32_t> bucket_first, next_in_bucket, least_loaded;
  auto deal = [&](int32_t ctas, Assignment& assigned) {
    const int64_t ring = max_cost + 1;
    bucket_first.assign(size_t(ring), -1);
    next_in_bucket.assign(size_t(ctas), -1);
    least_loaded.resize(size_t(ctas));  // the CTAs at the least load, in order of index
    std::iota(least_loaded.begin(), least_loaded.end(), 0);
    size_t taken = 0;
    int64_t least = 0, least_bucket = 0, most = 0;  // least_bucket: least % ring
    assigned.clear();
    assigned.reserve(size_t(num_items));
    for (int32_t u : order) {
      const int64_t cost = costs[size_t(u)];
      for (int32_t h = 0; h < num_kv_heads; ++h) {
        while (taken == least_loaded.size()) {  // on to the next load some CTA is at
          ++least;
          if (++least_bucket == ring) least_bucket = 0;
          int32_t& first = bucket_first[size_t(least_bucket)];
          if (first < 0) continue;
          least_loaded.clear();
          for (int32_t c = first; c >= 0; c = next_in_bucket[size_t(c)]) least_loaded.push_back(c);
          first = -1;
          std::ranges::sort(least_loaded);
          taken = 0;
        }
        const int32_t cta = least_loaded[taken];
        assigned.push_back({cta, u * num_kv_heads + h});
        most = std::max(most, least + cost);
        if (cost == 0) continue;  // it stays the least loaded
        ++taken;
        const int64_t bucket = least_bucket + cost;  // (least + cost) % ring: cost < ring
        int32_t& first = bucket_first[size_t(bucket < ring ? bucket : bucket - ring)];
        next_in_bucket[size_t(cta)] = first;
        first = cta;
      }
    }
    return most;
  };
  PrefixSchedule schedule;
  schedule.ctas = int32_t(std::min<int64_t>(num_items, std::max(workers, 1)));
  // Items that fill whole rounds of fewer CTAs that finish as early go to those: 256 items of one
  // cost on 132 CTAs leave 8 of them idle for the second round, and the other 124 do not go faster
  // for it, while fewer CTAs in full rounds do. Fewer CTAs for items of many costs in many rounds
  // were slower, so only whole rounds count (docs/experiments/prefix-attention.md).
  Assignment assigned, fewer;
  std::vector<int32_t> count;  // items per CTA
  auto most_items = [&](const Assignment& a, int32_t ctas) {
    count.assign(size_t(ctas), 0);
    for (const auto& [cta, item] : a) ++count[size_t(cta)];
    return count.empty() ? 0 : *std::ranges::max_element(count);
  };
  const int64_t makespan = deal(schedule.ctas, assigned);
  int32_t rounds = most_items(assigned, schedule.ctas);
  if (rounds > 0 && num_items % rounds == 0 && num_items / rounds < schedule.ctas &&
      deal(int32_t(num_items / rounds), fewer) <= makespan) {
    schedule.ctas = int32_t(num_items / rounds);
    assigned.swap(fewer);
    rounds = most_items(assigned, schedule.ctas);
  }
  schedule.slots.assign(size_t(rounds) * size_t(schedule.ctas), -1);
  std::ranges::fill(count, 0);
  for (const auto& [cta, item] : assigned) schedule.slots[size_t(cta) + size_t(count[size_t(cta)]++) * size_t(schedule.ctas)] = item;
  return schedule;
}

void PrefixWorkspace::upload(const attention::PrefixPlan& plan, const attention::DecodeBatch& batch,
                             const attention::AttentionShape& shape, const PrefixTiles& tiles,
                             cudaStream_t stream, int32_t graph_rows) {
  check_plan(plan, batch, shape, tiles);
  const KernelUnits kernel = kernel_units(plan, batch.block_ids, shape.block_size, tiles.one_tile_rows);
  const int64_t num_items = int64_t(kernel.units.size()) * shape.num_kv_heads;
  if (num_items > INT32_MAX) fail(ErrorKind::kInvalidArgument, "prefix attention: {} work items", num_items);
  const PrefixSchedule plan_schedule = prefix_schedule(kernel.units, shape.num_kv_heads, tiles.workers);
  // Each slot's unit and kv head, so that the kernel reads them with two independent loads rather
  // than the item and then its unit: a round trip less before a CTA's first tile. CTA c's n-th
  // item moves from the schedule's slot c + n * ctas to c + n * grid.
  ctas = plan_schedule.ctas;
  grid = graph_rows > 0 ? tiles.workers : ctas;
  const size_t rounds = ctas > 0 ? plan_schedule.slots.size() / size_t(ctas) : 0;
  const size_t used_slots = rounds * size_t(grid);
  if (used_slots > size_t(INT32_MAX) / 2) {  // room to grow twofold within PrefixParams::num_slots
    fail(ErrorKind::kInvalidArgument, "prefix attention: a schedule of {} slots", used_slots);
  }
  slot_units.make_room(used_slots);
  slot_heads.make_room(used_slots);
  // Slots past used_slots keep whatever units they held: the kernel uses no unit whose head is -1.
  std::vector<KernelUnit> units_by_slot(used_slots);
  std::vector<int32_t> heads_by_slot(size_t(num_slots()), -1);
  for (size_t slot = 0; slot < plan_schedule.slots.size(); ++slot) {
    const int32_t item = plan_schedule.slots[slot];
    if (item < 0) continue;
    const size_t at = slot % size_t(ctas) + slot / size_t(ctas) * size_t(grid);
    units_by_slot[at] = kernel.units[size_t(item / shape.num_kv_heads)];
    heads_by_slot[at] = item % shape.num_kv_heads;
  }
  slot_units.upload(units_by_slot, stream);
  slot_heads.upload(heads_by_slot, stream);
  unit_queries.upload_grown(kernel.queries, stream);
  tail_tiles.upload_grown(kernel.tail_tiles, stream);
  std::vector<attention::MergeTask> tasks = plan.merges;
  if (graph_rows > 0 && !tasks.empty()) {
    if (tasks.size() > size_t(graph_rows)) {
      fail(ErrorKind::kInvalidArgument, "prefix attention: {} merge tasks, more than the graph's {} rows",
           tasks.size(), graph_rows);
    }
    tasks.resize(size_t(graph_rows), attention::MergeTask{.seq = -1, .kv_head = 0, .partial_begin = 0, .num_partials = 0});
  }
  merges.upload_grown(tasks, stream);
  max_partials = attention::max_partials(plan.merges);
  block_ids.upload_grown(batch.block_ids, stream);
  group_size = shape.num_kv_heads > 0 ? shape.group_size() : 0;
  head_dim = shape.head_dim;
  if (plan.num_pieces > piece_stride) piece_stride = std::max(plan.num_pieces, 2 * piece_stride);
  num_kv_heads = shape.num_kv_heads;
  const size_t group = size_t(std::max(group_size, 1));
  const size_t partials = size_t(piece_stride) * size_t(std::max(num_kv_heads, 0));
  partial_o.resize(partials * group * size_t(std::max(head_dim, 0)));
  partial_lse.resize(partials * group);
  max_block_id = batch.block_ids.empty() ? -1 : *std::ranges::max_element(batch.block_ids);
  min_block_id = batch.block_ids.empty() ? 0 : *std::ranges::min_element(batch.block_ids);
}

int32_t PrefixWorkspace::graph_shape() const {
  if (merges.size() == 0) return 0;
  return merge_warps_per_row(int(merges.size()), num_kv_heads, group_size, head_dim, max_partials);
}

void prefix_attention(PrefixWorkspace& workspace, const attention::AttentionShape& shape, const PagedKv& kv,
                      const KvTensorMaps& maps, const void* q, void* out, float* lse, cudaStream_t stream) {
  if (const char* reason = prefix_unsupported_reason(shape, kv)) {
    fail(ErrorKind::kUnsupported, "prefix attention on the GPU: {}", reason);
  }
  check_workspace("prefix attention", workspace.group_size, workspace.head_dim, workspace.min_block_id,
                  workspace.max_block_id, shape, kv);
  if (workspace.num_kv_heads != shape.num_kv_heads) {
    fail(ErrorKind::kInvalidArgument, "prefix attention: the workspace was uploaded for {} kv heads, not {}",
         workspace.num_kv_heads, shape.num_kv_heads);
  }
  if (maps.kv != kv) fail(ErrorKind::kInvalidArgument, "prefix attention: the tensor maps describe another KV pool");
  if (workspace.grid > 0) {  // always for a graph's step: a capture must hold the launch
    const PrefixParams params{
        .slot_units = workspace.slot_units.data(),
        .slot_heads = workspace.slot_heads.data(),
        .num_slots = workspace.num_slots(),
        .unit_queries = workspace.unit_queries.data(),
        .tail_tiles = workspace.tail_tiles.data(),
        .block_ids = workspace.block_ids.data(),
        .pool = kv_pool_params(kv, shape.block_size),
        .k_map = maps.k,
        .v_map = maps.v,
        .q = q,
        .out = out,
        .lse = lse,
        .partial_o = workspace.partial_o.data(),
        .partial_lse = workspace.partial_lse.data(),
        .num_q_heads = shape.num_q_heads,
        .group = shape.group_size(),
        .piece_stride = workspace.piece_stride,
        .scale_log2 = shape.softmax_scale * std::numbers::log2e_v<float>,
    };
    launch_prefix_tiled(kv.dtype, shape.head_dim, params, workspace.grid, stream);
  }
  merge_partial_states(workspace.merges.data(), int(workspace.merges.size()), workspace.max_partials,
                       shape.num_kv_heads, workspace.piece_stride, shape.group_size(), shape.num_q_heads,
                       shape.head_dim, workspace.partial_o.data(), workspace.partial_lse.data(), kv.dtype, out,
                       lse, stream);
}

}  // namespace pagoda::cuda
