// TensorParallelModel: one model split over N ranks in one process, one thread per rank
// (docs/design.md, "Tensor parallelism"). Rank r owns backends[r], a Model holding only its shard
// (shard.h) and its Communicator; each step every rank runs the same chunks concurrently, and
// rank 0's gathered logits are what the engine samples. The engine sees a StepModel, as with one
// Model.
//
// A rank that throws aborts the others' collectives, and the step fails with that rank's error;
// the ranks' state is then inconsistent, so every later call fails with the same error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/model/model.h"
#include "pagoda/parallel/communicator.h"

namespace pagoda {

class TensorParallelModel final : public StepModel {
 public:
  // One rank per backend, rank r on backends[r]; each rank loads its shard on its own thread.
  // Throws Error(kInvalidArgument) when the model cannot be split that many ways (shard.h).
  TensorParallelModel(const Checkpoint& checkpoint, std::vector<std::unique_ptr<Backend>> backends,
                      const LoadOptions& options,
                      std::chrono::milliseconds collective_timeout = std::chrono::seconds(60));
  ~TensorParallelModel() override;

  int world_size() const { return int(ranks_.size()); }
  Model& rank_model(int rank) { return *ranks_[size_t(rank)].model; }
  Backend& rank_backend(int rank) { return *ranks_[size_t(rank)].backend; }
  // Seconds rank 0 has spent in collectives (its waits for the others included).
  double seconds_in_collectives() const { return ranks_[0].communicator->seconds_in_collectives(); }
  // One line for start-up logs: the ranks, where they run, what carries their collectives.
  std::string describe() const;
  // Seconds per all_reduce_sum of a [rows, hidden] activation, as the forward pass issues them:
  // `rounds` of `calls` back to back on every rank after one untimed call, rank 0's wall time over
  // a round (on a GPU until its stream has run them: launch costs included, as eager steps pay
  // them) divided by `calls`, the fastest round's (a round the OS preempted a rank in is slower).
  double time_all_reduce(int64_t rows, int calls, int rounds);

  const ModelConfig& config() const override { return ranks_[0].model->config(); }
  size_t weight_bytes() const override;
  DType weight_dtype() const override { return ranks_[0].model->weight_dtype(); }
  size_t kv_block_bytes(int32_t block_size) const override;
  size_t allocate_kv_cache(int32_t num_blocks, int32_t block_size) override;
  void reserve(int64_t max_rows, int64_t max_logit_rows) override;
  int32_t graph_rows(int32_t rows) const override { return ranks_[0].model->graph_rows(rows); }
  bool can_sample() const override { return ranks_[0].model->can_sample(); }
  void copy_kv_block(int32_t src, int32_t dst) override;
  void run(std::span<const SequenceChunk> chunks,
           const std::function<void(int32_t layer)>& after_layer_kv = {}) override;
  std::span<const float> download_logits() override;
  std::vector<int32_t> sample(std::span<const SamplingRow> rows, int32_t valid_vocab) override;
  void top_logprobs(std::span<const int32_t> rows, int32_t k, int32_t valid_vocab, std::vector<int32_t>& tokens,
                    std::vector<float>& logprobs) override;
  int64_t prefix_steps() const override { return ranks_[0].model->prefix_steps(); }
  double step_planning_seconds() const override { return ranks_[0].model->step_planning_seconds(); }

 private:
  struct Rank {
    // Destroyed after the backend: NCCL finalizes a communicator only once the CUDA graphs that
    // captured its collectives (the backend's) are gone.
    std::unique_ptr<parallel::Communicator> communicator;
    std::unique_ptr<Backend> backend;
    std::unique_ptr<Model> model;
    std::thread thread;
  };
  // Runs job(rank) on the threads of ranks [0, ranks) (1: rank 0 only) and waits for them;
  // rethrows the first failure.
  void on_ranks(const std::function<void(int rank)>& job, int ranks);
  void rank_main(int rank);
  void stop_threads();

  std::vector<Rank> ranks_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  uint64_t job_number_ = 0;
  const std::function<void(int)>* job_ = nullptr;
  int job_ranks_ = 0;
  int running_ = 0;
  bool stopping_ = false;
  std::exception_ptr failure_;  // the first rank failure; set, the ranks are unusable
};

}  // namespace pagoda
