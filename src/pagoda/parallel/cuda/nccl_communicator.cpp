#include "pagoda/parallel/cuda/nccl_communicator.h"

#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <set>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/core/error.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "pagoda needs NCCL 2.18 or newer (nonblocking communicators, ncclCommFinalize)"
#endif

namespace pagoda::parallel {

using Clock = std::chrono::steady_clock;
using pagoda::cuda::check_cuda;

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::kF32: return ncclFloat32;
    case DType::kF16: return ncclFloat16;
    case DType::kBF16: return ncclBfloat16;
    default: fail(ErrorKind::kInvalidArgument, "collectives take f32, f16 or bf16 tensors");
  }
}

double seconds(std::chrono::milliseconds d) { return double(d.count()) / 1000.0; }

// A nonblocking communicator's call may return ncclInProgress: poll (host only, so this is safe
// inside graph capture) until it is done or failed.
ncclResult_t settle(ncclComm_t comm, ncclResult_t result, Clock::time_point deadline) {
  while (result == ncclInProgress) {
    if (Clock::now() > deadline) return ncclInProgress;
    std::this_thread::yield();
    ncclCommGetAsyncError(comm, &result);
  }
  return result;
}

}  // namespace

// ---- GpuClique ---------------------------------------------------------------------------------

GpuClique::GpuClique(std::vector<int> gpus, GpuCliqueOptions options) : gpus_(std::move(gpus)), options_(options) {
  static_assert(sizeof(ncclUniqueId) == sizeof(nccl_id_));
  int present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess) present = 0;
  if (gpus_.empty()) fail(ErrorKind::kInvalidArgument, "tensor parallelism needs at least one GPU");
  if (int(gpus_.size()) > present) {
    fail(ErrorKind::kInvalidArgument, "tensor parallelism needs one GPU per rank: {} ranks, {} GPUs present",
         gpus_.size(), present);
  }
  std::set<int> seen;
  for (int g : gpus_) {
    if (g < 0 || g >= present) fail(ErrorKind::kInvalidArgument, "GPU {} does not exist ({} present)", g, present);
    if (!seen.insert(g).second) fail(ErrorKind::kInvalidArgument, "GPU {} is named for two ranks", g);
  }
  options_.one_shot_max_bytes -= options_.one_shot_max_bytes % 16;

  one_shot_available_ = options_.one_shot_max_bytes > 0 && world_size() <= cuda::kMaxRanks;
  for (int a : gpus_) {
    for (int b : gpus_) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) one_shot_available_ = false;
    }
  }

  // Before NCCL reads its environment (ncclGetUniqueId is its first call); a value the user set
  // is kept. Connections are made at start-up rather than at a collective's first call: that
  // first call may come inside graph capture, where the set-up's CUDA calls are not allowed.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    fail(ErrorKind::kInternal, "NCCL ncclGetUniqueId: {}", ncclGetErrorString(r));
  }
  std::memcpy(nccl_id_, &id, sizeof(id));

  check_cuda(cudaHostAlloc(&abort_word_, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
             "cudaHostAlloc (abort word)");
  *abort_word_ = 0;
  for (int r = 0; r < world_size(); ++r) ranks_.push_back(std::make_unique<Rank>());
  watchdog_ = std::thread([this] { watch(); });
}

GpuClique::~GpuClique() {
  stop_ = true;
  watchdog_.join();
  cudaFreeHost(abort_word_);
}

void GpuClique::abort(const std::string& reason) {
  {
    std::lock_guard lock(state_mutex_);
    if (aborted_) return;
    abort_reason_ = reason;
    aborted_ = true;
    *reinterpret_cast<volatile int*>(abort_word_) = 1;
  }
  joined_cv_.notify_all();
  for (auto& slot : ranks_) {
    std::lock_guard lock(slot->mutex);
    if (slot->comm) {
      ncclCommAbort(slot->comm);
      slot->comm = nullptr;
    }
  }
}

void GpuClique::check() const {
  if (!aborted_) return;
  std::lock_guard lock(state_mutex_);
  throw Error(ErrorKind::kInternal, abort_reason_);
}

