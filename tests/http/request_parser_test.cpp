#include "pagoda/http/request_parser.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <string>
#include <vector>

namespace pagoda::http {
namespace {

using namespace std::literals;
using State = RequestParser::State;

// What a parser made of a byte stream: the requests, then how it stopped.
struct Outcome {
  std::vector<Request> requests;
  State final_state = State::kNeedMore;
  int error_status = 0;
  std::string error_message;
  int headers_done = 0;  // times the parser paused for Expect: 100-continue
};

// Feeds `input` in pieces of `piece` bytes (0: all at once), taking every completed request.
Outcome parse(std::string_view input, size_t piece = 0, ParserLimits limits = {}) {
  RequestParser parser(limits);
  Outcome out;
  size_t pos = 0;
  for (;;) {
    const size_t offered = piece == 0 ? input.size() - pos : std::min(input.size() - pos, piece);
    const size_t used = parser.feed(input.substr(pos, offered));
    pos += used;
    if (parser.state() == State::kDone) {
      out.requests.push_back(parser.take());
    } else if (parser.state() == State::kHeadersDone) {
      ++out.headers_done;
    } else if (parser.state() == State::kError) {
      break;
    } else {
      EXPECT_EQ(used, offered) << "a parser that needs more must take all it is given";
      if (used != offered || pos == input.size()) break;
    }
  }
  out.final_state = parser.state();
  out.error_status = parser.error_status();
  out.error_message = parser.error_message();
  return out;
}

int error_of(std::string_view input, ParserLimits limits = {}) {
  const Outcome out = parse(input, 0, limits);
  EXPECT_EQ(out.final_state, State::kError) << input;
  return out.error_status;
}

void expect_same(const Outcome& a, const Outcome& b, std::string_view input) {
  ASSERT_EQ(a.requests.size(), b.requests.size()) << input;
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const Request& x = a.requests[i];
    const Request& y = b.requests[i];
    EXPECT_EQ(x.method, y.method);
    EXPECT_EQ(x.target, y.target);
    EXPECT_EQ(x.path, y.path);
    EXPECT_EQ(x.query, y.query);
    EXPECT_EQ(x.minor_version, y.minor_version);
    EXPECT_EQ(x.body, y.body);
    EXPECT_EQ(x.keep_alive, y.keep_alive);
    ASSERT_EQ(x.headers.size(), y.headers.size());
    for (size_t h = 0; h < x.headers.size(); ++h) {
      EXPECT_EQ(x.headers[h].name, y.headers[h].name);
      EXPECT_EQ(x.headers[h].value, y.headers[h].value);
    }
  }
  EXPECT_EQ(a.final_state, b.final_state) << input;
  EXPECT_EQ(a.error_status, b.error_status) << input;
  EXPECT_EQ(a.error_message, b.error_message) << input;
  EXPECT_EQ(a.headers_done, b.headers_done) << input;
}

TEST(RequestParser, ParsesAGet) {
  const Outcome out = parse("GET /v1/models?x=1&y HTTP/1.1\r\nHost: localhost\r\nX-Thing:  a b \t\r\n\r\n");
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.final_state, State::kNeedMore);
  const Request& r = out.requests[0];
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.target, "/v1/models?x=1&y");
  EXPECT_EQ(r.path, "/v1/models");
  EXPECT_EQ(r.query, "x=1&y");
  EXPECT_EQ(r.minor_version, 1);
  EXPECT_TRUE(r.keep_alive);
  EXPECT_EQ(r.body, "");
  ASSERT_EQ(r.headers.size(), 2u);
  EXPECT_EQ(r.headers[1].name, "x-thing");  // lowercased
  ASSERT_NE(r.header("x-thing"), nullptr);
  EXPECT_EQ(*r.header("x-thing"), "a b");  // surrounding whitespace trimmed, inner kept
  EXPECT_EQ(r.header("X-Thing"), nullptr);  // lookups take lowercase names
  EXPECT_EQ(r.header("missing"), nullptr);
}

TEST(RequestParser, PercentEncodingIsLeftAlone) {
  const Outcome out = parse("GET /a%20b?q=%3F HTTP/1.1\r\n\r\n");
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].path, "/a%20b");
  EXPECT_EQ(out.requests[0].query, "q=%3F");
}

