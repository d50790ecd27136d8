#include "pagoda/disagg/transfer_metrics.h"

#include <fmt/format.h>

namespace pagoda::disagg {

TransferMetrics::TransferMetrics(std::string role)
    : role_(std::move(role)),
      bytes_per_request_({65536, 262144, 1048576, 4194304, 16777216, 67108864, 268435456, 1073741824}),
      seconds_per_transfer_({0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5}) {}

void TransferMetrics::observe_transfer(uint64_t bytes, int64_t tokens, double seconds) {
  std::lock_guard lock(mutex_);
  bytes_per_request_.observe(double(bytes));
  seconds_per_transfer_.observe(seconds);
  bytes_total_ += bytes;
  tokens_total_ += tokens;
}

void TransferMetrics::count_fallback(bool local) {
  std::lock_guard lock(mutex_);
  ++(local ? fallbacks_local_ : fallbacks_peer_);
}

void TransferMetrics::count_peer_error() {
  std::lock_guard lock(mutex_);
  ++peer_errors_;
}

void TransferMetrics::set_queues(int64_t waiting, int64_t in_flight) {
  std::lock_guard lock(mutex_);
  waiting_ = waiting;
  in_flight_ = in_flight;
}

void TransferMetrics::set_peers_connected(int64_t peers) {
  std::lock_guard lock(mutex_);
  peers_connected_ = peers;
}

void TransferMetrics::render(std::string& out) const {
  std::lock_guard lock(mutex_);
  const std::string role = fmt::format("role=\"{}\"", role_);
  const auto one = [&](const char* name, const char* type, const char* help, auto value, const std::string& labels) {
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n{}{{{}}} {}\n", name, help, name, type, name, labels, value);
  };
  bytes_per_request_.render("pagoda_kv_transfer_bytes", "KV page bytes moved per request (this server's role: " "sent by prefill, received by decode)", out);
  seconds_per_transfer_.render("pagoda_kv_transfer_seconds", "time from a request's first KV byte on the wire to its last", out);
  one("pagoda_kv_transfer_bytes_total", "counter", "KV page bytes moved", bytes_total_, role);
  one("pagoda_kv_transfer_tokens_total", "counter", "prompt tokens whose KV pages were moved", tokens_total_, role);
  one("pagoda_kv_wire_bytes_per_token", "gauge", "KV bytes on the wire per prompt token moved",
      tokens_total_ ? double(bytes_total_) / double(tokens_total_) : 0.0, role);
  one("pagoda_disagg_queue_length", "gauge",
      "prefill work waiting (decode: for a batch slot and KV blocks; prefill: queued in its engine)", waiting_, role);
  one("pagoda_disagg_in_flight", "gauge", "prefill work in flight (decode: at prefill servers; prefill: computing or sending)",
      in_flight_, role);
  one("pagoda_disagg_peers_connected", "gauge", "peer links open", peers_connected_, role);
  out += "# HELP pagoda_disagg_fallbacks_total remote prefills that failed and went to another peer or ran locally\n"
         "# TYPE pagoda_disagg_fallbacks_total counter\n";
  out += fmt::format("pagoda_disagg_fallbacks_total{{{},to=\"peer\"}} {}\n", role, fallbacks_peer_);
  out += fmt::format("pagoda_disagg_fallbacks_total{{{},to=\"local\"}} {}\n", role, fallbacks_local_);
  one("pagoda_disagg_peer_errors_total", "counter", "peer links closed on a protocol error, a timeout or a lost connection",
      peer_errors_, role);
}

}  // namespace pagoda::disagg
