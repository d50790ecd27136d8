#include "pagoda/server/engine_service.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "pagoda/core/error.h"
#include "pagoda/server/api_error.h"

namespace pagoda::server {
namespace {

std::string describe_current_exception() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

std::vector<ChoiceEvent> GenerationStream::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, timeout, [&] { return !events_.empty() || unfinished_ == 0 || !error_.empty(); });
  return std::exchange(events_, {});
}

bool GenerationStream::done() const {
  std::lock_guard lock(mutex_);
  return events_.empty() && (unfinished_ == 0 || !error_.empty());
}

std::string GenerationStream::error() const {
  std::lock_guard lock(mutex_);
  return error_;
}

void GenerationStream::push(ChoiceEvent event) {
  {
    std::lock_guard lock(mutex_);
    if (event.event.finish != FinishReason::kNone) --unfinished_;
    events_.push_back(std::move(event));
  }
  ready_.notify_all();
}

void GenerationStream::fail(std::string message) {
  {
    std::lock_guard lock(mutex_);
    error_ = std::move(message);
  }
  ready_.notify_all();
}

EngineService::EngineService(Engine& engine, Metrics& metrics, int32_t max_queue, EngineHook* hook)
    : engine_(engine), metrics_(metrics), max_queue_(max_queue), hook_(hook) {
  publish_gauges();
  thread_ = std::thread([this] { loop(); });
}

EngineService::~EngineService() { stop(); }

void EngineService::stop() {
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
  }
  inbox_ready_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<GenerationStream> EngineService::submit(std::vector<Request> choices) {
  auto stream = std::make_shared<GenerationStream>(int32_t(choices.size()));
  std::future<void> accepted;
  {
    std::lock_guard lock(inbox_mutex_);
    if (stopping_) throw ApiError(503, "the server is shutting down");
    Submission& s = submissions_.emplace_back(Submission{.choices = std::move(choices), .stream = stream});
    accepted = s.accepted.get_future();
  }
  inbox_ready_.notify_all();
  accepted.get();  // rethrows the engine thread's refusal
  return stream;
}

void EngineService::wake() {
  {
    std::lock_guard lock(inbox_mutex_);
    woken_ = true;
  }
  inbox_ready_.notify_all();
}

void EngineService::cancel(const std::shared_ptr<GenerationStream>& stream) {
  {
    std::lock_guard lock(inbox_mutex_);
    cancellations_.push_back(stream);
  }
  inbox_ready_.notify_all();
}

