// A small pool of worker threads for the CPU backend, made for a machine that other processes
// share. Two things differ from OpenMP's fork/join:
// - No barrier: tasks are claimed one at a time from a shared counter and the caller returns as
//   soon as every task is done, so a worker the OS has descheduled holds up nothing unless it
//   is running a task; the caller takes the tasks no one else picks up. (An OpenMP region waits
//   for every thread of the team, and on an oversubscribed machine that wait is a scheduler
//   quantum, several times per layer.)
// - Idle workers spin only briefly (long enough to catch the next op of the same step), then
//   sleep on a futex (std::atomic::wait), leaving the core to whoever else needs it.
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

  // Runs fn(i) for every i in [0, tasks) (tasks < 2^24), spread over the threads; returns when
  // all are done. Calls from several threads at once run one after the other.
  template <class Fn>
  void parallel_for(int64_t tasks, Fn&& fn) {
    run(tasks, [](void* f, int64_t i) { (*static_cast<Fn*>(f))(i); }, &fn);
  }

  // The calling thread's pool: the one bound to it by bind_to_this_thread (a tensor-parallel
  // rank's share of the cores), else the process's, of omp_get_max_threads() threads at its first
  // use (--threads sets that).
  static ThreadPool& shared();
  static void bind_to_this_thread(ThreadPool* pool);

 private:
  void run(int64_t tasks, void (*fn)(void*, int64_t), void* context);
  // Claims and runs tasks of job `job` while there are any left.
  void work(uint32_t job);
  void worker_main();

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  // The current job: its number (16 bits), its task count (24) and the next unclaimed task (24),
  // in one word, so that a worker waking late can never claim a task of a job that has ended.
  std::atomic<uint64_t> claim_{0};
  std::atomic<uint32_t> generation_{0};  // the job number, 32-bit for futex waits
  std::atomic<uint32_t> done_{0};        // tasks of the current job finished
  std::atomic<void (*)(void*, int64_t)> fn_{nullptr};
  std::atomic<void*> context_{nullptr};
  std::atomic<bool> stopping_{false};
};

}  // namespace pagoda::cpu
