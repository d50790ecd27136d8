#include "pagoda/backend/cpu/thread_pool.h"

#include <immintrin.h>
#include <omp.h>

#include <chrono>

namespace pagoda::cpu {
namespace {

// How long an idle thread polls before it sleeps. A decode step's ops follow each other within
// tens of microseconds, so a wait that short is answered without a futex wake-up (which costs
// several microseconds and a trip through the scheduler); a longer one means the step is over,
// and the core is better left to others.
constexpr auto kSpin = std::chrono::microseconds(50);

// Polls `value` until it differs from `old`, spinning for up to kSpin, then sleeping.
template <class T>
T wait_change(const std::atomic<T>& value, T old) {
  T now = value.load(std::memory_order_acquire);
  if (now != old) return now;
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    _mm_pause();
    now = value.load(std::memory_order_acquire);
    if (now != old) return now;
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) break;
  }
  while ((now = value.load(std::memory_order_acquire)) == old) value.wait(old, std::memory_order_acquire);
  return now;
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_main(); });
}

ThreadPool::~ThreadPool() {
  stopping_ = true;
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

ThreadPool& ThreadPool::shared() {
  static ThreadPool pool(omp_get_max_threads());
  return pool;
}

void ThreadPool::work() {
  for (int64_t i; (i = next_task_.fetch_add(1, std::memory_order_relaxed)) < tasks_;) fn_(context_, i);
}

void ThreadPool::worker_main() {
  uint32_t seen = 0;
  for (;;) {
    seen = wait_change(generation_, seen);
    if (stopping_) return;
    work();
    if (busy_.fetch_sub(1, std::memory_order_acq_rel) == 1) busy_.notify_one();
  }
}

void ThreadPool::run(int64_t tasks, void (*fn)(void*, int64_t), void* context) {
  if (tasks <= 0) return;
  if (workers_.empty() || tasks == 1) {
    for (int64_t i = 0; i < tasks; ++i) fn(context, i);
    return;
  }
  std::lock_guard lock(run_mutex_);
  tasks_ = tasks, fn_ = fn, context_ = context;
  next_task_.store(0, std::memory_order_relaxed);
  busy_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  work();
  for (int busy; (busy = busy_.load(std::memory_order_acquire)) != 0;) wait_change(busy_, busy);
}

}  // namespace pagoda::cpu
