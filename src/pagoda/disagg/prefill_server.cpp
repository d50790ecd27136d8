#include "pagoda/disagg/prefill_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "pagoda/core/error.h"
#include "pagoda/disagg/handshake.h"

namespace pagoda::disagg {

PrefillServer::PrefillServer(Model& model, PrefillServerOptions options, TransferMetrics& metrics)
    : model_(model),
      options_(std::move(options)),
      metrics_(metrics),
      format_(local_kv_format(model)),
      listener_(Socket::listen(options_.host, options_.port)),
      port_(listener_.port()) {}

PrefillServer::~PrefillServer() { stop(); }

void PrefillServer::start(server::EngineService& service) {
  service_ = &service;
  acceptor_ = std::thread([this] { accept_loop(); });
}

// The peers themselves stay until destruction: the engine thread may still hold their jobs.
void PrefillServer::stop() {
  std::vector<Peer*> peers;
  {
    std::lock_guard lock(mutex_);
    if (stopping_.exchange(true)) return;
    for (Peer& peer : peers_) peers.push_back(&peer);
  }
  if (acceptor_.joinable()) acceptor_.join();  // adds no peer once stopping_ is set
  for (Peer* peer : peers) peer->link->close("shutting down", true);
  for (Peer* peer : peers)
    if (peer->reader.joinable()) peer->reader.join();  // each posts its goodbye without blocking
}

void PrefillServer::accept_loop() {
  while (!stopping_) {
    Socket socket = listener_.accept(std::chrono::milliseconds(200));
    if (!socket.valid()) continue;
    const std::string name = socket.peer_name();
    std::lock_guard lock(mutex_);
    if (stopping_) break;
    if (int(peers_.size()) >= options_.max_peers) {
      spdlog::warn("peer {}: refused: {} peer links are open (the limit)", name, peers_.size());
      continue;  // the socket closes here
    }
    Peer& peer = peers_.emplace_back();
    peer.link = std::make_unique<PeerLink>(std::move(socket), name, options_.send_timeout);
    peer.transport = std::make_unique<TcpKvTransport>(*peer.link);
    peer.transport->register_pool(model_.backend(), model_.config().num_layers);
    peer.reader = std::thread([this, &peer] { serve(peer); });
  }
}

// The peer's reader: the handshake, then its requests until the link ends.
void PrefillServer::serve(Peer& peer) {
  PeerLink& link = *peer.link;
  bool authenticated = false;
  try {
    handshake_as_prefill(link.socket(), options_.key, format_);
    authenticated = true;
    spdlog::info("peer {}: decode server connected", link.name());
    for (;;) {
      const FrameHeader header = link.read_header();
      const Deadline deadline = std::chrono::steady_clock::now() + options_.send_timeout;
      if (header.type == MessageType::kPrefill) {
        PrefillRequest request = parse_prefill(link.read_payload(header, deadline));
        const int32_t block_size = format_.block_size;
        const auto n = int64_t(request.tokens.size());
        if (int64_t(request.block_ids.size()) != (n + block_size - 1) / block_size)
          throw ProtocolError(fmt::format("request {}: {} blocks for {} tokens of blocks of {}", request.request_id,
                                          request.block_ids.size(), n, block_size));
        if (request.skip_blocks > (n - 1) / block_size)
          throw ProtocolError(fmt::format("request {}: skips {} blocks of a {}-token prompt", request.request_id,
                                          request.skip_blocks, n));
        post({.peer = &peer, .prefill = std::move(request)});
      } else if (header.type == MessageType::kCancel) {
        post({.peer = &peer, .request_id = parse_cancel(link.read_payload(header, deadline)).request_id});
      } else {
        throw ProtocolError(fmt::format("message type {} from a decode server", int(header.type)));
      }
    }
  } catch (const ProtocolError& e) {
    metrics_.count_peer_error();
    link.close(e.what());
  } catch (const PeerLost& e) {
    if (authenticated && !stopping_) metrics_.count_peer_error();
    link.close(e.what(), stopping_);
  } catch (const std::exception& e) {  // out of memory, an OpenSSL failure: this link only
    metrics_.count_peer_error();
    link.close(e.what());
  }
  post({.peer = &peer, .gone = true});
}

void PrefillServer::post(Inbound inbound) {
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(std::move(inbound));
  }
  if (service_) service_->wake();
}

// Engine thread: the peer's reader has returned; its requests stop and the peer goes.
void PrefillServer::forget_peer(Peer* peer, Engine& engine) {
  std::erase_if(jobs_, [&](const auto& entry) {
    if (entry.second.peer != peer) return false;
    engine.cancel(entry.first);
    return true;
  });
  std::lock_guard lock(mutex_);
  if (stopping_) return;  // stop() joins the readers
  auto it = std::find_if(peers_.begin(), peers_.end(), [&](const Peer& p) { return &p == peer; });
  if (it == peers_.end()) return;
  if (it->reader.joinable()) it->reader.join();
  peers_.erase(it);
}

