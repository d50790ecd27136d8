#include "pagoda/parallel/cpu_communicator.h"

#include <immintrin.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::parallel {

// The state the ranks share: one slot per rank for the address it publishes, and a barrier that
// times out.
class CpuRendezvous {
 public:
  CpuRendezvous(int world_size, std::chrono::milliseconds timeout)
      : world_size_(world_size), timeout_(timeout), slots_(size_t(world_size)) {}

  int world_size() const { return world_size_; }
  const void*& slot(int rank) { return slots_[size_t(rank)]; }

  // Returns when every rank has arrived; throws when one does not within the timeout, or when the
  // group was aborted.
  void arrive_and_wait(int rank) {
    std::unique_lock lock(mutex_);
    if (!failure_.empty()) fail(ErrorKind::kInternal, "{}", failure_);
    const uint32_t generation = generation_.load(std::memory_order_relaxed);
    arrived_mask_ |= uint64_t(1) << rank;
    if (++arrived_ == world_size_) {
      arrived_ = 0;
      arrived_mask_ = 0;
      generation_.store(generation + 1, std::memory_order_release);
      ready_.notify_all();
      return;
    }
    lock.unlock();
    // The others are usually a few microseconds behind (the ranks run the same ops): poll before
    // sleeping, but briefly, as ranks may outnumber the cores.
    for (int i = 0; i < 2000; ++i) {
      if (generation_.load(std::memory_order_acquire) != generation) return;
      _mm_pause();
    }
    lock.lock();
    const bool arrived = ready_.wait_for(lock, timeout_, [&] {
      return generation_.load(std::memory_order_acquire) != generation || !failure_.empty();
    });
    if (generation_.load(std::memory_order_acquire) != generation) return;
    if (arrived) fail(ErrorKind::kInternal, "{}", failure_);
    std::string missing;
    for (int r = 0; r < world_size_; ++r)
      if (!(arrived_mask_ >> r & 1)) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    failure_ = fmt::format("tensor parallel: rank {} waited {} ms at a collective for rank(s) {}, which never came",
                           rank, timeout_.count(), missing);
    ready_.notify_all();
    fail(ErrorKind::kInternal, "{}", failure_);
  }

  void abort(const std::string& reason) {
    std::lock_guard lock(mutex_);
    if (failure_.empty()) failure_ = "tensor parallel: stopped: " + reason;
    ready_.notify_all();
  }

 private:
  const int world_size_;
  const std::chrono::milliseconds timeout_;
  std::vector<const void*> slots_;
  std::mutex mutex_;
  std::condition_variable ready_;
  int arrived_ = 0;
  uint64_t arrived_mask_ = 0;
  std::atomic<uint32_t> generation_{0};
  std::string failure_;  // non-empty: the group is aborted
};

namespace {

float load(const void* base, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    default: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
}

void store(void* base, DType dtype, int64_t i, float v) {
  switch (dtype) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kF16: static_cast<uint16_t*>(base)[i] = f32_to_f16(v); break;
    default: static_cast<uint16_t*>(base)[i] = f32_to_bf16(v); break;
  }
}

class CpuCommunicator final : public Communicator {
 public:
  CpuCommunicator(std::shared_ptr<CpuRendezvous> rendezvous, int rank)
      : rendezvous_(std::move(rendezvous)), rank_(rank) {}

  int rank() const override { return rank_; }
  int world_size() const override { return rendezvous_->world_size(); }

  void all_reduce_sum(Tensor x) override {
    if (x.device != Device::kCpu || !x.is_contiguous() ||
        (x.dtype != DType::kF32 && x.dtype != DType::kF16 && x.dtype != DType::kBF16))
      fail(ErrorKind::kInternal, "all_reduce_sum: a contiguous f32/f16/bf16 host tensor, not {} {}",
           dtype_name(x.dtype), x.shape_string());
    const Timer timer(seconds_);
    const int64_t n = x.numel();
    sum_.resize(size_t(n));
    rendezvous_->slot(rank_) = x.data;
    rendezvous_->arrive_and_wait(rank_);
    std::memset(sum_.data(), 0, sum_.size() * sizeof(float));
    for (int r = 0; r < world_size(); ++r) {
      const void* other = rendezvous_->slot(r);
      if (x.dtype == DType::kF32) {
        const float* values = static_cast<const float*>(other);
        for (int64_t i = 0; i < n; ++i) sum_[size_t(i)] += values[i];
      } else {
        for (int64_t i = 0; i < n; ++i) sum_[size_t(i)] += load(other, x.dtype, i);
      }
    }
    rendezvous_->arrive_and_wait(rank_);  // every rank has read every input
    if (x.dtype == DType::kF32) {
      std::memcpy(x.data, sum_.data(), size_t(n) * sizeof(float));
    } else {
      for (int64_t i = 0; i < n; ++i) store(x.data, x.dtype, i, sum_[size_t(i)]);
    }
  }

  void all_gather(const Tensor& x, Tensor out) override {
    if (x.ndim != 2 || out.ndim != 2 || !x.is_contiguous() || !out.is_contiguous() || x.dtype != out.dtype ||
        is_block_quantized(x.dtype) || out.size(0) != x.size(0) || out.size(1) != x.size(1) * world_size())
      fail(ErrorKind::kInternal, "all_gather: x {} and out {} are not [n, m] and [n, {} m] of one dtype",
           x.shape_string(), out.shape_string(), world_size());
    const Timer timer(seconds_);
    const size_t row_bytes = dtype_bytes(x.dtype, x.size(1));
    rendezvous_->slot(rank_) = x.data;
    rendezvous_->arrive_and_wait(rank_);
    for (int r = 0; r < world_size(); ++r) {
      const auto* in = static_cast<const std::byte*>(rendezvous_->slot(r));
      auto* dst = static_cast<std::byte*>(out.data) + size_t(r) * row_bytes;
      for (int64_t row = 0; row < x.size(0); ++row)
        std::memcpy(dst + size_t(row) * row_bytes * size_t(world_size()), in + size_t(row) * row_bytes, row_bytes);
    }
    rendezvous_->arrive_and_wait(rank_);
  }

  void abort(const std::string& reason) override { rendezvous_->abort(reason); }
  double seconds_in_collectives() const override { return seconds_; }

 private:
  struct Timer {
    explicit Timer(double& total) : total(total) {}
    ~Timer() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
    double& total;
    std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  };

  std::shared_ptr<CpuRendezvous> rendezvous_;
  const int rank_;
  std::vector<float> sum_;
  double seconds_ = 0;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_cpu_communicators(int world_size, std::chrono::milliseconds timeout) {
  if (world_size < 1 || world_size > 64) fail(ErrorKind::kInvalidArgument, "{} ranks: 1 to 64", world_size);
  auto rendezvous = std::make_shared<CpuRendezvous>(world_size, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < world_size; ++r) out.push_back(std::make_unique<CpuCommunicator>(rendezvous, r));
  return out;
}

}  // namespace pagoda::parallel
