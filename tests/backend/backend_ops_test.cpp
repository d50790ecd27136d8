// The backend-op table (backend_ops.h) on the CPU backend. `backend_tests --perf` prints the perf
// table instead, against this machine's STREAM-copy bandwidth and OpenBLAS sgemm rate, both
// measured in the same run.
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "backend_ops.h"
#include "pagoda/backend/cpu/cpu_backend.h"

namespace pagoda::backend_ops {
namespace {

TEST(BackendOps, Cpu) {
  CpuBackend backend;
  test_every_op(backend, "cpu");
}

// The best of a few timed runs of fn, in seconds.
template <typename Fn>
double best_seconds(int runs, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < runs; ++i) {
    const auto start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

// STREAM's copy (each thread copies its share of 256 MiB: read + write) and a 1024^3 f32 sgemm.
Roofline measure_cpu() {
  const size_t n = size_t(64) << 20;  // floats
  std::vector<float> a(n, 1.f), b(n, 0.f);
  const double copy = best_seconds(5, [&] {
#pragma omp parallel
    {
      const size_t threads = size_t(omp_get_num_threads()), t = size_t(omp_get_thread_num());
      const size_t begin = n * t / threads, end = n * (t + 1) / threads;
      std::memcpy(&b[begin], &a[begin], (end - begin) * sizeof(float));
    }
  });
  const int m = 1024;
  std::vector<float> x(size_t(m) * m, 0.5f), y(size_t(m) * m, 0.25f), z(size_t(m) * m);
  const double gemm = best_seconds(3, [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, m, m, 1.f, x.data(), m, y.data(), m, 0.f, z.data(), m);
  });
  return {.bytes_per_second = 2.0 * double(n) * sizeof(float) / copy,
          .flops_per_second = 2.0 * m * m * double(m) / gemm,
          .bandwidth_from = "STREAM copy of 256 MiB, OpenMP, measured",
          .flops_from = "OpenBLAS sgemm 1024^3, measured"};
}

}  // namespace
}  // namespace pagoda::backend_ops

int main(int argc, char** argv) {
  return pagoda::backend_ops::main_with_perf(argc, argv, [] {
    pagoda::CpuBackend backend;
    pagoda::backend_ops::run_perf(backend, "cpu", pagoda::backend_ops::measure_cpu());
  });
}
