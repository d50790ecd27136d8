// A compiled PCRE2 pattern for pre-tokenizers: UTF mode with Unicode properties (\p{L}, \s and
// friends are Unicode-aware, as in the Rust `regex`/`onig` engines Hugging Face uses), JIT
// compiled when the library supports it. Invalid UTF-8 in the subject never matches instead of
// failing, so arbitrary bytes can be tokenized.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace pagoda {

class Regex {
 public:
  // Throws Error(kCorrupt) naming the pattern and PCRE2's message when it does not compile.
  // `literal` matches the pattern text as is (Hugging Face's Split with a String pattern).
  static Regex compile(std::string_view pattern, bool literal = false);

  // Calls on_match(begin, end) for each non-overlapping match, left to right. Empty matches are
  // skipped (they would split nothing).
  void for_each_match(std::string_view text, const std::function<void(size_t, size_t)>& on_match) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;  // immutable once compiled: shared by copies and threads
  std::string pattern_;
};

}  // namespace pagoda
