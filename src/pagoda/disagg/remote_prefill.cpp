#include "pagoda/disagg/remote_prefill.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "pagoda/core/error.h"
#include "pagoda/disagg/handshake.h"

namespace pagoda::disagg {

RemotePrefill::RemotePrefill(Model& model, RemotePrefillOptions options, TransferMetrics& metrics)
    : model_(model), options_(std::move(options)), metrics_(metrics), format_(local_kv_format(model)) {
  for (const std::string& address : options_.prefill_addresses) {
    auto peer = std::make_unique<Peer>();
    peer->address = address;
    std::tie(peer->host, peer->port) = parse_host_port(address);
    peers_.push_back(std::move(peer));
  }
}

RemotePrefill::~RemotePrefill() { stop(); }

void RemotePrefill::start(server::EngineService& service) {
  service_ = &service;
  for (auto& peer : peers_) peer->thread = std::thread([this, p = peer.get()] { run_peer(*p); });
  watchdog_ = std::thread([this] {
    std::unique_lock lock(mutex_);
    while (!stop_signal_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stopping_; }))
      if (std::chrono::steady_clock::now().time_since_epoch().count() >= next_deadline_.load()) service_->wake();
  });
}

void RemotePrefill::stop() {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
  }
  stop_signal_.notify_all();
  for (auto& peer : peers_) {
    if (std::shared_ptr<Link> link = link_of(*peer)) link->peer.close("shutting down", true);
  }
  for (auto& peer : peers_)
    if (peer->thread.joinable()) peer->thread.join();
  if (watchdog_.joinable()) watchdog_.join();
}

std::shared_ptr<RemotePrefill::Link> RemotePrefill::link_of(Peer& peer) {
  std::lock_guard lock(peer.mutex);
  return peer.link;
}

void RemotePrefill::post(Answer answer) {
  {
    std::lock_guard lock(mutex_);
    answers_.push_back(std::move(answer));
  }
  if (service_) service_->wake();
}

// A prefill server's thread: connect, authenticate, read its answers until the link ends; then
// again after the reconnect interval, until stop().
void RemotePrefill::run_peer(Peer& peer) {
  bool was_down_logged = false;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stopping_) return;
    }
    std::shared_ptr<Link> link;
    try {
      Socket socket = Socket::connect(peer.host, peer.port, std::chrono::seconds(2));
      handshake_as_decode(socket, options_.key, format_);
      link = std::make_shared<Link>(std::move(socket), peer.address, options_.timeout);
      link->transport.register_pool(model_.backend(), format_.num_layers);
      {
        std::lock_guard lock(peer.mutex);
        peer.link = link;
      }
      spdlog::info("prefill server {}: connected", peer.address);
      was_down_logged = false;
      if (service_) service_->wake();  // queued requests may go there now
      read_link(link);
    } catch (const std::exception& e) {  // connect or handshake failed
      if (!was_down_logged) spdlog::warn("prefill server {}: not available: {} (retrying every {} ms)", peer.address,
                                         e.what(), options_.reconnect_interval.count());
      was_down_logged = true;
    }
    if (link) {
      {
        std::lock_guard lock(peer.mutex);
        peer.link.reset();
      }
      post({.link = link, .error = "the link to the prefill server was lost", .lost = true});
    }
    std::unique_lock lock(mutex_);
    if (stop_signal_.wait_for(lock, options_.reconnect_interval, [&] { return stopping_; })) return;
  }
}

void RemotePrefill::read_link(const std::shared_ptr<Link>& shared) {
  Link& link = *shared;
  PeerLink& peer = link.peer;
  std::string reason;
  try {
    for (;;) {
      const FrameHeader header = peer.read_header();
      const Deadline deadline = std::chrono::steady_clock::now() + options_.timeout;
      switch (header.type) {
        case MessageType::kKv:
          link.transport.read_frame(header, deadline);
          break;
        case MessageType::kPrefillDone: {
          const PrefillDone done = parse_prefill_done(peer.read_payload(header, deadline));
          post({.link = shared, .request_id = done.request_id, .first_token = done.first_token});
          break;
        }
        case MessageType::kPrefillFailed: {
          const PrefillFailed failed = parse_prefill_failed(peer.read_payload(header, deadline));
          post({.link = shared, .request_id = failed.request_id, .error = failed.reason});
          break;
        }
        default:
          throw ProtocolError(fmt::format("message type {} from a prefill server", int(header.type)));
      }
    }
  } catch (const ProtocolError& e) {
    reason = e.what();
    metrics_.count_peer_error();
  } catch (const PeerLost& e) {
    reason = e.what();
    if (!peer.closed()) metrics_.count_peer_error();
  } catch (const std::exception& e) {
    reason = e.what();
    metrics_.count_peer_error();
  }
  peer.close(reason);
  link.transport.fail_all(reason);
}

