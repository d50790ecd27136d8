// Finding special and added tokens ("<|im_start|>", "<s>") inside text before BPE sees it, so
// they become their own ids instead of being spelled out. At each position the longest token
// that matches wins (leftmost-longest, as Hugging Face's added-token matcher).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda {

// A stretch of the input: plain text (id < 0) or one matched token.
struct TextSegment {
  std::string_view text;
  int32_t id = -1;
  size_t offset = 0;  // where it starts in the input
};

class SpecialTokenMatcher {
 public:
  struct Entry {
    std::string text;
    int32_t id;
    bool special;  // control token: matched only when the caller asks to parse specials
  };
  SpecialTokenMatcher() = default;
  explicit SpecialTokenMatcher(std::vector<Entry> entries);

  std::vector<TextSegment> split(std::string_view text, bool parse_special) const;

 private:
  std::vector<Entry> entries_;               // longest first, so the first match is the longest
  std::vector<uint32_t> first_entry_of_byte_;  // [257] entries starting with byte b: [b], [b+1]
};

}  // namespace pagoda