TEST(RequestParser, ParsesAPostBody) {
  const Outcome out = parse("POST /v1/completions HTTP/1.1\r\nContent-Length: 11\r\n\r\n{\"a\":\"b\r\n\"}");
  ASSERT_EQ(out.requests.size(), 1u);
  EXPECT_EQ(out.requests[0].method, "POST");
  EXPECT_EQ(out.requests[0].body, "{\"a\":\"b\r\n\"}");
}

TEST(RequestParser, StopsAtTheEndOfARequestForPipelining) {
  const std::string first = "POST /a HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc";
  const std::string second = "GET /b HTTP/1.1\r\n\r\n";
  RequestParser parser;
  const std::string both = first + second;
  EXPECT_EQ(parser.feed(both), first.size());
  ASSERT_EQ(parser.state(), State::kDone);
  EXPECT_EQ(parser.feed(second), 0u);  // nothing more until take()
  EXPECT_EQ(parser.take().path, "/a");
  EXPECT_FALSE(parser.in_progress());
  EXPECT_EQ(parser.feed(second), second.size());
  ASSERT_EQ(parser.state(), State::kDone);
  EXPECT_EQ(parser.take().path, "/b");

  const Outcome out = parse(both + both);
  ASSERT_EQ(out.requests.size(), 4u);
  EXPECT_EQ(out.requests[2].body, "abc");
  EXPECT_EQ(out.requests[3].path, "/b");
}

TEST(RequestParser, PartialRequestIsInProgress) {
  RequestParser parser;
  EXPECT_FALSE(parser.in_progress());
  parser.feed("GE");
  EXPECT_TRUE(parser.in_progress());
  EXPECT_EQ(parser.state(), State::kNeedMore);
}

TEST(RequestParser, SkipsEmptyLinesBeforeTheRequestLine) {
  const Outcome out = parse("POST / HTTP/1.1\r\nContent-Length: 1\r\n\r\nx\r\nGET /next HTTP/1.1\r\n\r\n");
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.requests[1].path, "/next");
}

// Every input, fed one byte at a time and in odd pieces, gives what it gives fed at once.
TEST(RequestParser, FragmentsParseLikeTheWhole) {
  const std::vector<std::string> inputs = {
      "GET / HTTP/1.1\r\nHost: a\r\n\r\n",
      "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 5\r\nContent-Type: application/json\r\n\r\nhello"
      "GET /x?y HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
      "\r\n\r\nGET / HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\nConnection: close\r\n\r\n",
      "POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\r\n\r\n",
      "GET / HTTP/1.1\nHost: a\r\n\r\n",
      "GET / HTTP/1.1\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\nab",
      "GET / HTTP/1.1\r\nBad Name: x\r\n\r\n",
      "GET / HTTP/2.0\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 99999999\r\n\r\n",
      "GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n",
      "GET / HTTP/1.1\r\nX: a\rb\r\n\r\n",
      "POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort",
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;e=1\r\nabc\r\n1A\r\n" + std::string(26, 'q') +
          "\r\n0\r\nT: 1\r\n\r\nGET /next HTTP/1.1\r\n\r\n",
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcd\r\n",
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffffff\r\n",
  };
  for (const std::string& input : inputs) {
    const Outcome whole = parse(input);
    for (size_t piece : {1, 2, 3, 7, 64}) expect_same(whole, parse(input, piece), input);
  }
}

TEST(RequestParser, KeepAliveFollowsVersionAndConnection) {
  const auto keep_alive = [](std::string_view head) {
    const Outcome out = parse(std::string(head) + "\r\n");
    EXPECT_EQ(out.requests.size(), 1u) << head;
    return !out.requests.empty() && out.requests[0].keep_alive;
  };
  EXPECT_TRUE(keep_alive("GET / HTTP/1.1\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.1\r\nConnection: close\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.1\r\nConnection: Upgrade, CLOSE\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.1\r\nConnection: keep-alive\r\nConnection: close\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.0\r\n"));
  EXPECT_TRUE(keep_alive("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n"));
  EXPECT_FALSE(keep_alive("GET / HTTP/1.0\r\nConnection: keep-alive-ish\r\n"));
}

