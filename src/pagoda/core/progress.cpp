#include "pagoda/core/progress.h"

#include <unistd.h>

#include <cstdio>

namespace pagoda {

ProgressBar::ProgressBar(std::string label, int64_t total)
    : label_(std::move(label)), total_(total > 0 ? total : 1), enabled_(::isatty(STDERR_FILENO)) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(int64_t n) {
  done_ += n;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ > std::chrono::milliseconds(50) || done_ >= total_) {
    last_draw_ = now;
    draw();
  }
}

void ProgressBar::draw() {
  if (!enabled_) return;
  constexpr int kWidth = 30;
  const double fraction = double(done_ < total_ ? done_ : total_) / double(total_);
  const int filled = int(fraction * kWidth);
  std::fprintf(stderr, "\r%s [%.*s%*s] %3d%%", label_.c_str(), filled,
               "##############################", kWidth - filled, "", int(fraction * 100));
  std::fflush(stderr);
}

void ProgressBar::finish() {
  if (finished_) return;
  finished_ = true;
  if (!enabled_) return;
  done_ = total_;
  draw();
  std::fputc('\n', stderr);
}

}  // namespace pagoda
