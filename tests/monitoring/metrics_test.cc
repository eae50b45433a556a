// Values of the serialized metrics after a known workload, input validation,
// and the HTTP exposer.
#include "monitoring/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "tests/monitoring/test_util.h"
#include "tests/monitoring/workload.h"

namespace pagedserve {
namespace {

using testing::Find;
using testing::Sample;

std::vector<Sample> Samples(const Metrics& m) {
  auto parsed = testing::ParseExposition(m.Serialize());
  EXPECT_TRUE(parsed.has_value()) << m.Serialize();
  return parsed.value_or(std::vector<Sample>{});
}

double Value(const std::vector<Sample>& samples, const std::string& name,
             const std::map<std::string, std::string>& labels = {}) {
  auto found = Find(samples, name, labels);
  EXPECT_EQ(found.size(), 1u) << name;
  return found.empty() ? std::nan("") : found[0].value;
}

// Checks a histogram against the raw observations: one bucket per bound plus
// +Inf, each the number of observations <= its bound (so cumulative and
// non-decreasing), count = number of observations, sum = their sum.
void ExpectHistogram(const std::vector<Sample>& samples, const std::string& name,
                     const std::vector<double>& bounds, const std::vector<double>& observed,
                     const std::map<std::string, std::string>& labels = {}) {
  SCOPED_TRACE(name);
  auto buckets = Find(samples, name + "_bucket", labels);
  ASSERT_EQ(buckets.size(), bounds.size() + 1);
  double previous = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    double le = std::strtod(buckets[i].labels.at("le").c_str(), nullptr);
    double expected = 0;
    for (double x : observed) expected += x <= le ? 1 : 0;
    if (i < bounds.size()) {
      EXPECT_DOUBLE_EQ(le, bounds[i]);
    } else {
      EXPECT_TRUE(std::isinf(le));
    }
    EXPECT_EQ(buckets[i].value, expected) << "le=" << buckets[i].labels.at("le");
    EXPECT_GE(buckets[i].value, previous);
    previous = buckets[i].value;
  }
  double sum = 0;
  for (double x : observed) sum += x;
  EXPECT_EQ(Value(samples, name + "_count", labels), static_cast<double>(observed.size()));
  EXPECT_NEAR(Value(samples, name + "_sum", labels), sum, 1e-9 * (1 + std::abs(sum)));
}

TEST(MetricsTest, KnownWorkloadGivesExactValues) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  testing::Workload w;
  w.Play(**m);
  auto s = Samples(**m);

  EXPECT_EQ(Value(s, "pagedserve_build_info",
                  {{"version", "0.1.0-test"},
                   {"tensor_parallel_size", "2"},
                   {"block_size", "16"},
                   {"backend", "cpu"},
                   {"max_num_seqs", "8"}}),
            1);
  // Every series carries the served model name (vLLM's `model_name` label).
  int pagedserve_series = 0;
  for (const auto& sample : s) {
    if (sample.name.rfind("pagedserve_", 0) != 0) continue;
    ++pagedserve_series;
    auto it = sample.labels.find("model_name");
    EXPECT_TRUE(it != sample.labels.end() && it->second == "SmolLM2-135M-Instruct.Q4_1.gguf")
        << sample.name << " lacks model_name";
  }
  EXPECT_GT(pagedserve_series, 100);
  // Gauges hold the last value: drained.
  EXPECT_EQ(Value(s, "pagedserve_requests_running"), 0);
  EXPECT_EQ(Value(s, "pagedserve_requests_waiting"), 0);
  EXPECT_EQ(Value(s, "pagedserve_requests_swapped"), 0);
  EXPECT_EQ(Value(s, "pagedserve_kv_cache_usage_ratio", {{"pool", "device"}}), 0);
  EXPECT_EQ(Value(s, "pagedserve_kv_cache_usage_ratio", {{"pool", "cpu"}}), 0);

