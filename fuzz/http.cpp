// libFuzzer target for the HTTP request parser. The input is the byte stream of one connection,
// parsed twice: all at once, and in pieces of 1, 2, 3, 5, 8 and 13 bytes in turn (small limits,
// so the 413 and 431 paths are reached too). Both must give the same requests and end the same
// way, and every request must be consistent with its framing. A crash, a sanitizer report, an
// exception, a parser that stops taking bytes while it needs more, or a mismatch is a finding.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagoda/http/request_parser.h"

namespace {

using pagoda::http::ParserLimits;
using pagoda::http::Request;
using pagoda::http::RequestParser;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

struct Outcome {
  std::vector<Request> requests;
  RequestParser::State state;
  int error_status;
  std::string error_message;
};

void check_request(const Request& r) {
  check(!r.method.empty() && (r.minor_version == 0 || r.minor_version == 1));
  const size_t question = r.target.find('?');
  check(r.path == r.target.substr(0, question));
  check(r.query == (question == std::string::npos ? "" : r.target.substr(question + 1)));
  for (const pagoda::http::Header& h : r.headers) {
    for (char c : h.name) check(!(c >= 'A' && c <= 'Z') && c != ':' && c != ' ');
    check(h.value.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos);
  }
  // Framed by one of Content-Length or chunked, never both, and never past the body limit.
  const std::string* length = r.header("content-length");
  const std::string* coding = r.header("transfer-encoding");
  check(length == nullptr || coding == nullptr);
  if (length != nullptr) check(std::stoull(*length) == r.body.size());
  if (length == nullptr && coding == nullptr) check(r.body.empty());
  check(r.body.size() <= 256);
}

Outcome parse(std::string_view input, bool in_pieces) {
  static constexpr size_t kPieces[] = {1, 2, 3, 5, 8, 13};
  RequestParser parser(ParserLimits{.max_header_bytes = 512, .max_body_bytes = 256, .max_headers = 8});
  Outcome out;
  size_t pos = 0;
  for (size_t turn = 0;; ++turn) {
    const size_t left = input.size() - pos;
    const size_t offered = in_pieces ? std::min(left, kPieces[turn % 6]) : left;
    const size_t used = parser.feed(input.substr(pos, offered));
    check(used <= offered);
    pos += used;
    const RequestParser::State state = parser.state();
    if (state == RequestParser::State::kDone) {
      out.requests.push_back(parser.take());
      check_request(out.requests.back());
    } else if (state == RequestParser::State::kError) {
      const int s = parser.error_status();
      check(s == 400 || s == 413 || s == 431 || s == 501 || s == 505);
      check(!parser.error_message().empty());
      break;
    } else if (state == RequestParser::State::kNeedMore) {
      check(used == offered);
      if (pos == input.size()) break;
    }
  }
  out.state = parser.state();
  out.error_status = parser.error_status();
  out.error_message = parser.error_message();
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const Outcome whole = parse(input, false);
  const Outcome pieces = parse(input, true);
  check(whole.requests.size() == pieces.requests.size());
  for (size_t i = 0; i < whole.requests.size(); ++i) {
    const Request& a = whole.requests[i];
    const Request& b = pieces.requests[i];
    check(a.method == b.method && a.target == b.target && a.minor_version == b.minor_version &&
          a.body == b.body && a.keep_alive == b.keep_alive && a.headers.size() == b.headers.size());
    for (size_t h = 0; h < a.headers.size(); ++h) {
      check(a.headers[h].name == b.headers[h].name && a.headers[h].value == b.headers[h].value);
    }
  }
  check(whole.state == pieces.state && whole.error_status == pieces.error_status &&
        whole.error_message == pieces.error_message);
  return 0;
}
