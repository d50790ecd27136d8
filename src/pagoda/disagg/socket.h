// A TCP connection or listener (POSIX sockets), for the peer links of disaggregated serving.
// Reads and writes either complete, or throw PeerLost (the peer closed, reset, or missed the
// deadline): a caller never sees half a frame.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

namespace pagoda::disagg {

class PeerLost : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using Deadline = std::optional<std::chrono::steady_clock::time_point>;  // nullopt: wait as long as it takes

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept;

  // Listens on host:port (port 0: any free port). Throws Error(kInvalidArgument) when it cannot.
  static Socket listen(const std::string& host, int port);
  // Connects within `timeout`; throws PeerLost when it cannot.
  static Socket connect(const std::string& host, int port, std::chrono::milliseconds timeout);
  // The next connection, or an invalid Socket after `timeout` (so a listener can check for stop).
  Socket accept(std::chrono::milliseconds timeout);

  void send_all(std::span<const uint8_t> bytes, Deadline deadline);
  void recv_exact(std::span<uint8_t> bytes, Deadline deadline);
  // Ends the connection both ways: a thread blocked in recv_exact on it returns (PeerLost).
  void shutdown();

  bool valid() const { return fd_ >= 0; }
  int port() const;             // the local port
  std::string peer_name() const;  // "host:port" of the other end

 private:
  int fd_ = -1;
};

// "host:port" -> (host, port); throws Error(kInvalidArgument) for anything else.
std::pair<std::string, int> parse_host_port(const std::string& address);

}  // namespace pagoda::disagg