  EXPECT_EQ(Value(s, "pagedserve_prefix_cache_queries_tokens_total"), 164);
  EXPECT_EQ(Value(s, "pagedserve_prefix_cache_hits_tokens_total"), 32);
  EXPECT_EQ(Value(s, "pagedserve_preemptions_total", {{"mode", "swap"}}), 2);
  EXPECT_EQ(Value(s, "pagedserve_preemptions_total", {{"mode", "recompute"}}), 1);
  EXPECT_EQ(Value(s, "pagedserve_prompt_tokens_total"),
            w.prompt_tokens() - testing::Workload::kCachedPromptTokens);
  // Generation tokens equal the sum of the requests' completion tokens.
  EXPECT_EQ(Value(s, "pagedserve_generation_tokens_total"), w.generation_tokens());
  EXPECT_EQ(Value(s, "pagedserve_requests_finished_total", {{"finish_reason", "stop"}}), 2);
  EXPECT_EQ(Value(s, "pagedserve_requests_finished_total", {{"finish_reason", "length"}}), 1);
  EXPECT_EQ(Value(s, "pagedserve_requests_finished_total", {{"finish_reason", "abort"}}), 1);
  EXPECT_EQ(Value(s, "pagedserve_requests_finished_total", {{"finish_reason", "error"}}), 1);

  std::vector<double> ttft, e2e, queue, prefill, decode, prompt_len, gen_len;
  for (const auto& r : w.requests) {
    e2e.push_back(r.e2e_s);
    if (r.queue_s >= 0) queue.push_back(r.queue_s);
    prompt_len.push_back(static_cast<double>(r.prompt_len));
    gen_len.push_back(static_cast<double>(r.generation_len));
    if (r.ttft_s >= 0) {
      ttft.push_back(r.ttft_s);
      prefill.push_back(r.prefill_s);
      decode.push_back(r.decode_s);
    }
  }
  // The failed request of Play(): e2e 0.01, queue 0.005, prompt 3, no tokens.
  e2e.push_back(0.01);
  queue.push_back(0.005);
  prompt_len.push_back(3);
  gen_len.push_back(0);
  // TTFT count = requests that produced a first token (3 of 5 finished).
  ExpectHistogram(s, "pagedserve_time_to_first_token_seconds", Metrics::LatencyBuckets(), ttft);
  ASSERT_EQ(ttft.size(), 3u);
  ExpectHistogram(s, "pagedserve_request_e2e_latency_seconds", Metrics::RequestTimeBuckets(), e2e);
  ExpectHistogram(s, "pagedserve_request_queue_time_seconds", Metrics::RequestTimeBuckets(), queue);
  ExpectHistogram(s, "pagedserve_request_prefill_time_seconds", Metrics::RequestTimeBuckets(),
                  prefill);
  ExpectHistogram(s, "pagedserve_request_decode_time_seconds", Metrics::RequestTimeBuckets(),
                  decode);
  ExpectHistogram(s, "pagedserve_request_prompt_tokens", Metrics::TokenCountBuckets(), prompt_len);
  ExpectHistogram(s, "pagedserve_request_generation_tokens", Metrics::TokenCountBuckets(), gen_len);
  ExpectHistogram(s, "pagedserve_inter_token_latency_seconds", Metrics::InterTokenBuckets(), w.itl);
  std::vector<double> steps(w.step_tokens.begin(), w.step_tokens.end());
  ExpectHistogram(s, "pagedserve_step_tokens", Metrics::StepTokenBuckets(), steps);
  for (int rank : {0, 1}) {
    std::vector<double> step, coll;
    for (const auto& r : w.rank_steps) {
      if (r.rank != rank) continue;
      step.push_back(r.step_s);
      coll.push_back(r.collective_s);
    }
    std::map<std::string, std::string> l = {{"rank", std::to_string(rank)}};
    ExpectHistogram(s, "pagedserve_rank_step_duration_seconds", Metrics::RankStepBuckets(), step,
                    l);
    ExpectHistogram(s, "pagedserve_rank_collective_duration_seconds", Metrics::RankStepBuckets(),
                    coll, l);
  }
  // Nothing was rejected.
  EXPECT_TRUE(Find(s, "pagedserve_metrics_rejected_observations_total").empty());
}

