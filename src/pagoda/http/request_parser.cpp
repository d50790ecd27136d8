#include "pagoda/http/request_parser.h"

#include <algorithm>
#include <cassert>
#include <cstdint>
#include <optional>
#include <utility>

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
    if (phase_ == Phase::kBody) {
      const size_t n = std::min(body_length_ - request_.body.size(), bytes.size() - used);
      request_.body.append(bytes.substr(used, n));
      used += n;
      if (request_.body.size() == body_length_) state_ = State::kDone;
      continue;
    }
    const size_t lf = bytes.find('\n', used);
    const size_t end = lf == std::string_view::npos ? bytes.size() : lf + 1;
    // Checked before buffering, so a client cannot make a connection hold more than the limit.
    if (end - used > limits_.max_header_bytes - head_bytes_) {
      set_error(431, fmt::format("request head larger than {} bytes", limits_.max_header_bytes));
      break;
    }
    line_.append(bytes.substr(used, end - used));
    head_bytes_ += end - used;
    used = end;
    if (lf == std::string_view::npos) break;

    std::string_view line(line_);
    line.remove_suffix(1);  // '\n'
    if (line.empty() || line.back() != '\r') {
      set_error(400, "bare LF in the request head: lines must end with CRLF");
      break;
    }
    line.remove_suffix(1);  // '\r'
    if (line.find('\r') != std::string_view::npos) {
      set_error(400, "bare CR in the request head");
      break;
    }
    if (phase_ == Phase::kRequestLine) {
      parse_request_line(line);
    } else {
      parse_header_line(line);
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
  if (line.front() == ' ' || line.front() == '\t') {
    return set_error(400, "obsolete line folding in a header is not accepted");
  }
  if (request_.headers.size() >= limits_.max_headers) {
    return set_error(431, fmt::format("more than {} header fields", limits_.max_headers));
  }
  const size_t colon = line.find(':');
  const std::string_view name = line.substr(0, colon);
  if (colon == std::string_view::npos || !is_token(name)) {
    return set_error(400, "malformed header line: expected a token, ':' and a value");
  }
  const std::string_view value = trim(line.substr(colon + 1));
  if (!is_field_value(value)) {
    return set_error(400, fmt::format("control character in the value of header {}", name));
  }
  Header& header = request_.headers.emplace_back(Header{std::string(name), std::string(value)});
  std::transform(header.name.begin(), header.name.end(), header.name.begin(),
                 [](char c) { return c >= 'A' && c <= 'Z' ? char(c - 'A' + 'a') : c; });
}

void RequestParser::finish_head() {
  bool close = false, keep_alive = false, expect_continue = false, chunked = false;
  std::optional<uint64_t> length;
  for (const Header& h : request_.headers) {
    if (h.name == "connection") {
      close = close || lists_option(h.value, "close");
      keep_alive = keep_alive || lists_option(h.value, "keep-alive");
    } else if (h.name == "expect") {
      expect_continue = expect_continue || lists_option(h.value, "100-continue");
    } else if (h.name == "transfer-encoding") {
      chunked = true;
    } else if (h.name == "content-length") {
      const std::optional<uint64_t> n = parse_length(h.value);
      // The value is not echoed: it may hold bytes that are not UTF-8, and the message goes into JSON.
      if (!n) return set_error(400, "Content-Length must be a decimal number of bytes");
      if (length && *length != *n) return set_error(400, "Content-Length headers disagree");
      length = n;
    }
  }
  if (chunked && length) {
    return set_error(400, "both Content-Length and Transfer-Encoding: ambiguous request framing");
  }
  if (chunked) {
    return set_error(501, "Transfer-Encoding on a request is not supported (no chunked uploads); "
                          "send the body with Content-Length");
  }
  if (length.value_or(0) > limits_.max_body_bytes) {
    return set_error(413, fmt::format("request body of {} bytes is larger than the limit of {} bytes",
                                      *length, limits_.max_body_bytes));
  }
  // HTTP/1.0 closes after each response unless the client asks to keep the connection.
  request_.keep_alive = !close && (request_.minor_version >= 1 || keep_alive);
  body_length_ = size_t(length.value_or(0));
  phase_ = Phase::kBody;
  if (body_length_ == 0) {
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
  body_length_ = 0;
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