void RemotePrefill::prepare(Request& request) {
  // Logprobs of the first token would have to travel too, and a beam search forks its prompt's
  // KV into beams from the prompt's logits: such requests are prefilled here.
  if (request.params.logprobs > 0 || request.params.beam_width > 0) return;
  request.prefill_remotely = std::any_of(peers_.begin(), peers_.end(), [&](const auto& p) { return link_of(*p) != nullptr; });
}

RemotePrefill::Peer* RemotePrefill::least_loaded(const std::vector<Peer*>& exclude) {
  Peer* best = nullptr;
  for (auto& peer : peers_) {
    if (std::find(exclude.begin(), exclude.end(), peer.get()) != exclude.end()) continue;
    const std::shared_ptr<Link> link = link_of(*peer);
    if (!link || link->peer.closed()) continue;
    if (!best || peer->in_flight < best->in_flight) best = peer.get();
  }
  return best;
}

// Posts the receive of the pages, then asks for them.
bool RemotePrefill::send_to(Peer& peer, Pending& pending) {
  std::shared_ptr<Link> link = link_of(peer);
  if (!link) return false;
  const Engine::RemotePrefill& r = pending.request;
  const std::span<const int32_t> blocks = std::span(r.block_ids).subspan(size_t(r.cached_blocks));
  const auto last_block_tokens = int32_t(int64_t(r.prompt.size()) - int64_t(r.block_ids.size() - 1) * format_.block_size);
  link->transport.receive(uint64_t(r.id), blocks, last_block_tokens, 0, format_.num_layers);
  const SamplingParams& p = r.params;
  link->peer.send(encode(PrefillRequest{.request_id = uint64_t(r.id),
                                        .tokens = r.prompt,
                                        .block_ids = r.block_ids,
                                        .skip_blocks = r.cached_blocks,
                                        .sampling = {.temperature = p.temperature,
                                                     .top_k = p.top_k,
                                                     .top_p = p.top_p,
                                                     .min_p = p.min_p,
                                                     .repetition_penalty = p.repetition_penalty,
                                                     .presence_penalty = p.presence_penalty,
                                                     .frequency_penalty = p.frequency_penalty,
                                                     .seed = p.seed.value_or(0)}}));
  pending.peer = &peer;
  pending.link = std::move(link);
  pending.sent = std::chrono::steady_clock::now();
  pending.deadline = pending.sent + options_.timeout;
  pending.tried.push_back(&peer);
  pending.pages_written = false;
  ++peer.in_flight;
  return true;
}

void RemotePrefill::fail_over(Engine& engine, RequestId id, const std::string& why) {
  auto it = pending_.find(id);
  if (it == pending_.end()) return;
  Pending& pending = it->second;
  --pending.peer->in_flight;
  pending.link->transport.cancel_receive(uint64_t(id));
  pending.link.reset();
  if (Peer* next = least_loaded(pending.tried); next && send_to(*next, pending)) {
    spdlog::warn("request {}: prefill at {} failed ({}); trying {}", id, pending.tried.front()->address, why, next->address);
    metrics_.count_fallback(false);
    return;
  }
  spdlog::warn("request {}: remote prefill failed ({}); prefilling it here", id, why);
  metrics_.count_fallback(true);
  engine.fail_remote_prefill(id);
  pending_.erase(it);
}

void RemotePrefill::dispatch(Engine& engine) {
  for (Engine::RemotePrefill& r : engine.start_remote_prefills()) {
    Pending pending{.request = std::move(r)};
    const RequestId id = pending.request.id;
    Peer* peer = least_loaded({});
    if (peer && send_to(*peer, pending)) {
      pending_.emplace(id, std::move(pending));
    } else {
      metrics_.count_fallback(true);
      engine.fail_remote_prefill(id);
    }
  }
}

