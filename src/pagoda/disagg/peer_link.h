// PeerLink: one authenticated connection between a decode server and a prefill server. Frames
// are written by a thread of its own from a queue (the engine thread never blocks on a slow
// peer) and read by its owner's reader thread. close() ends it once, with a logged reason; the
// owner's reader then fails with PeerLost, and whatever was queued is dropped.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "pagoda/disagg/socket.h"
#include "pagoda/disagg/wire.h"

namespace pagoda::disagg {

class PeerLink {
 public:
  // send_timeout: the longest a frame may take to go out before the peer counts as stalled.
  PeerLink(Socket socket, std::string name, std::chrono::milliseconds send_timeout);
  ~PeerLink();  // close("shutting down") and join the writer
  PeerLink(const PeerLink&) = delete;
  PeerLink& operator=(const PeerLink&) = delete;

  void send(std::vector<uint8_t> frame);
  // The first call logs `reason` (at warning level unless `quiet`) and shuts the socket down.
  void close(const std::string& reason, bool quiet = false);
  bool closed() const;
  const std::string& name() const { return name_; }

  // Reader thread: the next frame's header (waits as long as it takes), then its control
  // payload, which must follow within `deadline`.
  FrameHeader read_header();
  std::vector<uint8_t> read_payload(const FrameHeader& header, Deadline deadline);
  Socket& socket() { return socket_; }

 private:
  void write_loop();

  Socket socket_;
  std::string name_;
  std::chrono::milliseconds send_timeout_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<std::vector<uint8_t>> queue_;
  bool closed_ = false;
  std::thread writer_;
};

}  // namespace pagoda::disagg
