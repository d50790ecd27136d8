// Response: a whole response as a handler builds it; the Exchange adds the framing headers
// (Content-Length, Connection) when it writes one.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "pagoda/http/request.h"

namespace pagoda::http {

struct Response {
  int status = 200;
  std::string content_type = "application/json";  // "" sends no Content-Type
  std::string body;
  // Extra headers, written as given. Content-Length, Transfer-Encoding and Connection belong to
  // the HTTP layer: setting them here is refused, as a wrong one would break the framing.
  std::vector<Header> headers;
};

// The reason phrase of a status code pagoda sends ("Not Found"), or "" for others: the phrase is
// optional on the wire (RFC 9112 4) and clients go by the number.
std::string_view status_reason(int status);

}  // namespace pagoda::http
