// Metrics: what `GET /metrics` reports, in Prometheus' text format (version 0.0.4). The HTTP
// threads count requests by status; the engine thread counts tokens, observes latencies and sets
// the gauges after every step. One mutex guards it all: updates are a few per request and per
// step, far below anything that would contend.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace pagoda::server {

// A cumulative histogram with fixed upper bounds (seconds), rendered as _bucket/_sum/_count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
  void render(const char* name, const char* help, std::string& out) const;

 private:
  std::vector<double> upper_bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

struct EngineGauges {
  int32_t queue_length = 0;     // requests waiting for admission
  int32_t running_requests = 0;
  int32_t kv_blocks_used = 0;    // held by requests (blocks only the prefix cache holds are not)
  int32_t kv_blocks_cached = 0;  // in the prefix cache, held by requests or not
  int32_t kv_blocks_total = 0;
};

class Metrics {
 public:
  Metrics();

  void count_request(int http_status);
  void count_client_disconnect();
  void count_tokens(int64_t prompt_tokens, int64_t generated_tokens);
  void count_prefix_cache_hit_tokens(int64_t tokens);
  void observe_time_to_first_token(double seconds);
  void observe_time_per_output_token(double seconds);
  void set_gauges(const EngineGauges& gauges);

  EngineGauges gauges() const;
  std::string render() const;
  // Another part of the server's metrics (disaggregated serving's), appended to render()'s text;
  // called without this object's lock held. Set before the server starts.
  void add_section(std::function<void(std::string& out)> section);

 private:
  mutable std::mutex mutex_;
  std::map<int, int64_t> requests_by_status_;
  int64_t client_disconnects_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t generated_tokens_ = 0;
  int64_t prefix_cache_hit_tokens_ = 0;
  Histogram time_to_first_token_;
  Histogram time_per_output_token_;
  EngineGauges gauges_;
  std::vector<std::function<void(std::string&)>> sections_;
};

}  // namespace pagoda::server
