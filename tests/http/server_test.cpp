#include "pagoda/http/server.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>

#include <fmt/format.h>

#include "pagoda/core/error.h"
#include "test_client.h"

namespace pagoda::http {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// "METHOD target body", so a test sees what the server handed the handler.
void echo(const Request& request, Exchange& exchange) {
  exchange.respond({.status = 200,
                    .content_type = "text/plain",
                    .body = fmt::format("{} {} {}", request.method, request.target, request.body),
                    .headers = {{"X-Echo", "1"}}});
}

std::string get(std::string_view target, std::string_view extra_headers = "") {
  return fmt::format("GET {} HTTP/1.1\r\nHost: test\r\n{}\r\n", target, extra_headers);
}

class ServerTest : public ::testing::Test {
 protected:
  void start(Handler handler, ServerOptions options = {}) {
    options.port = 0;
    server_ = std::make_unique<Server>(std::move(options), std::move(handler));
    thread_ = std::thread([this] {
      server_->run();
      returned_ = true;
    });
  }
  void stop() {
    if (!thread_.joinable()) return;
    server_->shutdown();
    thread_.join();
  }
  void TearDown() override { stop(); }
  int port() const { return server_->port(); }

  std::unique_ptr<Server> server_;
  std::thread thread_;
  std::atomic<bool> returned_{false};
};

TEST_F(ServerTest, GetAndPostRoundTrip) {
  start(echo);
  TestClient client(port());
  ASSERT_TRUE(client.connected());
  client.send(get("/v1/models?x=1"));
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "GET /v1/models?x=1 ");
  EXPECT_EQ(*r->header("content-type"), "text/plain");
  EXPECT_EQ(*r->header("x-echo"), "1");
  EXPECT_EQ(r->header("connection"), nullptr);  // kept alive

  client.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 13\r\n\r\n{\"prompt\":\"\"}");
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "POST /v1/completions {\"prompt\":\"\"}");
  EXPECT_EQ(*r->header("content-length"), "34");
}

TEST_F(ServerTest, PipelinedRequestsAreAnsweredInOrder) {
  std::atomic<bool> gone_seen{false};
  start([&](const Request& request, Exchange& exchange) {
    // Unread pipelined bytes behind this request do not make the client look gone.
    if (exchange.client_gone()) gone_seen = true;
    echo(request, exchange);
  });
  TestClient client(port());
  client.send(get("/1") + "POST /2 HTTP/1.1\r\nContent-Length: 1\r\n\r\nx" + get("/3"));
  for (std::string_view expected : {"GET /1 ", "POST /2 x", "GET /3 "}) {
    std::optional<TestResponse> r = client.read_response();
    ASSERT_TRUE(r.has_value()) << expected;
    EXPECT_EQ(r->body, expected);
  }
  EXPECT_FALSE(gone_seen);
}

TEST_F(ServerTest, ConnectionCloseAndHttp10) {
  start(echo);
  {
    TestClient client(port());
    client.send(get("/", "Connection: close\r\n"));
    std::optional<TestResponse> r = client.read_response();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(*r->header("connection"), "close");
    EXPECT_TRUE(client.at_end());
  }
  {
    TestClient client(port());
    client.send("GET /old HTTP/1.0\r\n\r\n");
    std::optional<TestResponse> r = client.read_response();
    ASSERT_TRUE(r.has_value());
    EXPECT_EQ(r->body, "GET /old ");
    EXPECT_EQ(*r->header("connection"), "close");
    EXPECT_TRUE(client.at_end());
  }
  {
    TestClient client(port());
    for (int i = 0; i < 2; ++i) {
      client.send("GET /old HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
      std::optional<TestResponse> r = client.read_response();
      ASSERT_TRUE(r.has_value()) << i;
      EXPECT_EQ(*r->header("connection"), "keep-alive");  // HTTP/1.0 needs telling
    }
  }
}

void stream(const Request&, Exchange& exchange) {
  ASSERT_TRUE(exchange.start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}}));
  EXPECT_TRUE(exchange.send("data: 1\n\n"));
  EXPECT_TRUE(exchange.send(""));  // nothing, not the end of the stream
  EXPECT_TRUE(exchange.send(std::string(70000, 'x') + "\n\n"));
  exchange.end_stream();
}

