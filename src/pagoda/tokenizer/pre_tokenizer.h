// Pre-tokenization: cutting text into the pieces ("words") that BPE merges within. A
// PreTokenizer is a sequence of regex splits, each applied to every piece the previous one
// produced, as Hugging Face's Sequence of Split pre-tokenizers and llama.cpp's regex lists do.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pagoda/tokenizer/regex.h"

namespace pagoda {

// What happens to the matches of a split (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior {
  kIsolated,            // matches and the text between them are separate pieces
  kRemoved,             // matches are dropped
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
};

// The GPT-2 pattern, also what Hugging Face's ByteLevel pre-tokenizer uses with use_regex.
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class PreTokenizer {
 public:
  // The pre-tokenizer that a GGUF's tokenizer.ggml.pre names (as llama.cpp reads it).
  // Throws Error(kUnsupported) naming it and listing the known names.
  static PreTokenizer for_gguf_name(std::string_view name);
  // The tokenizer.ggml.pre name of a sequence of isolating regex splits (Hugging Face's
  // ByteLevel is kGpt2Pattern), the inverse of for_gguf_name; "" when no name fits.
  static std::string_view gguf_name_of(const std::vector<std::string>& patterns);

  void add_split(Regex regex, SplitBehavior behavior);
  bool empty() const { return steps_.empty(); }

  // Pieces of `text`, in order, as views into it.
  std::vector<std::string_view> split(std::string_view text) const;

 private:
  struct Step {
    Regex regex;
    SplitBehavior behavior;
  };
  std::vector<Step> steps_;
};

}  // namespace pagoda
