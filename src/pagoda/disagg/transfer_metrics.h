// TransferMetrics: disaggregated serving's part of /metrics (Prometheus text), for either role:
// KV bytes moved per request and their transfer time, bytes per prompt token on the wire, the
// queues of prefill work, peers connected, fallbacks and peer errors. Threads of the peer links
// and the engine thread update it; one mutex guards it.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "pagoda/server/metrics.h"

namespace pagoda::disagg {

class TransferMetrics {
 public:
  explicit TransferMetrics(std::string role);  // "prefill" or "decode"

  // One request's pages, sent (prefill) or received (decode): bytes for `tokens` prompt tokens.
  void observe_transfer(uint64_t bytes, int64_t tokens, double seconds);
  void count_fallback(bool local);  // a failed remote prefill went to another peer, or ran here
  void count_peer_error();          // a peer link closed on a protocol error, timeout or loss
  // Prefill work waiting (decode: for a batch slot and blocks; prefill: jobs queued in its
  // engine) and in flight (decode: at a prefill server; prefill: being computed or sent).
  void set_queues(int64_t waiting, int64_t in_flight);
  void set_peers_connected(int64_t peers);

  void render(std::string& out) const;

 private:
  std::string role_;
  mutable std::mutex mutex_;
  server::Histogram bytes_per_request_;
  server::Histogram seconds_per_transfer_;
  uint64_t bytes_total_ = 0;
  int64_t tokens_total_ = 0;
  int64_t fallbacks_peer_ = 0, fallbacks_local_ = 0, peer_errors_ = 0;
  int64_t waiting_ = 0, in_flight_ = 0, peers_connected_ = 0;
};

}  // namespace pagoda::disagg
