// PrefillServer: the prefill role (`pagoda serve --role prefill`). It listens for decode servers
// (127.0.0.1 unless told otherwise), authenticates each (handshake.h), and runs their prefill
// requests through this server's engine, as requests of one token whose KV the engine keeps
// when they finish. The pages go back over the peer's transport layer by layer, as the step that
// completes the prompt stores each layer's K/V (Engine::set_kept_kv_layer_hook), so that the
// transfer overlaps the rest of the prefill; then the first token.
//
// Threads: one acceptor; per peer link, a reader (this file) and a writer (PeerLink). The
// engine work happens in the EngineHook calls, on the engine thread. A peer whose bytes are not
// a valid message is disconnected with the reason logged; its requests are cancelled, and no
// other peer notices.
#pragma once

#include <atomic>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagoda/disagg/peer_link.h"
#include "pagoda/disagg/tcp_kv_transport.h"
#include "pagoda/disagg/transfer_metrics.h"
#include "pagoda/server/engine_service.h"

namespace pagoda::disagg {

struct PrefillServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;             // 0: any free port
  std::string key;          // --peer-key
  int max_peers = 64;       // links (authenticated or not) at once; more are closed at once
  std::chrono::milliseconds send_timeout{30000};  // a frame not sent by then: the peer is stalled
};

class PrefillServer final : public server::EngineHook {
 public:
  // Listens at once (throws Error(kInvalidArgument) when it cannot); peers are served after
  // start(). The model's KV pool must be allocated (the engine exists).
  PrefillServer(Model& model, PrefillServerOptions options, TransferMetrics& metrics);
  // stop(); the engine service's thread must have ended (it may hold this server's peers).
  ~PrefillServer() override;

  void start(server::EngineService& service);
  // Closes every peer link and joins its threads; before the engine service stops.
  void stop();
  int port() const { return port_; }

  void before_step(Engine& engine) override;
  void after_step(Engine& engine, std::vector<TokenEvent>& events) override;

 private:
  struct Peer {
    std::unique_ptr<PeerLink> link;
    std::unique_ptr<TcpKvTransport> transport;
    std::thread reader;
  };
  struct Inbound {  // from a reader to the engine thread
    Peer* peer;
    std::optional<PrefillRequest> prefill;  // else a cancel of request_id (or, with gone, the link)
    uint64_t request_id = 0;
    bool gone = false;
  };
  struct Job {
    Peer* peer;
    uint64_t request_id;  // the decode server's
    int32_t num_blocks;   // the prompt's
    int32_t skip_blocks;  // leading blocks the decode server has: not sent
    int32_t num_prompt;
    int32_t layers_sent = 0;
    uint64_t bytes_sent = 0;
    double read_seconds = 0;  // reading its pages from the pool
  };

  void accept_loop();
  void serve(Peer& peer);
  void post(Inbound inbound);
  void forget_peer(Peer* peer, Engine& engine);
  void publish(const Engine& engine);
  void send_layer(int32_t layer, std::span<const Engine::KeptKvLayer> requests);
  void send_layers(Job& job, std::span<const int32_t> block_ids, int32_t first_layer, int32_t num_layers);

  Model& model_;
  PrefillServerOptions options_;
  TransferMetrics& metrics_;
  KvFormat format_;
  Socket listener_;
  int port_ = 0;
  server::EngineService* service_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  std::mutex mutex_;  // peers_ and inbox_
  std::list<Peer> peers_;
  std::vector<Inbound> inbox_;

  // Engine thread only.
  std::unordered_map<RequestId, Job> jobs_;
  Engine* hooked_engine_ = nullptr;  // the engine whose layer hook sends this server's pages
};

}  // namespace pagoda::disagg
