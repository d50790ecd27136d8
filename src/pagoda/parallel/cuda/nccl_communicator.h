// The collectives between the GPUs of one process's ranks (one thread per GPU, docs/design.md
// "Tensor parallelism"), on each rank's backend stream so that they order with the ops around
// them and a CUDA graph captures them: NCCL for every collective, and for all-reduces of at most
// GpuCliqueOptions::one_shot_max_bytes the one-shot kernel (one_shot_all_reduce.h): one launch
// and one barrier, where NCCL's latency at decode's few-KB messages is several dependent steps.
//
// NVLink multicast (NVLS) is never used: NCCL_NVLS_ENABLE=0 is set before NCCL starts unless the
// environment already says otherwise (multicast objects can take a shared host's GPUs out of
// service, and a decode all-reduce gains nothing from them).
//
// Faults: every NCCL communicator is nonblocking, so start-up and every call poll with a deadline
// instead of blocking. A watchdog thread polls each rank's NCCL async error, the one-shot
// kernel's status word and the completion of the last collective enqueued outside a graph; when
// one fails or a collective is not done within the timeout (a rank died or stalled), it aborts
// the clique: every rank's NCCL communicator is aborted (its kernels waiting on a peer return),
// the one-shot kernels stop waiting, and every rank's next collective or check() throws one
// Error naming the first failure. A rank whose thread fails calls abort() (the tensor-parallel
// rank loop does), so the others stop at once. Collectives replayed from a graph are not timed
// (nothing runs on the host then): a peer that stops there is caught by the one-shot kernel's
// own timeout, which the watchdog turns into an abort of the rest, but not while it waits in
// NCCL alone.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/parallel/communicator.h"
#include "pagoda/parallel/cuda/one_shot_all_reduce.h"

typedef struct ncclComm* ncclComm_t;

namespace pagoda::parallel {

// Messages up to this many bytes take the one-shot kernel. 64 KiB covers decode's hidden states
// up to batch 8 at hidden 4096 in f16; `pagoda bench allreduce` on the GPUs in use reports the
// largest size at which the one-shot kernel is still faster than NCCL (docs/kernels.md).
constexpr size_t kDefaultOneShotMaxBytes = 64 * 1024;

struct GpuCliqueOptions {
  // A rank that has not joined by then, or a collective enqueued outside a graph and not done by
  // then: the clique aborts.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
  // all_reduce_sum of at most this many bytes (a multiple of 16) takes the one-shot kernel, when
  // every pair of GPUs has peer access; 0: NCCL only.
  size_t one_shot_max_bytes = kDefaultOneShotMaxBytes;
};

// What the ranks of one process share: NCCL's unique id, every rank's one-shot buffers, the
// abort state and the watchdog. Made once before the ranks start; each rank then makes its
// NcclCommunicator on its own thread.
class GpuClique {
 public:
  // gpus[r]: rank r's device. Throws Error(kInvalidArgument) when one is absent or named twice.
  explicit GpuClique(std::vector<int> gpus, GpuCliqueOptions options = {});
  ~GpuClique();
  GpuClique(const GpuClique&) = delete;
  GpuClique& operator=(const GpuClique&) = delete;

  int world_size() const { return int(gpus_.size()); }
  int gpu(int rank) const { return gpus_[rank]; }
  const GpuCliqueOptions& options() const { return options_; }
  // Whether all_reduce_sum may take the one-shot kernel: every pair of GPUs has peer access, at
  // most kMaxRanks ranks, one_shot_max_bytes > 0.
  bool one_shot_available() const { return one_shot_available_; }

  // Stops every rank (see the top of this file); the first reason is the one every rank throws.
  void abort(const std::string& reason);
  bool aborted() const { return aborted_.load(); }
  // Throws Error(kInternal, reason) once the clique was aborted.
  void check() const;

 private:
  friend class NcclCommunicator;
  struct Rank {  // guarded by mutex; the watchdog reads it
    std::mutex mutex;
    ncclComm_t comm = nullptr;
    cuda::OneShotBuffers one_shot;
    int* status = nullptr;      // host-mapped, written by the one-shot kernel
    cudaEvent_t last = nullptr;  // after the last collective enqueued outside a graph
    std::chrono::steady_clock::time_point last_enqueued;
    bool pending = false;       // `last` was recorded and not yet seen complete
    bool joined = false;
  };

  // Called by each rank's communicator once its buffers are in place; returns when every rank
  // has joined. Throws when the deadline passes first or the clique aborts.
  void join(int rank, std::chrono::steady_clock::time_point deadline);
  void watch();

  std::vector<int> gpus_;
  GpuCliqueOptions options_;
  bool one_shot_available_ = false;
  char nccl_id_[128] = {};  // ncclUniqueId (NCCL_UNIQUE_ID_BYTES)
  int* abort_word_ = nullptr;  // host-mapped, read by the one-shot kernel
  std::vector<std::unique_ptr<Rank>> ranks_;

  mutable std::mutex state_mutex_;
  std::condition_variable joined_cv_;
  int joined_ = 0;
  std::string abort_reason_;
  std::atomic<bool> aborted_{false};

  std::atomic<bool> stop_{false};
  std::thread watchdog_;
};

class NcclCommunicator final : public Communicator {
 public:
  // On rank `rank`'s thread: makes the current device clique->gpu(rank) and joins NCCL and the
  // one-shot buffers with every other rank. `stream` (the rank backend's, on that device) carries
  // every collective. Throws Error when a rank does not join within the timeout.
  NcclCommunicator(std::shared_ptr<GpuClique> clique, int rank, cudaStream_t stream);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int world_size() const override { return clique_->world_size(); }
  // One rank: nothing to do. Otherwise the one-shot kernel when x is small enough, else NCCL.
  void all_reduce_sum(Tensor x) override;
  void all_gather(const Tensor& x, Tensor out) override;
  void abort(const std::string& reason) override { clique_->abort(reason); }

  // Each all-reduce path on its own (also with one rank), for the benchmark and the tests.
  void all_reduce_sum_nccl(Tensor x);
  void all_reduce_sum_one_shot(Tensor x);

  // Throws the clique's abort reason, or this rank's one-shot failure; a rank loop calls it once
  // per step (graph replays enqueue collectives without calling the communicator).
  void check();

 private:
  // Frees this rank's NCCL communicator (aborted when it cannot finalize within the timeout)
  // and buffers.
  void release();
  void check_tensor(const Tensor& x, const char* what) const;
  // all_gather's buffer of the stacked ranks, at least `bytes`. Grown outside graph capture only
  // (a step runs eagerly before it is captured); outgrown buffers are kept, since a captured
  // graph may still hold one.
  void* gather_scratch(size_t bytes);
  // After an enqueue outside graph capture: records the event the watchdog times.
  void mark_enqueued(GpuClique::Rank& slot);

  std::shared_ptr<GpuClique> clique_;
  int rank_;
  cudaStream_t stream_;
  cuda::OneShotArgs one_shot_;
  std::vector<pagoda::cuda::DeviceArray<std::byte>> gather_scratch_;
};

// One communicator per rank, rank r's on gpus[r] with streams[r] (its backend's): made on one
// thread per rank at once, as NCCL's start-up needs every rank. Throws the first rank's Error.
std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_communicators(std::span<const int> gpus,
                                                                       std::span<const cudaStream_t> streams,
                                                                       const GpuCliqueOptions& options);

}  // namespace pagoda::parallel
