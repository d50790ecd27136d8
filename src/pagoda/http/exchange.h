// Exchange: one request's way back to its client, handed to the handler with the request. The
// handler either respond()s once, or streams: start_stream(), send() per piece, end_stream().
// While it works (waiting for generation), it polls client_gone() to learn that the client left,
// so it can cancel and free what the request holds. Used from one thread at a time.
#pragma once

#include <atomic>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/http/request.h"
#include "pagoda/http/response.h"

namespace pagoda::http {

class Exchange {
 public:
  // Over a connected socket, which stays the caller's. `minor_version` is the request's (HTTP/1.0
  // clients get no chunked encoding). `keep_alive`: the connection is to stay open after this
  // response; if false, or once *stopping turns true, the response says Connection: close.
  // `head_only`: the request was HEAD, so the response is its status line and headers alone
  // (Content-Length still counts the body a GET would get); handlers answer it as a GET.
  Exchange(int fd, int minor_version, bool keep_alive, const std::atomic<bool>* stopping = nullptr,
           bool head_only = false);

  // The whole response, with Content-Length. A failed write (client gone) is not an error here:
  // client_gone() reports it.
  void respond(const Response& response);

  // Server-sent events and other streams: the status line and headers with
  // Transfer-Encoding: chunked (so the connection can be kept alive afterwards), then one chunk
  // per send(). To an HTTP/1.0 client: no chunking, and the end of the stream closes the
  // connection. Returns false when the client has gone.
  bool start_stream(int status, std::string_view content_type, const std::vector<Header>& extra = {});
  // One chunk; false when the client has gone. Empty data sends nothing (an empty chunk would
  // end the stream).
  bool send(std::string_view data);
  // The terminating zero-length chunk. A handler that returns without it leaves a stream the
  // client can tell was cut off: the server closes the connection instead of finishing it.
  void end_stream();

  // Non-blocking: true once the peer has reset the connection or a write to it failed. A FIN
  // alone does not tell a client that left from one that only half-closed (shutdown(SHUT_WR)
  // after its request, as some clients and proxies do) and waits for the answer; so at the first
  // FIN, before any response, an interim "100 Continue" goes out as a probe (RFC 9110 15.2: HTTP/1.1
  // clients must accept unexpected 1xx responses). A client that has closed its socket answers it
  // with a reset, seen at the next call; one that half-closed reads on and gets its response.
  // While streaming, the chunks themselves probe. HTTP/1.0 clients cannot get a 1xx, so for them
  // a FIN counts as gone.
  bool client_gone();

  // respond() or start_stream() was called (whether or not the client was still there).
  bool responded() const { return responded_; }
  // For the server, after the handler: the connection can carry another request (a whole response
  // went out, the client is there, and neither side asked to close).
  bool reusable() const;

  // Programmer errors throw pagoda::Error(kInternal): responding twice, send() outside a stream,
  // a status outside 200..599, a header name or value that is not a token / has CR, LF or NUL
  // (response splitting), or a framing header among the extras.

 private:
  // Writes the parts in order, whole; false (and the exchange broken) when the socket fails.
  bool write(std::initializer_list<std::string_view> parts);
  // The status line and headers; marks the exchange responded. `close`: the body ends with the
  // connection.
  std::string head(int status, std::string_view content_type, const std::vector<Header>& extra,
                   std::string_view framing, bool close);

  int fd_;
  int minor_version_;
  bool keep_alive_;
  const std::atomic<bool>* stopping_;
  bool head_only_;
  bool responded_ = false;
  bool streaming_ = false;
  bool stream_ended_ = false;
  bool close_after_ = false;  // the head sent said Connection: close (or streamed to HTTP/1.0)
  bool broken_ = false;       // a write failed or the peer closed: the connection cannot be reused
  bool probed_ = false;       // the 100 Continue probe went out
};

}  // namespace pagoda::http