void EngineService::accept(Submission& s) {
  const auto now = std::chrono::steady_clock::now();
  if (int64_t(s.choices.size()) > max_queue_) {  // could never fit: retrying would not help
    s.accepted.set_exception(std::make_exception_ptr(ApiError(
        400, fmt::format("the request has {} choices; this server queues at most {} (--max-queue)", s.choices.size(),
                         max_queue_))));
    return;
  }
  if (engine_.num_waiting() + int64_t(s.choices.size()) > max_queue_) {
    s.accepted.set_exception(std::make_exception_ptr(
        ApiError(429, fmt::format("the server is busy: {} requests are waiting (limit {}); retry later",
                                  engine_.num_waiting(), max_queue_))));
    return;
  }
  std::vector<RequestId> ids;
  try {
    for (Request& request : s.choices) {
      if (hook_) hook_->prepare(request);
      ids.push_back(engine_.submit(std::move(request)));
    }
  } catch (const std::exception& e) {
    for (RequestId id : ids) engine_.cancel(id);  // all of a request's choices run, or none
    const auto* error = dynamic_cast<const Error*>(&e);
    const int status = error && error->kind() != ErrorKind::kInternal ? 400 : 500;
    s.accepted.set_exception(std::make_exception_ptr(ApiError(status, e.what())));
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    tracked_.emplace(ids[i], Tracked{.stream = s.stream, .choice = int32_t(i), .submitted = now});
  s.accepted.set_value();
}

void EngineService::deliver(std::vector<TokenEvent> events) {
  const auto now = std::chrono::steady_clock::now();
  for (TokenEvent& event : events) {
    auto it = tracked_.find(event.request);
    if (it == tracked_.end()) continue;  // cancelled by its client: nobody is listening
    Tracked& t = it->second;
    if (event.generated_tokens == 1 && event.token >= 0) {
      t.first_token = now;
      metrics_.observe_time_to_first_token(std::chrono::duration<double>(now - t.submitted).count());
    }
    const bool finished = event.finish != FinishReason::kNone;
    if (finished && event.generated_tokens > 1 && event.beams.empty()) {  // a beam search streams no tokens
      metrics_.observe_time_per_output_token(std::chrono::duration<double>(now - t.first_token).count() /
                                             (event.generated_tokens - 1));
    }
    t.stream->push({.choice = t.choice, .event = std::move(event)});
    if (finished) tracked_.erase(it);
  }
}

void EngineService::fail_all(const std::string& message) {
  for (auto& [id, t] : tracked_) {
    engine_.cancel(id);
    t.stream->fail(message);
  }
  tracked_.clear();
}

void EngineService::publish_gauges() {
  const EngineStats& stats = engine_.stats();
  metrics_.count_tokens(stats.prompt_tokens - reported_stats_.prompt_tokens,
                        stats.generated_tokens - reported_stats_.generated_tokens);
  metrics_.count_prefix_cache_hit_tokens(stats.prefix_hit_tokens - reported_stats_.prefix_hit_tokens);
  reported_stats_ = stats;
  // Blocks only the prefix cache holds are reusable at once, not in use: "used" stays "held by
  // requests", so it is 0 when the server is idle, whatever the cache keeps.
  metrics_.set_gauges({.queue_length = engine_.num_waiting(),
                       .running_requests = engine_.num_running(),
                       .kv_blocks_used = engine_.num_kv_blocks() - engine_.num_free_blocks() -
                                         engine_.num_evictable_blocks(),
                       .kv_blocks_cached = engine_.num_cached_blocks(),
                       .kv_blocks_total = engine_.num_kv_blocks()});
}

void EngineService::loop() {
  for (;;) {
    std::deque<Submission> submissions;
    std::vector<std::shared_ptr<GenerationStream>> cancellations;
    {
      std::unique_lock lock(inbox_mutex_);
      inbox_ready_.wait(lock, [&] {
        return stopping_ || woken_ || !submissions_.empty() || !cancellations_.empty() || engine_.has_work();
      });
      if (stopping_) break;
      woken_ = false;
      submissions.swap(submissions_);
      cancellations.swap(cancellations_);
    }
    try {
      for (Submission& s : submissions) accept(s);
      for (const auto& stream : cancellations) {
        std::erase_if(tracked_, [&](const auto& entry) {
          if (entry.second.stream != stream) return false;
          engine_.cancel(entry.first);
          return true;
        });
      }
      if (hook_) hook_->before_step(engine_);
      if (engine_.has_work()) {
        std::vector<TokenEvent> events = engine_.step();
        if (hook_) hook_->after_step(engine_, events);
        deliver(std::move(events));
      }
      publish_gauges();
    } catch (...) {
      // A step that throws has put its sequences back in the engine's queue; retrying it would
      // most likely fail the same way, so the requests in flight end with the error instead.
      // (Out of memory elsewhere in this iteration ends up here too, rather than in terminate.)
      const std::string what = describe_current_exception();
      spdlog::error("engine thread: {}", what);
      fail_all(fmt::format("the engine failed: {}", what));
      for (Submission& s : submissions) {
        try {
          s.accepted.set_exception(std::make_exception_ptr(ApiError(500, "the engine failed: " + what)));
        } catch (const std::future_error&) {  // this one was answered before the failure
        }
      }
    }
  }
  // Whoever still waits (stop() without a drain) hears why, instead of waiting forever.
  fail_all("the server is shutting down");
  std::lock_guard lock(inbox_mutex_);
  for (Submission& s : submissions_)
    s.accepted.set_exception(std::make_exception_ptr(ApiError(503, "the server is shutting down")));
  submissions_.clear();
}

}  // namespace pagoda::server
