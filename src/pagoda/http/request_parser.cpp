#include "pagoda/http/request_parser.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "pagoda/http/syntax.h"

namespace pagoda::http {
namespace {

// Whether a comma-separated header value (Connection, Expect) lists `option`, in any case.
bool lists_option(std::string_view value, std::string_view option) {
  while (!value.empty()) {
    const size_t comma = value.find(',');
    if (iequals(trim(value.substr(0, comma)), option)) return true;
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return false;
}

// A chunk-size line holds a few hex digits and, rarely, short extensions; anything longer is not
// a client we serve, and the line is buffered, so it is bounded.
constexpr size_t kMaxChunkSizeLine = 1024;

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Plain decimal digits that fit in 64 bits, or nullopt.
std::optional<uint64_t> parse_length(std::string_view s) {
  if (s.empty()) return std::nullopt;
  uint64_t n = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    const auto digit = uint64_t(c - '0');
    if (n > (UINT64_MAX - digit) / 10) return std::nullopt;
    n = n * 10 + digit;
  }
  return n;
}

}  // namespace

RequestParser::RequestParser(ParserLimits limits) : limits_(limits) {}

size_t RequestParser::feed(std::string_view bytes) {
  if (state_ == State::kDone || state_ == State::kError) return 0;
  if (state_ == State::kHeadersDone) state_ = State::kNeedMore;  // on to the body
  size_t used = 0;
  while (used < bytes.size() && state_ == State::kNeedMore) {
    if (phase_ == Phase::kBody || phase_ == Phase::kChunkData) {
      const size_t n = std::min(body_left_, bytes.size() - used);
      request_.body.append(bytes.substr(used, n));
      used += n;
      body_left_ -= n;
      if (body_left_ == 0) {
        if (phase_ == Phase::kBody) {
          state_ = State::kDone;
        } else {
          phase_ = Phase::kChunkDataEnd;
        }
      }
      continue;
    }
    const bool head_line = phase_ == Phase::kRequestLine || phase_ == Phase::kHeaders || phase_ == Phase::kTrailers;
    const size_t room = head_line ? limits_.max_header_bytes - head_bytes_ : kMaxChunkSizeLine - line_.size();
    const size_t lf = bytes.find('\n', used);
    const size_t end = lf == std::string_view::npos ? bytes.size() : lf + 1;
    // Checked before buffering, so a client cannot make a connection hold more than the limit.
    if (end - used > room) {
      if (!head_line) {
        set_error(400, fmt::format("chunk size line longer than {} bytes", kMaxChunkSizeLine));
      } else if (phase_ == Phase::kTrailers) {
        set_error(431, fmt::format("request head and trailers larger than {} bytes", limits_.max_header_bytes));
      } else {
        set_error(431, fmt::format("request head larger than {} bytes", limits_.max_header_bytes));
      }
      break;
    }
    line_.append(bytes.substr(used, end - used));
    if (head_line) head_bytes_ += end - used;
    used = end;
    if (lf == std::string_view::npos) break;

    std::string_view line(line_);
    line.remove_suffix(1);  // '\n'
    if (line.empty() || line.back() != '\r') {
      set_error(400, "bare LF in the request: lines must end with CRLF");
      break;
    }
    line.remove_suffix(1);  // '\r'
    if (line.find('\r') != std::string_view::npos) {
      set_error(400, "bare CR in the request");
      break;
    }
    switch (phase_) {
      case Phase::kRequestLine: parse_request_line(line); break;
      case Phase::kHeaders: parse_header_line(line); break;
      case Phase::kChunkSize: parse_chunk_size_line(line); break;
      case Phase::kChunkDataEnd:
        if (!line.empty()) {
          set_error(400, "chunk data longer than its size");
        } else {
          phase_ = Phase::kChunkSize;
        }
        break;
      case Phase::kTrailers: parse_trailer_line(line); break;
      case Phase::kBody:
      case Phase::kChunkData: break;  // handled above
    }
    line_.clear();
  }
  return used;
}

void RequestParser::parse_request_line(std::string_view line) {
  if (line.empty()) return;  // an empty line before the request line: skipped (RFC 9112 2.2)
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return set_error(400, "malformed request line: expected METHOD TARGET HTTP/1.1");
  }
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) return set_error(400, "malformed request line: invalid method");
  if (target.empty() || !std::all_of(target.begin(), target.end(),
                                     [](char c) { return c > 0x20 && c < 0x7f; })) {
    return set_error(400, "malformed request line: invalid request target");
  }
  const auto is_digit = [](char c) { return c >= '0' && c <= '9'; };
  if (version.size() != 8 || !version.starts_with("HTTP/") || !is_digit(version[5]) ||
      version[6] != '.' || !is_digit(version[7])) {
    return set_error(400, "malformed request line: invalid HTTP version");
  }
  if (version[5] != '1') return set_error(505, fmt::format("{} is not supported; use HTTP/1.1", version));

  request_.method = method;
  request_.target = target;
  const size_t question = target.find('?');
  request_.path = target.substr(0, question);
  if (question != std::string_view::npos) request_.query = target.substr(question + 1);
  request_.minor_version = version[7] == '0' ? 0 : 1;
  phase_ = Phase::kHeaders;
}

void RequestParser::parse_header_line(std::string_view line) {
  if (line.empty()) return finish_head();
  if (request_.headers.size() >= limits_.max_headers) {
    return set_error(431, fmt::format("more than {} header fields", limits_.max_headers));
  }
  if (std::optional<Header> header = parse_field_line(line)) request_.headers.push_back(std::move(*header));
}

