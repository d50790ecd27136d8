#include "pagoda/server/api.h"

#include <algorithm>
#include <ctime>
#include <memory>
#include <span>
#include <utility>

#include "pagoda/core/error.h"
#include "pagoda/http/syntax.h"
#include "pagoda/server/api_error.h"
#include "pagoda/server/chat_page.h"
#include "pagoda/server/openai_response.h"
#include "pagoda/tokenizer/utf8.h"

namespace pagoda::server {
namespace {

// The status nginx logs for "the client closed the connection before the response": nothing is
// sent, but /metrics counts such requests under it.
constexpr int kClientClosedRequest = 499;

// The same time whatever the key's first wrong byte, so a timing cannot tell how much was right.
bool equal_in_constant_time(std::string_view a, std::string_view b) {
  unsigned char difference = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < a.size(); ++i) difference |= uint8_t(a[i]) ^ uint8_t(i < b.size() ? b[i] : 0);
  return difference == 0;
}

// A browser sends Origin with every cross-site POST, and a page elsewhere could otherwise make a
// visitor's browser use a server on their own machine (a "simple" text/plain POST needs no
// preflight). Requests without Origin (curl, SDKs) and the chat page's own (same origin) pass.
bool cross_origin(const http::Request& request) {
  const std::string* origin = request.header("origin");
  if (!origin) return false;
  const std::string* host = request.header("host");
  const size_t scheme_end = origin->find("://");
  const std::string_view authority =
      scheme_end == std::string::npos ? std::string_view() : std::string_view(*origin).substr(scheme_end + 3);
  return !host || authority != *host;
}

int status_for(const Error& e) {
  switch (e.kind()) {
    case ErrorKind::kInvalidArgument:
    case ErrorKind::kCorrupt:
    case ErrorKind::kUnsupported: return 400;
    case ErrorKind::kNotFound: return 404;
    case ErrorKind::kOutOfMemory: return 503;
    case ErrorKind::kInternal: return 500;
  }
  return 500;
}

std::string sse_event(const std::string& json) { return "data: " + json + "\n\n"; }

}  // namespace

http::Response api_error_response(int status, std::string_view message) {
  return {.status = status, .content_type = "application/json", .body = api_error_json(status, std::string(message))};
}

Api::Api(const ModelContext& model, EngineService& engine, Metrics& metrics, ApiOptions options)
    : model_(model), engine_(engine), metrics_(metrics), options_(std::move(options)), created_(std::time(nullptr)) {}

void Api::handle(const http::Request& request, http::Exchange& exchange) {
  int status;
  try {
    status = route(request, exchange);
  } catch (const ApiError& e) {
    status = e.status;
    if (exchange.responded()) throw;  // mid-stream: the HTTP layer closes the connection
    exchange.respond({.status = status, .body = api_error_json(status, e.what(), e.param)});
  } catch (const Error& e) {
    status = status_for(e);
    if (exchange.responded()) throw;
    exchange.respond(api_error_response(status, e.what()));
  }
  // Only the API's own traffic: scrapes of /metrics and health checks would swamp the counts.
  if (request.path.starts_with("/v1/")) metrics_.count_request(status);
}

bool Api::authorized(const http::Request& request, std::string_view key) {
  if (key.empty()) return true;
  const std::string* header = request.header("authorization");
  if (!header) return false;
  // credentials = auth-scheme 1*SP token68 (RFC 9110 11.4); the scheme is case-insensitive.
  const std::string_view value(*header);
  const size_t space = value.find(' ');
  if (space == std::string_view::npos || !http::iequals(value.substr(0, space), "Bearer")) return false;
  const std::string_view token = value.substr(std::min(value.find_first_not_of(' ', space), value.size()));
  return equal_in_constant_time(token, key);
}

int Api::route(const http::Request& request, http::Exchange& exchange) {
  const std::string& path = request.path;
  // HEAD is a GET whose body the HTTP layer leaves out (health checks use it).
  const bool get = request.method == "GET" || request.method == "HEAD", post = request.method == "POST";
  const auto method_not_allowed = [&](const char* allowed) -> int {
    throw ApiError(405, fmt::format("{} {} is not supported; use {}", request.method, path, allowed));
  };

  if (path == "/" || path == "/index.html") {
    if (!get) return method_not_allowed("GET");
    exchange.respond({.content_type = "text/html; charset=utf-8", .body = std::string(chat_page_html())});
    return 200;
  }
  if (path == "/health") {
    if (!get) return method_not_allowed("GET");
    exchange.respond({.body = R"({"status":"ok"})"});
    return 200;
  }
  if (path == "/metrics") {
    if (!get) return method_not_allowed("GET");
    if (!authorized(request, options_.metrics_key)) {
      throw ApiError(401, "Incorrect metrics key provided. Pass it as 'Authorization: Bearer <key>'.");
    }
    exchange.respond({.content_type = "text/plain; version=0.0.4; charset=utf-8", .body = metrics_.render()});
    return 200;
  }
  if (!path.starts_with("/v1/")) throw ApiError(404, fmt::format("there is no {} here", path));
  if (cross_origin(request)) {
    throw ApiError(403, "cross-origin requests are refused: the page's Origin does not match this server's Host");
  }
  if (!authorized(request, options_.api_key)) {
    throw ApiError(401, "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.");
  }
  if (path == "/v1/models") {
    if (!get) return method_not_allowed("GET");
    exchange.respond({.body = models_json(model_.model_id, created_, model_.max_context)});
    return 200;
  }
  if (path == "/v1/chat/completions") {
    if (!post) return method_not_allowed("POST");
    return generate(request, exchange, ApiKind::kChat);
  }
  if (path == "/v1/completions") {
    if (!post) return method_not_allowed("POST");
    return generate(request, exchange, ApiKind::kCompletion);
  }
  throw ApiError(404, fmt::format("there is no {} here", path));
}

