// pagoda bench allreduce: the all-reduce of tensor parallelism at decode's message sizes, NCCL
// against the one-shot kernel, one rank per GPU.
//
// How: one thread per rank (as tensor parallelism runs), each with a stream on its GPU and an
// NcclCommunicator. For each size and path every rank captures --calls all-reduces of one zeroed
// buffer into a CUDA graph (decode steps replay graphs, so the launch cost is a graph node's, not
// a host launch's); the ranks meet at a host barrier before each replay so that their launches
// line up, and rank 0 times the replay with events: latency per call = replay time / calls, the
// median over --runs.
//
// Bound: the latency floor (a graph of --calls empty kernels, measured in the same run) plus the
// bytes each rank must move over NVLink at --link-gb-s: the one-shot kernel reads (N - 1) x bytes
// from its peers, NCCL's ring sends 2 (N - 1) / N x bytes. "frac" is bound / measured. With one
// GPU nothing crosses a link: both paths then measure only what they cost on top of the floor.
#include "pagoda/bench/allreduce.h"

#include "pagoda/core/error.h"

#if PAGODA_HAVE_NCCL
#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "pagoda/backend/cuda/check.h"
#include "pagoda/backend/cuda/device_array.h"
#include "pagoda/bench/bench_report.h"
#include "pagoda/bench/cuda_support.h"
#include "pagoda/parallel/cuda/nccl_communicator.h"
#endif

namespace pagoda::bench {
namespace {

#if PAGODA_HAVE_NCCL

using cuda::check_cuda;

size_t parse_size(const std::string& text) {
  size_t pos = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &pos);
  } catch (const std::exception&) {
    fail(ErrorKind::kInvalidArgument, "--sizes: '{}' is not a size (e.g. 8K, 1M, 4096)", text);
  }
  const std::string suffix = text.substr(pos);
  if (suffix == "K" || suffix == "k") {
    value <<= 10;
  } else if (suffix == "M" || suffix == "m") {
    value <<= 20;
  } else if (!suffix.empty()) {
    fail(ErrorKind::kInvalidArgument, "--sizes: '{}' is not a size (e.g. 8K, 1M, 4096)", text);
  }
  if (value == 0 || value % 16 != 0 || value > (size_t(1) << 30)) {
    fail(ErrorKind::kInvalidArgument, "--sizes: {} must be a multiple of 16 bytes, at most 1G", text);
  }
  return value;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? NAN : v[v.size() / 2];
}

// The ranks' meeting point before each timed replay; gives up when the clique aborted (a rank
// failed), so no rank waits forever for one that is gone.
class RankBarrier {
 public:
  RankBarrier(int n, const parallel::GpuClique& clique) : n_(n), clique_(clique) {}
  void arrive_and_wait() {
    std::unique_lock lock(mutex_);
    const uint64_t generation = generation_;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    while (generation_ == generation) {
      cv_.wait_for(lock, std::chrono::milliseconds(50));
      clique_.check();
    }
  }

 private:
  int n_;
  const parallel::GpuClique& clique_;
  std::mutex mutex_;
  std::condition_variable cv_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

struct Row {
  size_t bytes = 0;
  double nccl_us = NAN;
  double one_shot_us = NAN;  // NaN without peer access
  double nccl_bound_us = 0;
  double one_shot_bound_us = 0;
};

std::string format_us(double us) { return std::isnan(us) ? "-" : fmt::format("{:.2f}", us); }

#endif  // PAGODA_HAVE_NCCL

}  // namespace