std::optional<Header> RequestParser::parse_field_line(std::string_view line) {
  if (line.front() == ' ' || line.front() == '\t') {
    set_error(400, "obsolete line folding in a header is not accepted");
    return std::nullopt;
  }
  const size_t colon = line.find(':');
  const std::string_view name = line.substr(0, colon);
  if (colon == std::string_view::npos || !is_token(name)) {
    set_error(400, "malformed header line: expected a token, ':' and a value");
    return std::nullopt;
  }
  const std::string_view value = trim(line.substr(colon + 1));
  if (!is_field_value(value)) {
    set_error(400, fmt::format("control character in the value of header {}", name));
    return std::nullopt;
  }
  Header header{std::string(name), std::string(value)};
  std::transform(header.name.begin(), header.name.end(), header.name.begin(),
                 [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; });
  return header;
}

void RequestParser::parse_chunk_size_line(std::string_view line) {
  // chunk-size [ chunk-ext ]: 1*HEXDIG, then nothing or BWS ";" and extensions.
  size_t digits = 0;
  size_t size = 0;
  const size_t room = limits_.max_body_bytes - request_.body.size();
  for (; digits < line.size() && hex_digit(line[digits]) >= 0; ++digits) {
    // Past the room left, the size is over the limit whatever digits follow: stop before it
    // can overflow.
    if (size > room || size > SIZE_MAX / 16) break;
    size = size * 16 + size_t(hex_digit(line[digits]));
  }
  if (digits == 0) return set_error(400, "malformed chunk size: expected hex digits");
  if (size > room) {
    return set_error(413, fmt::format("request body larger than the limit of {} bytes", limits_.max_body_bytes));
  }
  const std::string_view extensions = line.substr(digits);
  const size_t semicolon = extensions.find_first_not_of(" \t");
  if (!extensions.empty() && (semicolon == std::string_view::npos || extensions[semicolon] != ';' ||
                              !is_field_value(extensions))) {
    return set_error(400, "malformed chunk size line: expected hex digits and optional ;extensions");
  }
  if (size == 0) {
    phase_ = Phase::kTrailers;
  } else {
    body_left_ = size;
    phase_ = Phase::kChunkData;
  }
}

void RequestParser::parse_trailer_line(std::string_view line) {
  if (line.empty()) {
    state_ = State::kDone;
    return;
  }
  parse_field_line(line);  // checked, then dropped
}

void RequestParser::finish_head() {
  bool close = false, keep_alive = false, expect_continue = false, has_transfer_encoding = false;
  std::vector<std::string_view> codings;  // every Transfer-Encoding value's list, in order
  std::optional<uint64_t> length;
  for (const Header& h : request_.headers) {
    if (h.name == "connection") {
      close = close || lists_option(h.value, "close");
      keep_alive = keep_alive || lists_option(h.value, "keep-alive");
    } else if (h.name == "expect") {
      expect_continue = expect_continue || lists_option(h.value, "100-continue");
    } else if (h.name == "transfer-encoding") {
      has_transfer_encoding = true;
      for (std::string_view list = h.value;;) {
        const size_t comma = list.find(',');
        codings.push_back(trim(list.substr(0, comma)));
        if (comma == std::string_view::npos) break;
        list.remove_prefix(comma + 1);
      }
    } else if (h.name == "content-length") {
      const std::optional<uint64_t> n = parse_length(h.value);
      // The value is not echoed: it may hold bytes that are not UTF-8, and the message goes into JSON.
      if (!n) return set_error(400, "Content-Length must be a decimal number of bytes");
      if (length && *length != *n) return set_error(400, "Content-Length headers disagree");
      length = n;
    }
  }
  if (has_transfer_encoding && length) {
    return set_error(400, "both Content-Length and Transfer-Encoding: ambiguous request framing");
  }
  if (has_transfer_encoding) {
    if (request_.minor_version == 0) {
      return set_error(400, "Transfer-Encoding on an HTTP/1.0 request: its framing cannot be trusted");
    }
    for (size_t i = 0; i < codings.size(); ++i) {
      const bool chunked = iequals(codings[i], "chunked");
      if (chunked && i + 1 == codings.size()) break;
      if (chunked || codings[i].empty() || !iequals(codings.back(), "chunked")) {
        return set_error(400, "Transfer-Encoding must end with chunked, once: the body's end cannot be found");
      }
      // Not echoed: the value may not be UTF-8, and the message goes into JSON.
      return set_error(501, "only the chunked transfer coding is supported on requests");
    }
  }
  if (length.value_or(0) > limits_.max_body_bytes) {
    return set_error(413, fmt::format("request body of {} bytes is larger than the limit of {} bytes",
                                      *length, limits_.max_body_bytes));
  }
  // HTTP/1.0 closes after each response unless the client asks to keep the connection.
  request_.keep_alive = !close && (request_.minor_version >= 1 || keep_alive);
  body_left_ = size_t(length.value_or(0));
  phase_ = has_transfer_encoding ? Phase::kChunkSize : Phase::kBody;
  if (!has_transfer_encoding && body_left_ == 0) {
    state_ = State::kDone;
  } else if (expect_continue && request_.minor_version >= 1) {  // 1.0 expectations are ignored
    state_ = State::kHeadersDone;
  }
}

Request RequestParser::take() {
  assert(state_ == State::kDone);
  Request request = std::move(request_);
  request_ = Request{};
  line_.clear();
  head_bytes_ = 0;
  body_left_ = 0;
  phase_ = Phase::kRequestLine;
  state_ = State::kNeedMore;
  return request;
}

void RequestParser::set_error(int status, std::string message) {
  state_ = State::kError;
  error_status_ = status;
  error_message_ = std::move(message);
}

}  // namespace pagoda::http
