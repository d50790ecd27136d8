// EngineService: the engine on its own thread, shared by every HTTP connection.
//
// The Engine is single-threaded by design, so one thread owns it: it takes new requests and
// cancellations from an inbox between steps, runs step() while there is work, and hands each
// step's events to the GenerationStream of the API request they belong to. An HTTP thread only
// ever touches its stream (wait for events) and the inbox (submit, cancel). Continuous batching
// falls out: every request in the engine shares each step, whichever connection it came from.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagoda/engine/engine.h"
#include "pagoda/server/metrics.h"

namespace pagoda::server {

// One choice's news: the index of the choice within its API request, and the engine's event.
struct ChoiceEvent {
  int32_t choice = 0;
  TokenEvent event;
};

// The events of one API request (its n choices), from the engine thread to the HTTP thread.
class GenerationStream {
 public:
  explicit GenerationStream(int32_t num_choices) : unfinished_(num_choices) {}

  // The events that came since the last call, waiting up to `timeout` for the first of them.
  std::vector<ChoiceEvent> wait(std::chrono::milliseconds timeout);
  // Every choice has finished and all events were taken, or the engine failed (see error()).
  bool done() const;
  // Set when the engine failed under this request (the step threw): what to tell the client.
  std::string error() const;

 private:
  friend class EngineService;
  void push(ChoiceEvent event);
  void fail(std::string message);

  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::vector<ChoiceEvent> events_;
  int32_t unfinished_;
  std::string error_;
};

// Work that shares the engine thread with the API requests: disaggregated serving's (disagg/)
// prefill jobs from decode peers, or remote prefills of a decode server's requests.
class EngineHook {
 public:
  virtual ~EngineHook() = default;
  // Each engine request of an API request, before the engine gets it (engine thread).
  virtual void prepare(Request& /*request*/) {}
  // On the engine thread, before each step.
  virtual void before_step(Engine& engine) = 0;
  // A step's events, before they go to the API streams: the hook takes those that are its own.
  virtual void after_step(Engine& engine, std::vector<TokenEvent>& events) = 0;
};

class EngineService {
 public:
  // max_queue: requests (engine sequences) that may wait for admission; more get 429.
  // hook: null, or work of its own on the engine thread (outlives the service).
  EngineService(Engine& engine, Metrics& metrics, int32_t max_queue, EngineHook* hook = nullptr);
  ~EngineService();  // stop()

  // Queues one engine request per choice and returns once the engine thread has accepted them
  // all. Throws ApiError 429 when the queue is full, 400 when the engine refuses one (then none
  // of them runs).
  std::shared_ptr<GenerationStream> submit(std::vector<Request> choices);
  // The client went away: its choices stop and their KV blocks go back to the pool.
  void cancel(const std::shared_ptr<GenerationStream>& stream);
  // Ends the engine thread; requests still running are dropped (drain before calling this).
  void stop();
  // Runs the engine thread's loop once more even without new requests: the hook has news.
  void wake();

 private:
  struct Submission {
    std::vector<Request> choices;
    std::shared_ptr<GenerationStream> stream;
    std::promise<void> accepted;
  };
  struct Tracked {  // one running choice, as the engine thread sees it
    std::shared_ptr<GenerationStream> stream;
    int32_t choice;
    std::chrono::steady_clock::time_point submitted, first_token;
  };

  void loop();
  void accept(Submission& submission);
  void deliver(std::vector<TokenEvent> events);
  void fail_all(const std::string& message);
  void publish_gauges();

  Engine& engine_;
  Metrics& metrics_;
  int32_t max_queue_;
  EngineHook* hook_;

  std::mutex inbox_mutex_;
  std::condition_variable inbox_ready_;
  std::deque<Submission> submissions_;
  std::vector<std::shared_ptr<GenerationStream>> cancellations_;
  bool stopping_ = false;
  bool woken_ = false;

  // Engine thread only.
  std::unordered_map<RequestId, Tracked> tracked_;
  EngineStats reported_stats_;
  std::thread thread_;
};

}  // namespace pagoda::server