void GpuClique::join(int rank, Clock::time_point deadline) {
  std::unique_lock lock(state_mutex_);
  // NCCL's unique id starts one communicator per rank: a second would wait on a clique that has
  // moved on, and fail after NCCL's own timeout with a reason that names the network.
  if (ranks_[rank]->joined)
    fail(ErrorKind::kInvalidArgument, "rank {} joined these GPU collectives already: a clique makes one communicator per rank",
         rank);
  ranks_[rank]->joined = true;
  ++joined_;
  joined_cv_.notify_all();
  if (!joined_cv_.wait_until(lock, deadline, [&] { return joined_ == world_size() || aborted_; })) {
    std::string missing;
    for (int r = 0; r < world_size(); ++r) {
      if (!ranks_[r]->joined) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    lock.unlock();
    abort(fmt::format("rank(s) {} did not join the GPU collectives within {} s", missing, seconds(options_.timeout)));
  } else {
    lock.unlock();
  }
  check();
}

void GpuClique::watch() {
  while (!stop_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (aborted_) continue;
    for (int r = 0; r < world_size() && !aborted_; ++r) {
      Rank& slot = *ranks_[r];
      std::string reason;
      {
        std::lock_guard lock(slot.mutex);
        ncclResult_t state = ncclSuccess;
        if (slot.comm && ncclCommGetAsyncError(slot.comm, &state) == ncclSuccess && state != ncclSuccess &&
            state != ncclInProgress) {
          reason = fmt::format("rank {}: NCCL failed: {} ({})", r, ncclGetErrorString(state), ncclGetLastError(slot.comm));
        } else if (slot.status && *reinterpret_cast<volatile int*>(slot.status) == cuda::kOneShotPeerTimeout) {
          reason = fmt::format("rank {}: a peer did not reach the all-reduce within {} s: a rank died or stalled", r,
                               seconds(options_.timeout));
        } else if (slot.pending) {
          cudaSetDevice(gpus_[r]);
          cudaError_t q = cudaEventQuery(slot.last);
          if (q != cudaErrorNotReady) {
            slot.pending = false;
          } else if (Clock::now() - slot.last_enqueued > options_.timeout) {
            reason = fmt::format("rank {}: a collective has not completed after {} s: a rank died or stalled", r,
                                 seconds(options_.timeout));
          }
        }
      }
      if (!reason.empty()) abort(reason);
    }
  }
}

// ---- NcclCommunicator --------------------------------------------------------------------------

NcclCommunicator::NcclCommunicator(std::shared_ptr<GpuClique> clique, int rank, cudaStream_t stream)
    : clique_(std::move(clique)), rank_(rank), stream_(stream) {
  GpuClique& c = *clique_;
  if (rank < 0 || rank >= c.world_size()) fail(ErrorKind::kInvalidArgument, "rank {} of {}", rank, c.world_size());
  GpuClique::Rank& slot = *c.ranks_[rank];
  const int world = c.world_size();
  const Clock::time_point deadline = Clock::now() + c.options_.timeout;
  check_cuda(cudaSetDevice(c.gpu(rank)), "cudaSetDevice");

  try {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclUniqueId id;
    std::memcpy(&id, c.nccl_id_, sizeof(id));
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, world, id, rank, &config);
    // Polled here rather than in settle(): the clique aborting is a reason to stop waiting too.
    while (r == ncclInProgress && Clock::now() < deadline && !c.aborted()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ncclCommGetAsyncError(comm, &r);
    }
    if (r != ncclSuccess) {
      if (comm) ncclCommAbort(comm);
      c.check();
      if (r == ncclInProgress) {
        c.abort(fmt::format("rank {}: NCCL start-up did not complete within {} s: a rank did not join", rank,
                            seconds(c.options_.timeout)));
      } else {
        c.abort(fmt::format("rank {}: NCCL start-up failed: {}", rank, ncclGetErrorString(r)));
      }
      c.check();
    }
    {
      std::lock_guard lock(slot.mutex);
      slot.comm = comm;
    }
    // The abort may have come between the wait and the store: the comm would then escape it.
    if (c.aborted()) {
      std::lock_guard lock(slot.mutex);
      if (slot.comm) ncclCommAbort(slot.comm);
      slot.comm = nullptr;
      c.check();
    }

    check_cuda(cudaEventCreateWithFlags(&slot.last, cudaEventDisableTiming), "cudaEventCreate");
    if (c.one_shot_available()) {
      for (int p = 0; p < world; ++p) {
        if (p == rank) continue;
        cudaError_t e = cudaDeviceEnablePeerAccess(c.gpu(p), 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) {
          cudaGetLastError();  // not an error here; clear it
        } else {
          check_cuda(e, "cudaDeviceEnablePeerAccess");
        }
      }
      const size_t capacity = c.options_.one_shot_max_bytes;
      void* base = nullptr;
      check_cuda(cudaMalloc(&base, cuda::one_shot_buffer_bytes(capacity)), "cudaMalloc (one-shot buffers)");
      slot.one_shot = cuda::one_shot_buffers_at(static_cast<std::byte*>(base), capacity);
      check_cuda(cudaMemset(base, 0, cuda::one_shot_buffer_bytes(capacity)), "cudaMemset");
      check_cuda(cudaHostAlloc(&slot.status, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable),
                 "cudaHostAlloc (one-shot status)");
      *slot.status = cuda::kOneShotOk;
      check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    }
  } catch (const Error& e) {
    c.abort(fmt::format("rank {}: {}", rank, e.what()));
    release();
    throw;
  }

  // Every rank's buffers exist once all have joined.
  try {
    c.join(rank, deadline);
  } catch (...) {
    release();
    throw;
  }
  if (c.one_shot_available()) {
    one_shot_.capacity = c.options_.one_shot_max_bytes;
    one_shot_.rank = rank;
    one_shot_.world = world;
    for (int p = 0; p < world; ++p) {
      one_shot_.staging[p] = c.ranks_[p]->one_shot.staging;
      one_shot_.flags[p] = c.ranks_[p]->one_shot.flags;
    }
    one_shot_.calls = slot.one_shot.calls;
    one_shot_.status = slot.status;
    one_shot_.abort = c.abort_word_;
    one_shot_.timeout_ns = uint64_t(c.options_.timeout.count()) * 1000000;
  }
}

