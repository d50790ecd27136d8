#include "pagoda/http/server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cassert>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <system_error>
#include <thread>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "pagoda/core/error.h"
#include "pagoda/http/connection.h"

namespace pagoda::http {
namespace {

std::string errno_message(int error) { return std::system_category().message(error); }

void bump(int event_fd) {
  const uint64_t one = 1;
  // Cannot fail short of a bad fd: an eventfd counter does not overflow at these rates.
  [[maybe_unused]] const ssize_t n = ::write(event_fd, &one, sizeof one);
}

void check_options(const ServerOptions& o) {
  if (o.port < 0 || o.port > 65535) fail(ErrorKind::kInvalidArgument, "port {} is not in 0..65535", o.port);
  if (o.max_connections < 1) fail(ErrorKind::kInvalidArgument, "max_connections must be at least 1");
  if (o.keep_alive_timeout_s < 1 || o.read_timeout_s < 1 || o.write_timeout_s < 1) {
    fail(ErrorKind::kInvalidArgument, "HTTP timeouts must be at least 1 s");
  }
}

}  // namespace

struct Server::Worker {
  explicit Worker(int fd) : slot(fd) {}
  ConnectionSlot slot;
  std::thread thread;
  std::atomic<bool> done{false};
};

Server::Server(ServerOptions options, Handler handler) : options_(std::move(options)), handler_(std::move(handler)) {
  check_options(options_);
  if (!handler_) fail(ErrorKind::kInvalidArgument, "HTTP server without a handler");
  const std::string where = options_.host.find(':') != std::string::npos
                                ? fmt::format("[{}]:{}", options_.host, options_.port)
                                : fmt::format("{}:{}", options_.host, options_.port);

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(options_.port);
  if (const int rc = getaddrinfo(options_.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    fail(ErrorKind::kInvalidArgument, "cannot listen on {}: {}", where, gai_strerror(rc));
  }
  int error = 0;
  for (const addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    // Non-blocking: a client that resets between poll() and accept() must not block run().
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) {
      error = errno;
      continue;
    }
    const int one = 1;  // a restarted server can bind while old connections sit in TIME_WAIT
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd_ = fd;
    } else {
      error = errno;
      ::close(fd);
    }
  }
  freeaddrinfo(found);
  if (listen_fd_ < 0) fail(ErrorKind::kInvalidArgument, "cannot listen on {}: {}", where, errno_message(error));

  sockaddr_storage bound{};
  socklen_t length = sizeof bound;
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<const sockaddr_in6&>(bound).sin6_port
                                            : reinterpret_cast<const sockaddr_in&>(bound).sin_port);

  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  reap_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0 || reap_fd_ < 0) {
    error = errno;
    for (int fd : {listen_fd_, stop_fd_, reap_fd_}) {
      if (fd >= 0) ::close(fd);
    }
    fail(ErrorKind::kInternal, "cannot create an eventfd: {}", errno_message(error));
  }
}

Server::~Server() {
  assert(workers_.empty() && "Server destroyed while run() serves");
  for (int fd : {listen_fd_, stop_fd_, reap_fd_}) {
    if (fd >= 0) ::close(fd);
  }
}

void Server::run() {
  pollfd fds[3] = {{stop_fd_, POLLIN, 0}, {reap_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
  // Leaves on stop_fd_ alone, not on stopping_: shutdown() sets the flag before it writes the
  // eventfd, and run() returning lets the Server be destroyed under that write.
  for (;;) {
    if (poll(fds, 3, -1) < 0) {
      if (errno != EINTR) {
        spdlog::error("http: poll failed: {}", errno_message(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    if ((fds[0].revents & POLLIN) != 0) break;
    if ((fds[1].revents & POLLIN) != 0) {
      uint64_t count;
      [[maybe_unused]] const ssize_t n = ::read(reap_fd_, &count, sizeof count);
      reap_finished();
    }
    if ((fds[2].revents & POLLIN) != 0) accept_one();
  }
  // Clients connecting from now on are refused by the kernel rather than left in the backlog.
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
  for (const std::unique_ptr<Worker>& worker : workers_) worker->thread.join();
  workers_.clear();
}

void Server::shutdown() {
  stopping_.store(true);
  bump(stop_fd_);
}

void Server::accept_one() {
  const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
    // Out of descriptors or memory: the connection stays in the backlog, so pause instead of
    // spinning on it (and wake for shutdown).
    spdlog::warn("http: accept failed: {}", errno_message(errno));
    pollfd stop{stop_fd_, POLLIN, 0};
    poll(&stop, 1, 100);
    return;
  }
  reap_finished();
  if (open_connections() >= size_t(options_.max_connections) && !close_longest_idle()) return reject(fd);

  const int one = 1;  // streamed tokens go out at once, not after Nagle waits on a delayed ACK
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const timeval send_timeout{.tv_sec = options_.write_timeout_s, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);

  auto worker = std::make_unique<Worker>(fd);
  Worker* w = worker.get();
  try {
    w->thread = std::thread([this, w, fd] {
      Connection(fd, w->slot, options_, handler_, stopping_, stop_fd_).serve();
      w->done.store(true);
      bump(reap_fd_);
    });
  } catch (const std::system_error& e) {
    spdlog::warn("http: cannot start a connection thread: {}", e.what());
    return reject(fd);
  }
  workers_.push_back(std::move(worker));
}

void Server::reject(int fd) {
  // On the accept thread, so nothing here may block: the reply fits an empty send buffer, and only
  // what has already arrived is drained (closing with unread bytes would reset the connection and
  // could destroy the 503 before the client reads it).
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  try {
    Exchange(fd, 1, /*keep_alive=*/false)
        .respond(make_error_response(options_, 503,
                                     fmt::format("server busy: {} connections open", options_.max_connections)));
  } catch (const std::exception& e) {
    spdlog::error("http: cannot send 503: {}", e.what());
  }
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
  ::close(fd);
}

size_t Server::open_connections() const {
  size_t open = 0;
  for (const std::unique_ptr<Worker>& worker : workers_) open += worker->done.load() || worker->slot.closed() ? 0 : 1;
  return open;
}

bool Server::close_longest_idle() {
  Worker* longest = nullptr;
  ConnectionSlot::Clock::time_point longest_since;
  for (const std::unique_ptr<Worker>& worker : workers_) {
    const std::optional<ConnectionSlot::Clock::time_point> since = worker->slot.idle_since();
    if (since && (longest == nullptr || *since < longest_since)) {
      longest = worker.get();
      longest_since = *since;
    }
  }
  // It may have turned busy since it was looked at: then the newcomer is refused this time.
  return longest != nullptr && longest->slot.close_if_idle();
}

void Server::reap_finished() {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace pagoda::http
