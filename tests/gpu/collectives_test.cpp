// The GPU collectives (parallel/cuda/nccl_communicator.h): all_reduce_sum by NCCL and by the
// one-shot kernel, and all_gather, against sums and concatenations computed on the host, with one
// rank (any GPU) and with one rank per GPU present (skipped below two GPUs), eagerly and replayed
// from a CUDA graph; and the faults: more ranks than GPUs, a rank that never joins, a rank that
// stops calling.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "gpu_test.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/core/error.h"
#include "pagoda/core/half.h"
#include "pagoda/parallel/cuda/nccl_communicator.h"

namespace pagoda::parallel {
namespace {

using ::pagoda::cuda::check_cuda;
using ::pagoda::cuda::DeviceArray;
using ::pagoda::cuda::GpuTest;
using namespace std::chrono_literals;

int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::vector<int> first_gpus(int n) {
  std::vector<int> gpus(n);
  for (int i = 0; i < n; ++i) gpus[i] = i;
  return gpus;
}

// Host values <-> the bytes of a dtype.
std::vector<std::byte> encode(const std::vector<float>& v, DType dtype) {
  std::vector<std::byte> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i * 4], &v[i], 4);
    } else {
      const uint16_t h = dtype == DType::kF16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

std::vector<float> decode(const std::vector<std::byte>& b, DType dtype) {
  const size_t n = b.size() / dtype_size(dtype);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(&out[i], &b[i * 4], 4);
    } else {
      uint16_t h;
      std::memcpy(&h, &b[i * 2], 2);
      out[i] = dtype == DType::kF16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }
  return out;
}

float round_to(float v, DType dtype) { return decode(encode({v}, dtype), dtype)[0]; }

// Multiples of 1/8 in [-1, 1]: any sum of up to 8 of them is exact in f16, bf16 and f32, so every
// algorithm must give the host's sum exactly.
float small_value(int rank, size_t i, int call) {
  return float(int((i * 7 + size_t(rank) * 13 + size_t(call) * 5) % 17) - 8) * 0.125f;
}

Tensor tensor_of(DeviceArray<std::byte>& a, DType dtype) {
  return Tensor::contiguous(a.data(), dtype, {int64_t(a.size() / dtype_size(dtype))}, Device::kCuda);
}

enum class Path { kAuto, kNccl, kOneShot };
const char* path_name(Path p) { return p == Path::kNccl ? "nccl" : p == Path::kOneShot ? "one-shot" : "auto"; }

void all_reduce(NcclCommunicator& comm, Tensor x, Path path) {
  if (path == Path::kNccl) {
    comm.all_reduce_sum_nccl(x);
  } else if (path == Path::kOneShot) {
    comm.all_reduce_sum_one_shot(x);
  } else {
    comm.all_reduce_sum(x);
  }
}

// Runs fn on one thread per rank, each with its GPU current, a stream of its own and its
// NcclCommunicator on that stream; returns each rank's failure ("" for none). A rank that fails
// aborts the clique, as a tensor-parallel rank loop does.
std::vector<std::string> run_ranks(const std::shared_ptr<GpuClique>& clique,
                                   const std::function<void(NcclCommunicator&, cudaStream_t)>& fn) {
  std::vector<std::string> failures(clique->world_size());
  std::vector<std::thread> threads;
  for (int r = 0; r < clique->world_size(); ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      try {
        check_cuda(cudaSetDevice(clique->gpu(r)), "cudaSetDevice");
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        NcclCommunicator comm(clique, r, stream);
        fn(comm, stream);
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        comm.check();
      } catch (const std::exception& e) {
        failures[r] = e.what();
        clique->abort(fmt::format("rank {}: {}", r, e.what()));
      }
      if (stream) cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  return failures;
}

void expect_no_failures(const std::vector<std::string>& failures) {
  for (size_t r = 0; r < failures.size(); ++r) EXPECT_EQ(failures[r], "") << "rank " << r;
}

constexpr DType kDtypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Calls back to back on separate buffers (the one-shot kernel's staging halves alternate and its
// flags count calls: a reuse bug shows up as a wrong sum in a later call), each checked against
// the host's sum.
void check_all_reduce(int world, Path path, const std::vector<size_t>& sizes, int calls = 5) {
  auto clique = std::make_shared<GpuClique>(first_gpus(world));
  if (path == Path::kOneShot && !clique->one_shot_available()) GTEST_SKIP() << "no peer access between the GPUs";
  std::vector<std::string> errors(world);
  auto failures = run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t stream) {
    const int r = comm.rank();
    for (DType dtype : kDtypes) {
      for (size_t bytes : sizes) {
        const size_t n = bytes / dtype_size(dtype);
        std::vector<DeviceArray<std::byte>> x(calls);
        for (int k = 0; k < calls; ++k) {
          std::vector<float> v(n);
          for (size_t i = 0; i < n; ++i) v[i] = small_value(r, i, k);
          x[k].upload(encode(v, dtype));
        }
        check_cuda(cudaDeviceSynchronize(), "upload");
        for (int k = 0; k < calls; ++k) all_reduce(comm, tensor_of(x[k], dtype), path);
        check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
        comm.check();
        for (int k = 0; k < calls && errors[r].empty(); ++k) {
          std::vector<float> got = decode(x[k].download(), dtype);
          for (size_t i = 0; i < n; ++i) {
            float want = 0;
            for (int p = 0; p < world; ++p) want += small_value(p, i, k);
            if (got[i] != want) {
              errors[r] = fmt::format("{} {} bytes {} call {} element {}: {} != {}", path_name(path), bytes,
                                      dtype_name(dtype), k, i, got[i], want);
              break;
            }
          }
        }
      }
    }
  });
  expect_no_failures(failures);
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

const std::vector<size_t> kSizes = {16, 8 << 10, 16 << 10, 32 << 10, 64 << 10};

TEST(GpuClique, MoreRanksThanGpusIsAnError) {
  const int present = gpu_count();
  try {
    GpuClique clique(first_gpus(present + 1));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()), fmt::format("tensor parallelism needs one GPU per rank: {} ranks, {} GPUs present",
                                                 present + 1, present));
  }
}