// TTFT and end-to-end buckets reach 40 minutes (as vLLM's do): a 25-minute
// TTFT, a 21-minute queue wait and a 35-minute request land in finite buckets,
// not only in +Inf.
TEST(MetricsTest, LongRequestsLandInFiniteBuckets) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  FinishedRequest r;
  r.reason = MetricsFinishReason::kLength;
  r.ttft_s = 25 * 60;
  r.e2e_s = 35 * 60;
  r.queue_s = 21 * 60;
  r.prefill_s = 5 * 60;
  r.decode_s = 10 * 60;
  r.prompt_len = 100000;
  r.generation_len = 4;
  (*m)->RequestFinished(r);
  auto s = Samples(**m);
  auto bucket = [&s](const std::string& name, const char* le) {
    return Value(s, name + "_bucket", {{"le", le}});
  };
  EXPECT_EQ(bucket("pagedserve_time_to_first_token_seconds", "1200"), 0);
  EXPECT_EQ(bucket("pagedserve_time_to_first_token_seconds", "1800"), 1);
  EXPECT_EQ(bucket("pagedserve_request_e2e_latency_seconds", "1800"), 0);
  EXPECT_EQ(bucket("pagedserve_request_e2e_latency_seconds", "2400"), 1);
  EXPECT_EQ(bucket("pagedserve_request_queue_time_seconds", "1200"), 0);
  EXPECT_EQ(bucket("pagedserve_request_queue_time_seconds", "1800"), 1);
  EXPECT_EQ(Metrics::LatencyBuckets().back(), 2400);
  EXPECT_EQ(Metrics::RequestTimeBuckets().back(), 2400);
}

TEST(MetricsTest, PerRankSeriesExistBeforeTheFirstStep) {
  auto o = testing::TestOptions();
  o.build_info.tensor_parallel_size = 3;
  auto m = Metrics::Create(o);
  ASSERT_TRUE(m.ok()) << m.status();
  auto s = Samples(**m);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(
        Value(s, "pagedserve_rank_step_duration_seconds_count", {{"rank", std::to_string(rank)}}),
        0);
  }
  EXPECT_TRUE(Find(s, "pagedserve_rank_step_duration_seconds_count", {{"rank", "3"}}).empty());
  // A rank beyond tp is accepted and creates its series.
  (*m)->ObserveRankStep(3, 0.01, 0.0);
  EXPECT_EQ(Value(Samples(**m), "pagedserve_rank_step_duration_seconds_count", {{"rank", "3"}}), 1);
}

TEST(MetricsTest, FailedHandshakesAreCountedByReason) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  Metrics& x = **m;
  const std::string h = "pagedserve_zmq_handshakes_failed_total";
  auto s = Samples(x);
  for (const char* reason : {"auth", "protocol", "other"})
    EXPECT_EQ(Value(s, h, {{"reason", reason}}), 0);
  x.AddFailedHandshake("auth");
  x.AddFailedHandshake("auth");
  x.AddFailedHandshake("protocol");
  x.AddFailedHandshake("other");
  x.AddFailedHandshake("bogus");  // not a reason: rejected, no new series
  s = Samples(x);
  EXPECT_EQ(Value(s, h, {{"reason", "auth"}}), 2);
  EXPECT_EQ(Value(s, h, {{"reason", "protocol"}}), 1);
  EXPECT_EQ(Value(s, h, {{"reason", "other"}}), 1);
  EXPECT_TRUE(Find(s, h, {{"reason", "bogus"}}).empty());
  EXPECT_EQ(Value(s, "pagedserve_metrics_rejected_observations_total",
                  {{"method", "AddFailedHandshake"}}),
            1);
}