TEST(RequestParser, Versions) {
  const Outcome v10 = parse("GET / HTTP/1.0\r\n\r\n");
  ASSERT_EQ(v10.requests.size(), 1u);
  EXPECT_EQ(v10.requests[0].minor_version, 0);
  const Outcome v12 = parse("GET / HTTP/1.2\r\n\r\n");  // a later 1.x minor reads as 1.1
  ASSERT_EQ(v12.requests.size(), 1u);
  EXPECT_EQ(v12.requests[0].minor_version, 1);
  EXPECT_EQ(error_of("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(error_of("GET / HTTP/0.9\r\n\r\n"), 505);
  EXPECT_EQ(error_of("GET / http/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.10\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1\r\n\r\n"), 400);
}

TEST(RequestParser, MalformedRequestLines) {
  EXPECT_EQ(error_of("GET /\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET  / HTTP/1.1\r\n\r\n"), 400);  // two spaces: an empty target
  EXPECT_EQ(error_of("GET / HTTP/1.1 \r\n\r\n"), 400);
  EXPECT_EQ(error_of("G(T / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of(" GET / HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(error_of(std::string("GET /\x01 HTTP/1.1\r\n\r\n")), 400);
  EXPECT_EQ(error_of("GET /\xff HTTP/1.1\r\n\r\n"), 400);
}

TEST(RequestParser, OnlyCrlfEndsALine) {
  const Outcome bare_lf = parse("GET / HTTP/1.1\nHost: a\n\n");
  EXPECT_EQ(bare_lf.error_status, 400);
  EXPECT_NE(bare_lf.error_message.find("CRLF"), std::string::npos);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nHost: a\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nHost: a\r\n\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n"), 400);  // bare CR
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\r\n\r\n"), 400);
}

TEST(RequestParser, MalformedHeaders) {
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nHost : a\r\n\r\n"), 400);  // space before the colon
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nNoColon\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\n: value\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nX: a\r\n  folded\r\n\r\n"), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nX: a\0b\r\n\r\n"s), 400);
  EXPECT_EQ(error_of("GET / HTTP/1.1\r\nX: a\x7f\r\n\r\n"), 400);
  // Bytes >= 0x80 in a value are opaque data, not an error.
  const Outcome utf8 = parse("GET / HTTP/1.1\r\nX-Name: caf\xc3\xa9\r\nEmpty:\r\n\r\n");
  ASSERT_EQ(utf8.requests.size(), 1u);
  EXPECT_EQ(*utf8.requests[0].header("x-name"), "caf\xc3\xa9");
  EXPECT_EQ(*utf8.requests[0].header("empty"), "");
}

TEST(RequestParser, RejectsAmbiguousFraming) {
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc"), 400);
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"), 400);
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), 400);
  for (const char* length : {"-1", "+3", "3a", "0x3", "3 3", "3, 3", "", "99999999999999999999999"}) {
    EXPECT_EQ(error_of(fmt::format("POST / HTTP/1.1\r\nContent-Length: {}\r\n\r\nabc", length)), 400)
        << '"' << length << '"';
  }
  // The same length twice is one length.
  const Outcome same = parse("POST / HTTP/1.1\r\nContent-Length: 3\r\ncontent-length: 3\r\n\r\nabc");
  ASSERT_EQ(same.requests.size(), 1u);
  EXPECT_EQ(same.requests[0].body, "abc");
  // Leading zeros are still digits.
  const Outcome zeros = parse("POST / HTTP/1.1\r\nContent-Length: 003\r\n\r\nabc");
  ASSERT_EQ(zeros.requests.size(), 1u);
}

// RFC 9112 7.1: hex sizes in either case and with leading zeros, extensions ignored, trailer
// fields read and dropped; the body is the chunks' data joined.
TEST(RequestParser, ChunkedBodiesAreDecoded) {
  const Outcome out = parse(
      "POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "3\r\nabc\r\n00A;name=value\r\n0123456789\r\nf ; x ;y=\"q\"\r\n" + std::string(15, 'z') + "\r\n"
      "0\r\nX-Trailer: 1\r\nAnother: two\r\n\r\n"
      "POST /d HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n1\r\n!\r\n0;end\r\n\r\n");
  ASSERT_EQ(out.requests.size(), 2u);
  EXPECT_EQ(out.final_state, State::kNeedMore);
  EXPECT_EQ(out.requests[0].path, "/c");
  EXPECT_EQ(out.requests[0].body, "abc0123456789" + std::string(15, 'z'));
  EXPECT_EQ(out.requests[0].header("x-trailer"), nullptr);  // trailers are not headers
  EXPECT_EQ(out.requests[1].body, "!");
  // An empty chunked body.
  const Outcome empty = parse("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n");
  ASSERT_EQ(empty.requests.size(), 1u);
  EXPECT_EQ(empty.requests[0].body, "");
}

