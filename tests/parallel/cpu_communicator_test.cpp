// The CPU communicator: ranks as threads. Sums and gathers against values computed by hand, the
// ranks' sums bit-identical, and a rank that never comes (or aborts) makes the others throw.
#include "pagoda/parallel/cpu_communicator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/core/error.h"
#include "pagoda/core/half.h"

namespace pagoda::parallel {
namespace {

// Runs body(rank) on one thread per rank; returns each rank's error message ("" when none).
std::vector<std::string> on_threads(std::vector<std::unique_ptr<Communicator>>& comms,
                                    const std::function<void(Communicator&)>& body) {
  std::vector<std::string> errors(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r)
    threads.emplace_back([&, r] {
      try {
        body(*comms[r]);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  for (std::thread& t : threads) t.join();
  return errors;
}

TEST(CpuCommunicator, AllReduceSumsEveryRanksValues) {
  auto comms = make_cpu_communicators(3, std::chrono::seconds(10));
  std::vector<std::vector<float>> x(3);
  on_threads(comms, [&](Communicator& c) {
    const int r = c.rank();
    for (int round = 0; round < 50; ++round) {  // back-to-back collectives reuse the rendezvous
      x[size_t(r)] = {float(r + 1), 0.5f * float(r), -float(round), 1e-8f};
      c.all_reduce_sum(Tensor::contiguous(x[size_t(r)].data(), DType::kF32, {2, 2}));
    }
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(x[size_t(r)][0], 6.f);  // 1 + 2 + 3
    EXPECT_EQ(x[size_t(r)][1], 1.5f);  // 0 + 0.5 + 1
    EXPECT_EQ(x[size_t(r)][2], -147.f);  // round 49, three times
    EXPECT_EQ(x[size_t(r)][3], x[0][3]);  // every rank sums in one order: bit-identical
  }
}

TEST(CpuCommunicator, AllReduceOfHalvesRoundsTheF32Sum) {
  auto comms = make_cpu_communicators(2, std::chrono::seconds(10));
  std::vector<std::vector<uint16_t>> x(2);
  on_threads(comms, [&](Communicator& c) {
    x[size_t(c.rank())] = {f32_to_f16(1.f), f32_to_f16(c.rank() == 0 ? 0.25f : -3.f)};
    c.all_reduce_sum(Tensor::contiguous(x[size_t(c.rank())].data(), DType::kF16, {2}));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(f16_to_f32(x[size_t(r)][0]), 2.f);
    EXPECT_EQ(f16_to_f32(x[size_t(r)][1]), -2.75f);
  }
}

// Columns [r m, (r + 1) m) of every row are rank r's row.
TEST(CpuCommunicator, AllGatherPutsTheRanksColumnsSideBySide) {
  auto comms = make_cpu_communicators(3, std::chrono::seconds(10));
  std::vector<std::vector<float>> out(3, std::vector<float>(2 * 6));
  on_threads(comms, [&](Communicator& c) {
    const float r = float(c.rank());
    std::vector<float> x = {10 * r, 10 * r + 1, 100 + 10 * r, 100 + 10 * r + 1};  // [2 rows, 2 columns]
    c.all_gather(Tensor::contiguous(x.data(), DType::kF32, {2, 2}),
                 Tensor::contiguous(out[size_t(c.rank())].data(), DType::kF32, {2, 6}));
  });
  const std::vector<float> expected = {0, 1, 10, 11, 20, 21, 100, 101, 110, 111, 120, 121};
  for (int r = 0; r < 3; ++r) EXPECT_EQ(out[size_t(r)], expected);
}

TEST(CpuCommunicator, ARankThatNeverComesIsNamed) {
  auto comms = make_cpu_communicators(3, std::chrono::milliseconds(100));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(comms, [&](Communicator& c) {
    if (c.rank() == 2) return;
    float x = 1;
    c.all_reduce_sum(Tensor::contiguous(&x, DType::kF32, {1}));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  for (int r = 0; r < 2; ++r) EXPECT_NE(errors[size_t(r)].find("for rank(s) 2, which never came"), std::string::npos) << errors[size_t(r)];
  // The group stays failed: a late rank does not wait either.
  float x = 1;
  EXPECT_THROW(comms[2]->all_reduce_sum(Tensor::contiguous(&x, DType::kF32, {1})), Error);
}

TEST(CpuCommunicator, AbortWakesTheWaitingRanks) {
  auto comms = make_cpu_communicators(2, std::chrono::seconds(60));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(comms, [&](Communicator& c) {
    if (c.rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      c.abort("rank 1 failed: out of luck");
      return;
    }
    float x = 1;
    c.all_reduce_sum(Tensor::contiguous(&x, DType::kF32, {1}));
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_NE(errors[0].find("rank 1 failed: out of luck"), std::string::npos) << errors[0];
}

}  // namespace
}  // namespace pagoda::parallel