TEST_F(ServerTest, StreamIsChunkedAndKeepsTheConnection) {
  start([](const Request& request, Exchange& exchange) {
    if (request.path == "/stream") return stream(request, exchange);
    echo(request, exchange);
  });
  TestClient client(port());
  client.send(get("/stream"));
  std::optional<TestResponse> r = client.read_response();  // de-chunks, and fails on bad chunking
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(*r->header("transfer-encoding"), "chunked");
  EXPECT_EQ(*r->header("content-type"), "text/event-stream");
  EXPECT_EQ(*r->header("cache-control"), "no-cache");
  EXPECT_EQ(r->header("content-length"), nullptr);
  EXPECT_EQ(r->body, "data: 1\n\n" + std::string(70000, 'x') + "\n\n");

  client.send(get("/after"));
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /after ");
}

TEST_F(ServerTest, StreamToHttp10IsUnchunkedAndEndsWithTheConnection) {
  start(stream);
  TestClient client(port());
  client.send("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->header("transfer-encoding"), nullptr);
  EXPECT_EQ(*r->header("connection"), "close");
  EXPECT_EQ(r->body, "data: 1\n\n" + std::string(70000, 'x') + "\n\n");
}

TEST_F(ServerTest, ClientGoneTurnsTrueSoonAfterTheClientCloses) {
  std::promise<bool> started;  // client_gone() before the client closed
  std::promise<Clock::time_point> gone_at;
  start([&](const Request&, Exchange& exchange) {
    started.set_value(exchange.client_gone());
    const Clock::time_point give_up = Clock::now() + 3s;
    while (!exchange.client_gone() && Clock::now() < give_up) std::this_thread::sleep_for(10ms);
    gone_at.set_value(exchange.client_gone() ? Clock::now() : Clock::time_point::max());
    exchange.respond({.body = "too late"});  // a write to a gone client fails quietly
  });
  TestClient client(port());
  client.send("POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  std::future<bool> started_future = started.get_future();
  ASSERT_EQ(started_future.wait_for(2s), std::future_status::ready);
  EXPECT_FALSE(started_future.get());
  std::this_thread::sleep_for(50ms);
  client.close();
  const Clock::time_point closed_at = Clock::now();
  std::future<Clock::time_point> gone_future = gone_at.get_future();
  ASSERT_EQ(gone_future.wait_for(4s), std::future_status::ready);
  EXPECT_LT(gone_future.get() - closed_at, 1s);
}

// A client that sends its request and shuts down its sending side (shutdown(SHUT_WR), as some
// clients and proxies do) is waiting for the answer, not gone. The handler below waits like the
// API does, asking client_gone() as it goes.
TEST_F(ServerTest, HalfClosedClientGetsItsResponse) {
  start([&](const Request& request, Exchange& exchange) {
    const bool stream = request.path == "/stream";
    if (stream) exchange.start_stream(200, "text/event-stream");
    for (int i = 0; i < 20; ++i) {
      if (exchange.client_gone()) return;
      if (stream) exchange.send(fmt::format("data: {}\n\n", i));
      std::this_thread::sleep_for(10ms);
    }
    if (stream) return exchange.end_stream();
    echo(request, exchange);
  });
  TestClient client(port());
  client.send("POST /whole HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}");
  client.shutdown_write();
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 100);  // the probe that tells a half-close from a close
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /whole {}");
  EXPECT_TRUE(client.at_end());  // then closed: the client said it sends nothing more

  TestClient streaming(port());
  streaming.send(get("/stream"));
  streaming.shutdown_write();
  r = streaming.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_TRUE(r->body.ends_with("data: 19\n\n")) << r->body;
}

TEST_F(ServerTest, ChunkedRequestBodyReachesTheHandler) {
  start(echo, {.limits = {.max_body_bytes = 10}});
  TestClient client(port());
  client.send("POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n");
  client.send("2;x=y\r\nef\r\n0\r\nX-Checksum: 1\r\n\r\n");
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /up abcdef");
  client.send(get("/next"));  // still in step
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /next ");
  // Past the body limit: 413 and closed.
  client.send("POST /up HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n8\r\n01234567\r\n8\r\n");
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(client.at_end());
}

TEST_F(ServerTest, ShutdownWaitsForTheHandlerInFlight) {
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  start([&](const Request& request, Exchange& exchange) {
    if (request.path == "/slow") {
      started.set_value();
      released.wait();
    }
    echo(request, exchange);
  });
  TestClient idle(port());  // a kept-alive connection between requests
  idle.send(get("/"));
  ASSERT_TRUE(idle.read_response().has_value());
  TestClient busy(port());
  busy.send(get("/slow"));
  ASSERT_EQ(started.get_future().wait_for(2s), std::future_status::ready);

  server_->shutdown();
  EXPECT_TRUE(idle.at_end());  // closed at once
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(returned_);  // the handler still runs
  release.set_value();
  std::optional<TestResponse> r = busy.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /slow ");
  EXPECT_EQ(*r->header("connection"), "close");  // so the client sends nothing more here
  EXPECT_TRUE(busy.at_end());
  busy.close();
  thread_.join();
  EXPECT_TRUE(returned_);
  EXPECT_FALSE(TestClient(port()).connected());  // no longer listening
}

TEST_F(ServerTest, RequestArrivingDuringShutdownGets503) {
  start(echo);
  TestClient client(port());
  client.send(get("/"));
  ASSERT_TRUE(client.read_response().has_value());
  client.send("POST / HTTP/1.1\r\nContent-Len");  // the next request, half sent
  std::this_thread::sleep_for(50ms);
  server_->shutdown();
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(*r->header("connection"), "close");
  EXPECT_TRUE(client.at_end());
}

TEST_F(ServerTest, ConnectionsBeyondTheLimitGet503WhenNoneIsIdle) {
  std::promise<void> started;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  start(
      [&](const Request& request, Exchange& exchange) {
        if (request.path == "/slow") {
          started.set_value();
          released.wait();
        }
        echo(request, exchange);
      },
      {.max_connections = 1});
  TestClient busy(port());
  busy.send(get("/slow"));
  ASSERT_EQ(started.get_future().wait_for(2s), std::future_status::ready);

  // The one connection has a request in flight: it is not closed for a newcomer.
  TestClient second(port());
  std::optional<TestResponse> r = second.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 503);
  EXPECT_EQ(*r->header("connection"), "close");
  EXPECT_TRUE(second.at_end());

  release.set_value();
  r = busy.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /slow ");
}