NcclCommunicator::~NcclCommunicator() { release(); }

void NcclCommunicator::release() {
  GpuClique& c = *clique_;
  GpuClique::Rank& slot = *c.ranks_[rank_];
  cudaSetDevice(c.gpu(rank_));
  std::lock_guard lock(slot.mutex);
  if (slot.comm) {
    // Finalizing flushes what is still queued, which needs the peers: bounded by the timeout.
    ncclResult_t r = ncclCommFinalize(slot.comm);
    r = settle(slot.comm, r, Clock::now() + c.options_.timeout);
    if (r == ncclSuccess) {
      ncclCommDestroy(slot.comm);
    } else {
      ncclCommAbort(slot.comm);
    }
    slot.comm = nullptr;
  }
  if (slot.last) cudaEventDestroy(slot.last);
  slot.last = nullptr;
  slot.pending = false;
  if (slot.one_shot.staging) cudaFree(slot.one_shot.staging);
  slot.one_shot = {};
  if (slot.status) cudaFreeHost(slot.status);
  slot.status = nullptr;
}

void NcclCommunicator::check() {
  clique_->check();
  if (one_shot_.status && *reinterpret_cast<volatile int*>(one_shot_.status) == cuda::kOneShotPeerTimeout) {
    clique_->abort(fmt::format("rank {}: a peer did not reach the all-reduce within {} s: a rank died or stalled", rank_,
                               seconds(clique_->options().timeout)));
    clique_->check();
  }
}

void NcclCommunicator::check_tensor(const Tensor& x, const char* what) const {
  if (x.device != Device::kCuda || !x.is_contiguous()) {
    fail(ErrorKind::kInvalidArgument, "{}: the tensor must be contiguous on the GPU", what);
  }
  nccl_type(x.dtype);
}

void NcclCommunicator::mark_enqueued(GpuClique::Rank& slot) {
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) return;
  check_cuda(cudaEventRecord(slot.last, stream_), "cudaEventRecord");
  slot.last_enqueued = Clock::now();
  slot.pending = true;
}

void NcclCommunicator::all_reduce_sum(Tensor x) {
  if (world_size() == 1) return;
  const size_t bytes = x.nbytes();
  // Decided by the size alone, the same on every rank (a rank taking the other path would leave
  // its peers waiting); a misaligned x is a caller's bug, which one_shot_all_reduce rejects.
  if (clique_->one_shot_available() && bytes <= one_shot_.capacity && bytes % 16 == 0) {
    all_reduce_sum_one_shot(x);
  } else {
    all_reduce_sum_nccl(x);
  }
}

void NcclCommunicator::all_reduce_sum_nccl(Tensor x) {
  check_tensor(x, "all_reduce_sum");
  check();
  GpuClique::Rank& slot = *clique_->ranks_[rank_];
  std::string failure;
  {
    std::lock_guard lock(slot.mutex);
    if (!slot.comm) {
      failure = "the NCCL communicator was aborted";
    } else {
      ncclResult_t r = ncclAllReduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), ncclSum, slot.comm, stream_);
      r = settle(slot.comm, r, Clock::now() + clique_->options().timeout);
      if (r != ncclSuccess) {
        failure = r == ncclInProgress
                      ? fmt::format("rank {}: NCCL all-reduce not enqueued after {} s: a rank died or stalled", rank_,
                                    seconds(clique_->options().timeout))
                      : fmt::format("rank {}: NCCL all-reduce failed: {}", rank_, ncclGetErrorString(r));
      } else {
        mark_enqueued(slot);
      }
    }
  }
  if (!failure.empty()) {
    clique_->abort(failure);
    clique_->check();
  }
}

