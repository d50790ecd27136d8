#include "pagoda/server/metrics.h"

#include <algorithm>

#include <fmt/format.h>

namespace pagoda::server {

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const auto bucket = std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value) - upper_bounds_.begin();
  ++counts_[size_t(bucket)];
  sum_ += value;
  ++count_;
}

void Histogram::render(const char* name, const char* help, std::string& out) const {
  out += fmt::format("# HELP {} {}\n# TYPE {} histogram\n", name, help, name);
  int64_t cumulative = 0;
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, upper_bounds_[i], cumulative);
  }
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, count_, name, sum_, name, count_);
}

// Bucket bounds as vLLM chooses them: TTFT spans a cached short prompt (ms) to a long queue wait
// (tens of s); TPOT spans a GPU step (ms) to a CPU step under load (s).
Metrics::Metrics()
    : time_to_first_token_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                            10.0, 20.0, 40.0, 80.0}),
      time_per_output_token_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0}) {}

void Metrics::count_request(int http_status) {
  std::lock_guard lock(mutex_);
  ++requests_by_status_[http_status];
}

void Metrics::count_client_disconnect() {
  std::lock_guard lock(mutex_);
  ++client_disconnects_;
}

void Metrics::count_tokens(int64_t prompt_tokens, int64_t generated_tokens) {
  std::lock_guard lock(mutex_);
  prompt_tokens_ += prompt_tokens;
  generated_tokens_ += generated_tokens;
}

void Metrics::count_prefix_cache_hit_tokens(int64_t tokens) {
  std::lock_guard lock(mutex_);
  prefix_cache_hit_tokens_ += tokens;
}

void Metrics::observe_time_to_first_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_to_first_token_.observe(seconds);
}

void Metrics::observe_time_per_output_token(double seconds) {
  std::lock_guard lock(mutex_);
  time_per_output_token_.observe(seconds);
}

void Metrics::set_gauges(const EngineGauges& gauges) {
  std::lock_guard lock(mutex_);
  gauges_ = gauges;
}

EngineGauges Metrics::gauges() const {
  std::lock_guard lock(mutex_);
  return gauges_;
}

void Metrics::add_section(std::function<void(std::string& out)> section) { sections_.push_back(std::move(section)); }

std::string Metrics::render() const {
  std::string out;
  for (const auto& section : sections_) section(out);
  std::lock_guard lock(mutex_);
  out += "# HELP pagoda_requests_total API requests by HTTP status (499: the client disconnected)\n"
         "# TYPE pagoda_requests_total counter\n";
  for (const auto& [status, count] : requests_by_status_)
    out += fmt::format("pagoda_requests_total{{status=\"{}\"}} {}\n", status, count);
  const auto counter = [&](const char* name, const char* help, int64_t value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} counter\n{} {}\n", name, help, name, name, value);
  };
  const auto gauge = [&](const char* name, const char* help, int64_t value) {
    out += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, value);
  };
  counter("pagoda_prompt_tokens_total", "prompt tokens prefilled (recomputed tokens of preempted requests included)",
          prompt_tokens_);
  counter("pagoda_generation_tokens_total", "tokens generated", generated_tokens_);
  counter("pagoda_prefix_cache_hit_tokens_total",
          "prompt tokens served from the prefix cache at admission (pagoda_prompt_tokens_total counts those computed)",
          prefix_cache_hit_tokens_);
  counter("pagoda_client_disconnects_total", "requests cancelled because their client went away",
          client_disconnects_);
  time_to_first_token_.render("pagoda_time_to_first_token_seconds", "time from request to its first token", out);
  time_per_output_token_.render("pagoda_time_per_output_token_seconds",
                                "mean time between a request's tokens after the first", out);
  gauge("pagoda_queue_length", "requests waiting for admission", gauges_.queue_length);
  gauge("pagoda_running_requests", "requests in the running batch", gauges_.running_requests);
  gauge("pagoda_kv_blocks_used", "KV cache blocks held by requests", gauges_.kv_blocks_used);
  gauge("pagoda_kv_blocks_cached", "KV cache blocks in the prefix cache (held by requests or not)",
        gauges_.kv_blocks_cached);
  gauge("pagoda_kv_blocks_total", "KV cache blocks in the pool", gauges_.kv_blocks_total);
  return out;
}

}  // namespace pagoda::server
