#include "pagoda/bench/kv_transfer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "pagoda/bench/bench_report.h"
#include "pagoda/core/error.h"
#include "pagoda/disagg/tcp_kv_transport.h"

namespace pagoda::bench {
namespace {

using Clock = std::chrono::steady_clock;
using disagg::PeerLink;
using disagg::Socket;
using disagg::TcpKvTransport;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Both ends of one loopback TCP connection, each a PeerLink (the sender's frames go out on its
// writer thread, as on a prefill server).
struct Loopback {
  Loopback() {
    Socket listener = Socket::listen("127.0.0.1", 0);
    Socket client = Socket::connect("127.0.0.1", listener.port(), std::chrono::seconds(5));
    Socket server = listener.accept(std::chrono::seconds(5));
    if (!server.valid()) fail(ErrorKind::kInternal, "bench kv-transfer: the loopback connection was not accepted");
    sender = std::make_unique<PeerLink>(std::move(client), "prefill", std::chrono::seconds(60));
    receiver = std::make_unique<PeerLink>(std::move(server), "decode", std::chrono::seconds(60));
  }
  std::unique_ptr<PeerLink> sender, receiver;
};

// Bytes per second through the loopback connection: the bound of the host path.
double loopback_bandwidth() {
  Loopback link;
  const size_t chunk = size_t(4) << 20, total = size_t(256) << 20;
  std::thread drain([&] {
    std::vector<uint8_t> buffer(chunk);
    for (size_t got = 0; got < total; got += chunk) link.receiver->socket().recv_exact(buffer, std::nullopt);
  });
  const std::vector<uint8_t> data(chunk, 1);
  const auto start = Clock::now();
  for (size_t sent = 0; sent < total; sent += chunk) link.sender->socket().send_all(data, std::nullopt);
  drain.join();
  return double(total) / seconds(start, Clock::now());
}

struct Run {
  double prefill_s = 0;   // submit to the first token
  double transfer_s = 0;  // first page read to last byte received (the one-frame way)
  double exposed_s = 0;   // last byte received after the prefill's end
  uint64_t bytes = 0;
};

class Bench {
 public:
  Bench(Session& session, int prompt_tokens)
      : session_(session), engine_(*session.model, session.tokenizer, engine_options(session, prompt_tokens)) {
    std::mt19937 rng(0);
    std::uniform_int_distribution<int32_t> token(100, std::min(30000, session.tokenizer.vocab_size() - 1));
    for (int i = 0; i < prompt_tokens; ++i) prompt_.push_back(token(rng));
    tx_.register_pool(*session.backend, layers());
    rx_.register_pool(*session.backend, layers());
  }

  // way 0: prefill only; 1: then send in one frame; 2: layer by layer during it.
  Run run(int way) {
    Run result;
    const uint64_t wire_id = next_id_++;
    const int32_t block_size = session_.engine_options.block_size;
    Clock::time_point received{};
    int frames = 0;
    std::thread reader;
    auto start_reader = [&](std::span<const int32_t> blocks) {
      const auto last = int32_t(prompt_.size() - (blocks.size() - 1) * size_t(block_size));
      rx_.receive(wire_id, blocks, last, 0, layers());
      frames = way == 1 ? 1 : layers();
      reader = std::thread([&] {
        for (int f = 0; f < frames; ++f) rx_.read_frame(link_.receiver->read_header(), std::nullopt);
        received = Clock::now();
      });
    };
    Clock::time_point first_read{};
    if (way == 2) {
      engine_.set_kept_kv_layer_hook([&](int32_t layer, std::span<const Engine::KeptKvLayer> requests) {
        if (layer == 0) {
          start_reader(requests[0].block_ids);
          first_read = Clock::now();
        }
        const auto last = int32_t(prompt_.size() - (requests[0].block_ids.size() - 1) * size_t(block_size));
        tx_.send(wire_id, requests[0].block_ids, last, layer, 1);
      });
    } else {
      engine_.set_kept_kv_layer_hook({});
    }
    const auto start = Clock::now();
    const RequestId id = engine_.submit({.prompt = prompt_,
                                         .params = {.temperature = 0.f, .max_tokens = 1, .ignore_eos = true},
                                         .keep_kv = true});
    while (engine_.has_work()) engine_.step();
    const auto prefilled = Clock::now();
    result.prefill_s = seconds(start, prefilled);
    const kv::BlockTable* kept = engine_.kept_kv(id);
    if (!kept) fail(ErrorKind::kInternal, "bench kv-transfer: the prompt kept no KV");
    if (way == 1) {
      start_reader(kept->block_ids);
      first_read = Clock::now();
      const auto last = int32_t(prompt_.size() - (kept->block_ids.size() - 1) * size_t(block_size));
      tx_.send(wire_id, kept->block_ids, last, 0, layers());
    }
    if (reader.joinable()) reader.join();
    if (way > 0) {
      result.transfer_s = seconds(first_read, received);
      result.exposed_s = std::max(0.0, seconds(prefilled, received));
      tx_.poll();
      // Writes the pages back where they came from: the same bytes, and the blocks are freed next.
      for (const disagg::TransferEvent& e : rx_.poll()) result.bytes = e.bytes;
    }
    engine_.release_kept_kv(id);
    return result;
  }

 private:
  static EngineOptions engine_options(const Session& session, int prompt_tokens) {
    EngineOptions options = session.engine_options;
    options.prefix_caching = false;  // every run computes the whole prompt
    options.max_step_tokens = std::max(options.max_step_tokens, prompt_tokens);  // one step: its layers overlap
    return options;
  }
  int32_t layers() const { return session_.model->config().num_layers; }

  Session& session_;
  Engine engine_;
  std::vector<int32_t> prompt_;
  Loopback link_;
  TcpKvTransport tx_{*link_.sender}, rx_{*link_.receiver};
  uint64_t next_id_ = 1;
};

}  // namespace

void run_kv_transfer_bench(KvTransferBenchOptions options) {
  if (options.prompt_tokens < 1 || options.prompt_tokens > 1 << 20)
    fail(ErrorKind::kInvalidArgument, "--prompt-tokens must be in [1, 1048576]");
  if (options.runs < 1 || options.runs > 1000) fail(ErrorKind::kInvalidArgument, "--runs must be in [1, 1000]");
  Session session(options.model);
  if (options.prompt_tokens >= session.model->config().max_context)
    fail(ErrorKind::kInvalidArgument, "--prompt-tokens {} does not fit the model's context of {}",
         options.prompt_tokens, session.model->config().max_context);
  std::fprintf(stderr, "bench: measuring the loopback bandwidth...\n");
  const double bandwidth = loopback_bandwidth();
  Bench bench(session, options.prompt_tokens);
  std::fprintf(stderr, "bench: warm-up...\n");
  for (int way = 0; way < 3; ++way) bench.run(way);
  std::vector<double> prefill, prefill_sequential, prefill_overlapped, transfer, exposed_sequential, exposed;
  uint64_t bytes = 0;
  for (int r = 0; r < options.runs; ++r) {
    std::fprintf(stderr, "bench: run %d of %d...\n", r + 1, options.runs);
    prefill.push_back(bench.run(0).prefill_s);
    const Run sequential = bench.run(1);
    prefill_sequential.push_back(sequential.prefill_s);
    transfer.push_back(sequential.transfer_s);
    exposed_sequential.push_back(sequential.exposed_s);
    const Run overlapped = bench.run(2);
    prefill_overlapped.push_back(overlapped.prefill_s);
    exposed.push_back(overlapped.exposed_s);
    bytes = overlapped.bytes;
  }
  const double t_prefill = median(prefill), t_transfer = median(transfer), t_exposed = median(exposed);
  const double t_overlapped_prefill = median(prefill_overlapped);
  const double bound = double(bytes) / bandwidth;
  const double t_overlapped_total = t_overlapped_prefill + t_exposed;
  const double hidden = t_transfer > 0 ? (t_prefill + t_transfer - t_overlapped_total) / t_transfer : 0;
  const ModelConfig& c = session.model->config();
  std::printf("pagoda bench kv-transfer: %d-token prompt, %d layers, %s backend, KV %s; %d runs (median)\n",
              options.prompt_tokens, c.num_layers, session.backend->name().c_str(), options.model.kv_cache_dtype.c_str(),
              options.runs);
  std::printf("KV on the wire %.2f MB (%.1f KB/token); loopback bandwidth %.2f GB/s -> bound %.2f ms\n", double(bytes) / 1e6,
              double(bytes) / 1e3 / options.prompt_tokens, bandwidth / 1e9, bound * 1e3);
  std::printf("| | ms |\n|---|---|\n");
  std::printf("| prefill alone | %.1f |\n", t_prefill * 1e3);
  std::printf("| transfer after it, one frame (first page read to last byte) | %.1f (%.2fx the bound) |\n",
              t_transfer * 1e3, bound > 0 ? t_transfer / bound : 0);
  std::printf("| prefill, sending layer by layer | %.1f |\n", t_overlapped_prefill * 1e3);
  std::printf("| transfer left after that prefill's end | %.1f |\n", t_exposed * 1e3);
  std::printf("| prompt to last KV byte: sent after the prefill / layer by layer | %.1f / %.1f |\n",
              (t_prefill + t_transfer) * 1e3, t_overlapped_total * 1e3);
  const double spread = *std::max_element(prefill.begin(), prefill.end()) - *std::min_element(prefill.begin(), prefill.end());
  std::printf("hidden by the layer-by-layer overlap: %.0f%% of the transfer end to end%s; %.0f%% no longer after the "
              "prefill's end (transfer / prefill = %.2f)\n",
              100 * hidden, spread > t_transfer ? " (noise: the prefill's runs spread more than the transfer takes)" : "",
              t_transfer > 0 ? 100 * (1 - t_exposed / t_transfer) : 0.0, t_prefill > 0 ? t_transfer / t_prefill : 0);
  if (!options.json_path.empty()) {
    const nlohmann::json j = {
        {"benchmark", "kv-transfer"},
        {"commit", git_commit()},
        {"backend", session.backend->name()},
        {"model", options.model.path.empty() ? "default" : options.model.path},
        {"kv_cache_dtype", options.model.kv_cache_dtype},
        {"layers", c.num_layers},
        {"kv_heads", c.num_kv_heads},
        {"head_dim", c.head_dim},
        {"prompt_tokens", options.prompt_tokens},
        {"runs", options.runs},
        {"kv_bytes", bytes},
        {"loopback_bytes_per_s", bandwidth},
        {"bound_s", bound},
        {"prefill_s", t_prefill},
        {"transfer_s", t_transfer},
        {"transfer_over_bound", bound > 0 ? t_transfer / bound : 0},
        {"sequential_exposed_s", median(exposed_sequential)},
        {"overlapped_prefill_s", t_overlapped_prefill},
        {"overlapped_exposed_s", t_exposed},
        {"sequential_total_s", t_prefill + t_transfer},
        {"overlapped_total_s", t_overlapped_total},
        {"hidden_fraction", hidden},
        {"prefill_spread_s", spread},
        {"hidden_after_prefill_fraction", t_transfer > 0 ? 1 - t_exposed / t_transfer : 0},
        {"all_runs", {{"prefill_s", prefill}, {"transfer_s", transfer}, {"overlapped_prefill_s", prefill_overlapped},
                      {"overlapped_exposed_s", exposed}}},
    };
    write_json_file(options.json_path, j);
    std::fprintf(stderr, "bench: wrote %s\n", options.json_path.c_str());
  }
}

}  // namespace pagoda::bench
