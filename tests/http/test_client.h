// TestClient: a blocking loopback client for the server tests, with a reader for the responses
// pagoda writes (Content-Length, chunked, or to the end of the connection). Every read gives up
// after two seconds, so a server bug fails a test instead of hanging it.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "pagoda/http/request.h"

namespace pagoda::http {

struct TestResponse {
  int status = 0;
  std::vector<Header> headers;  // names lowercased
  std::string body;             // de-chunked

  const std::string* header(std::string_view name) const {
    for (const Header& h : headers) {
      if (h.name == name) return &h.value;
    }
    return nullptr;
  }
};

class TestClient {
 public:
  explicit TestClient(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const timeval timeout{.tv_sec = 2, .tv_usec = 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    connected_ = connect(fd_, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0;
  }
  ~TestClient() { close(); }
  TestClient(const TestClient&) = delete;
  TestClient& operator=(const TestClient&) = delete;

  bool connected() const { return connected_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  void shutdown_write() { ::shutdown(fd_, SHUT_WR); }

  bool send(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n = ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0) return false;
      bytes.remove_prefix(size_t(n));
    }
    return true;
  }

  // One response; nullopt when the connection ends (or times out) before a whole one arrived.
  std::optional<TestResponse> read_response() {
    TestResponse r;
    std::optional<std::string> status_line = read_line();
    if (!status_line || status_line->size() < 12 || !status_line->starts_with("HTTP/1.1 ")) return std::nullopt;
    r.status = std::atoi(status_line->c_str() + 9);
    for (;;) {
      std::optional<std::string> line = read_line();
      if (!line) return std::nullopt;
      if (line->empty()) break;
      const size_t colon = line->find(':');
      if (colon == std::string::npos) return std::nullopt;
      Header h{line->substr(0, colon), line->substr(colon + 1)};
      for (char& c : h.name) c = char(std::tolower(static_cast<unsigned char>(c)));
      h.value.erase(0, h.value.find_first_not_of(' '));
      r.headers.push_back(std::move(h));
    }
    if (r.status == 100 || r.status == 204) return r;
    if (const std::string* te = r.header("transfer-encoding")) {
      if (*te != "chunked") return std::nullopt;
      for (;;) {
        std::optional<std::string> size_line = read_line();
        if (!size_line || size_line->empty()) return std::nullopt;
        const size_t size = std::strtoul(size_line->c_str(), nullptr, 16);
        std::optional<std::string> data = read_exactly(size + 2);
        if (!data || !data->ends_with("\r\n")) return std::nullopt;
        if (size == 0) return r;
        r.body.append(*data, 0, size);
      }
    }
    if (const std::string* length = r.header("content-length")) {
      std::optional<std::string> body = read_exactly(std::strtoul(length->c_str(), nullptr, 10));
      if (!body) return std::nullopt;
      r.body = std::move(*body);
      return r;
    }
    r.body = read_to_end();
    return r;
  }

  // True when the server closed the connection (no more bytes), within the read timeout.
  bool at_end() {
    if (!buffered_.empty()) return false;
    char c;
    return ::recv(fd_, &c, 1, 0) == 0;
  }

  // All bytes until the server closes (or the read timeout).
  std::string read_to_end() {
    std::string out = std::move(buffered_);
    buffered_.clear();
    char chunk[4096];
    for (ssize_t n; (n = ::recv(fd_, chunk, sizeof chunk, 0)) > 0;) out.append(chunk, size_t(n));
    return out;
  }

 private:
  bool fill() {
    char chunk[4096];
    const ssize_t n = ::recv(fd_, chunk, sizeof chunk, 0);
    if (n <= 0) return false;
    buffered_.append(chunk, size_t(n));
    return true;
  }
  std::optional<std::string> read_line() {
    size_t crlf;
    while ((crlf = buffered_.find("\r\n")) == std::string::npos) {
      if (!fill()) return std::nullopt;
    }
    std::string line = buffered_.substr(0, crlf);
    buffered_.erase(0, crlf + 2);
    return line;
  }
  std::optional<std::string> read_exactly(size_t n) {
    while (buffered_.size() < n) {
      if (!fill()) return std::nullopt;
    }
    std::string out = buffered_.substr(0, n);
    buffered_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buffered_;
};

}  // namespace pagoda::http
