#include "pagoda/model/tensor_parallel_model.h"

#include <algorithm>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/model/shard.h"
#include "pagoda/parallel/make_communicators.h"

namespace pagoda {
namespace {

// The exception a rank threw, as an Error naming the rank (its kind kept).
Error rank_error(int rank, std::exception_ptr thrown) {
  try {
    std::rethrow_exception(thrown);
  } catch (const Error& e) {
    return Error(e.kind(), fmt::format("tensor-parallel rank {}: {}", rank, e.what()));
  } catch (const std::exception& e) {
    return Error(ErrorKind::kInternal, fmt::format("tensor-parallel rank {}: {}", rank, e.what()));
  } catch (...) {
    return Error(ErrorKind::kInternal, fmt::format("tensor-parallel rank {}: an unknown exception", rank));
  }
}

}  // namespace

TensorParallelModel::TensorParallelModel(const Checkpoint& checkpoint, std::vector<std::unique_ptr<Backend>> backends,
                                         const LoadOptions& options, std::chrono::milliseconds collective_timeout) {
  check_tensor_parallel(checkpoint.config(), int(backends.size()));
  std::vector<Backend*> raw;
  for (const auto& backend : backends) raw.push_back(backend.get());
  auto communicators = parallel::make_communicators(raw, collective_timeout);
  ranks_.resize(backends.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    ranks_[r].backend = std::move(backends[r]);
    ranks_[r].communicator = std::move(communicators[r]);
  }
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r].thread = std::thread([this, r] { rank_main(int(r)); });
  try {
    on_ranks([&](int rank) {
      LoadOptions rank_options = options;
      rank_options.show_progress = options.show_progress && rank == 0;  // one bar, not N interleaved
      ranks_[size_t(rank)].model = std::make_unique<Model>(checkpoint, *ranks_[size_t(rank)].backend, rank_options,
                                                           ranks_[size_t(rank)].communicator.get());
    }, world_size());
  } catch (...) {
    stop_threads();
    throw;
  }
}

TensorParallelModel::~TensorParallelModel() { stop_threads(); }

void TensorParallelModel::stop_threads() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  start_.notify_all();
  for (Rank& rank : ranks_)
    if (rank.thread.joinable()) rank.thread.join();
}

void TensorParallelModel::rank_main(int rank) {
  ranks_[size_t(rank)].backend->bind_to_this_thread();
  uint64_t seen = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    start_.wait(lock, [&] { return stopping_ || job_number_ != seen; });
    if (stopping_) {
      // A rank's model, backend and communicator end on the thread its backend is bound to (a
      // GPU's memory is freed on its device); the communicator last, as NCCL finalizes one only
      // once the CUDA graphs that captured its collectives (the backend's) are gone.
      lock.unlock();
      Rank& own = ranks_[size_t(rank)];
      own.model.reset();
      own.backend.reset();
      own.communicator.reset();
      return;
    }
    seen = job_number_;
    if (rank >= job_ranks_) continue;
    const std::function<void(int)>& job = *job_;
    lock.unlock();
    try {
      job(rank);
    } catch (...) {
      const Error error = rank_error(rank, std::current_exception());
      {
        std::lock_guard failed(mutex_);
        if (!failure_) failure_ = std::make_exception_ptr(error);
      }
      ranks_[size_t(rank)].communicator->abort(error.what());
    }
    lock.lock();
    if (--running_ == 0) done_.notify_all();
  }
}

void TensorParallelModel::on_ranks(const std::function<void(int rank)>& job, int ranks) {
  std::unique_lock lock(mutex_);
  if (failure_) std::rethrow_exception(failure_);
  job_ = &job;
  job_ranks_ = ranks;
  running_ = ranks;
  ++job_number_;
  start_.notify_all();
  done_.wait(lock, [&] { return running_ == 0; });
  job_ = nullptr;
  if (failure_) std::rethrow_exception(failure_);
}

std::string TensorParallelModel::describe() const {
  if (ranks_[0].backend->device() == Device::kCpu)
    return fmt::format("{} ranks on the CPU, a thread and a share of the cores each, collectives through shared "
                       "memory",
                       world_size());
  return fmt::format("{} ranks, rank r on GPU r, collectives by NCCL (small all-reduces by the one-shot kernel)",
                     world_size());
}