void run_allreduce_bench(const AllReduceBenchOptions& options) {
#if !PAGODA_HAVE_NCCL
  (void)options;
  fail(ErrorKind::kUnsupported, "`pagoda bench allreduce` needs a build with CUDA and NCCL");
#else
  AllReduceBenchOptions o = options;
  if (o.sizes.empty()) fail(ErrorKind::kInvalidArgument, "--sizes: give at least one size");
  std::vector<size_t> sizes;
  for (const std::string& s : o.sizes) sizes.push_back(parse_size(s));
  DType dtype;
  if (o.dtype == "f32") {
    dtype = DType::kF32;
  } else if (o.dtype == "f16" || o.dtype == "fp16") {
    dtype = DType::kF16;
  } else if (o.dtype == "bf16") {
    dtype = DType::kBF16;
  } else {
    fail(ErrorKind::kInvalidArgument, "--dtype: f32, f16 or bf16, not '{}'", o.dtype);
  }
  if (o.calls < 1 || o.calls > 10000) fail(ErrorKind::kInvalidArgument, "--calls: 1 to 10000");
  if (o.runs < 1 || o.runs > 10000) fail(ErrorKind::kInvalidArgument, "--runs: 1 to 10000");
  if (o.warmup < 0 || o.warmup > 10000) fail(ErrorKind::kInvalidArgument, "--warmup: 0 to 10000");
  if (!(o.link_gb_s > 0)) fail(ErrorKind::kInvalidArgument, "--link-gb-s must be positive");
  int present = 0;
  if (cudaGetDeviceCount(&present) != cudaSuccess || present == 0) {
    fail(ErrorKind::kUnsupported, "`pagoda bench allreduce` needs a GPU; none is present");
  }
  if (o.ranks < 0) fail(ErrorKind::kInvalidArgument, "--ranks must be positive");
  const int world = o.ranks == 0 ? present : o.ranks;
  std::vector<int> gpus(world);
  for (int r = 0; r < world; ++r) gpus[r] = r;

  parallel::GpuCliqueOptions clique_options;
  clique_options.one_shot_max_bytes = *std::max_element(sizes.begin(), sizes.end());
  auto clique = std::make_shared<parallel::GpuClique>(gpus, clique_options);
  const bool one_shot = clique->one_shot_available();
  const DeviceSummary device = describe_current_device();

  RankBarrier barrier(world, *clique);
  double floor_us = NAN;
  std::vector<Row> rows(sizes.size());
  std::vector<std::string> failures(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      cudaStream_t stream = nullptr;
      try {
        check_cuda(cudaSetDevice(gpus[r]), "cudaSetDevice");
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        parallel::NcclCommunicator comm(clique, r, stream);
        cuda::DeviceArray<std::byte> buffer(*std::max_element(sizes.begin(), sizes.end()));
        check_cuda(cudaMemset(buffer.data(), 0, buffer.bytes()), "cudaMemset");
        cudaEvent_t start = nullptr, stop = nullptr;
        check_cuda(cudaEventCreate(&start), "cudaEventCreate");
        check_cuda(cudaEventCreate(&stop), "cudaEventCreate");

        // Microseconds per call of `enqueue`, replayed from a graph of o.calls of them.
        auto time_graph = [&](const std::function<void()>& enqueue) {
          cudaGraph_t graph = nullptr;
          cudaGraphExec_t exec = nullptr;
          enqueue();  // once outside capture, as the engine runs a step before capturing it
          check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
          check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
          for (int c = 0; c < o.calls; ++c) enqueue();
          check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
          check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
          std::vector<double> us;
          for (int i = 0; i < o.warmup + o.runs; ++i) {
            barrier.arrive_and_wait();
            check_cuda(cudaEventRecord(start, stream), "cudaEventRecord");
            check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch");
            check_cuda(cudaEventRecord(stop, stream), "cudaEventRecord");
            check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
            comm.check();
            float ms = 0;
            check_cuda(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
            if (i >= o.warmup) us.push_back(ms * 1000.0 / o.calls);
          }
          cudaGraphExecDestroy(exec);
          cudaGraphDestroy(graph);
          return median(us);
        };

        const double floor = time_graph([&] { gpu_sleep(0, stream); });
        if (r == 0) floor_us = floor;
        for (size_t s = 0; s < sizes.size(); ++s) {
          const Tensor x = Tensor::contiguous(buffer.data(), dtype, {int64_t(sizes[s] / dtype_size(dtype))},
                                              Device::kCuda);
          const double nccl = time_graph([&] { comm.all_reduce_sum_nccl(x); });
          const double shot = one_shot ? time_graph([&] { comm.all_reduce_sum_one_shot(x); }) : NAN;
          if (r == 0) {
            rows[s].bytes = sizes[s];
            rows[s].nccl_us = nccl;
            rows[s].one_shot_us = shot;
          }
        }
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
      } catch (const std::exception& e) {
        failures[r] = e.what();
        clique->abort(fmt::format("rank {}: {}", r, e.what()));
      }
      if (stream) cudaStreamDestroy(stream);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < world; ++r) {
    if (!failures[r].empty()) fail(ErrorKind::kInternal, "bench allreduce: rank {}: {}", r, failures[r]);
  }

  const double link_bytes_per_us = o.link_gb_s * 1e3;
  size_t one_shot_faster_up_to = 0;
  for (Row& row : rows) {
    row.one_shot_bound_us = floor_us + double(world - 1) * double(row.bytes) / link_bytes_per_us;
    row.nccl_bound_us = floor_us + 2.0 * (world - 1) / world * double(row.bytes) / link_bytes_per_us;
    if (row.one_shot_us < row.nccl_us) one_shot_faster_up_to = std::max(one_shot_faster_up_to, row.bytes);
  }

  std::string table = fmt::format(
      "all-reduce on {} x {}, {}, {} calls per graph, median of {} replays; peer access: {}\n"
      "latency floor (one empty kernel node): {:.2f} us; bound = floor + bytes over NVLink at {} GB/s per direction"
      " (one-shot: (N-1) x bytes, NCCL ring: 2(N-1)/N x bytes); frac = bound / measured\n",
      world, device.name, o.dtype, o.calls, o.runs, one_shot ? "yes" : "no", floor_us, o.link_gb_s);
  if (world == 1) {
    table += "one GPU: nothing crosses a link; both paths measure only their cost over the launch floor (NCCL has "
             "nothing to do in place with one rank and enqueues no work)\n";
  }
  table += "\n| bytes | NCCL us | one-shot us | NCCL / one-shot | NCCL bound us | NCCL frac | one-shot bound us | one-shot frac |\n";
  table += "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (const Row& row : rows) {
    table += fmt::format("| {} | {} | {} | {} | {:.2f} | {:.2f} | {:.2f} | {} |\n", row.bytes, format_us(row.nccl_us),
                         format_us(row.one_shot_us),
                         std::isnan(row.one_shot_us) ? "-" : fmt::format("{:.2f}", row.nccl_us / row.one_shot_us),
                         row.nccl_bound_us, row.nccl_bound_us / row.nccl_us, row.one_shot_bound_us,
                         std::isnan(row.one_shot_us) ? "-" : fmt::format("{:.2f}", row.one_shot_bound_us / row.one_shot_us));
  }
  if (world > 1) {
    table += fmt::format("\none-shot faster than NCCL up to {} bytes (the largest size measured where it wins; "
                         "GpuCliqueOptions::one_shot_max_bytes is {})\n",
                         one_shot_faster_up_to, parallel::kDefaultOneShotMaxBytes);
  }
  std::fputs(table.c_str(), stdout);

  nlohmann::json j;
  j["benchmark"] = "allreduce";
  j["commit"] = git_commit();
  j["device"] = device.name;
  j["ranks"] = world;
  j["dtype"] = o.dtype;
  j["calls_per_graph"] = o.calls;
  j["runs"] = o.runs;
  j["peer_access"] = one_shot;
  j["link_gb_s"] = o.link_gb_s;
  j["floor_us"] = floor_us;
  j["one_shot_faster_up_to_bytes"] = one_shot_faster_up_to;
  j["default_one_shot_max_bytes"] = parallel::kDefaultOneShotMaxBytes;
  for (const Row& row : rows) {
    nlohmann::json r;
    r["bytes"] = row.bytes;
    r["nccl_us"] = row.nccl_us;
    r["one_shot_us"] = std::isnan(row.one_shot_us) ? nlohmann::json() : nlohmann::json(row.one_shot_us);
    r["nccl_bound_us"] = row.nccl_bound_us;
    r["one_shot_bound_us"] = row.one_shot_bound_us;
    j["sizes"].push_back(r);
  }
  std::string out = o.out.empty() ? "bench/results/" + device_slug(device.name) + "/allreduce.json" : o.out;
  write_json_file(out, j);
  std::string md = out.size() > 5 && out.ends_with(".json") ? out.substr(0, out.size() - 5) + ".md" : out + ".md";
  std::ofstream(md) << "# pagoda bench allreduce\n\n" << table;
  std::printf("wrote %s and %s\n", out.c_str(), md.c_str());
#endif
}

}  // namespace pagoda::bench
