#include "pagoda/disagg/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <utility>

#include "pagoda/core/error.h"

namespace pagoda::disagg {
namespace {

int poll_timeout_ms(const Deadline& deadline) {
  if (!deadline) return 1000;  // wake now and then: a shut-down socket reports itself anyway
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(*deadline - std::chrono::steady_clock::now());
  return int(std::max<int64_t>(0, left.count()));
}

bool expired(const Deadline& deadline) { return deadline && std::chrono::steady_clock::now() >= *deadline; }

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) return nullptr;
  return result;
}

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

Socket Socket::listen(const std::string& host, int port) {
  addrinfo* addresses = resolve(host, port, true);
  if (!addresses) fail(ErrorKind::kInvalidArgument, "cannot resolve peer address {}", host);
  std::string why = "no address";
  for (addrinfo* a = addresses; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol));
    if (!s.valid()) continue;
    const int one = 1;
    setsockopt(s.fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(s.fd_, a->ai_addr, a->ai_addrlen) == 0 && ::listen(s.fd_, 64) == 0) {
      freeaddrinfo(addresses);
      return s;
    }
    why = std::strerror(errno);
  }
  freeaddrinfo(addresses);
  fail(ErrorKind::kInvalidArgument, "cannot listen for peers on {}:{}: {}", host, port, why);
}

Socket Socket::connect(const std::string& host, int port, std::chrono::milliseconds timeout) {
  addrinfo* addresses = resolve(host, port, false);
  if (!addresses) throw PeerLost("cannot resolve " + host);
  std::string why = "no address";
  for (addrinfo* a = addresses; a; a = a->ai_next) {
    Socket s(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol));
    if (!s.valid()) continue;
    if (::connect(s.fd_, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::strerror(errno);
      continue;
    }
    pollfd p{.fd = s.fd_, .events = POLLOUT};
    int error = 0;
    socklen_t length = sizeof error;
    if (::poll(&p, 1, int(timeout.count())) == 1 && getsockopt(s.fd_, SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
        error == 0) {
      freeaddrinfo(addresses);
      const int one = 1;
      setsockopt(s.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      return s;
    }
    why = error ? std::strerror(error) : "timed out";
  }
  freeaddrinfo(addresses);
  throw PeerLost(fmt::format("cannot connect to {}:{}: {}", host, port, why));
}

Socket Socket::accept(std::chrono::milliseconds timeout) {
  pollfd p{.fd = fd_, .events = POLLIN};
  if (::poll(&p, 1, int(timeout.count())) != 1) return {};
  Socket s(::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
  if (s.valid()) {
    const int one = 1;
    setsockopt(s.fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return s;
}

void Socket::send_all(std::span<const uint8_t> bytes, Deadline deadline) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += size_t(n);
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw PeerLost(fmt::format("send: {}", std::strerror(errno)));
    if (expired(deadline)) throw PeerLost("send timed out");
    pollfd p{.fd = fd_, .events = POLLOUT};
    ::poll(&p, 1, poll_timeout_ms(deadline));
    if (p.revents & (POLLERR | POLLHUP | POLLNVAL)) throw PeerLost("the connection closed");
  }
}

void Socket::recv_exact(std::span<uint8_t> bytes, Deadline deadline) {
  size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t n = ::recv(fd_, bytes.data() + got, bytes.size() - got, 0);
    if (n > 0) {
      got += size_t(n);
      continue;
    }
    if (n == 0) throw PeerLost(got == 0 ? "the peer closed the connection" : "the peer closed the connection mid-frame");
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
      throw PeerLost(fmt::format("recv: {}", std::strerror(errno)));
    if (expired(deadline)) throw PeerLost("timed out waiting for the peer");
    pollfd p{.fd = fd_, .events = POLLIN};
    ::poll(&p, 1, poll_timeout_ms(deadline));
    if (p.revents & POLLNVAL) throw PeerLost("the connection closed");
  }
}

void Socket::shutdown() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

int Socket::port() const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  return address.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port)
                                       : ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

std::string Socket::peer_name() const {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  char host[NI_MAXHOST] = "?", service[NI_MAXSERV] = "?";
  if (getpeername(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0)
    getnameinfo(reinterpret_cast<sockaddr*>(&address), length, host, sizeof host, service, sizeof service,
                NI_NUMERICHOST | NI_NUMERICSERV);
  return fmt::format("{}:{}", host, service);
}

std::pair<std::string, int> parse_host_port(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = -1;
  if (colon != std::string::npos && colon > 0) {
    const char* first = address.data() + colon + 1;
    const char* last = address.data() + address.size();
    const auto [end, ec] = std::from_chars(first, last, port);
    if (ec != std::errc() || end != last || first == last) port = -1;
  }
  if (port < 1 || port > 65535) fail(ErrorKind::kInvalidArgument, "'{}' is not HOST:PORT", address);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return {host, port};
}

}  // namespace pagoda::disagg
