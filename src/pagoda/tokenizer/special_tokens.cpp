#include "pagoda/tokenizer/special_tokens.h"

#include <algorithm>

namespace pagoda {

SpecialTokenMatcher::SpecialTokenMatcher(std::vector<Entry> entries) : entries_(std::move(entries)) {
  std::erase_if(entries_, [](const Entry& entry) { return entry.text.empty(); });
  // Grouped by first byte, longest first within a group.
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    const auto first_a = static_cast<uint8_t>(a.text[0]), first_b = static_cast<uint8_t>(b.text[0]);
    return first_a != first_b ? first_a < first_b : a.text.size() > b.text.size();
  });
  first_entry_of_byte_.assign(257, 0);
  for (const Entry& entry : entries_) ++first_entry_of_byte_[static_cast<uint8_t>(entry.text[0]) + 1];
  for (size_t b = 1; b < first_entry_of_byte_.size(); ++b) first_entry_of_byte_[b] += first_entry_of_byte_[b - 1];
}

std::vector<TextSegment> SpecialTokenMatcher::split(std::string_view text, bool parse_special) const {
  std::vector<TextSegment> segments;
  size_t plain_start = 0;
  for (size_t pos = 0; pos < text.size();) {
    const auto byte = static_cast<uint8_t>(text[pos]);
    const Entry* match = nullptr;
    if (!entries_.empty()) {
      for (uint32_t e = first_entry_of_byte_[byte]; e < first_entry_of_byte_[byte + 1]; ++e) {
        const Entry& entry = entries_[e];
        if ((parse_special || !entry.special) && text.substr(pos).starts_with(entry.text)) {
          match = &entry;
          break;
        }
      }
    }
    if (match == nullptr) {
      ++pos;
      continue;
    }
    if (pos > plain_start) segments.push_back({text.substr(plain_start, pos - plain_start), -1, plain_start});
    segments.push_back({text.substr(pos, match->text.size()), match->id, pos});
    pos += match->text.size();
    plain_start = pos;
  }
  if (plain_start < text.size()) segments.push_back({text.substr(plain_start), -1, plain_start});
  return segments;
}

}  // namespace pagoda
