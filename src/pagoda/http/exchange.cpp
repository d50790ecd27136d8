#include "pagoda/http/exchange.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <iterator>

#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "pagoda/http/syntax.h"

namespace pagoda::http {
namespace {

// Response splitting and broken framing are bugs in the handler; refusing them here turns them
// into a 500 (the server's handler-threw path) instead of bytes that confuse the client.
void check_header(std::string_view name, std::string_view value) {
  if (!is_token(name) || !is_field_value(value)) {
    fail(ErrorKind::kInternal, "response header \"{}\" has an invalid name or value", name);
  }
  for (std::string_view reserved : {"content-length", "transfer-encoding", "connection"}) {
    if (iequals(name, reserved)) {
      fail(ErrorKind::kInternal, "response header {} is set by the HTTP layer, not the handler", name);
    }
  }
}

void check_status(int status) {
  if (status < 200 || status > 599) fail(ErrorKind::kInternal, "response status {} is not in 200..599", status);
}

}  // namespace

Exchange::Exchange(int fd, int minor_version, bool keep_alive, const std::atomic<bool>* stopping, bool head_only)
    : fd_(fd), minor_version_(minor_version), keep_alive_(keep_alive), stopping_(stopping), head_only_(head_only) {}

std::string Exchange::head(int status, std::string_view content_type, const std::vector<Header>& extra,
                           std::string_view framing, bool close) {
  check_status(status);
  if (!content_type.empty()) check_header("Content-Type", content_type);
  for (const Header& h : extra) check_header(h.name, h.value);
  if (responded_) fail(ErrorKind::kInternal, "a second response to one request");
  responded_ = true;

  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", status, status_reason(status));
  if (!content_type.empty()) fmt::format_to(std::back_inserter(out), "Content-Type: {}\r\n", content_type);
  for (const Header& h : extra) fmt::format_to(std::back_inserter(out), "{}: {}\r\n", h.name, h.value);
  out += framing;
  // Saying close while shutting down keeps the client from sending a request the server would
  // only refuse.
  close_after_ = close || !keep_alive_ || (stopping_ != nullptr && stopping_->load());
  if (close_after_) {
    out += "Connection: close\r\n";
  } else if (minor_version_ == 0) {
    out += "Connection: keep-alive\r\n";  // HTTP/1.0 closes unless told otherwise
  }
  out += "\r\n";
  return out;
}

void Exchange::respond(const Response& response) {
  // 204 has neither body nor Content-Length (RFC 9110 8.6).
  const bool has_body = response.status != 204;
  const std::string framing = has_body ? fmt::format("Content-Length: {}\r\n", response.body.size()) : "";
  const std::string h = head(response.status, response.content_type, response.headers, framing, false);
  write({h, has_body && !head_only_ ? std::string_view(response.body) : std::string_view()});
}

bool Exchange::start_stream(int status, std::string_view content_type, const std::vector<Header>& extra) {
  // HTTP/1.0 has no chunked encoding: the body runs to the end of the connection.
  // HEAD: no body at all, so nothing frames one and the connection closes after the headers.
  const bool http10 = minor_version_ == 0;
  const std::string h = head(status, content_type, extra, http10 || head_only_ ? "" : "Transfer-Encoding: chunked\r\n",
                             http10 || head_only_);
  streaming_ = true;
  return write({h});
}

bool Exchange::send(std::string_view data) {
  if (!streaming_ || stream_ended_) fail(ErrorKind::kInternal, "send() outside a stream");
  if (data.empty() || broken_ || head_only_) return !broken_;
  if (minor_version_ == 0) return write({data});
  const std::string size = fmt::format("{:x}\r\n", data.size());
  return write({size, data, "\r\n"});
}

void Exchange::end_stream() {
  if (!streaming_ || stream_ended_) fail(ErrorKind::kInternal, "end_stream() outside a stream");
  stream_ended_ = true;
  if (minor_version_ != 0 && !head_only_) write({"0\r\n\r\n"});
}

bool Exchange::client_gone() {
  if (broken_) return true;
  // POLLRDHUP: the peer's FIN, even with unread (pipelined) bytes before it. POLLHUP and POLLERR
  // (a reset) are always reported.
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0) {
    broken_ = true;
  } else if ((p.revents & POLLRDHUP) != 0) {
    if (minor_version_ == 0) {
      broken_ = true;
    } else if (!responded_ && !probed_) {
      probed_ = true;
      write({"HTTP/1.1 100 Continue\r\n\r\n"});
    }
  }
  return broken_;
}

bool Exchange::reusable() const {
  return responded_ && !broken_ && !close_after_ && (!streaming_ || stream_ended_);
}

bool Exchange::write(std::initializer_list<std::string_view> parts) {
  if (broken_) return false;
  std::array<iovec, 4> iov{};
  size_t n = 0;
  for (std::string_view part : parts) {
    if (!part.empty()) iov[n++] = {const_cast<char*>(part.data()), part.size()};
  }
  size_t first = 0;
  while (first < n) {
    msghdr msg{};
    msg.msg_iov = &iov[first];
    msg.msg_iovlen = n - first;
    // MSG_NOSIGNAL: a client that has gone is an EPIPE here, not a SIGPIPE for the process.
    const ssize_t sent = sendmsg(fd_, &msg, MSG_NOSIGNAL);
    if (sent < 0 && errno == EINTR) continue;
    if (sent <= 0) {  // EPIPE, ECONNRESET, or EAGAIN after the socket's send timeout
      broken_ = true;
      return false;
    }
    for (auto left = size_t(sent); left > 0;) {
      const size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return true;
}

}  // namespace pagoda::http
