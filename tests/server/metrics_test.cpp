// /metrics in Prometheus' text format: cumulative buckets, per-status counters, gauges.
#include "pagoda/server/metrics.h"

#include <gtest/gtest.h>

namespace pagoda::server {
namespace {

bool contains_line(const std::string& text, const std::string& line) {
  return text.find("\n" + line + "\n") != std::string::npos || text.starts_with(line + "\n");
}

TEST(Histogram, BucketsAreCumulativeAndInclusive) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le="0.1" includes its bound
  h.observe(0.5);
  h.observe(3.0);
  std::string out;
  h.render("t_seconds", "help", out);
  EXPECT_TRUE(contains_line(out, "# TYPE t_seconds histogram")) << out;
  EXPECT_TRUE(contains_line(out, "t_seconds_bucket{le=\"0.1\"} 2")) << out;
  EXPECT_TRUE(contains_line(out, "t_seconds_bucket{le=\"1\"} 3")) << out;
  EXPECT_TRUE(contains_line(out, "t_seconds_bucket{le=\"+Inf\"} 4")) << out;
  EXPECT_TRUE(contains_line(out, "t_seconds_sum 3.65")) << out;
  EXPECT_TRUE(contains_line(out, "t_seconds_count 4")) << out;
}

TEST(Metrics, RendersCountersAndGauges) {
  Metrics m;
  m.count_request(200);
  m.count_request(200);
  m.count_request(429);
  m.count_client_disconnect();
  m.count_tokens(12, 5);
  m.count_tokens(3, 1);
  m.count_prefix_cache_hit_tokens(32);
  m.count_prefix_cache_hit_tokens(16);
  m.set_gauges(
      {.queue_length = 2, .running_requests = 3, .kv_blocks_used = 7, .kv_blocks_cached = 5, .kv_blocks_total = 64});
  m.observe_time_to_first_token(0.3);
  const std::string out = m.render();
  EXPECT_TRUE(contains_line(out, "pagoda_requests_total{status=\"200\"} 2")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_requests_total{status=\"429\"} 1")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_client_disconnects_total 1")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_prompt_tokens_total 15")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_generation_tokens_total 6")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_prefix_cache_hit_tokens_total 48")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_queue_length 2")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_running_requests 3")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_kv_blocks_used 7")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_kv_blocks_cached 5")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_kv_blocks_total 64")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_time_to_first_token_seconds_count 1")) << out;
  EXPECT_TRUE(contains_line(out, "pagoda_time_per_output_token_seconds_count 0")) << out;
  EXPECT_EQ(m.gauges().kv_blocks_used, 7);
  EXPECT_EQ(m.gauges().kv_blocks_cached, 5);
}

}  // namespace
}  // namespace pagoda::server