void RemotePrefill::before_step(Engine& engine) {
  std::vector<Answer> answers;
  {
    std::lock_guard lock(mutex_);
    answers.swap(answers_);
  }
  // Pages first: a link's pages come before its done message, so every done taken above has its
  // pages staged by now.
  std::set<Link*> links;
  for (const auto& [id, p] : pending_) links.insert(p.link.get());
  for (Link* link : links) {
    for (TransferEvent& event : link->transport.poll()) {
      auto it = pending_.find(RequestId(event.request_id));
      if (it == pending_.end() || it->second.link.get() != link) continue;
      if (event.ok) {
        it->second.pages_written = true;
        it->second.transfer = event;
      }  // a failed receive: the lost link's answer fails the request over
    }
  }
  for (Answer& answer : answers) {
    if (answer.lost) {
      std::vector<RequestId> ids;
      for (const auto& [id, p] : pending_)
        if (p.link == answer.link) ids.push_back(id);
      for (RequestId id : ids) fail_over(engine, id, answer.error);
      continue;
    }
    auto it = pending_.find(RequestId(answer.request_id));
    if (it == pending_.end() || it->second.link.get() != answer.link.get()) {  // moved on already
      // A cancelled receive waits for its remaining layers; a failure says none will come.
      if (!answer.first_token) answer.link->transport.forget(answer.request_id);
      continue;
    }
    Pending& pending = it->second;
    if (!answer.first_token) {
      pending.link->transport.forget(answer.request_id);
      fail_over(engine, it->first, "the prefill server failed it: " + answer.error);
      continue;
    }
    if (!pending.pages_written) {
      pending.link->peer.close(fmt::format("request {}: done without its KV pages", answer.request_id));
      fail_over(engine, it->first, "no KV pages");
      continue;
    }
    try {
      engine.complete_remote_prefill(it->first, *answer.first_token);
    } catch (const Error& e) {
      pending.link->peer.close(fmt::format("request {}: {}", answer.request_id, e.what()));
      fail_over(engine, it->first, e.what());
      continue;
    }
    const Engine::RemotePrefill& r = pending.request;
    metrics_.observe_transfer(pending.transfer.bytes,
                              int64_t(r.prompt.size()) - int64_t(r.cached_blocks) * format_.block_size,
                              pending.transfer.seconds);
    --pending.peer->in_flight;
    pending_.erase(it);
  }
  // Cancelled by their clients: the prefill server may stop, and late pages are dropped.
  const auto now = std::chrono::steady_clock::now();
  std::vector<RequestId> stalled;
  for (auto it = pending_.begin(); it != pending_.end();) {
    Pending& p = it->second;
    if (!engine.remote_prefill_pending(it->first)) {
      p.link->transport.cancel_receive(uint64_t(it->first));
      p.link->peer.send(encode(Cancel{uint64_t(it->first)}));
      --p.peer->in_flight;
      it = pending_.erase(it);
      continue;
    }
    if (now >= p.deadline) stalled.push_back(it->first);
    ++it;
  }
  for (RequestId id : stalled) {
    auto it = pending_.find(id);
    if (it == pending_.end()) continue;
    it->second.link->peer.close(fmt::format("stalled: request {} not prefilled within {} ms", id, options_.timeout.count()));
    fail_over(engine, id, "timed out");
  }
  dispatch(engine);
  publish(engine);
}

void RemotePrefill::after_step(Engine& engine, std::vector<TokenEvent>& /*events*/) {
  dispatch(engine);  // the step may have freed the blocks or the batch slot a queued request needs
  publish(engine);
}

void RemotePrefill::publish(const Engine& engine) {
  auto earliest = std::chrono::steady_clock::time_point::max();
  for (const auto& [id, p] : pending_) earliest = std::min(earliest, p.deadline);
  next_deadline_ = earliest.time_since_epoch().count();
  int64_t connected = 0;
  for (auto& peer : peers_) connected += link_of(*peer) != nullptr;
  metrics_.set_peers_connected(connected);
  metrics_.set_queues(engine.num_remote_queued(), engine.num_remote_prefilling());
}

}  // namespace pagoda::disagg
