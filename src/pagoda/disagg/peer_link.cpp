#include "pagoda/disagg/peer_link.h"

#include <spdlog/spdlog.h>

namespace pagoda::disagg {

PeerLink::PeerLink(Socket socket, std::string name, std::chrono::milliseconds send_timeout)
    : socket_(std::move(socket)), name_(std::move(name)), send_timeout_(send_timeout) {
  writer_ = std::thread([this] { write_loop(); });
}

PeerLink::~PeerLink() {
  close("shutting down", true);
  writer_.join();
}

void PeerLink::send(std::vector<uint8_t> frame) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    queue_.push_back(std::move(frame));
  }
  ready_.notify_all();
}

void PeerLink::close(const std::string& reason, bool quiet) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    closed_ = true;
    queue_.clear();
  }
  if (!quiet) spdlog::warn("peer {}: disconnected: {}", name_, reason);
  socket_.shutdown();
  ready_.notify_all();
}

bool PeerLink::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

void PeerLink::write_loop() {
  for (;;) {
    std::vector<uint8_t> frame;
    {
      std::unique_lock lock(mutex_);
      ready_.wait(lock, [&] { return closed_ || !queue_.empty(); });
      if (closed_) return;
      frame = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      socket_.send_all(frame, std::chrono::steady_clock::now() + send_timeout_);
    } catch (const PeerLost& e) {
      close(e.what());
      return;
    }
  }
}

FrameHeader PeerLink::read_header() {
  std::vector<uint8_t> bytes(kFrameHeaderBytes);
  socket_.recv_exact(bytes, std::nullopt);
  return parse_frame_header(bytes);
}

std::vector<uint8_t> PeerLink::read_payload(const FrameHeader& header, Deadline deadline) {
  std::vector<uint8_t> payload(header.payload_bytes);  // bounded by parse_frame_header
  socket_.recv_exact(payload, deadline);
  return payload;
}

}  // namespace pagoda::disagg
