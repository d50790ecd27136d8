// The BPE merge loop both tokenizer flavours share. A word starts as one symbol per character;
// the best-ranked adjacent pair is merged until no pair merges. Candidates sit in a priority
// queue (rank, then leftmost first), stale entries are skipped when popped: O(n log n) per word.
#pragma once

#include <cstdint>
#include <optional>
#include <queue>
#include <string_view>
#include <vector>

#include "pagoda/tokenizer/utf8.h"

namespace pagoda {

// `rank(left, right)` returns the merge priority of two adjacent pieces of `word` as a
// std::optional<double> (lower merges first), or nullopt when they do not merge. Returns the
// final pieces, as views into `word`.
template <typename RankFn>
std::vector<std::string_view> bpe_merge(std::string_view word, const RankFn& rank) {
  struct Symbol {
    uint32_t begin, length;
    int32_t prev, next;  // neighbours in the linked list of live symbols; -1 at the ends
  };
  struct Candidate {
    double rank;
    int32_t left;
    uint32_t combined_length;  // to tell a stale candidate: its symbols changed since
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : left > other.left;
    }
  };

  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t pos = 0; pos < word.size();) {
    const size_t length = utf8_char_length(word, pos);
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(length), index - 1, index + 1});
    pos += length;
  }
  if (!symbols.empty()) symbols.back().next = -1;

  const auto text_of = [&](const Symbol& symbol) { return word.substr(symbol.begin, symbol.length); };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  const auto consider = [&](int32_t left) {
    if (left < 0 || symbols[left].next < 0) return;
    const Symbol& a = symbols[left];
    const Symbol& b = symbols[a.next];
    if (const std::optional<double> r = rank(text_of(a), text_of(b))) {
      queue.push({*r, left, a.length + b.length});
    }
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);

  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& a = symbols[top.left];
    if (a.length == 0 || a.next < 0) continue;  // merged away, or now the last symbol
    Symbol& b = symbols[a.next];
    if (a.length + b.length != top.combined_length) continue;  // a neighbour changed
    a.length += b.length;
    b.length = 0;
    a.next = b.next;
    if (a.next >= 0) symbols[a.next].prev = top.left;
    consider(a.prev);
    consider(top.left);
  }

  std::vector<std::string_view> pieces;
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) pieces.push_back(text_of(symbols[i]));
  return pieces;
}

}  // namespace pagoda
