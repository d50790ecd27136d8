#include "pagoda/http/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "pagoda/http/exchange.h"
#include "pagoda/http/request_parser.h"

namespace pagoda::http {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kReadSize = 64 << 10;
constexpr auto kLingerTime = std::chrono::seconds(1);

// Milliseconds from now until `deadline`, for poll(); 0 once it has passed.
int ms_until(Clock::time_point deadline) {
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms <= 0 ? 0 : int(std::min<int64_t>(ms, INT32_MAX));
}

bool send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    bytes.remove_prefix(size_t(n));
  }
  return true;
}

}  // namespace

Response make_error_response(const ServerOptions& options, int status, std::string_view message) {
  if (options.error_response) {
    try {
      return options.error_response(status, message);
    } catch (const std::exception& e) {
      spdlog::error("http: error_response({}) threw: {}", status, e.what());
    }
  }
  return Response{.status = status, .content_type = "text/plain; charset=utf-8", .body = fmt::format("{}\n", message)};
}

void ConnectionSlot::enter_idle(Clock::time_point since) {
  std::lock_guard lock(mutex_);
  idle_ = true;
  idle_since_ = since;
}

bool ConnectionSlot::leave_idle() {
  std::lock_guard lock(mutex_);
  idle_ = false;
  return !closed_;
}

void ConnectionSlot::release() {
  std::lock_guard lock(mutex_);
  idle_ = false;
  fd_ = -1;
}

std::optional<ConnectionSlot::Clock::time_point> ConnectionSlot::idle_since() const {
  std::lock_guard lock(mutex_);
  if (!idle_ || closed_) return std::nullopt;
  return idle_since_;
}

bool ConnectionSlot::close_if_idle() {
  // Under the lock, so the connection cannot close the fd (and the number be reused) meanwhile.
  std::lock_guard lock(mutex_);
  if (!idle_ || closed_ || fd_ < 0) return false;
  // Bytes waiting are a request on its way: closing now would lose it.
  char byte;
  if (::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) > 0) return false;
  closed_ = true;
  ::shutdown(fd_, SHUT_RDWR);
  return true;
}

bool ConnectionSlot::closed() const {
  std::lock_guard lock(mutex_);
  return closed_;
}

Connection::Connection(int fd, ConnectionSlot& slot, const ServerOptions& options, const Handler& handler,
                       const std::atomic<bool>& stopping, int stop_fd)
    : fd_(fd), slot_(slot), options_(options), handler_(handler), stopping_(stopping), stop_fd_(stop_fd) {}

Connection::~Connection() {
  slot_.release();
  ::close(fd_);
}

void Connection::serve() {
  try {
    loop();
  } catch (const std::exception& e) {
    spdlog::error("http: connection closed after an error: {}", e.what());
  } catch (...) {
    spdlog::error("http: connection closed after an unknown exception");
  }
}

void Connection::loop() {
  buffer_.resize(kReadSize);
  RequestParser parser(options_.limits);
  size_t begin = 0, end = 0;  // buffer_[begin, end): read, not yet fed
  Clock::time_point idle_since = Clock::now();
  Clock::time_point request_start;
  for (;;) {
    const bool was_idle = !parser.in_progress();
    begin += parser.feed(std::string_view(buffer_.data() + begin, end - begin));
    // From here, not from the read: a pipelined request waiting behind a long handler did not
    // start its clock while that handler ran.
    if (was_idle && parser.in_progress()) request_start = Clock::now();
    switch (parser.state()) {
      case RequestParser::State::kHeadersDone:
        if (stopping_.load()) return close_with_error(503, "server is shutting down");
        // Ask for the body, unless the client has already started sending it without waiting.
        if (begin == end && !send_all(fd_, "HTTP/1.1 100 Continue\r\n\r\n")) return;
        continue;
      case RequestParser::State::kError:
        return close_with_error(parser.error_status(), parser.error_message());
      case RequestParser::State::kDone: {
        const Request request = parser.take();
        if (stopping_.load()) return close_with_error(503, "server is shutting down");
        if (!dispatch(request)) return linger();
        idle_since = Clock::now();
        continue;
      }
      case RequestParser::State::kNeedMore:
        break;
    }

    // The parser took everything buffered; wait for more.
    const bool mid_request = parser.in_progress();
    if (!mid_request && stopping_.load()) return;
    const Clock::time_point deadline = mid_request ? request_start + std::chrono::seconds(options_.read_timeout_s)
                                                   : idle_since + std::chrono::seconds(options_.keep_alive_timeout_s);
    pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (!mid_request) slot_.enter_idle(idle_since);
    const int ready = poll(fds, 2, ms_until(deadline));
    if (!mid_request && !slot_.leave_idle()) return;  // closed for a newcomer at the connection limit
    if (ready < 0) {
      if (errno == EINTR) continue;
      return;
    }
    // At shutdown, bytes that have arrived are read first: a request on a kept-alive connection
    // gets its 503 rather than a reset.
    if ((fds[1].revents & POLLIN) != 0 && fds[0].revents == 0) {
      if (!mid_request) return;  // idle: close
      return close_with_error(503, "server is shutting down");
    }
    if (fds[0].revents == 0) {
      if (Clock::now() < deadline) continue;
      if (!mid_request) return;  // keep-alive timeout: close quietly
      return close_with_error(408, fmt::format("request not received within {} s", options_.read_timeout_s));
    }
    const ssize_t n = ::recv(fd_, buffer_.data(), buffer_.size(), 0);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (n <= 0) return;  // the client closed (mid-request too: nobody is left to answer) or failed
    begin = 0;
    end = size_t(n);
  }
}

bool Connection::dispatch(const Request& request) {
  Exchange exchange(fd_, request.minor_version, request.keep_alive, &stopping_, request.method == "HEAD");
  std::optional<std::string> failure;
  try {
    handler_(request, exchange);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "unknown exception";
  }
  if (failure) {
    spdlog::error("http: handler for {} {} threw: {}", request.method, request.path, *failure);
    // Once part of a response is out, only closing the connection tells the client it is cut short.
    if (exchange.responded()) return false;
    exchange.respond(make_error_response(options_, 500, fmt::format("internal error: {}", *failure)));
  } else if (!exchange.responded()) {
    // A handler may give up on a client that has gone; there is no one to answer then.
    if (exchange.client_gone()) return false;
    spdlog::error("http: handler for {} {} returned without responding", request.method, request.path);
    exchange.respond(make_error_response(options_, 500, "internal error: the request was not answered"));
  }
  return exchange.reusable();
}

void Connection::close_with_error(int status, std::string_view message) {
  Exchange exchange(fd_, 1, /*keep_alive=*/false);
  exchange.respond(make_error_response(options_, status, message));
  linger();
}

void Connection::linger() {
  ::shutdown(fd_, SHUT_WR);
  const Clock::time_point until = Clock::now() + kLingerTime;
  for (;;) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, ms_until(until)) <= 0) return;
    if (::recv(fd_, buffer_.data(), buffer_.size(), 0) <= 0) return;
  }
}

}  // namespace pagoda::http
