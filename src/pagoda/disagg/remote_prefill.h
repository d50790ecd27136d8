// RemotePrefill: the decode role (`pagoda serve --role decode --prefill HOST:PORT ...`). The
// server's API requests are prefilled by prefill servers: for each, the engine allocates KV
// blocks (its own prefix cache's hits included, and those are not sent), the least loaded
// connected prefill server computes the prompt, its pages arrive over the link's transport and
// its first token after them, and the engine decodes from there.
//
// Faults: a prefill server that fails a request, drops the link, sends what was not asked for,
// or does not answer within the timeout (its link is then closed as stalled) makes its requests
// go to another connected prefill server not tried yet, or be prefilled here; their blocks are
// never written by a late answer. Each prefill server's link is retried every second while down,
// so a restarted server is used again. No peer up: requests are prefilled here.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagoda/disagg/peer_link.h"
#include "pagoda/disagg/tcp_kv_transport.h"
#include "pagoda/disagg/transfer_metrics.h"
#include "pagoda/server/engine_service.h"

namespace pagoda::disagg {

struct RemotePrefillOptions {
  std::vector<std::string> prefill_addresses;  // HOST:PORT, checked by the constructor
  std::string key;                             // --peer-key
  // A request's prefill at one prefill server (its queue, the compute, the transfer).
  std::chrono::milliseconds timeout{60000};
  std::chrono::milliseconds reconnect_interval{1000};
};

class RemotePrefill final : public server::EngineHook {
 public:
  // Throws Error(kInvalidArgument) for an address that is not HOST:PORT. The model's KV pool
  // must be allocated (the engine exists).
  RemotePrefill(Model& model, RemotePrefillOptions options, TransferMetrics& metrics);
  ~RemotePrefill() override;  // stop()

  // Connects to the prefill servers in the background.
  void start(server::EngineService& service);
  void stop();

  void prepare(Request& request) override;
  void before_step(Engine& engine) override;
  void after_step(Engine& engine, std::vector<TokenEvent>& events) override;

 private:
  struct Link {  // one connection to a prefill server
    Link(Socket socket, const std::string& name, std::chrono::milliseconds send_timeout)
        : peer(std::move(socket), name, send_timeout), transport(peer) {}
    PeerLink peer;
    TcpKvTransport transport;
  };
  struct Peer {
    std::string address, host;
    int port = 0;
    std::thread thread;  // connects, reads, reconnects
    std::mutex mutex;    // link
    std::shared_ptr<Link> link;  // null while down
    int64_t in_flight = 0;       // engine thread
  };
  struct Answer {  // from a peer's reader to the engine thread
    std::shared_ptr<Link> link;
    uint64_t request_id = 0;
    std::optional<int32_t> first_token;  // done
    std::string error;                   // failed (or, with lost, why the link ended)
    bool lost = false;                   // the link is gone
  };
  struct Pending {  // engine thread: a request at a prefill server
    Engine::RemotePrefill request;
    Peer* peer = nullptr;
    std::shared_ptr<Link> link;
    std::chrono::steady_clock::time_point sent, deadline;
    std::vector<Peer*> tried;
    bool pages_written = false;
    TransferEvent transfer;
  };

  void run_peer(Peer& peer);
  void read_link(const std::shared_ptr<Link>& link);
  void post(Answer answer);
  std::shared_ptr<Link> link_of(Peer& peer);
  Peer* least_loaded(const std::vector<Peer*>& exclude);
  void dispatch(Engine& engine);
  bool send_to(Peer& peer, Pending& pending);
  void fail_over(Engine& engine, RequestId id, const std::string& why);
  void publish(const Engine& engine);

  Model& model_;
  RemotePrefillOptions options_;
  TransferMetrics& metrics_;
  KvFormat format_;
  std::vector<std::unique_ptr<Peer>> peers_;
  server::EngineService* service_ = nullptr;

  std::mutex mutex_;  // answers_, stopping_
  std::condition_variable stop_signal_;
  bool stopping_ = false;
  std::vector<Answer> answers_;
  std::thread watchdog_;  // wakes the engine thread when a deadline passes
  std::atomic<int64_t> next_deadline_{INT64_MAX};  // steady_clock ticks

  // Engine thread only.
  std::unordered_map<RequestId, Pending> pending_;
};

}  // namespace pagoda::disagg
