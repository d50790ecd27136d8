// Request: one parsed HTTP/1.x request, as the RequestParser hands it to a handler. Plain data:
// the parser has already checked the framing, so a handler only reads fields.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagoda::http {

struct Header {
  std::string name;   // lowercased in requests; written as given in responses
  std::string value;  // surrounding spaces and tabs removed
};

struct Request {
  std::string method;         // "GET", "POST", ... (case-sensitive, as sent)
  std::string target;         // raw request target, "/v1/models?x=1"
  std::string path;           // target up to '?', percent-decoding NOT applied
  std::string query;          // after '?', or ""
  int minor_version = 1;      // HTTP/1.0 or 1.1 (1.2 and later minors read as 1.1)
  std::vector<Header> headers;  // in the order sent
  std::string body;
  bool keep_alive = true;  // from the version and the Connection header

  // The first header of that name, or nullptr. The name must be given in lowercase.
  const std::string* header(std::string_view lowercase_name) const;
};

}  // namespace pagoda::http
