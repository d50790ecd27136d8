#include "pagoda/bench/tree_batch.h"

#include <algorithm>
#include <charconv>
#include <numeric>
#include <random>

#include "pagoda/core/error.h"

namespace pagoda::bench {
namespace {

// A tree's tokens, a query's and all tables' together: within int32 block ids and lengths with
// room to grow (the bench appends a token to every query).
constexpr int64_t kMaxTreeTokens = int64_t(1) << 30;

std::vector<int32_t> parse_list(std::string_view list, std::string_view text, const char* what) {
  std::vector<int32_t> values;
  for (size_t begin = 0;;) {
    const size_t comma = list.find(',', begin);
    const std::string_view item = list.substr(begin, comma == std::string_view::npos ? list.npos : comma - begin);
    int32_t value = 0;
    const auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), value);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || value < 1) {
      fail(ErrorKind::kInvalidArgument, "prefix tree '{}': {} '{}' is not a positive number", text, what, item);
    }
    values.push_back(value);
    if (comma == std::string_view::npos) return values;
    begin = comma + 1;
  }
}

}  // namespace

std::vector<std::string> expand_benchmark_trees(const std::vector<std::string>& items) {
  std::vector<std::string> trees;
  for (const std::string& item : items) {
    if (item != "listed" && item != "pat") {
      trees.push_back(item);
      continue;
    }
    for (const BenchmarkTree& tree : kPatBenchmarkTrees) {
      if (tree.listed || item == "pat") trees.emplace_back(tree.text);
    }
  }
  return trees;
}

PrefixTreeSpec parse_prefix_tree(std::string_view text) {
  const size_t underscore = text.find('_');
  if (underscore == std::string_view::npos || text.find('_', underscore + 1) != std::string_view::npos) {
    fail(ErrorKind::kInvalidArgument, "prefix tree '{}' is not COUNTS_LENGTHS (e.g. 1,4,16_128,256,1024)", text);
  }
  PrefixTreeSpec spec{.counts = parse_list(text.substr(0, underscore), text, "count"),
                      .lengths = parse_list(text.substr(underscore + 1), text, "length"),
                      .text = std::string(text)};
  if (spec.counts.size() != spec.lengths.size()) {
    fail(ErrorKind::kInvalidArgument, "prefix tree '{}': {} counts but {} lengths", text, spec.counts.size(),
         spec.lengths.size());
  }
  int64_t nodes_tokens = 0, query_tokens = 0, table_tokens = 0;
  for (size_t level = 0; level < spec.counts.size(); ++level) {
    if (level > 0 && spec.counts[level] % spec.counts[level - 1] != 0) {
      fail(ErrorKind::kInvalidArgument, "prefix tree '{}': level {} has {} nodes, not a multiple of the {} above",
           text, level, spec.counts[level], spec.counts[level - 1]);
    }
    nodes_tokens += int64_t(spec.counts[level]) * spec.lengths[level];
    query_tokens += spec.lengths[level];
  }
  // Every query's table repeats its ancestors' blocks: the batch holds queries x path tokens.
  table_tokens = int64_t(spec.counts.back()) * query_tokens;
  if (nodes_tokens > kMaxTreeTokens || query_tokens > kMaxTreeTokens || table_tokens > kMaxTreeTokens) {
    fail(ErrorKind::kInvalidArgument, "prefix tree '{}': more than {} KV tokens", text, kMaxTreeTokens);
  }
  return spec;
}

int64_t tree_num_blocks(const PrefixTreeSpec& spec, int32_t block_size) {
  int64_t blocks = 0;
  for (size_t level = 0; level < spec.counts.size(); ++level) {
    blocks += int64_t(spec.counts[level]) * ((spec.lengths[level] + block_size - 1) / block_size);
  }
  return blocks;
}

attention::DecodeBatch make_tree_batch(const PrefixTreeSpec& spec, int32_t block_size, uint64_t seed) {
  if (block_size <= 0) fail(ErrorKind::kInvalidArgument, "prefix tree: block size {}", block_size);
  const size_t levels = spec.counts.size();
  for (size_t level = 0; level + 1 < levels; ++level) {
    if (spec.lengths[level] % block_size != 0) {
      fail(ErrorKind::kInvalidArgument,
           "prefix tree '{}': level {} nodes of {} tokens are shared, so they must fill whole blocks of {}",
           spec.text, level, spec.lengths[level], block_size);
    }
  }
  std::vector<int32_t> ids(size_t(tree_num_blocks(spec, block_size)));
  std::iota(ids.begin(), ids.end(), 0);
  if (seed != 0) std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));

  // first_block[level][i]: where node i of the level starts in ids.
  std::vector<std::vector<int64_t>> first_block(levels);
  int64_t next = 0;
  for (size_t level = 0; level < levels; ++level) {
    const int64_t blocks = (spec.lengths[level] + block_size - 1) / block_size;
    for (int32_t i = 0; i < spec.counts[level]; ++i, next += blocks) first_block[level].push_back(next);
  }
  attention::DecodeBatch batch;
  std::vector<int32_t> table;
  for (int32_t query = 0; query < spec.num_queries(); ++query) {
    table.clear();
    int64_t length = 0;
    for (size_t level = 0; level < levels; ++level) {
      const int32_t node = int32_t(int64_t(query) * spec.counts[level] / spec.num_queries());
      const int64_t blocks = (spec.lengths[level] + block_size - 1) / block_size;
      const int64_t first = first_block[level][size_t(node)];
      table.insert(table.end(), ids.begin() + first, ids.begin() + first + blocks);
      length += spec.lengths[level];
    }
    batch.add_sequence(table, int32_t(length));
  }
  return batch;
}

}  // namespace pagoda::bench