void NcclCommunicator::all_reduce_sum_one_shot(Tensor x) {
  check_tensor(x, "all_reduce_sum");
  if (!clique_->one_shot_available()) {
    fail(ErrorKind::kUnsupported, "the one-shot all-reduce needs peer access between every pair of GPUs");
  }
  if (x.nbytes() > one_shot_.capacity || x.nbytes() % 16 != 0) {
    fail(ErrorKind::kInvalidArgument, "the one-shot all-reduce takes a multiple of 16 bytes up to {}; got {}",
         one_shot_.capacity, x.nbytes());
  }
  check();
  cuda::one_shot_all_reduce(one_shot_, x.data, x.nbytes(), x.dtype, stream_);
  GpuClique::Rank& slot = *clique_->ranks_[rank_];
  std::lock_guard lock(slot.mutex);
  mark_enqueued(slot);
}

void NcclCommunicator::all_gather(const Tensor& x, Tensor out) {
  check_tensor(x, "all_gather");
  check_tensor(out, "all_gather");
  const int world = world_size();
  if (x.ndim != 2 || out.ndim != 2 || out.dtype != x.dtype || out.size(0) != x.size(0) ||
      out.size(1) != x.size(1) * world) {
    fail(ErrorKind::kInvalidArgument, "all_gather: x [n, m] and out [n, {} x m] of one dtype", world);
  }
  const size_t rows = size_t(x.size(0));
  const size_t row_bytes = dtype_bytes(x.dtype, x.size(1));
  if (world == 1) {
    if (out.data != x.data) {
      check_cuda(cudaMemcpyAsync(out.data, x.data, x.nbytes(), cudaMemcpyDeviceToDevice, stream_), "all_gather copy");
    }
    return;
  }
  check();
  // NCCL stacks the ranks' x; with more than one row they are then put side by side.
  void* stacked = rows == 1 ? out.data : gather_scratch(out.nbytes());
  GpuClique::Rank& slot = *clique_->ranks_[rank_];
  std::string failure;
  {
    std::lock_guard lock(slot.mutex);
    if (!slot.comm) {
      failure = "the NCCL communicator was aborted";
    } else {
      ncclResult_t r = ncclAllGather(x.data, stacked, size_t(x.numel()), nccl_type(x.dtype), slot.comm, stream_);
      r = settle(slot.comm, r, Clock::now() + clique_->options().timeout);
      if (r != ncclSuccess) {
        failure = r == ncclInProgress
                      ? fmt::format("rank {}: NCCL all-gather not enqueued after {} s: a rank died or stalled", rank_,
                                    seconds(clique_->options().timeout))
                      : fmt::format("rank {}: NCCL all-gather failed: {}", rank_, ncclGetErrorString(r));
      } else {
        mark_enqueued(slot);
      }
    }
  }
  if (!failure.empty()) {
    clique_->abort(failure);
    clique_->check();
  }
  if (stacked == out.data) return;
  for (int r = 0; r < world; ++r) {
    check_cuda(cudaMemcpy2DAsync(static_cast<std::byte*>(out.data) + r * row_bytes, world * row_bytes,
                                 static_cast<std::byte*>(stacked) + r * rows * row_bytes, row_bytes, row_bytes, rows,
                                 cudaMemcpyDeviceToDevice, stream_),
               "all_gather columns");
  }
}

void* NcclCommunicator::gather_scratch(size_t bytes) {
  if (!gather_scratch_.empty() && gather_scratch_.back().bytes() >= bytes) return gather_scratch_.back().data();
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  check_cuda(cudaStreamIsCapturing(stream_, &capturing), "cudaStreamIsCapturing");
  if (capturing != cudaStreamCaptureStatusNone) {
    fail(ErrorKind::kInternal, "all_gather of {} bytes first seen inside graph capture (run the step eagerly first)",
         bytes);
  }
  const size_t grown = gather_scratch_.empty() ? bytes : std::max(bytes, 2 * gather_scratch_.back().bytes());
  gather_scratch_.emplace_back(grown);
  return gather_scratch_.back().data();
}

std::vector<std::unique_ptr<NcclCommunicator>> make_nccl_communicators(std::span<const int> gpus,
                                                                       std::span<const cudaStream_t> streams,
                                                                       const GpuCliqueOptions& options) {
  if (gpus.size() != streams.size()) fail(ErrorKind::kInvalidArgument, "one stream per GPU");
  auto clique = std::make_shared<GpuClique>(std::vector<int>(gpus.begin(), gpus.end()), options);
  const int world = clique->world_size();
  std::vector<std::unique_ptr<NcclCommunicator>> comms(world);
  std::vector<std::exception_ptr> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        comms[r] = std::make_unique<NcclCommunicator>(clique, r, streams[r]);
      } catch (...) {
        failures[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // The first failure in time is the clique's abort reason; without one, a rank's own error.
  for (int r = 0; r < world; ++r) {
    if (failures[r]) {
      comms.clear();
      clique->check();
      std::rethrow_exception(failures[r]);
    }
  }
  return comms;
}

}  // namespace pagoda::parallel
