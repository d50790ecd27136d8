#include "pagoda/server/api_error.h"

#include <nlohmann/json.hpp>

namespace pagoda::server {

const char* api_error_type(int status) {
  if (status == 401) return "authentication_error";
  if (status == 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";  // OpenAI's type for every other 4xx, 404 included
}

namespace {

// OpenAI's machine-readable codes for the refusals clients branch on; null elsewhere.
nlohmann::json api_error_code(int status, const std::string& param) {
  if (status == 401) return "invalid_api_key";
  if (status == 404 && param == "model") return "model_not_found";
  if (status == 429) return "rate_limit_exceeded";
  return nullptr;
}

}  // namespace

std::string api_error_json(int status, const std::string& message, const std::string& param) {
  const nlohmann::json error = {{"error",
                                 {{"message", message},
                                  {"type", api_error_type(status)},
                                  {"param", param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param)},
                                  {"code", api_error_code(status, param)}}}};
  // replace: a message may quote the client's own bytes, which need not be valid UTF-8.
  return error.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace pagoda::server