TEST(RequestParser, MalformedChunksAre400) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  for (const char* chunks : {"x\r\nabc\r\n0\r\n\r\n", "\r\nabc\r\n0\r\n\r\n", "-3\r\nabc\r\n0\r\n\r\n",
                             "+3\r\nabc\r\n0\r\n\r\n", "0x3\r\nabc\r\n0\r\n\r\n", " 3\r\nabc\r\n0\r\n\r\n",
                             "3 \r\nabc\r\n0\r\n\r\n", "3 x\r\nabc\r\n0\r\n\r\n", "3\nabc\r\n0\r\n\r\n",
                             "3\r\nabcd\r\n0\r\n\r\n", "3\r\nabc\n0\r\n\r\n", "3;\x01\r\nabc\r\n0\r\n\r\n",
                             "3\r\nabc\r\n0\r\nBad Trailer: 1\r\n\r\n", "3\r\nabc\r\n0\r\nX: 1\n\r\n"}) {
    EXPECT_EQ(error_of(head + chunks), 400) << chunks;
  }
  // A size line that never ends is refused once it is longer than any sane one.
  EXPECT_EQ(error_of(head + "3;" + std::string(5000, 'e')), 400);
}

TEST(RequestParser, TransferCodingsOtherThanChunked) {
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"), 501);
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n"), 501);
  // Chunked not last: the body's end cannot be found (RFC 9112 6.3).
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, gzip\r\n\r\n"), 400);
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"), 400);
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nTransfer-Encoding: \r\n\r\n"), 400);
  // HTTP/1.0 has no transfer codings (RFC 9112 6.1): faulty framing.
  EXPECT_EQ(error_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 400);
}

TEST(RequestParser, ChunkedBodyLimits) {
  const std::string head = "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
  // At the limit, across chunks.
  const Outcome fits = parse(head + "6\r\n012345\r\n4\r\n6789\r\n0\r\n\r\n", 0, {.max_body_bytes = 10});
  ASSERT_EQ(fits.requests.size(), 1u);
  EXPECT_EQ(fits.requests[0].body, "0123456789");
  // One byte over: refused at the size line, before that chunk's data is read.
  RequestParser parser({.max_body_bytes = 10});
  const std::string first = head + "6\r\n012345\r\n";
  EXPECT_EQ(parser.feed(first + "5\r\n6789a\r\n0\r\n\r\n"), first.size() + 3);
  EXPECT_EQ(parser.state(), State::kError);
  EXPECT_EQ(parser.error_status(), 413);
  // Sizes that overflow 64 bits are over the limit too, not wrapped around.
  EXPECT_EQ(error_of(head + "10000000000000001\r\nx\r\n0\r\n\r\n"), 413);
  EXPECT_EQ(error_of(head + std::string(40, 'f') + "\r\n"), 413);
  // Trailers count against the head's limit.
  const ParserLimits small_head{.max_header_bytes = 128};
  EXPECT_EQ(error_of(head + "0\r\nX: " + std::string(100, 't') + "\r\n\r\n", small_head), 431);
}

TEST(RequestParser, ChunkedWithExpectContinuePausesAfterTheHead) {
  const std::string head = "POST / HTTP/1.1\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n";
  RequestParser parser;
  EXPECT_EQ(parser.feed(head + "1\r\na\r\n0\r\n\r\n"), head.size());
  ASSERT_EQ(parser.state(), State::kHeadersDone);
  parser.feed("1\r\na\r\n0\r\n\r\n");
  ASSERT_EQ(parser.state(), State::kDone);
  EXPECT_EQ(parser.take().body, "a");
}