double TensorParallelModel::time_all_reduce(int64_t rows, int calls, int rounds) {
  if (rows < 1 || calls < 1 || rounds < 1)
    fail(ErrorKind::kInvalidArgument, "time_all_reduce: {} rows, {} calls, {} rounds", rows, calls, rounds);
  double seconds = 0;
  on_ranks([&](int rank) {
    Backend& backend = *ranks_[size_t(rank)].backend;
    parallel::Communicator& communicator = *ranks_[size_t(rank)].communicator;
    const DType dtype = backend.activation_dtype();
    const int64_t hidden = config().hidden_size;
    const size_t bytes = size_t(rows * hidden) * dtype_size(dtype);
    const std::shared_ptr<Backend::Buffer> buffer = backend.allocate(bytes);
    backend.upload(buffer->data(), std::vector<std::byte>(bytes).data(), bytes);  // zeros stay zeros
    const Tensor x = Tensor::contiguous(buffer->data(), dtype, {rows, hidden}, backend.device());
    std::byte sink[16];
    const size_t sink_bytes = std::min(sizeof(sink), bytes);
    communicator.all_reduce_sum(x);  // first use (and the ranks meet)
    backend.download(sink, buffer->data(), sink_bytes);  // waits for the stream
    for (int round = 0; round < rounds; ++round) {
      const auto start = std::chrono::steady_clock::now();
      for (int c = 0; c < calls; ++c) communicator.all_reduce_sum(x);
      backend.download(sink, buffer->data(), sink_bytes);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / calls;
      if (rank == 0 && (round == 0 || s < seconds)) seconds = s;
    }
  }, world_size());
  return seconds;
}

size_t TensorParallelModel::weight_bytes() const {
  size_t bytes = 0;
  for (const Rank& rank : ranks_) bytes = std::max(bytes, rank.model->weight_bytes());
  return bytes;
}

size_t TensorParallelModel::kv_block_bytes(int32_t block_size) const {
  size_t bytes = 0;
  for (const Rank& rank : ranks_) bytes = std::max(bytes, rank.model->kv_block_bytes(block_size));
  return bytes;
}

size_t TensorParallelModel::allocate_kv_cache(int32_t num_blocks, int32_t block_size) {
  std::vector<size_t> bytes(ranks_.size());
  on_ranks([&](int rank) { bytes[size_t(rank)] = ranks_[size_t(rank)].model->allocate_kv_cache(num_blocks, block_size); },
           world_size());
  return *std::max_element(bytes.begin(), bytes.end());
}

void TensorParallelModel::reserve(int64_t max_rows, int64_t max_logit_rows) {
  on_ranks([&](int rank) { ranks_[size_t(rank)].model->reserve(max_rows, max_logit_rows); }, world_size());
}

void TensorParallelModel::copy_kv_block(int32_t src, int32_t dst) {
  on_ranks([&](int rank) { ranks_[size_t(rank)].model->copy_kv_block(src, dst); }, world_size());
}

void TensorParallelModel::run(std::span<const SequenceChunk> chunks,
                              const std::function<void(int32_t layer)>& after_layer_kv) {
  // Each rank holds only its kv heads' pages: moving a request's KV between servers
  // (disaggregation) would need every rank's, which serve refuses to combine with ranks.
  if (after_layer_kv) fail(ErrorKind::kUnsupported, "a split model does not hand out its KV layer by layer");
  on_ranks([&](int rank) { ranks_[size_t(rank)].model->run(chunks); }, world_size());
}

// Rank 0 holds the gathered logits; it reads them on its own thread, where its backend is bound.
std::span<const float> TensorParallelModel::download_logits() {
  std::span<const float> logits;
  on_ranks([&](int) { logits = ranks_[0].model->download_logits(); }, 1);
  return logits;
}

std::vector<int32_t> TensorParallelModel::sample(std::span<const SamplingRow> rows, int32_t valid_vocab) {
  std::vector<int32_t> tokens;
  on_ranks([&](int) { tokens = ranks_[0].model->sample(rows, valid_vocab); }, 1);
  return tokens;
}

void TensorParallelModel::top_logprobs(std::span<const int32_t> rows, int32_t k, int32_t valid_vocab,
                                       std::vector<int32_t>& tokens, std::vector<float>& logprobs) {
  on_ranks([&](int) { ranks_[0].model->top_logprobs(rows, k, valid_vocab, tokens, logprobs); }, 1);
}

}  // namespace pagoda
