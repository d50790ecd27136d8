// RequestParser: HTTP/1.1 request framing (RFC 9112), incremental: bytes go in as they arrive
// from the socket, complete requests come out one at a time. A parser serves one connection;
// after take() it parses the next request, so pipelined requests come out in order.
//
// Choices, each stricter than the RFC allows and each closing a request-smuggling door (a proxy
// in front of pagoda and pagoda must never disagree on where a request ends):
// - Lines end with CRLF only. A bare LF or bare CR in the head is a 400. RFC 9112 lets a server
//   accept bare LF, but line-end disagreements are how Node's parser got smuggled past proxies
//   (CVE-2023-30589), and every client we serve (curl, the OpenAI SDKs, browsers) sends CRLF.
// - Bodies are framed by Content-Length or by the chunked transfer coding (RFC 9112 7.1), which
//   must then be the only coding: another coding is a 501, chunked not last or twice is a 400,
//   and so is Transfer-Encoding with Content-Length as well, or on an HTTP/1.0 request.
//   Content-Length must be plain digits; repeats must agree; "5, 5" lists are refused. Chunk
//   sizes are hex digits only (no sign, no "0x", no spaces before them); extensions are checked
//   for control characters and ignored; trailer fields are checked like header lines and
//   dropped (RFC 9110 6.5.1 lets a recipient discard them), counting against the head's limit.
// - No obsolete line folding, no whitespace between a header name and its colon (400).
// Lenient where it costs nothing: empty lines before a request line are skipped (RFC 9112 2.2:
// some clients send a CRLF after a POST body), and HTTP/1.2+ is read as 1.1. Host is not
// required: pagoda serves one site, so Host selects nothing.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "pagoda/http/request.h"

namespace pagoda::http {

struct ParserLimits {
  size_t max_header_bytes = 16 << 10;  // request line + header lines + their CRLFs (431 beyond)
  size_t max_body_bytes = 1 << 20;     // Content-Length, or chunks adding up to, above this is a 413
                                       // before the bytes over it are read
  size_t max_headers = 100;            // header lines (431 beyond)
};

class RequestParser {
 public:
  enum class State {
    kNeedMore,     // feed more bytes
    kHeadersDone,  // head parsed, the client asked `Expect: 100-continue` and the body is still
                   // to come: the server answers 100 Continue, then feeds the body
    kDone,         // a complete request: take() it
    kError,        // malformed or over a limit: reply error_status() and close the connection
  };

  explicit RequestParser(ParserLimits limits = {});

  // Consumes bytes and returns how many it took. Stops after one complete request (the rest
  // belongs to the next one: pipelining), after the head when it enters kHeadersDone, and at the
  // first error. In kDone and kError it takes nothing.
  size_t feed(std::string_view bytes);
  State state() const { return state_; }
  // True once any byte of the current request has been consumed (the read timeout runs from then;
  // before, the connection is idle).
  bool in_progress() const { return phase_ != Phase::kRequestLine || head_bytes_ > 0; }

  // The completed request (state must be kDone); resets the parser for the next one.
  Request take();

  // 400 malformed, 413 body too large, 431 head (or head and trailers) too large or too many
  // headers, 501 a transfer coding other than chunked, 505 HTTP version other than 1.x.
  // 0 unless state() is kError.
  int error_status() const { return error_status_; }
  // One line for the client, saying what was wrong: "Content-Length is not a number".
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Phase {
    kRequestLine,
    kHeaders,
    kBody,          // Content-Length bytes
    kChunkSize,     // a chunk's size line
    kChunkData,     // its data
    kChunkDataEnd,  // the CRLF after the data
    kTrailers,      // trailer field lines, up to the empty line that ends the body
  };

  void parse_request_line(std::string_view line);
  void parse_header_line(std::string_view line);
  // A header or trailer line as a Header (name lowercased), or nullopt with the error set.
  std::optional<Header> parse_field_line(std::string_view line);
  void parse_chunk_size_line(std::string_view line);
  void parse_trailer_line(std::string_view line);
  void finish_head();
  void set_error(int status, std::string message);

  ParserLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kRequestLine;
  std::string line_;       // the line being received (head, chunk size, trailer), with its '\n'
  size_t head_bytes_ = 0;  // head and trailer bytes consumed for this request, line_ included
  size_t body_left_ = 0;   // bytes still to come of the Content-Length body or of this chunk
  Request request_;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace pagoda::http
