#include "pagoda/backend/cpu/thread_pool.h"

#include <immintrin.h>
#include <omp.h>

#include <chrono>

#include "pagoda/core/error.h"

namespace pagoda::cpu {
namespace {

// How long an idle thread polls before it sleeps. A decode step's ops follow each other within
// tens of microseconds, so a wait that short is answered without a futex wake-up (which costs
// several microseconds and a trip through the scheduler); a longer one means the step is over,
// and the core is better left to others.
constexpr auto kSpin = std::chrono::microseconds(50);

constexpr uint64_t kTaskBits = 24, kTaskMask = (uint64_t(1) << kTaskBits) - 1;

uint64_t pack(uint32_t job, uint64_t tasks, uint64_t next) {
  return uint64_t(job & 0xffff) << (2 * kTaskBits) | tasks << kTaskBits | next;
}

// Polls until value differs from old, spinning for up to kSpin, then sleeping.
uint32_t wait_change(const std::atomic<uint32_t>& value, uint32_t old) {
  uint32_t now = value.load(std::memory_order_acquire);
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
  stopping_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

namespace {
thread_local ThreadPool* bound_pool = nullptr;
}  // namespace

ThreadPool& ThreadPool::shared() {
  if (bound_pool) return *bound_pool;
  static ThreadPool pool(omp_get_max_threads());
  return pool;
}

void ThreadPool::bind_to_this_thread(ThreadPool* pool) { bound_pool = pool; }

void ThreadPool::work(uint32_t job) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint64_t tasks = claim >> kTaskBits & kTaskMask, next = claim & kTaskMask;
    if ((claim >> (2 * kTaskBits)) != (job & 0xffff) || next >= tasks) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    // The task is ours and unfinished, so its job is still the current one: fn_ and context_
    // are that job's.
    fn_.load(std::memory_order_relaxed)(context_.load(std::memory_order_relaxed), int64_t(next));
    if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == tasks) done_.notify_all();
    claim = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::worker_main() {
  uint32_t seen = 0;
  for (;;) {
    seen = wait_change(generation_, seen);
    if (stopping_.load(std::memory_order_relaxed)) return;
    work(seen);
  }
}

void ThreadPool::run(int64_t tasks, void (*fn)(void*, int64_t), void* context) {
  if (tasks <= 0) return;
  if (tasks > int64_t(kTaskMask)) fail(ErrorKind::kInternal, "thread pool: {} tasks in one call", tasks);
  if (workers_.empty() || tasks == 1) {
    for (int64_t i = 0; i < tasks; ++i) fn(context, i);
    return;
  }
  std::lock_guard lock(run_mutex_);
  const uint32_t job = generation_.load(std::memory_order_relaxed) + 1;
  fn_.store(fn, std::memory_order_relaxed);
  context_.store(context, std::memory_order_relaxed);
  done_.store(0, std::memory_order_relaxed);
  claim_.store(pack(job, uint64_t(tasks), 0), std::memory_order_release);
  generation_.store(job, std::memory_order_release);
  generation_.notify_all();
  work(job);
  for (uint32_t done; (done = done_.load(std::memory_order_acquire)) != uint32_t(tasks);) wait_change(done_, done);
}

}  // namespace pagoda::cpu
