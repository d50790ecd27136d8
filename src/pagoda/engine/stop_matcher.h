// StopMatcher: ends a completion at the first stop string, as the OpenAI API does: the text
// before the stop string is the output; the stop string and everything after it are not.
//
// Text arrives in deltas (one detokenized token or a few), and a stop string can span several of
// them, so the matcher holds back the longest suffix of the pending text that is a proper prefix
// of some stop string and emits the rest. That suffix is all it needs to keep: any later match
// must start inside it, or it would have been held back too. flush() releases it at the end.
//
// With several stop strings, the one that completes first (smallest end) wins, ties going to the
// one that starts first. That is what a token-by-token stream sees, so the output is the same
// however the text is split into deltas.
//
// A stop string that is valid UTF-8 starts with a lead byte, so for valid UTF-8 text both cut
// points (held-back suffix, match start) fall on character boundaries.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace pagoda {

class StopMatcher {
 public:
  struct Output {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched: text is the last of the output
  };

  // Empty strings are ignored (validate() rejects them: they would match before any text).
  explicit StopMatcher(std::vector<std::string> stop_strings);

  // Appends a delta. After a match every call returns {"", true}.
  Output push(std::string_view delta);

  // End of generation: returns the held-back text (empty after a match).
  std::string flush();

  bool stopped() const { return matched_ != kNone; }
  // The stop string that matched, or "" when none has.
  std::string_view matched_stop() const {
    return stopped() ? std::string_view(stop_strings_[matched_]) : std::string_view();
  }

 private:
  static constexpr size_t kNone = size_t(-1);

  std::vector<std::string> stop_strings_;
  size_t longest_ = 0;    // length of the longest stop string
  std::string pending_;   // text received but not yet emitted
  size_t matched_ = kNone;  // index into stop_strings_
};

}  // namespace pagoda
