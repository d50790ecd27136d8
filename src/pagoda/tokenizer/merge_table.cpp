#include "pagoda/tokenizer/merge_table.h"

#include "pagoda/core/error.h"

namespace pagoda {

MergeTable::MergeTable(const Vocabulary& vocab, const std::vector<std::pair<std::string, std::string>>& merges) {
  by_pair_.reserve(merges.size());
  const auto id_of = [&](const std::string& piece, size_t rank) {
    const std::optional<int32_t> id = vocab.find(piece);
    if (!id) fail(ErrorKind::kCorrupt, "merge {} names '{}', which is not in the vocabulary", rank, piece);
    return *id;
  };
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    const int32_t left_id = id_of(left, rank), right_id = id_of(right, rank);
    const int32_t merged = id_of(left + right, rank);
    by_pair_.try_emplace(key(left_id, right_id), MergeResult{static_cast<int32_t>(rank), merged});
  }
}

}  // namespace pagoda
