#include "pagoda/tokenizer/pre_tokenizer.h"

#include <array>

#include "pagoda/core/error.h"

namespace pagoda {
namespace {

// Llama 3: contractions in any case, letters with one leading non-letter, numbers of up to
// three digits, newlines kept with the punctuation before them.
constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2: as Llama 3 but every digit is its own piece.
constexpr std::string_view kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Digits isolated first, then GPT-2 (Hugging Face: Digits(individual_digits) + ByteLevel).
constexpr std::string_view kDigitPattern = R"(\p{N})";

struct NamedPreTokenizer {
  std::string_view name;
  std::array<std::string_view, 2> patterns;  // applied in order; "" ends the list
};

// tokenizer.ggml.pre values and their patterns, as llama.cpp groups them. Where names share
// patterns, the first is the one gguf_name_of gives (what llama.cpp's converter writes).
constexpr std::array kNamedPreTokenizers = {
    NamedPreTokenizer{"gpt2", {kGpt2Pattern, ""}},
    NamedPreTokenizer{"default", {kGpt2Pattern, ""}},
    NamedPreTokenizer{"llama-bpe", {kLlama3Pattern, ""}},
    NamedPreTokenizer{"llama3", {kLlama3Pattern, ""}},
    NamedPreTokenizer{"qwen2", {kQwen2Pattern, ""}},
    NamedPreTokenizer{"smollm", {kDigitPattern, kGpt2Pattern}},
    NamedPreTokenizer{"starcoder", {kDigitPattern, kGpt2Pattern}},
    NamedPreTokenizer{"refact", {kDigitPattern, kGpt2Pattern}},
};

}  // namespace

PreTokenizer PreTokenizer::for_gguf_name(std::string_view name) {
  for (const NamedPreTokenizer& named : kNamedPreTokenizers) {
    if (named.name != name) continue;
    PreTokenizer pre;
    for (std::string_view pattern : named.patterns) {
      if (!pattern.empty()) pre.add_split(Regex::compile(pattern), SplitBehavior::kIsolated);
    }
    return pre;
  }
  std::string known;
  for (const NamedPreTokenizer& named : kNamedPreTokenizers) {
    known += known.empty() ? "" : ", ";
    known += named.name;
  }
  fail(ErrorKind::kUnsupported, "unsupported pre-tokenizer '{}' (known: {})", name, known);
}

std::string_view PreTokenizer::gguf_name_of(const std::vector<std::string>& patterns) {
  for (const NamedPreTokenizer& named : kNamedPreTokenizers) {
    size_t count = 0;
    while (count < named.patterns.size() && !named.patterns[count].empty()) ++count;
    if (count != patterns.size()) continue;
    bool same = true;
    for (size_t i = 0; i < count; ++i) same = same && named.patterns[i] == patterns[i];
    if (same) return named.name;
  }
  return "";
}

void PreTokenizer::add_split(Regex regex, SplitBehavior behavior) {
  steps_.push_back({std::move(regex), behavior});
}

std::vector<std::string_view> PreTokenizer::split(std::string_view text) const {
  std::vector<std::string_view> pieces;
  if (!text.empty()) pieces.push_back(text);
  std::vector<std::string_view> next;
  for (const Step& step : steps_) {
    next.clear();
    for (std::string_view piece : pieces) {
      // Walk the matches; `pending` is the start of text not yet emitted.
      size_t pending = 0;
      const auto emit = [&](size_t begin, size_t end) {
        if (end > begin) next.push_back(piece.substr(begin, end - begin));
      };
      step.regex.for_each_match(piece, [&](size_t begin, size_t end) {
        switch (step.behavior) {
          case SplitBehavior::kIsolated:
            emit(pending, begin);
            emit(begin, end);
            pending = end;
            break;
          case SplitBehavior::kRemoved:
            emit(pending, begin);
            pending = end;
            break;
          case SplitBehavior::kMergedWithPrevious:
            emit(pending, end);
            pending = end;
            break;
          case SplitBehavior::kMergedWithNext:
            emit(pending, begin);
            pending = begin;
            break;
        }
      });
      emit(pending, piece.size());
    }
    pieces.swap(next);
  }
  return pieces;
}

}  // namespace pagoda
