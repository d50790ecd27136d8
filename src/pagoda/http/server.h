// Server: an HTTP/1.1 server for `pagoda serve`, one thread per connection. Ours rather than
// cpp-httplib's because a handler must learn that its client disconnected (to cancel generation
// and free KV memory) for non-streaming requests too, which httplib 0.11 cannot tell.
// A thread per connection is enough: connections are bounded by max_connections, and the engine,
// not the HTTP layer, is the bottleneck. Keep-alive and pipelining are supported; HTTP/1.0 clients
// are closed after each response unless they send Connection: keep-alive.
#pragma once

#include <atomic>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <string_view>

#include "pagoda/http/exchange.h"
#include "pagoda/http/request.h"
#include "pagoda/http/request_parser.h"
#include "pagoda/http/response.h"

namespace pagoda::http {

// Runs on the connection's thread, once per request, so calls for different connections run
// concurrently: the handler must be thread-safe. It must respond (respond() or a stream) unless
// the client has gone (Exchange::client_gone()); if it returns without, the client gets a 500.
// If it throws, the client gets a 500 when nothing was sent yet; otherwise the connection is
// closed.
using Handler = std::function<void(const Request&, Exchange&)>;

struct ServerOptions {
  std::string host = "127.0.0.1";  // a numeric address or a name; "::" or "0.0.0.0" for all
  int port = 8000;                 // 0: any free port; Server::port() tells which
  ParserLimits limits;
  int max_connections = 512;      // at the limit, the longest-idle connection (none of its
                                  // request read) is closed for a newcomer; with none idle, the
                                  // newcomer gets 503
  int keep_alive_timeout_s = 30;  // idle time between requests on one connection (and before the first)
  int read_timeout_s = 30;        // to receive a whole request once it has started (slowloris): 408
  int write_timeout_s = 30;       // a client that accepts no bytes for this long is dropped, so a
                                  // stuck reader cannot pin a handler (and shutdown) forever
  // Builds the body of the errors the HTTP layer itself sends (400, 408, 413, 431, 501, 503, 505,
  // and 500 when a handler throws or never responds); the API layer passes one that writes
  // OpenAI's JSON error shape. Unset: text/plain with the message.
  std::function<Response(int status, std::string_view message)> error_response;
};

class Server {
 public:
  // Binds and listens now. Throws pagoda::Error(kInvalidArgument) with what failed:
  // "cannot listen on 127.0.0.1:8000: Address already in use".
  Server(ServerOptions options, Handler handler);
  // After run() has returned, or if it was never called.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }

  // Serves until shutdown(); returns once every connection is closed and no handler runs. Once.
  void run();
  // From any thread, also a signal handler (it only stores a flag and writes an eventfd): stop
  // accepting; requests in flight finish (their handlers run to the end, their responses say
  // Connection: close); idle keep-alive connections close; a request that has arrived, or is
  // arriving, on a kept-alive connection gets 503. Then run() returns.
  void shutdown();

 private:
  struct Worker;

  void accept_one();
  void reject(int fd);  // 503 to a connection beyond max_connections
  void reap_finished();
  size_t open_connections() const;  // not finished, not closed for a newcomer
  bool close_longest_idle();        // true when one was closed

  ServerOptions options_;
  Handler handler_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd, readable once shutdown() was called; never drained, so every
                      // connection's poll sees it
  int reap_fd_ = -1;  // eventfd a finishing connection thread bumps, so run() joins it
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::list<std::unique_ptr<Worker>> workers_;  // run()'s thread only
};

}  // namespace pagoda::http