TEST(RequestParser, BodyTooLargeIsDecidedFromContentLength) {
  RequestParser parser({.max_body_bytes = 10});
  const std::string head = "POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n";
  EXPECT_EQ(parser.feed(head + "0123456789a"), head.size());  // no body byte read
  EXPECT_EQ(parser.state(), State::kError);
  EXPECT_EQ(parser.error_status(), 413);

  const Outcome fits = parse("POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789", 0, {.max_body_bytes = 10});
  ASSERT_EQ(fits.requests.size(), 1u);
}

TEST(RequestParser, HeadTooLarge) {
  const ParserLimits limits{.max_header_bytes = 64};
  const std::string request_line = "GET / HTTP/1.1\r\n";  // 16 bytes
  // Exactly at the limit: request line, a 46-byte header line, the final CRLF.
  const std::string fits = request_line + "X: " + std::string(41, 'a') + "\r\n\r\n";
  ASSERT_EQ(fits.size(), 64u);
  EXPECT_EQ(parse(fits, 0, limits).requests.size(), 1u);
  EXPECT_EQ(parse(fits, 1, limits).requests.size(), 1u);
  EXPECT_EQ(error_of(request_line + "X: " + std::string(42, 'a') + "\r\n\r\n", limits), 431);
  // A line that never ends is refused as soon as it passes the limit, not buffered.
  RequestParser parser(limits);
  EXPECT_EQ(parser.feed(std::string(64, 'G')), 64u);
  EXPECT_EQ(parser.state(), State::kNeedMore);
  parser.feed("G");
  EXPECT_EQ(parser.state(), State::kError);
  EXPECT_EQ(parser.error_status(), 431);
}

TEST(RequestParser, TooManyHeaders) {
  std::string head = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 3; ++i) head += fmt::format("X-{}: {}\r\n", i, i);
  EXPECT_EQ(parse(head + "\r\n", 0, {.max_headers = 3}).requests.size(), 1u);
  EXPECT_EQ(error_of(head + "X-3: 3\r\n\r\n", {.max_headers = 3}), 431);
}

TEST(RequestParser, ExpectContinuePausesAfterTheHead) {
  const std::string head = "POST / HTTP/1.1\r\nExpect: 100-Continue\r\nContent-Length: 3\r\n\r\n";
  RequestParser parser;
  EXPECT_EQ(parser.feed(head + "abc"), head.size());
  ASSERT_EQ(parser.state(), State::kHeadersDone);
  EXPECT_EQ(parser.feed(""), 0u);  // feeding on, even nothing, goes on to the body
  EXPECT_EQ(parser.state(), State::kNeedMore);
  EXPECT_EQ(parser.feed("abc"), 3u);
  ASSERT_EQ(parser.state(), State::kDone);
  EXPECT_EQ(parser.take().body, "abc");

  // No pause without a body to wait for, nor for HTTP/1.0 (which has no 100 Continue).
  EXPECT_EQ(parse("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 0\r\n\r\n").headers_done, 0);
  EXPECT_EQ(parse("POST / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx").headers_done, 0);
  // Too large: the 413 comes instead of the pause, so the client is told before it uploads.
  EXPECT_EQ(error_of("POST / HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n", {.max_body_bytes = 10}),
            413);
}

TEST(RequestParser, TakeResetsForTheNextRequest) {
  RequestParser parser;
  parser.feed("POST /a HTTP/1.0\r\nContent-Length: 1\r\nX: y\r\n\r\nz");
  ASSERT_EQ(parser.state(), State::kDone);
  parser.take();
  parser.feed("GET /b HTTP/1.1\r\n\r\n");
  ASSERT_EQ(parser.state(), State::kDone);
  const Request r = parser.take();
  EXPECT_EQ(r.path, "/b");
  EXPECT_EQ(r.query, "");
  EXPECT_EQ(r.minor_version, 1);
  EXPECT_TRUE(r.headers.empty());
  EXPECT_TRUE(r.body.empty());
  EXPECT_TRUE(r.keep_alive);
}

TEST(RequestParser, ErrorIsFinal) {
  RequestParser parser;
  parser.feed("BAD\r\n");
  ASSERT_EQ(parser.state(), State::kError);
  EXPECT_EQ(parser.feed("GET / HTTP/1.1\r\n\r\n"), 0u);
  EXPECT_EQ(parser.state(), State::kError);
  EXPECT_EQ(parser.error_status(), 400);
}

}  // namespace
}  // namespace pagoda::http
