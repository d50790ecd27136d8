// Connection: one accepted client socket, served on its own thread: read requests, hand each to
// the handler, keep the connection open between them, and close it on an error, a timeout, the
// client's wish, or shutdown. The Server's part, not an API.
#pragma once

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "pagoda/http/request.h"
#include "pagoda/http/response.h"
#include "pagoda/http/server.h"

namespace pagoda::http {

// The part of a connection the accept loop sees: whether it waits idle (between requests,
// nothing of the next one read) and since when. At the connection limit the accept loop closes
// the longest-idle connection for the newcomer, so idle keep-alive sockets cannot lock active
// clients out; a connection with a request in flight is never closed for one.
class ConnectionSlot {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ConnectionSlot(int fd) : fd_(fd) {}

  // The connection's side.
  void enter_idle(Clock::time_point since);
  // False when the accept loop closed the connection meanwhile: it is to end.
  bool leave_idle();
  // Before the connection closes its socket: from then on the accept loop leaves the fd alone.
  void release();

  // The accept loop's side. When idle: since when.
  std::optional<Clock::time_point> idle_since() const;
  // Shuts the socket down (the connection's poll wakes and it ends, as at a keep-alive timeout)
  // if it is still idle with no byte of a request waiting unread. True if it did.
  bool close_if_idle();
  bool closed() const;

 private:
  mutable std::mutex mutex_;
  int fd_;  // -1 once released
  bool idle_ = false;
  bool closed_ = false;
  Clock::time_point idle_since_;
};

class Connection {
 public:
  // Takes the socket (closes it). `stop_fd` turns readable, and `stopping` true, at shutdown.
  Connection(int fd, ConnectionSlot& slot, const ServerOptions& options, const Handler& handler,
             const std::atomic<bool>& stopping, int stop_fd);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Until the connection is closed. Never throws: whatever goes wrong closes this connection only.
  void serve();

 private:
  void loop();
  // Runs the handler; true when the connection can carry another request.
  bool dispatch(const Request& request);
  // An error response with Connection: close, then linger().
  void close_with_error(int status, std::string_view message);
  // Half-closes, then reads and drops what the client still sends, for a second at most. Closing
  // with unread bytes would make the kernel send a reset, which can destroy the response we just
  // sent before the client reads it (a 413 to a client still uploading, say).
  void linger();

  int fd_;
  ConnectionSlot& slot_;
  const ServerOptions& options_;
  const Handler& handler_;
  const std::atomic<bool>& stopping_;
  int stop_fd_;
  std::vector<char> buffer_;  // bytes read from the socket, not yet fed to the parser
};

// options.error_response(status, message), or text/plain when it is unset or throws.
Response make_error_response(const ServerOptions& options, int status, std::string_view message);

}  // namespace pagoda::http
