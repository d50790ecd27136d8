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

void TcpKvTransport::send(uint64_t request_id, std::span<const int32_t> blocks, int32_t first_layer,
                          int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "KV transport: send before register_pool");
  const auto start = std::chrono::steady_clock::now();
  const KvHeader header{.request_id = request_id,
                        .first_layer = first_layer,
                        .num_layers = num_layers,
                        .num_blocks = int32_t(blocks.size())};
  std::vector<uint8_t> frame = encode_kv_prefix(header, page_bytes_);
  const size_t prefix = frame.size();
  const uint64_t bytes = kv_pages_bytes(header, page_bytes_);
  frame.resize(prefix + bytes);
  const size_t layer_bytes = 2 * blocks.size() * page_bytes_;
  for (int32_t l = 0; l < num_layers; ++l)
    backend_->read_kv_pages(first_layer + l, blocks, reinterpret_cast<std::byte*>(frame.data() + prefix + size_t(l) * layer_bytes));
  link_.send(std::move(frame));
  std::lock_guard lock(mutex_);
  sent_.push_back({.request_id = request_id,
                   .ok = true,
                   .bytes = bytes,
                   .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()});
}

void TcpKvTransport::receive(uint64_t request_id, std::span<const int32_t> blocks, int32_t first_layer,
                             int32_t num_layers) {
  if (!backend_) fail(ErrorKind::kInternal, "KV transport: receive before register_pool");
  if (first_layer < 0 || num_layers <= 0 || first_layer + num_layers > num_layers_)
    fail(ErrorKind::kInternal, "KV transport: layers [{}, {}) outside the model's {}", first_layer,
         first_layer + num_layers, num_layers_);
  std::lock_guard lock(mutex_);
  posted_[request_id] = Posted{.blocks = {blocks.begin(), blocks.end()}, .first_layer = first_layer, .num_layers = num_layers};
}

void TcpKvTransport::cancel_receive(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  auto it = posted_.find(request_id);
  if (it == posted_.end()) return;
  if (it->second.staged || !it->second.error.empty())
    posted_.erase(it);  // arrived already: nothing more comes
  else
    it->second.cancelled = true;
}

void TcpKvTransport::forget(uint64_t request_id) {
  std::lock_guard lock(mutex_);
  posted_.erase(request_id);
}

void TcpKvTransport::read_frame(const FrameHeader& frame, Deadline deadline) {
  std::vector<uint8_t> header_bytes(kKvHeaderBytes);
  link_.socket().recv_exact(header_bytes, deadline);
  const KvHeader header = parse_kv_header(header_bytes);
  const uint64_t bytes = kv_pages_bytes(header, page_bytes_);
  {
    std::lock_guard lock(mutex_);
    auto it = posted_.find(header.request_id);
    if (it == posted_.end() || it->second.staged || it->second.reading || !it->second.error.empty())
      throw ProtocolError(fmt::format("KV pages for request {}, which this server is not waiting for", header.request_id));
    const Posted& p = it->second;
    if (header.first_layer != p.first_layer || header.num_layers != p.num_layers ||
        header.num_blocks != int32_t(p.blocks.size()))
      throw ProtocolError(fmt::format("KV pages of layers [{}, +{}) x {} blocks for request {}, expected [{}, +{}) x {}",
                                      header.first_layer, header.num_layers, header.num_blocks, header.request_id,
                                      p.first_layer, p.num_layers, p.blocks.size()));
    if (frame.payload_bytes != kKvHeaderBytes + bytes)
      throw ProtocolError(fmt::format("KV frame of {} bytes for {} bytes of pages", frame.payload_bytes, bytes));
    it->second.reading = true;
  }
  // Outside the lock: the engine thread may cancel the receive meanwhile (then the pages are
  // read to keep the stream in step, and dropped).
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::byte> pages(bytes);
  link_.socket().recv_exact(std::span(reinterpret_cast<uint8_t*>(pages.data()), pages.size()), deadline);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::lock_guard lock(mutex_);
  auto it = posted_.find(header.request_id);
  if (it == posted_.end()) return;
  if (it->second.cancelled) {
    posted_.erase(it);
    return;
  }
  it->second.pages = std::move(pages);
  it->second.reading = false;
  it->second.staged = true;
  it->second.seconds = seconds;
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
    const size_t layer_bytes = 2 * p.blocks.size() * page_bytes_;
    for (int32_t l = 0; l < p.num_layers; ++l)
      backend_->write_kv_pages(p.first_layer + l, p.blocks, p.pages.data() + size_t(l) * layer_bytes);
    events.push_back({.request_id = id, .ok = true, .bytes = p.pages.size(), .seconds = p.seconds});
  }
  return events;
}

}  // namespace pagoda::disagg
