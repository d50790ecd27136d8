// Api: the routes of `pagoda serve`, from an HTTP request to the engine and back.
//
//   GET  /                     the chat page
//   GET  /health               {"status":"ok"}
//   GET  /metrics              Prometheus text (open unless a metrics key is set)
//   GET  /v1/models            the served model
//   POST /v1/chat/completions  OpenAI chat, streamed as server-sent events or whole
//   POST /v1/completions       OpenAI (legacy) completions, likewise
//
// A handler waits for its request's events in slices of kPollInterval and asks the connection
// between slices whether the client is still there: a client that went away cancels its
// request, and the engine frees its KV blocks at the next step.
#pragma once

#include <chrono>
#include <string>

#include "pagoda/http/server.h"
#include "pagoda/server/engine_service.h"
#include "pagoda/server/metrics.h"
#include "pagoda/server/openai_request.h"

namespace pagoda::server {

struct ApiOptions {
  std::string api_key;      // "" : no key needed; otherwise /v1/* need "Authorization: Bearer <key>"
  std::string metrics_key;  // "" : /metrics is open; otherwise it needs "Authorization: Bearer <key>"
};

class Api {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{50};

  Api(const ModelContext& model, EngineService& engine, Metrics& metrics, ApiOptions options);

  void handle(const http::Request& request, http::Exchange& exchange);

 private:
  int route(const http::Request& request, http::Exchange& exchange);  // returns the HTTP status sent
  int generate(const http::Request& request, http::Exchange& exchange, ApiKind kind);
  // No key set, or the request's Authorization is "Bearer <key>" (the scheme in any case).
  static bool authorized(const http::Request& request, std::string_view key);

  const ModelContext& model_;
  EngineService& engine_;
  Metrics& metrics_;
  ApiOptions options_;
  int64_t created_;  // when the server started: the model's "created"
};

// The HTTP layer's own errors (bad framing, oversized body, ...) in OpenAI's error shape.
http::Response api_error_response(int status, std::string_view message);

}  // namespace pagoda::server