using Collectives = GpuTest;

TEST_F(Collectives, OneRankAllReduceIsTheIdentity) {
  check_all_reduce(1, Path::kAuto, kSizes);
  check_all_reduce(1, Path::kNccl, {16, 64 << 10, 1 << 20});
  check_all_reduce(1, Path::kOneShot, kSizes);
}

TEST_F(Collectives, OneRankAllGatherCopies) {
  auto clique = std::make_shared<GpuClique>(first_gpus(1));
  std::vector<float> got;
  expect_no_failures(run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t) {
    std::vector<float> v(1000);
    for (size_t i = 0; i < v.size(); ++i) v[i] = small_value(0, i, 0);
    DeviceArray<std::byte> x, out(v.size() * 2);
    x.upload(encode(v, DType::kBF16));
    comm.all_gather(Tensor::contiguous(x.data(), DType::kBF16, {4, 250}, Device::kCuda),
                    Tensor::contiguous(out.data(), DType::kBF16, {4, 250}, Device::kCuda));
    check_cuda(cudaDeviceSynchronize(), "sync");
    got = decode(out.download(), DType::kBF16);
    EXPECT_EQ(got, v);
  }));
  EXPECT_EQ(got.size(), 1000u);
}

// Both paths captured into one graph with the copies that refill their inputs, replayed three
// times: the one-shot kernel's call counter lives on the device, so replays stay in step.
void check_graph_replay(int world) {
  auto clique = std::make_shared<GpuClique>(first_gpus(world));
  const bool one_shot = clique->one_shot_available();
  std::vector<std::string> errors(world);
  expect_no_failures(run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t stream) {
    const int r = comm.rank();
    const DType dtype = DType::kF16;
    const size_t n = 4096;  // 8 KB
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = small_value(r, i, 0);
    DeviceArray<std::byte> source, a, b;
    source.upload(encode(v, dtype));
    a.resize(source.size());
    b.resize(source.size());
    check_cuda(cudaDeviceSynchronize(), "upload");
    cudaGraph_t graph = nullptr;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    check_cuda(cudaMemcpyAsync(a.data(), source.data(), source.size(), cudaMemcpyDeviceToDevice, stream), "copy");
    check_cuda(cudaMemcpyAsync(b.data(), source.data(), source.size(), cudaMemcpyDeviceToDevice, stream), "copy");
    if (one_shot) comm.all_reduce_sum_one_shot(tensor_of(a, dtype));
    comm.all_reduce_sum_nccl(tensor_of(b, dtype));
    check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    for (int replay = 0; replay < 3; ++replay) {
      check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
      check_cuda(cudaStreamSynchronize(stream), "replay");
      comm.check();
      for (auto* out : {&a, &b}) {
        if (out == &a && !one_shot) continue;
        std::vector<float> got = decode(out->download(), dtype);
        for (size_t i = 0; i < n && errors[r].empty(); ++i) {
          float want = 0;
          for (int p = 0; p < world; ++p) want += small_value(p, i, 0);
          if (got[i] != want) {
            errors[r] = fmt::format("{} replay {} element {}: {} != {}", out == &a ? "one-shot" : "nccl", replay, i,
                                    got[i], want);
          }
        }
      }
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }));
  for (int r = 0; r < world; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_F(Collectives, OneRankGraphReplay) { check_graph_replay(1); }

// Made all at once from one thread (as the tensor-parallel model does), then used from another.
TEST_F(Collectives, MadeTogetherThenUsed) {
  const int world = std::min(gpu_count(), cuda::kMaxRanks);
  std::vector<cudaStream_t> streams(world);
  for (int r = 0; r < world; ++r) {
    check_cuda(cudaSetDevice(r), "cudaSetDevice");
    check_cuda(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  auto comms = make_nccl_communicators(first_gpus(world), streams, {});
  ASSERT_EQ(int(comms.size()), world);
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        check_cuda(cudaSetDevice(r), "cudaSetDevice");
        std::vector<float> v(4096);
        for (size_t i = 0; i < v.size(); ++i) v[i] = small_value(r, i, 2);
        DeviceArray<std::byte> x;
        x.upload(encode(v, DType::kF32));
        check_cuda(cudaDeviceSynchronize(), "upload");
        comms[r]->all_reduce_sum(tensor_of(x, DType::kF32));
        check_cuda(cudaStreamSynchronize(streams[r]), "sync");
        std::vector<float> got = decode(x.download(), DType::kF32);
        for (size_t i = 0; i < v.size(); ++i) {
          float want = 0;
          for (int p = 0; p < world; ++p) want += small_value(p, i, 2);
          if (got[i] != want) {
            errors[r] = fmt::format("element {}: {} != {}", i, got[i], want);
            break;
          }
        }
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  comms.clear();
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    cudaStreamDestroy(streams[r]);
  }
}

// ---- one rank per GPU present -------------------------------------------------------------------

class MultiGpu : public GpuTest {
 protected:
  void SetUp() override {
    GpuTest::SetUp();
    if (IsSkipped()) return;
    if (gpu_count() < 2) GTEST_SKIP() << "needs at least 2 GPUs; " << gpu_count() << " present";
  }
  int world() const { return std::min(gpu_count(), cuda::kMaxRanks); }
};

TEST_F(MultiGpu, NcclAllReduceMatchesHostSum) {
  std::vector<size_t> sizes = kSizes;
  sizes.push_back(4 << 20);
  check_all_reduce(world(), Path::kNccl, sizes);
}

TEST_F(MultiGpu, OneShotAllReduceMatchesHostSum) { check_all_reduce(world(), Path::kOneShot, kSizes); }

TEST_F(MultiGpu, AllReduceChoosesEitherPath) { check_all_reduce(world(), Path::kAuto, {8 << 10, 64 << 10, 1 << 20}); }

// Random values: the one-shot kernel sums in fp32 in rank order and rounds once, as the host does
// here, so its result is the host's to the bit; NCCL's order differs, so it is held to a tolerance.
TEST_F(MultiGpu, AllReduceOfRandomValues) {
  const int n_ranks = world();
  const size_t n = 8192;
  for (DType dtype : kDtypes) {
    auto clique = std::make_shared<GpuClique>(first_gpus(n_ranks));  // one communicator per rank each
    std::vector<std::vector<float>> inputs(n_ranks, std::vector<float>(n));
    std::mt19937 rng(7);
    std::normal_distribution<float> normal;
    for (auto& in : inputs) {
      for (float& v : in) v = round_to(normal(rng), dtype);
    }
    std::vector<float> want(n);
    for (size_t i = 0; i < n; ++i) {
      float acc = 0;
      for (int r = 0; r < n_ranks; ++r) acc += inputs[r][i];
      want[i] = round_to(acc, dtype);
    }
    const double tolerance = dtype == DType::kF32 ? 1e-5 : dtype == DType::kF16 ? 4e-3 : 3e-2;
    std::vector<std::string> errors(n_ranks);
    expect_no_failures(run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t stream) {
      const int r = comm.rank();
      DeviceArray<std::byte> a, b;
      a.upload(encode(inputs[r], dtype));
      b.upload(encode(inputs[r], dtype));
      check_cuda(cudaDeviceSynchronize(), "upload");
      if (clique->one_shot_available()) comm.all_reduce_sum_one_shot(tensor_of(a, dtype));
      comm.all_reduce_sum_nccl(tensor_of(b, dtype));
      check_cuda(cudaStreamSynchronize(stream), "sync");
      std::vector<float> one_shot = decode(a.download(), dtype), nccl = decode(b.download(), dtype);
      for (size_t i = 0; i < n && errors[r].empty(); ++i) {
        if (clique->one_shot_available() && one_shot[i] != want[i]) {
          errors[r] = fmt::format("one-shot {} element {}: {} != {}", dtype_name(dtype), i, one_shot[i], want[i]);
        }
        if (std::abs(nccl[i] - want[i]) > tolerance * (1 + std::abs(want[i]))) {
          errors[r] = fmt::format("nccl {} element {}: {} vs {}", dtype_name(dtype), i, nccl[i], want[i]);
        }
      }
    }));
    for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
  }
}