int Api::generate(const http::Request& request, http::Exchange& exchange, ApiKind kind) {
  const GenerationJob job =
      kind == ApiKind::kChat ? parse_chat_request(request.body, model_) : parse_completion_request(request.body, model_);
  // A beam search is one engine request per prompt, whose n best hypotheses are its n choices.
  std::vector<Request> choices;
  for (size_t p = 0; p < job.prompts.size(); ++p) {
    for (int32_t j = 0; j < (job.beam_search ? 1 : job.n); ++j)
      choices.push_back({.prompt = job.prompts[p], .params = choice_params(job, int32_t(p) * job.n + j)});
  }
  std::vector<ChoiceOutput> outputs(job.prompts.size() * size_t(job.n));
  for (size_t i = 0; i < outputs.size(); ++i) outputs[i].index = int32_t(i);
  const std::shared_ptr<GenerationStream> stream = engine_.submit(std::move(choices));
  // However this handler ends (a client gone, an exception), the request stops with it.
  struct CancelUnfinished {
    EngineService& engine;
    const std::shared_ptr<GenerationStream>& stream;
    ~CancelUnfinished() {
      if (!stream->done()) engine.cancel(stream);
    }
  } cancel_unfinished{engine_, stream};
  const ResponseIds ids{.id = new_response_id(kind), .created = std::time(nullptr), .model = model_.model_id};
  const Tokenizer& tokenizer = model_.tokenizer;

  std::vector<int32_t> streamed_characters(outputs.size(), 0);  // completions' text_offset: code points sent
  bool connected = true;
  const auto send = [&](const std::string& data) { connected = connected && exchange.send(data); };
  if (job.stream) {
    connected = exchange.start_stream(200, "text/event-stream", {{"cache-control", "no-cache"}});
    // OpenAI opens each chat choice with a chunk that carries the role.
    if (kind == ApiKind::kChat) {
      for (const ChoiceOutput& out : outputs)
        send(stream_chunk_event(job, ids, out.index, "", {}, FinishReason::kNone, true, tokenizer));
    }
  }
  while (!stream->done()) {
    for (ChoiceEvent& news : stream->wait(kPollInterval)) {
      const TokenEvent& event = news.event;
      if (job.beam_search) {  // one event, at the end (streaming is refused)
        for (size_t j = 0; j < event.beams.size(); ++j) {
          ChoiceOutput& out = outputs[size_t(news.choice) * size_t(job.n) + j];
          out.text = event.beams[j].text;
          out.finish = event.beams[j].finish;
          out.cumulative_logprob = event.beams[j].cumulative_logprob;
          out.beam_score = event.beams[j].score;
          out.prompt_tokens = event.prompt_tokens;
          out.completion_tokens = j == 0 ? event.generated_tokens : 0;  // every beam's tokens, counted once
        }
        if (event.finish == FinishReason::kCancelled) outputs[size_t(news.choice) * size_t(job.n)].finish = event.finish;
        continue;
      }
      ChoiceOutput& out = outputs[size_t(news.choice)];
      const bool has_token = event.token >= 0;
      if (has_token && job.logprobs) out.tokens.push_back(event.sampled);
      out.prompt_tokens = event.prompt_tokens;
      out.completion_tokens = event.generated_tokens;
      out.finish = event.finish;
      if (job.stream && (!event.text.empty() || event.finish != FinishReason::kNone || (has_token && job.logprobs))) {
        const auto token = has_token && job.logprobs ? std::span(&event.sampled, 1) : std::span<const SampledToken>();
        send(stream_chunk_event(job, ids, news.choice, event.text, token, event.finish, false, tokenizer,
                                streamed_characters[size_t(news.choice)]));
        streamed_characters[size_t(news.choice)] += int32_t(count_code_points(event.text));
      }
      out.text += event.text;
    }
    if (!connected || exchange.client_gone()) {
      metrics_.count_client_disconnect();
      return kClientClosedRequest;
    }
  }

  if (const std::string error = stream->error(); !error.empty()) {
    if (!job.stream) throw ApiError(500, error);
    send(sse_event(api_error_json(500, error)));
    send(std::string(kStreamDone));
    exchange.end_stream();
    return 500;
  }
  if (!job.stream) {
    exchange.respond({.body = completion_response_json(job, ids, outputs, tokenizer)});
    return 200;
  }
  if (job.include_usage) {
    int32_t prompt_tokens = 0, completion_tokens = 0;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (i % size_t(job.n) == 0) prompt_tokens += outputs[i].prompt_tokens;  // once per prompt, not per choice
      completion_tokens += outputs[i].completion_tokens;
    }
    send(stream_usage_event(job, ids, prompt_tokens, completion_tokens));
  }
  send(std::string(kStreamDone));
  exchange.end_stream();
  return 200;
}

}  // namespace pagoda::server
