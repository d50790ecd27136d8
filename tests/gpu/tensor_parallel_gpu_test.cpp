// Tensor parallelism on GPUs: a model split over N GPUs (its all-reduces and logits gather by
// NCCL or the one-shot kernel, decode steps replayed from CUDA graphs that captured them) gives the
// logits of the unsplit model on one GPU. N = 1 runs on any GPU and goes through every part of
// the rank machinery (communicators, rank threads, graphs with the gather in them); N = every GPU
// present is skipped below two.
//
// Tolerance: as the GPU model test's (model_gpu_test.cpp), a fraction of the logit range; a split
// model rounds its partial sums to f16 before they are added across ranks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "../model/model_runner.h"
#include "gpu_test.h"
#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/cuda_backend.h"
#include "pagoda/model/tensor_parallel_model.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;

constexpr double kLogitTolerance = 1e-2;
constexpr int32_t kNumBlocks = 64, kBlockSize = 16;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

void expect_split_matches_unsplit(int ranks) {
  const fs::path dir = fs::temp_directory_path() / "pagoda-gpu-tp-test";
  const std::string command = std::string(PAGODA_BINARY) +
                              " make-model --arch llama3-8b --layers 2 --dtype fp16 --out " + dir.string() + " > /dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const Checkpoint checkpoint = Checkpoint::open(dir.string());
  std::mt19937 rng(11);
  std::vector<int32_t> ids(40);
  for (int32_t& id : ids) id = int32_t(rng() % 256);  // the byte tokens of make-model's tokenizer

  std::vector<std::unique_ptr<Backend>> backends;
  for (int r = 0; r < ranks; ++r) backends.push_back(std::make_unique<CudaBackend>(DType::kF16, CudaBackendOptions{.gpu = r}));
  cuda::check_cuda(cudaSetDevice(0), "cudaSetDevice");
  TensorParallelModel split(checkpoint, std::move(backends), LoadOptions{.show_progress = false});
  split.allocate_kv_cache(kNumBlocks, kBlockSize);
  CudaBackend backend(DType::kF16);
  Model whole(checkpoint, backend, LoadOptions{.show_progress = false});
  whole.allocate_kv_cache(kNumBlocks, kBlockSize);

  for (size_t chunk : {ids.size(), size_t(7), size_t(1)}) {
    const auto expected = testing::run_chunks(whole, ids, chunk, kNumBlocks, kBlockSize);
    const auto actual = testing::run_chunks(split, ids, chunk, kNumBlocks, kBlockSize);
    ASSERT_EQ(actual.size(), expected.size());
    double worst = 0;
    for (size_t i = 0; i < expected.size(); ++i) worst = std::max(worst, testing::relative_max_diff(actual[i], expected[i]));
    std::printf("  %d ranks, chunks of %2zu: max |split - whole| = %.2e of the logit range\n", ranks, chunk, worst);
    EXPECT_LE(worst, kLogitTolerance) << ranks << " ranks, chunks of " << chunk;
  }
  // The token-by-token run's decode steps replayed graphs with the collectives in them.
  EXPECT_GT(split.rank_backend(0).graph_stats().replays, 0);
  fs::remove_all(dir);
}

using GpuTensorParallel = cuda::GpuTest;

TEST_F(GpuTensorParallel, OneRankMatchesTheUnsplitModel) { expect_split_matches_unsplit(1); }

TEST_F(GpuTensorParallel, EveryGpuMatchesTheUnsplitModel) {
  if (gpu_count() < 2) GTEST_SKIP() << "needs at least 2 GPUs; " << gpu_count() << " present";
  expect_split_matches_unsplit(std::min(gpu_count(), 8));
}

}  // namespace
}  // namespace pagoda