// out [rows, N x m]: rank p's x in columns [p m, (p + 1) m) of every row; one row (NCCL straight
// into out) and several (stacked, then put side by side).
TEST_F(MultiGpu, AllGatherMatchesHost) {
  const int n_ranks = world();
  auto clique = std::make_shared<GpuClique>(first_gpus(n_ranks));
  const int64_t m = 1001;  // not a multiple of 16 bytes: all_gather has no such requirement
  std::vector<std::string> errors(n_ranks);
  expect_no_failures(run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t stream) {
    const int r = comm.rank();
    for (DType dtype : kDtypes) {
      for (int64_t rows : {1, 3}) {
        std::vector<float> v(rows * m);
        for (size_t i = 0; i < v.size(); ++i) v[i] = small_value(r, i, 1);
        DeviceArray<std::byte> x, out(rows * m * n_ranks * dtype_size(dtype));
        x.upload(encode(v, dtype));
        check_cuda(cudaDeviceSynchronize(), "upload");
        comm.all_gather(Tensor::contiguous(x.data(), dtype, {rows, m}, Device::kCuda),
                        Tensor::contiguous(out.data(), dtype, {rows, m * n_ranks}, Device::kCuda));
        check_cuda(cudaStreamSynchronize(stream), "sync");
        std::vector<float> got = decode(out.download(), dtype);
        for (int64_t row = 0; row < rows && errors[r].empty(); ++row) {
          for (int p = 0; p < n_ranks && errors[r].empty(); ++p) {
            for (int64_t j = 0; j < m; ++j) {
              if (got[(row * n_ranks + p) * m + j] != small_value(p, row * m + j, 1)) {
                errors[r] = fmt::format("{} {} rows: row {}, rank {}'s column {}", dtype_name(dtype), rows, row, p, j);
                break;
              }
            }
          }
        }
      }
    }
  }));
  for (int r = 0; r < n_ranks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST_F(MultiGpu, GraphReplay) { check_graph_replay(world()); }

TEST_F(MultiGpu, RankThatNeverJoinsIsAnError) {
  auto clique = std::make_shared<GpuClique>(first_gpus(2), GpuCliqueOptions{.timeout = 2s});
  const auto start = std::chrono::steady_clock::now();
  std::string error;
  std::thread rank0([&] {
    try {
      cudaSetDevice(0);
      NcclCommunicator comm(clique, 0, nullptr);
    } catch (const Error& e) {
      error = e.what();
    }
  });
  rank0.join();
  EXPECT_NE(error.find("did not join"), std::string::npos) << error;
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

// Rank 1 joins and then never calls the collective rank 0 waits in: rank 0's stream still drains
// (the one-shot kernel gives up, NCCL's is aborted by the watchdog) and rank 0 gets one error.
void check_stalled_rank(Path path) {
  auto clique = std::make_shared<GpuClique>(first_gpus(2), GpuCliqueOptions{.timeout = 2s});
  if (path == Path::kOneShot && !clique->one_shot_available()) GTEST_SKIP() << "no peer access between the GPUs";
  std::atomic<bool> rank0_done = false;
  const auto start = std::chrono::steady_clock::now();
  auto failures = run_ranks(clique, [&](NcclCommunicator& comm, cudaStream_t stream) {
    if (comm.rank() == 1) {
      while (!rank0_done) std::this_thread::sleep_for(10ms);
      return;
    }
    DeviceArray<std::byte> x(8192);
    try {
      all_reduce(comm, tensor_of(x, DType::kF16), path);
      check_cuda(cudaStreamSynchronize(stream), "sync");
      comm.check();
    } catch (...) {
      rank0_done = true;
      throw;
    }
    rank0_done = true;
  });
  EXPECT_NE(failures[0].find("died or stalled"), std::string::npos) << path_name(path) << ": " << failures[0];
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
}

TEST_F(MultiGpu, StalledRankStopsTheOneShotAllReduce) { check_stalled_rank(Path::kOneShot); }
TEST_F(MultiGpu, StalledRankStopsTheNcclAllReduce) { check_stalled_rank(Path::kNccl); }

}  // namespace
}  // namespace pagoda::parallel