TEST(MetricsTest, HttpResponsesAreCountedByStatusCode) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  Metrics& x = **m;
  const char* h = "pagedserve_http_responses_total";
  x.AddHttpResponse(200);
  x.AddHttpResponse(200);
  x.AddHttpResponse(400);
  x.AddHttpResponse(503);
  x.AddHttpResponse(99);   // not a status code: rejected, no series
  x.AddHttpResponse(600);  // neither
  auto s = Samples(x);
  EXPECT_EQ(Value(s, h, {{"status", "200"}}), 2);
  EXPECT_EQ(Value(s, h, {{"status", "400"}}), 1);
  EXPECT_EQ(Value(s, h, {{"status", "503"}}), 1);
  EXPECT_TRUE(Find(s, h, {{"status", "99"}}).empty());
  EXPECT_TRUE(Find(s, h, {{"status", "600"}}).empty());
  EXPECT_EQ(
      Value(s, "pagedserve_metrics_rejected_observations_total", {{"method", "AddHttpResponse"}}),
      2);
}

TEST(MetricsTest, BadValuesAreRejectedAndCounted) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  Metrics& x = **m;
  x.SetKvUsage(0.5, 0.25);
  x.SetKvUsage(1.5, 0.0);           // > 1
  x.SetKvUsage(std::nan(""), 0.0);  // NaN
  x.SetRequests(1, -1, 0);
  x.AddPrefixCache(10, 11);  // more hits than queries
  x.AddPromptTokens(-5);
  x.AddGenerationTokens(-1);
  x.ObserveInterTokenLatency(-0.1);
  x.ObserveInterTokenLatency(INFINITY);
  x.ObserveStepTokens(-3);
  x.ObserveRankStep(-1, 0.1, 0.0);
  x.ObserveRankStep(0, 0.1, 0.2);  // collectives longer than the step
  FinishedRequest bad;
  bad.e2e_s = -1;
  x.RequestFinished(bad);
  FinishedRequest half;  // a TTFT but no decode time
  half.ttft_s = 0.1;
  half.e2e_s = 0.2;
  x.RequestFinished(half);
  FinishedRequest no_token_but_output;
  no_token_but_output.e2e_s = 0.2;
  no_token_but_output.generation_len = 5;
  x.RequestFinished(no_token_but_output);

  auto s = Samples(x);
  EXPECT_EQ(Value(s, "pagedserve_kv_cache_usage_ratio", {{"pool", "device"}}), 0.5);
  EXPECT_EQ(Value(s, "pagedserve_kv_cache_usage_ratio", {{"pool", "cpu"}}), 0.25);
  EXPECT_EQ(Value(s, "pagedserve_prompt_tokens_total"), 0);
  EXPECT_EQ(Value(s, "pagedserve_prefix_cache_queries_tokens_total"), 0);
  EXPECT_EQ(Value(s, "pagedserve_inter_token_latency_seconds_count"), 0);
  EXPECT_EQ(Value(s, "pagedserve_rank_step_duration_seconds_count", {{"rank", "0"}}), 0);
  EXPECT_EQ(Value(s, "pagedserve_request_e2e_latency_seconds_count"), 0);
  const std::string r = "pagedserve_metrics_rejected_observations_total";
  EXPECT_EQ(Value(s, r, {{"method", "SetKvUsage"}}), 2);
  EXPECT_EQ(Value(s, r, {{"method", "SetRequests"}}), 1);
  EXPECT_EQ(Value(s, r, {{"method", "AddPrefixCache"}}), 1);
  EXPECT_EQ(Value(s, r, {{"method", "AddPromptTokens"}}), 1);
  EXPECT_EQ(Value(s, r, {{"method", "AddGenerationTokens"}}), 1);
  EXPECT_EQ(Value(s, r, {{"method", "ObserveInterTokenLatency"}}), 2);
  EXPECT_EQ(Value(s, r, {{"method", "ObserveStepTokens"}}), 1);
  EXPECT_EQ(Value(s, r, {{"method", "ObserveRankStep"}}), 2);
  EXPECT_EQ(Value(s, r, {{"method", "RequestFinished"}}), 3);
}

