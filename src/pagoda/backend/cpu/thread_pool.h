// A small pool of worker threads for the CPU backend's matmuls, made for a machine that other
// processes share. Idle workers spin only briefly (long enough to catch the next op of the same
// step) and then sleep on a futex (std::atomic::wait), so they do not burn a core that another
// process, or this process's other threads, could use; and tasks are claimed one at a time from a
// shared counter, so a thread the OS descheduled holds up at most the one task it is running
// while the others take the rest.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace pagoda::cpu {

class ThreadPool {
 public:
  // threads - 1 workers; the calling thread is the last one.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return int(workers_.size()) + 1; }

  // Runs fn(i) for every i in [0, tasks), spread over the threads; returns when all are done.
  // Calls from several threads at once run one after the other.
  template <class Fn>
  void parallel_for(int64_t tasks, Fn&& fn) {
    run(tasks, [](void* f, int64_t i) { (*static_cast<Fn*>(f))(i); }, &fn);
  }

  // The process's pool, of omp_get_max_threads() threads at its first use (--threads sets that).
  static ThreadPool& shared();

 private:
  void run(int64_t tasks, void (*fn)(void*, int64_t), void* context);
  void work();
  void worker_main();

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::atomic<uint32_t> generation_{0};  // bumped once per job; workers wait for it to change
  std::atomic<int> busy_{0};             // workers not yet done with the current job
  std::atomic<int64_t> next_task_{0};
  int64_t tasks_ = 0;
  void (*fn_)(void*, int64_t) = nullptr;
  void* context_ = nullptr;
  bool stopping_ = false;
};

}  // namespace pagoda::cpu
