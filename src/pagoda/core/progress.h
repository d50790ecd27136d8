// A one-line progress bar on stderr for long work (model loading, benchmarks). Silent when stderr
// is not a terminal, so logs and tests stay clean.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace pagoda {

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total);
  ~ProgressBar();
  void advance(int64_t n = 1);
  void finish();

 private:
  void draw();
  std::string label_;
  int64_t total_;
  int64_t done_ = 0;
  bool enabled_;
  bool finished_ = false;
  std::chrono::steady_clock::time_point last_draw_{};
};

}  // namespace pagoda