TEST(MetricsTest, CreateRejectsBadOptionsNamingTheField) {
  for (const char* address : {"9400", ":9400", "localhost:", "localhost:http", "127.0.0.1:65536",
                              "127.0.0.1:-1", "::1:9400", "[::1:9400"}) {
    auto m = Metrics::Create(testing::TestOptions(address));
    ASSERT_FALSE(m.ok()) << address;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << address;
    EXPECT_NE(m.status().message().find("listen_address"), std::string_view::npos) << m.status();
  }
  auto o = testing::TestOptions();
  o.build_info.extra_labels = {{"bad-name", "1"}};
  auto m = Metrics::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("bad-name"), std::string_view::npos) << m.status();
  o.build_info.extra_labels = {{"__reserved", "1"}};
  EXPECT_FALSE(Metrics::Create(o).ok());
  o.build_info.extra_labels = {{"model", "other"}};
  EXPECT_FALSE(Metrics::Create(o).ok());
  o.build_info.extra_labels = {{"model_name", "other"}};
  EXPECT_FALSE(Metrics::Create(o).ok());
  o.build_info.extra_labels = {};
  o.model_name = "";
  m = Metrics::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("model_name"), std::string_view::npos) << m.status();
  o.model_name = "m";
  o.build_info.tensor_parallel_size = 0;
  m = Metrics::Create(o);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("tensor_parallel_size"), std::string_view::npos);
}

TEST(MetricsTest, PortZeroMeansNoEndpoint) {
  auto m = Metrics::Create(testing::TestOptions("0.0.0.0:0"));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->listening_port(), 0);
  EXPECT_NE((*m)->Serialize().find("pagedserve_build_info"), std::string::npos);
}

TEST(MetricsTest, ExposerServesTheRegistryOverHttp) {
  int port = testing::FreePort();
  ASSERT_GT(port, 0);
  auto m = Metrics::Create(testing::TestOptions("127.0.0.1:" + std::to_string(port)));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->listening_port(), port);
  (*m)->AddGenerationTokens(41);
  auto r = testing::HttpGet(port, "/metrics");
  ASSERT_EQ(r.status, 200) << r.body;
  auto s = testing::ParseExposition(r.body);
  ASSERT_TRUE(s.has_value()) << r.body;
  EXPECT_EQ(Value(*s, "pagedserve_generation_tokens_total"), 41);
  EXPECT_EQ(Value(*s, "pagedserve_build_info", {{"model", "SmolLM2-135M-Instruct.Q4_1.gguf"}}), 1);
}

TEST(MetricsTest, BusyPortIsUnavailable) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  auto m = Metrics::Create(testing::TestOptions("127.0.0.1:" + std::to_string(port)));
  close(fd);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
  EXPECT_NE(m.status().message().find(std::to_string(port)), std::string_view::npos);
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok()) << m.status();
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5000; ++i) {
        (*m)->AddGenerationTokens(1);
        (*m)->ObserveInterTokenLatency(0.01);
        (*m)->ObserveRankStep(t % 2, 0.01, 0.001);
      }
    });
  }
  for (auto& th : threads) th.join();
  auto s = Samples(**m);
  EXPECT_EQ(Value(s, "pagedserve_generation_tokens_total"), 20000);
  EXPECT_EQ(Value(s, "pagedserve_inter_token_latency_seconds_count"), 20000);
  EXPECT_EQ(Value(s, "pagedserve_rank_step_duration_seconds_count", {{"rank", "1"}}), 10000);
}

}  // namespace
}  // namespace pagedserve