void PrefillServer::before_step(Engine& engine) {
  if (hooked_engine_ != &engine) {
    engine.set_kept_kv_layer_hook([this](int32_t layer, std::span<const Engine::KeptKvLayer> requests) {
      send_layer(layer, requests);
    });
    hooked_engine_ = &engine;
  }
  std::vector<Inbound> inbox;
  {
    std::lock_guard lock(mutex_);
    inbox.swap(inbox_);
  }
  for (Inbound& in : inbox) {
    if (in.gone) {
      forget_peer(in.peer, engine);
      continue;
    }
    if (!in.prefill) {  // a cancel: the peer hears back that its request is gone
      auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](const auto& entry) {
        return entry.second.peer == in.peer && entry.second.request_id == in.request_id;
      });
      if (it == jobs_.end()) continue;  // answered already
      engine.cancel(it->first);
      in.peer->link->send(encode(PrefillFailed{in.request_id, "cancelled"}));
      jobs_.erase(it);
      continue;
    }
    PrefillRequest& r = *in.prefill;
    const int32_t n = int32_t(r.tokens.size());
    Request request{.prompt = std::move(r.tokens),
                    .params = {.temperature = r.sampling.temperature,
                               .top_k = r.sampling.top_k,
                               .top_p = r.sampling.top_p,
                               .min_p = r.sampling.min_p,
                               .repetition_penalty = r.sampling.repetition_penalty,
                               .presence_penalty = r.sampling.presence_penalty,
                               .frequency_penalty = r.sampling.frequency_penalty,
                               .seed = r.sampling.seed,
                               .max_tokens = 1,
                               .ignore_eos = true},
                    .keep_kv = true};
    try {
      const RequestId id = engine.submit(std::move(request));
      jobs_.emplace(id, Job{.peer = in.peer,
                            .request_id = r.request_id,
                            .num_blocks = int32_t(r.block_ids.size()),
                            .skip_blocks = r.skip_blocks,
                            .num_prompt = n});
    } catch (const Error& e) {
      in.peer->link->send(encode(PrefillFailed{r.request_id, e.what()}));
    }
  }
  publish(engine);
}

void PrefillServer::after_step(Engine& engine, std::vector<TokenEvent>& events) {
  std::erase_if(events, [&](const TokenEvent& event) {
    auto it = jobs_.find(event.request);
    if (it == jobs_.end()) return false;
    if (event.finish == FinishReason::kNone) return true;  // a one-token request: never
    Job job = it->second;
    jobs_.erase(it);
    const kv::BlockTable* kept = engine.kept_kv(event.request);
    PeerLink& link = *job.peer->link;
    if (event.token < 0 || !kept || int32_t(kept->block_ids.size()) != job.num_blocks) {
      engine.release_kept_kv(event.request);
      link.send(encode(PrefillFailed{job.request_id, "the prefill server could not compute the prompt's KV"}));
      return true;
    }
    const int32_t num_layers = model_.config().num_layers;
    if (job.layers_sent < num_layers)  // the step's layer hook did not send them all
      send_layers(job, kept->block_ids, job.layers_sent, num_layers - job.layers_sent);
    engine.release_kept_kv(event.request);
    link.send(encode(PrefillDone{job.request_id, event.token}));
    metrics_.observe_transfer(job.bytes_sent, job.num_prompt - int64_t(job.skip_blocks) * format_.block_size,
                              job.read_seconds);
    return true;
  });
  publish(engine);
}

// Engine thread, inside a step: layer `layer` of these requests' prompts is stored.
void PrefillServer::send_layer(int32_t layer, std::span<const Engine::KeptKvLayer> requests) {
  for (const Engine::KeptKvLayer& r : requests) {
    auto it = jobs_.find(r.id);
    // A step recomputed after one that threw calls again for layers already sent.
    if (it == jobs_.end() || it->second.layers_sent != layer || int32_t(r.block_ids.size()) != it->second.num_blocks)
      continue;
    send_layers(it->second, r.block_ids, layer, 1);
  }
}

void PrefillServer::send_layers(Job& job, std::span<const int32_t> block_ids, int32_t first_layer, int32_t num_layers) {
  const int32_t last_block_tokens = job.num_prompt - (job.num_blocks - 1) * format_.block_size;
  job.peer->transport->send(job.request_id, block_ids.subspan(size_t(job.skip_blocks)), last_block_tokens, first_layer,
                            num_layers);
  job.layers_sent = first_layer + num_layers;
  for (const TransferEvent& sent : job.peer->transport->poll()) {
    job.bytes_sent += sent.bytes;
    job.read_seconds += sent.seconds;
  }
}

void PrefillServer::publish(const Engine& engine) {
  int64_t connected = 0;
  {
    std::lock_guard lock(mutex_);
    for (const Peer& p : peers_) connected += !p.link->closed();
  }
  metrics_.set_peers_connected(connected);
  metrics_.set_queues(engine.num_waiting(), int64_t(jobs_.size()));
}

}  // namespace pagoda::disagg
