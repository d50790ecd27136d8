#include "pagoda/engine/stop_matcher.h"

#include <algorithm>

namespace pagoda {

StopMatcher::StopMatcher(std::vector<std::string> stop_strings) {
  for (std::string& s : stop_strings) {
    if (s.empty()) continue;
    longest_ = std::max(longest_, s.size());
    stop_strings_.push_back(std::move(s));
  }
}

StopMatcher::Output StopMatcher::push(std::string_view delta) {
  if (stopped()) return {"", true};
  pending_.append(delta);

  // pending_ held no match before this delta, so searching all of it finds only new matches;
  // it is short (the held-back suffix, under longest_ bytes, plus the delta).
  size_t best_end = std::string::npos;
  size_t best_start = std::string::npos;
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    const size_t start = pending_.find(stop_strings_[i]);
    if (start == std::string::npos) continue;
    const size_t end = start + stop_strings_[i].size();
    if (end < best_end || (end == best_end && start < best_start)) {
      best_end = end;
      best_start = start;
      matched_ = i;
    }
  }
  if (stopped()) {
    Output out{pending_.substr(0, best_start), true};
    pending_.clear();
    return out;
  }

  // Hold back from the earliest position whose suffix could still grow into a stop string.
  // Only the last longest_ - 1 bytes can be a proper prefix of a stop string.
  size_t hold_from = pending_.size();
  const size_t window = longest_ > 0 ? longest_ - 1 : 0;
  const size_t earliest = pending_.size() - std::min(pending_.size(), window);
  for (size_t pos = earliest; pos < pending_.size() && hold_from == pending_.size(); ++pos) {
    const std::string_view suffix = std::string_view(pending_).substr(pos);
    for (const std::string& s : stop_strings_) {
      if (s.size() > suffix.size() && s.starts_with(suffix)) {
        hold_from = pos;
        break;
      }
    }
  }
  Output out{pending_.substr(0, hold_from), false};
  pending_.erase(0, hold_from);
  return out;
}

std::string StopMatcher::flush() {
  std::string rest = std::move(pending_);
  pending_.clear();
  return rest;
}

}  // namespace pagoda