// At the limit, the connection idle the longest (no request in flight) is closed for the new
// one: idle sockets cannot lock active clients out.
TEST_F(ServerTest, IdleConnectionsGiveWayToNewOnes) {
  start(echo, {.max_connections = 2});
  TestClient oldest(port());
  oldest.send(get("/1"));
  ASSERT_TRUE(oldest.read_response().has_value());
  std::this_thread::sleep_for(50ms);
  TestClient newer(port());
  newer.send(get("/2"));
  ASSERT_TRUE(newer.read_response().has_value());

  TestClient third(port());
  third.send(get("/3"));
  std::optional<TestResponse> r = third.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "GET /3 ");
  EXPECT_TRUE(oldest.at_end());  // closed quietly, as at a keep-alive timeout
  newer.send(get("/again"));
  r = newer.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->body, "GET /again ");
}

// The client gives up reading after 2 s, so the 1 s timeouts, not the default 30 s, must act.
TEST_F(ServerTest, SlowRequestsAndIdleConnectionsTimeOut) {
  start(echo, {.keep_alive_timeout_s = 1, .read_timeout_s = 1});
  TestClient slow(port());
  TestClient idle(port());
  slow.send("GET / HTTP/1.1\r\nHost: test\r\n");  // and never the blank line
  std::optional<TestResponse> r = slow.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 408);
  EXPECT_EQ(*r->header("connection"), "close");
  EXPECT_TRUE(slow.at_end());
  EXPECT_TRUE(idle.at_end());  // closed without a word
}

// The API layer's error shape stands in for OpenAI's.
Response json_error(int status, std::string_view message) {
  return {.status = status, .body = fmt::format("{{\"error\":{{\"message\":\"{}\"}}}}", message)};
}

TEST_F(ServerTest, HandlerFailuresBecome500) {
  start(
      [](const Request& request, Exchange& exchange) {
        if (request.path == "/throw") throw std::runtime_error("boom");
        if (request.path == "/silent") return;
        if (request.path == "/split") {
          return exchange.respond({.headers = {{"X-Injected", "a\r\nSet-Cookie: evil"}}});
        }
        echo(request, exchange);
      },
      {.error_response = json_error});
  TestClient client(port());
  client.send(get("/throw"));
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(*r->header("content-type"), "application/json");
  EXPECT_EQ(r->body, "{\"error\":{\"message\":\"internal error: boom\"}}");

  client.send(get("/silent"));  // the connection survives a 500
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  EXPECT_NE(r->body.find("not answered"), std::string::npos);

  client.send(get("/split"));
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 500);
  EXPECT_EQ(r->header("set-cookie"), nullptr);
  EXPECT_EQ(r->header("x-injected"), nullptr);

  client.send(get("/fine"));
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
}

