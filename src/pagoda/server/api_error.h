// ApiError: a request the API refuses, as OpenAI reports it: an HTTP status and
// {"error": {"message", "type", "param", "code"}}. Thrown by request parsing and the routes and
// turned into a response in one place (api.cpp), so every refusal has the same shape.
#pragma once

#include <stdexcept>
#include <string>

namespace pagoda::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = {})
      : std::runtime_error(message), status(status), param(std::move(param)) {}

  int status;         // 400, 401, 403, 404, 405, 413, 429, 500, 503
  std::string param;  // the request field at fault ("messages[1].content"), or "" for none
};

// OpenAI's error "type" for a status: authentication_error (401), rate_limit_error (429),
// server_error (5xx), invalid_request_error (any other 4xx).
const char* api_error_type(int status);

// {"error":{"message":...,"type":...,"param":...|null,"code":...|null}}
std::string api_error_json(int status, const std::string& message, const std::string& param = {});

}  // namespace pagoda::server
