// A BPE merge list as a lookup: (left id, right id) -> (rank, merged id). Used by byte-level BPE
// and by tokenizer.json BPE models with byte fallback.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagoda/tokenizer/vocabulary.h"

namespace pagoda {

struct MergeResult {
  int32_t rank;
  int32_t id;
};

class MergeTable {
 public:
  MergeTable() = default;
  // merges[i] = (left, right) merges with rank i. Throws Error(kCorrupt) when a merge names a
  // piece, or makes one, that is not in the vocabulary. A repeated pair keeps its first rank.
  MergeTable(const Vocabulary& vocab, const std::vector<std::pair<std::string, std::string>>& merges);

  bool empty() const { return by_pair_.empty(); }
  std::optional<MergeResult> find(int32_t left, int32_t right) const {
    const auto it = by_pair_.find(key(left, right));
    if (it == by_pair_.end()) return std::nullopt;
    return it->second;
  }

 private:
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }
  std::unordered_map<uint64_t, MergeResult> by_pair_;
};

}  // namespace pagoda