// A HEAD response carries the GET's headers and no body, or the next response on the
// connection would be read as that body.
TEST_F(ServerTest, HeadHasNoBody) {
  start(echo);
  TestClient client(port());
  client.send("HEAD /h HTTP/1.1\r\nHost: test\r\n\r\n" + get("/g", "Connection: close\r\n"));
  const std::string bytes = client.read_to_end();
  EXPECT_NE(bytes.find("Content-Length: 8\r\n"), std::string::npos) << bytes;  // "HEAD /h "
  EXPECT_EQ(bytes.find("HEAD /h "), std::string::npos) << bytes;
  const size_t second = bytes.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << bytes;
  EXPECT_TRUE(bytes.ends_with("GET /g ")) << bytes;
  EXPECT_EQ(bytes.find("\r\n\r\nHTTP/1.1"), second - 4) << "the HEAD response is not headers alone: " << bytes;
}

TEST_F(ServerTest, HandlerThrowingMidStreamClosesTheConnection) {
  start([](const Request&, Exchange& exchange) {
    exchange.start_stream(200, "text/event-stream");
    exchange.send("data: 1\n\n");
    throw std::runtime_error("engine failed");
  });
  TestClient client(port());
  client.send(get("/"));
  EXPECT_FALSE(client.read_response().has_value());  // a chunked body with no end: cut off
  EXPECT_TRUE(client.at_end());
}

TEST_F(ServerTest, MalformedRequestsGetTheErrorResponseAndAreClosed) {
  start(echo, {.limits = {.max_body_bytes = 10}, .error_response = json_error});
  const std::pair<std::string, int> cases[] = {
      {"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nabc", 400},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 501},
      {"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nz\r\nabc\r\n0\r\n\r\n", 400},
      {"POST / HTTP/1.1\r\nContent-Length: 11\r\n\r\n01234567890", 413},
      {"GET / HTTP/3.0\r\n\r\n", 505},
      {"GET / HTTP/1.1\r\nX: " + std::string(20000, 'a') + "\r\n\r\n", 431},
  };
  for (const auto& [request, status] : cases) {
    TestClient client(port());
    client.send(request);
    std::optional<TestResponse> r = client.read_response();
    ASSERT_TRUE(r.has_value()) << status;
    EXPECT_EQ(r->status, status);
    EXPECT_EQ(*r->header("connection"), "close");
    EXPECT_TRUE(r->body.starts_with("{\"error\"")) << r->body;
    EXPECT_TRUE(client.at_end());
  }
}

TEST_F(ServerTest, ExpectContinue) {
  start(echo, {.limits = {.max_body_bytes = 10}});
  TestClient client(port());
  client.send("POST /up HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n");
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 100);
  client.send("hello");
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 200);
  EXPECT_EQ(r->body, "POST /up hello");

  // Too large: the 413 comes at once, instead of the 100.
  client.send("POST /up HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 11\r\n\r\n");
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 413);
  EXPECT_TRUE(client.at_end());
}

TEST_F(ServerTest, NoContentHasNoLength) {
  start([](const Request&, Exchange& exchange) { exchange.respond({.status = 204, .content_type = ""}); });
  TestClient client(port());
  client.send(get("/"));
  std::optional<TestResponse> r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 204);
  EXPECT_EQ(r->header("content-length"), nullptr);
  EXPECT_EQ(r->header("content-type"), nullptr);
  client.send(get("/"));  // and the connection is still in step
  r = client.read_response();
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->status, 204);
}

TEST(Server, ListenErrorSaysWhere) {
  Server first({.port = 0}, echo);
  try {
    Server second({.port = first.port()}, echo);
    ADD_FAILURE() << "a second server listened on the same port";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()),
              fmt::format("cannot listen on 127.0.0.1:{}: Address already in use", first.port()));
  }
  EXPECT_THROW(Server({.port = 70000}, echo), Error);
}

TEST(Server, ShutdownBeforeRunReturnsAtOnce) {
  Server server({.port = 0}, echo);
  server.shutdown();
  server.run();
}

}  // namespace
}  // namespace pagoda::http
