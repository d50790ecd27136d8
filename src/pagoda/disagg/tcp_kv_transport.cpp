#include "pagoda/disagg/tcp_kv_transport.h"

#include <fmt/format.h>

#include <cstring>

#include "pagoda/core/error.h"

namespace pagoda::disagg {

void TcpKvTransport::register_pool(Backend& backend, int32_t num_layers) {
  backend_ = &backend;
  num_layers_ = num_layers;
  page_bytes_ = backend.kv_page_bytes();
}

uint64_t TcpKvTransport::layer_bytes(size_t num_blocks, int32_t last_block_tokens) const {
  return 2 * num_blocks * page_bytes_ + (num_blocks > 0 ? backend_->kv_tail_bytes(last_block_tokens) : 0);
}

void TcpKvTransport::send(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens,
                          int32_t first_layer, int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "KV transport: send before register_pool");
  const auto start = std::chrono::steady_clock::now();
  const KvHeader header{.request_id = request_id,
                        .first_layer = first_layer,
                        .num_layers = num_layers,
                        .num_blocks = int32_t(blocks.size())};
  const uint64_t pages_bytes = 2 * blocks.size() * page_bytes_;
  const uint64_t tail_bytes = layer_bytes(blocks.size(), last_block_tokens) - pages_bytes;
  std::vector<uint8_t> frame = encode_kv_prefix(header, page_bytes_, tail_bytes);
  const size_t prefix = frame.size();
  const uint64_t bytes = kv_pages_bytes(header, page_bytes_, tail_bytes);
  frame.resize(prefix + bytes);
  for (int32_t l = 0; l < num_layers; ++l) {
    auto* at = reinterpret_cast<std::byte*>(frame.data() + prefix + size_t(l) * (pages_bytes + tail_bytes));
    backend_->read_kv_pages(first_layer + l, blocks, at);
    if (tail_bytes > 0) backend_->read_kv_tail(first_layer + l, blocks.back(), last_block_tokens, at + pages_bytes);
  }
  link_.send(std::move(frame));
  std::lock_guard lock(mutex_);
  sent_.push_back({.request_id = request_id,
                   .ok = true,
                   .bytes = bytes,
                   .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
}

void TcpKvTransport::receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t last_block_tokens,
                             int32_t first_layer, int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "KV transport: receive before register_pool");
  if (first_layer < 0 || num_layers <= 0 || first_layer + num_layers > num_layers_)
    fail(ErrorKind::kInternal, "KV transport: layers [{}, {}) outside the model's {}", first_layer,
         first_layer + num_layers, num_layers_);
  const uint64_t bytes = layer_bytes(blocks.size(), last_block_tokens);
  std::lock_guard lock(mutex_);
  posted_[request_id] = Posted{.blocks = {blocks.begin(), blocks.end()},
                               .last_block_tokens = last_block_tokens,
                               .first_layer = first_layer,
                               .num_layers = num_layers,
                               .next_layer = first_layer,
                               .layer_bytes = bytes};
}

void TcpKvTransport::cancel_receive(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  auto it = posted_.find(request_id);
  if (it == posted_.end()) return;
  if (it->second.staged || !it->second.error.empty())
    posted_.erase(it);  // arrived already: nothing more comes
  else {
    it->second.cancelled = true;
    std::vector<std::byte>().swap(it->second.pages);
  }
}

void TcpKvTransport::forget(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  posted_.erase(request_id);
}

void TcpKvTransport::read_frame(const FrameHeader& frame, Deadline deadline) {
  std::vector<uint8_t> header_bytes(kKvHeaderBytes);
  link_.socket().recv_exact(header_bytes, deadline);
  const KvHeader header = parse_kv_header(header_bytes);
  uint64_t bytes = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = posted_.find(header.request_id);
    if (it == posted_.end() || it->second.staged || it->second.reading || !it->second.error.empty())
      throw ProtocolError(fmt::format("KV pages for request {}, which this server is not waiting for", header.request_id));
    Posted& p = it->second;
    if (header.first_layer != p.next_layer || header.num_layers > p.first_layer + p.num_layers - p.next_layer ||
        header.num_blocks != int32_t(p.blocks.size()))
      throw ProtocolError(fmt::format("KV pages of layers [{}, +{}) x {} blocks for request {}, expected [{}, +{}) x {}",
                                      header.first_layer, header.num_layers, header.num_blocks, header.request_id,
                                      p.next_layer, p.first_layer + p.num_layers - p.next_layer, p.blocks.size()));
    bytes = uint64_t(header.num_layers) * p.layer_bytes;
    if (frame.payload_bytes != kKvHeaderBytes + bytes)
      throw ProtocolError(fmt::format("KV frame of {} bytes for {} bytes of pages", frame.payload_bytes, bytes));
    p.reading = true;
  }
  // Outside the lock: the engine thread may cancel the receive meanwhile (then the pages are
  // read to keep the stream in step, and dropped).
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::byte> pages(bytes);
  link_.socket().recv_exact(std::span(reinterpret_cast<uint8_t*>(pages.data()), pages.size()), deadline);
  const auto end = std::chrono::steady_clock::now();
  std::lock_guard lock(mutex_);
  auto it = posted_.find(header.request_id);
  if (it == posted_.end()) return;
  Posted& p = it->second;
  const bool first = p.next_layer == p.first_layer;
  p.next_layer += header.num_layers;
  p.reading = false;
  const bool complete = p.next_layer == p.first_layer + p.num_layers;
  if (p.cancelled) {  // its later layers are still read, and dropped
    if (complete) posted_.erase(it);
    return;
  }
  if (first) {
    p.pages = std::move(pages);
  } else {
    p.pages.insert(p.pages.end(), pages.begin(), pages.end());
  }
  p.staged = complete;
  // The frames' own reading times: between a request's per-layer frames the prefill computes.
  p.seconds += std::chrono::duration<double>(end - start).count();
}

void TcpKvTransport::fail_all(const std::string& reason) {
  std::lock_guard lock(mutex_);
  for (auto& [id, p] : posted_)
    if (!p.staged) p.error = reason;
  std::erase_if(posted_, [](const auto& entry) { return entry.second.cancelled; });
}

std::vector<TransferEvent> TcpKvTransport::poll() {
  std::vector<TransferEvent> events;
  std::vector<std::pair<uint64_t, Posted>> done;
  {
    std::lock_guard lock(mutex_);
    events = std::exchange(sent_, {});
    for (auto it = posted_.begin(); it != posted_.end();) {
      if (it->second.cancelled && !it->second.reading && (it->second.staged || !it->second.error.empty())) {
        it = posted_.erase(it);
      } else if (!it->second.cancelled && (it->second.staged || !it->second.error.empty())) {
        done.emplace_back(it->first, std::move(it->second));
        it = posted_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& [id, p] : done) {
    if (!p.error.empty()) {
      events.push_back({.request_id = id, .ok = false, .error = p.error});
      continue;
    }
    const size_t pages_bytes = 2 * p.blocks.size() * page_bytes_;
    for (int32_t l = 0; l < p.num_layers; ++l) {
      const std::byte* at = p.pages.data() + size_t(l) * p.layer_bytes;
      backend_->write_kv_pages(p.first_layer + l, p.blocks, at);
      if (!p.blocks.empty()) backend_->write_kv_tail(p.first_layer + l, p.blocks.back(), p.last_block_tokens, at + pages_bytes);
    }
    events.push_back({.request_id = id, .ok = true, .bytes = p.pages.size(), .seconds = p.seconds});
  }
  return events;
}

}  // namespace pagoda::disagg
