#include "monitoring/metrics.h"

#include <cmath>
#include <exception>
#include <sstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "prometheus/counter.h"
#include "prometheus/exposer.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace pagedserve {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

bool ValidLabelName(std::string_view name) {
  if (name.empty() || name.substr(0, 2) == "__") return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
              (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// Splits "HOST:PORT" ("[v6]:PORT" for IPv6) and checks the port.
absl::StatusOr<int> ParsePort(const std::string& address) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetricsOptions.listen_address: expected HOST:PORT, got '", address, "'"));
  }
  std::string host = address.substr(0, colon);
  if (host.front() == '[' ? host.back() != ']' || host.size() < 3
                          : host.find(':') != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "MetricsOptions.listen_address: IPv6 hosts must be bracketed, as in [::1]:9400; got '",
        address, "'"));
  }
  int port = 0;
  std::string port_text = address.substr(colon + 1);
  if (!absl::SimpleAtoi(port_text, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("MetricsOptions.listen_address: port must be an integer in 0..65535, got '",
                     port_text, "'"));
  }
  return port;
}

bool Valid(double x) { return std::isfinite(x) && x >= 0; }

// Checks the build info and model name and returns the labels of
// pagedserve_build_info: the built-in ones and BuildInfo.extra_labels (valid
// Prometheus label names, none repeating a built-in label or one of `constant`).
absl::StatusOr<prometheus::Labels> BuildInfoLabels(const MetricsOptions& options,
                                                   const prometheus::Labels& constant) {
  const BuildInfo& info = options.build_info;
  if (info.tensor_parallel_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "BuildInfo.tensor_parallel_size must be >= 1, got ", info.tensor_parallel_size));
  }
  if (options.model_name.empty()) {
    return absl::InvalidArgumentError("MetricsOptions.model_name must not be empty");
  }
  prometheus::Labels info_labels = {
      {"version", info.version},
      {"model", info.model},
      {"tensor_parallel_size", std::to_string(info.tensor_parallel_size)},
      {"block_size", std::to_string(info.block_size)},
      {"backend", info.backend},
  };
  for (const auto& [name, value] : info.extra_labels) {
    if (!ValidLabelName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "BuildInfo.extra_labels: '", name,
          "' is not a valid Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*, no leading __)"));
    }
    if (constant.count(name) > 0 || !info_labels.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("BuildInfo.extra_labels: '", name, "' repeats a built-in label"));
    }
  }
  return info_labels;
}

}  // namespace

std::string_view FinishReasonName(MetricsFinishReason reason) {
  switch (reason) {
    case MetricsFinishReason::kStop: return "stop";
    case MetricsFinishReason::kLength: return "length";
    case MetricsFinishReason::kAbort: return "abort";
    case MetricsFinishReason::kError: return "error";
  }
  return "error";
}

std::string_view PreemptionModeName(MetricsPreemptionMode mode) {
  return mode == MetricsPreemptionMode::kSwap ? "swap" : "recompute";
}

const std::vector<double>& Metrics::LatencyBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08,  0.1,   0.25,  0.5,    0.75,   1.0,   2.5,
      5.0,   7.5,   10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1200.0, 1800.0, 2400.0};
  return *b;
}
const std::vector<double>& Metrics::InterTokenBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
      0.1,   0.15,   0.2,   0.3,  0.4,   0.5,  0.75,  1.0,  2.5,  5.0,  10.0};
  return *b;
}
const std::vector<double>& Metrics::RequestTimeBuckets() {
  static const auto* b = new std::vector<double>{
      0.01, 0.025, 0.05, 0.1,  0.25,  0.5,   1.0,   2.5,   5.0,    10.0,   15.0,  20.0,
      30.0, 40.0,  50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1200.0, 1800.0, 2400.0};
  return *b;
}
const std::vector<double>& Metrics::TokenCountBuckets() {
  static const auto* b = new std::vector<double>{
      1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
  return *b;
}
const std::vector<double>& Metrics::StepTokenBuckets() {
  static const auto* b =
      new std::vector<double>{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
  return *b;
}
const std::vector<double>& Metrics::RankStepBuckets() {
  static const auto* b = new std::vector<double>{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                 0.1,    0.25,  0.5,    1.0,   2.5,  5.0};
  return *b;
}

// vLLM's buckets, as in vllm/v1/metrics/loggers.py at vllm-project/vllm
// 005a810bc40faa25b8870fbc8559c3462581eee3 (facts, listed in docs/metrics.md).
const std::vector<double>& Metrics::VllmTtftBuckets() {
  static const auto* b = new std::vector<double>{
      0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
      1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
  return *b;
}
const std::vector<double>& Metrics::VllmTpotBuckets() {
  static const auto* b =
      new std::vector<double>{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,  0.3,  0.4, 0.5,
                              0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
  return *b;
}
const std::vector<double>& Metrics::VllmRequestLatencyBuckets() {
  static const auto* b = new std::vector<double>{0.3,  0.5,   0.8,   1.0,   1.5,   2.0,    2.5,
                                                 5.0,  10.0,  15.0,  20.0,  30.0,  40.0,   50.0,
                                                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
  return *b;
}
const std::vector<double>& Metrics::VllmPrefillPerTokenBuckets() {
  static const auto* b =
      new std::vector<double>{0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0};
  return *b;
}
std::vector<double> Metrics::Vllm125Buckets(int64_t max_value) {
  std::vector<double> b;
  for (int64_t scale = 1; scale <= max_value && scale <= (int64_t{1} << 52); scale *= 10) {
    for (int64_t m : {1, 2, 5}) {
      if (m * scale <= max_value) b.push_back(static_cast<double>(m * scale));
    }
  }
  return b;
}

Metrics::Metrics() : registry_(std::make_shared<prometheus::Registry>()) {}

Metrics::~Metrics() {
  // Stop serving before the registry's series go away.
  exposer_.reset();
}

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Create(const MetricsOptions& options) {
  // The constant label of every family: a series never lacks it.
  const prometheus::Labels constant = {{"model_name", options.model_name}};
  absl::StatusOr<prometheus::Labels> info_labels = BuildInfoLabels(options, constant);
  if (!info_labels.ok()) return info_labels.status();
  int port = 0;
  if (!options.listen_address.empty()) {
    absl::StatusOr<int> parsed = ParsePort(options.listen_address);
    if (!parsed.ok()) return parsed.status();
    port = *parsed;
  }

  std::unique_ptr<Metrics> m(new Metrics());
  m->RegisterGauges(constant, *info_labels);
  m->RegisterCounters(constant);
  m->RegisterHistograms(constant, options.build_info.tensor_parallel_size);
  m->RegisterVllm(options.model_name,
                  options.max_model_len > 0 ? options.max_model_len : int64_t{100000});
  if (port != 0) {
    if (absl::Status s = m->StartExposer(options.listen_address, port); !s.ok()) return s;
  }
  return m;
}

void Metrics::RegisterGauges(const prometheus::Labels& constant,
                             const prometheus::Labels& info_labels) {
  prometheus::Registry& r = *registry_;
  BuildGauge()
      .Name("pagedserve_build_info")
      .Help("Build and configuration of this server; the value is always 1.")
      .Labels(constant)
      .Register(r)
      .Add(info_labels)
      .Set(1);

  running_ = &BuildGauge()
                  .Name("pagedserve_requests_running")
                  .Help("Requests (sequence groups) in the running queue.")
                  .Labels(constant)
                  .Register(r)
                  .Add({});
  waiting_ = &BuildGauge()
                  .Name("pagedserve_requests_waiting")
                  .Help("Requests (sequence groups) waiting to be scheduled.")
                  .Labels(constant)
                  .Register(r)
                  .Add({});
  swapped_ = &BuildGauge()
                  .Name("pagedserve_requests_swapped")
                  .Help("Requests (sequence groups) preempted by swap, KV blocks in the CPU pool.")
                  .Labels(constant)
                  .Register(r)
                  .Add({});
  auto& kv = BuildGauge()
                 .Name("pagedserve_kv_cache_usage_ratio")
                 .Help("Fraction (0-1) of KV cache blocks in use, by pool (device or cpu swap).")
                 .Labels(constant)
                 .Register(r);
  kv_device_ = &kv.Add({{"pool", "device"}});
  kv_cpu_ = &kv.Add({{"pool", "cpu"}});
}

void Metrics::RegisterCounters(const prometheus::Labels& constant) {
  prometheus::Registry& r = *registry_;
  prefix_queries_ = &BuildCounter()
                         .Name("pagedserve_prefix_cache_queries_tokens_total")
                         .Help("Prompt tokens looked up in the prefix cache.")
                         .Labels(constant)
                         .Register(r)
                         .Add({});
  prefix_hits_ = &BuildCounter()
                      .Name("pagedserve_prefix_cache_hits_tokens_total")
                      .Help("Prompt tokens found in cached KV blocks (prefix cache hits).")
                      .Labels(constant)
                      .Register(r)
                      .Add({});
  auto& preempt = BuildCounter()
                      .Name("pagedserve_preemptions_total")
                      .Help("Sequence groups preempted, by mode (swap or recompute).")
                      .Labels(constant)
                      .Register(r);
  preempt_swap_ = &preempt.Add({{"mode", "swap"}});
  preempt_recompute_ = &preempt.Add({{"mode", "recompute"}});
  prompt_tokens_ = &BuildCounter()
                        .Name("pagedserve_prompt_tokens_total")
                        .Help("Prompt tokens prefilled, recomputed ones included.")
                        .Labels(constant)
                        .Register(r)
                        .Add({});
  generation_tokens_ = &BuildCounter()
                            .Name("pagedserve_generation_tokens_total")
                            .Help("Output tokens generated.")
                            .Labels(constant)
                            .Register(r)
                            .Add({});
  auto spec = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Labels(constant).Register(r).Add({});
  };
  spec_drafts_ = spec("pagedserve_spec_decode_drafts_total",
                      "Speculative decoding: verification entries (a sequence verifying >= 1 "
                      "draft token in a step).");
  spec_draft_tokens_ = spec("pagedserve_spec_decode_draft_tokens_total",
                            "Speculative decoding: draft tokens proposed.");
  spec_accepted_ = spec("pagedserve_spec_decode_accepted_tokens_total",
                        "Speculative decoding: draft tokens accepted by the target model.");
  spec_emitted_ = spec("pagedserve_spec_decode_emitted_tokens_total",
                       "Speculative decoding: tokens emitted by verification entries (accepted "
                       "drafts + the target's next token, less stop-condition cuts).");
  spec_per_pos_ = &BuildCounter()
                       .Name("pagedserve_spec_decode_accepted_tokens_per_pos_total")
                       .Help(
                           "Speculative decoding: accepted draft tokens by position in the draft "
                           "(0 = first).")
                       .Labels(constant)
                       .Register(r);
  auto& handshakes = BuildCounter()
                         .Name("pagedserve_zmq_handshakes_failed_total")
                         .Help(
                             "ZeroMQ connections refused during the handshake (CurveZMQ), by "
                             "reason: auth (client key not authorized), protocol (wrong server "
                             "key, mechanism mismatch, malformed greeting), other.")
                         .Labels(constant)
                         .Register(r);
  handshake_auth_ = &handshakes.Add({{"reason", "auth"}});
  handshake_protocol_ = &handshakes.Add({{"reason", "protocol"}});
  handshake_other_ = &handshakes.Add({{"reason", "other"}});
  http_responses_ = &BuildCounter()
                         .Name("pagedserve_http_responses_total")
                         .Help(
                             "HTTP responses of the OpenAI-compatible API, every route and "
                             "error included, by status code.")
                         .Labels(constant)
                         .Register(r);
  auto& finished = BuildCounter()
                       .Name("pagedserve_requests_finished_total")
                       .Help("Requests that left the server, by finish reason.")
                       .Labels(constant)
                       .Register(r);
  for (MetricsFinishReason reason : {MetricsFinishReason::kStop, MetricsFinishReason::kLength,
                                     MetricsFinishReason::kAbort, MetricsFinishReason::kError}) {
    finished_[static_cast<int>(reason)] =
        &finished.Add({{"finish_reason", std::string(FinishReasonName(reason))}});
  }
  rejected_ = &BuildCounter()
                   .Name("pagedserve_metrics_rejected_observations_total")
                   .Help(
                       "Observations dropped because a value was negative, NaN or out of "
                       "range, by Metrics method; nonzero means a caller bug.")
                   .Labels(constant)
                   .Register(r);
}

void Metrics::RegisterHistograms(const prometheus::Labels& constant, int tensor_parallel_size) {
  prometheus::Registry& r = *registry_;
  auto histogram = [&r, &constant](const char* name, const char* help,
                                   const std::vector<double>& buckets) -> prometheus::Histogram* {
    return &BuildHistogram().Name(name).Help(help).Labels(constant).Register(r).Add({}, buckets);
  };
  ttft_ = histogram("pagedserve_time_to_first_token_seconds",
                    "Time from arrival to the first output token, per request.", LatencyBuckets());
  itl_ = histogram("pagedserve_inter_token_latency_seconds",
                   "Time between consecutive output tokens of a sequence.", InterTokenBuckets());
  e2e_ = histogram("pagedserve_request_e2e_latency_seconds",
                   "Time from arrival to the final message, per request.", RequestTimeBuckets());
  queue_ =
      histogram("pagedserve_request_queue_time_seconds",
                "Time from arrival to first being scheduled, per request.", RequestTimeBuckets());
  prefill_ = histogram("pagedserve_request_prefill_time_seconds",
                       "Time from first scheduled to the first output token, per request.",
                       RequestTimeBuckets());
  decode_ =
      histogram("pagedserve_request_decode_time_seconds",
                "Time from the first to the last output token, per request.", RequestTimeBuckets());
  prompt_len_ = histogram("pagedserve_request_prompt_tokens",
                          "Prompt length in tokens, per finished request.", TokenCountBuckets());
  generation_len_ =
      histogram("pagedserve_request_generation_tokens",
                "Output tokens per finished request (all its sequences).", TokenCountBuckets());
  step_tokens_ =
      histogram("pagedserve_step_tokens",
                "Tokens (prefill and decode) processed in one model step.", StepTokenBuckets());
  rank_step_ = &BuildHistogram()
                    .Name("pagedserve_rank_step_duration_seconds")
                    .Help("Wall time of one model step on a worker, by tensor-parallel rank.")
                    .Labels(constant)
                    .Register(r);
  rank_collective_ = &BuildHistogram()
                          .Name("pagedserve_rank_collective_duration_seconds")
                          .Help("Time of one step spent in tensor-parallel collectives, by rank.")
                          .Labels(constant)
                          .Register(r);
  for (int rank = 0; rank < tensor_parallel_size; ++rank) {
    RankHistogram(rank_step_, rank);
    RankHistogram(rank_collective_, rank);
  }
}

void Metrics::RegisterVllm(const std::string& model_name, int64_t max_model_len) {
  prometheus::Registry& r = *registry_;
  // vLLM V1 labels every series with the served model and the engine index
  // (one engine here: "0").
  const prometheus::Labels labels = {{"model_name", model_name}, {"engine", "0"}};
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(r).Add(labels);
  };
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(r).Add(labels);
  };
  auto histogram = [&](const char* name, const char* help, const std::vector<double>& buckets) {
    return &BuildHistogram().Name(name).Help(help).Register(r).Add(labels, buckets);
  };
  Vllm& v = vllm_;
  v.running =
      gauge("vllm:num_requests_running",
            "Number of requests in model execution batches (= pagedserve_requests_running).");
  v.waiting = gauge("vllm:num_requests_waiting",
                    "Number of requests waiting to be processed (= pagedserve_requests_waiting).");
  v.swapped = gauge("vllm:num_requests_swapped",
                    "Number of requests swapped to CPU (= pagedserve_requests_swapped).");
  v.gpu_cache = gauge("vllm:gpu_cache_usage_perc",
                      "Device KV-cache usage, 1 means 100 percent (= "
                      "pagedserve_kv_cache_usage_ratio{pool=\"device\"}).");
  v.kv_cache = gauge("vllm:kv_cache_usage_perc",
                     "KV-cache usage, 1 means 100 percent (= "
                     "pagedserve_kv_cache_usage_ratio{pool=\"device\"}).");
  v.cpu_cache = gauge("vllm:cpu_cache_usage_perc",
                      "CPU swap KV-cache usage, 1 means 100 percent (= "
                      "pagedserve_kv_cache_usage_ratio{pool=\"cpu\"}).");
  v.prefix_hit_rate = gauge("vllm:gpu_prefix_cache_hit_rate",
                            "Prefix cache hit rate (0-1) since start: hit tokens / queried tokens "
                            "(vLLM V0's gauge; 0 before the first query).");
  v.gpu_prefix_queries = counter("vllm:gpu_prefix_cache_queries_total",
                                 "Prefix cache queries, in queried tokens (vLLM's older name).");
  v.gpu_prefix_hits = counter("vllm:gpu_prefix_cache_hits_total",
                              "Prefix cache hits, in cached tokens (vLLM's older name).");
  v.prefix_queries =
      counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in queried tokens.");
  v.prefix_hits = counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in cached tokens.");
  v.preemptions = counter("vllm:num_preemptions_total",
                          "Cumulative number of preemptions (swap and recompute).");
  v.prompt_tokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.");
  v.generation_tokens =
      counter("vllm:generation_tokens_total", "Number of generation tokens processed.");
  v.spec_drafts = counter("vllm:spec_decode_num_drafts_total", "Number of spec decoding drafts.");
  v.spec_draft_tokens =
      counter("vllm:spec_decode_num_draft_tokens_total", "Number of draft tokens.");
  v.spec_accepted =
      counter("vllm:spec_decode_num_accepted_tokens_total", "Number of accepted tokens.");
  v.spec_per_pos = &BuildCounter()
                        .Name("vllm:spec_decode_num_accepted_tokens_per_pos_total")
                        .Help("Accepted tokens per draft position.")
                        .Register(r);
  v.labels = labels;
  auto& success = BuildCounter()
                      .Name("vllm:request_success_total")
                      .Help("Count of finished requests, by finished_reason.")
                      .Register(r);
  for (MetricsFinishReason reason : {MetricsFinishReason::kStop, MetricsFinishReason::kLength,
                                     MetricsFinishReason::kAbort, MetricsFinishReason::kError}) {
    prometheus::Labels l = labels;
    l["finished_reason"] = std::string(FinishReasonName(reason));
    v.success[static_cast<int>(reason)] = &success.Add(l);
  }
  const std::vector<double> lengths = Vllm125Buckets(max_model_len);
  v.prompt_len = histogram("vllm:request_prompt_tokens",
                           "Number of prefill tokens processed, per request.", lengths);
  v.generation_len = histogram("vllm:request_generation_tokens",
                               "Number of generation tokens processed, per request.", lengths);
  v.max_generation_len =
      histogram("vllm:request_max_num_generation_tokens",
                "Generation tokens of the longest sequence of a request.", lengths);
  v.iteration_tokens =
      histogram("vllm:iteration_tokens_total", "Histogram of number of tokens per engine step.",
                StepTokenBuckets());  // the same as vLLM's
  v.ttft = histogram("vllm:time_to_first_token_seconds",
                     "Histogram of time to first token in seconds.", VllmTtftBuckets());
  v.tpot = histogram("vllm:time_per_output_token_seconds",
                     "Histogram of time per output token (between two tokens) in seconds.",
                     VllmTpotBuckets());
  v.itl = histogram("vllm:inter_token_latency_seconds",
                    "Histogram of inter-token latency in seconds.", VllmTpotBuckets());
  v.prefill_per_token = histogram("vllm:time_per_prefill_token_request_seconds",
                                  "Prefill time per prompt token of a request, in seconds.",
                                  VllmPrefillPerTokenBuckets());
  v.e2e = histogram("vllm:e2e_request_latency_seconds",
                    "Histogram of e2e request latency in seconds.", VllmRequestLatencyBuckets());
  v.queue = histogram("vllm:request_queue_time_seconds",
                      "Histogram of time spent in WAITING phase for request.",
                      VllmRequestLatencyBuckets());
  v.inference = histogram("vllm:request_inference_time_seconds",
                          "Histogram of time spent in RUNNING phase (prefill + decode) for "
                          "request.",
                          VllmRequestLatencyBuckets());
  v.prefill = histogram("vllm:request_prefill_time_seconds",
                        "Histogram of time spent in PREFILL phase for request.",
                        VllmRequestLatencyBuckets());
  v.decode = histogram("vllm:request_decode_time_seconds",
                       "Histogram of time spent in DECODE phase for request.",
                       VllmRequestLatencyBuckets());
}

absl::Status Metrics::StartExposer(const std::string& listen_address, int port) {
  try {
    exposer_ = std::make_unique<prometheus::Exposer>(listen_address);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("MetricsOptions.listen_address: cannot serve metrics on '", listen_address,
                     "': ", e.what()));
  }
  exposer_->RegisterCollectable(registry_);
  std::vector<int> ports = exposer_->GetListeningPorts();
  listening_port_ = ports.empty() ? port : ports.front();
  return absl::OkStatus();
}

prometheus::Histogram& Metrics::RankHistogram(prometheus::Family<prometheus::Histogram>* family,
                                              int rank) {
  // Family::Add returns the existing series for labels already seen.
  return family->Add({{"rank", std::to_string(rank)}}, RankStepBuckets());
}

void Metrics::Reject(std::string_view method) {
  rejected_->Add({{"method", std::string(method)}}).Increment();
}

void Metrics::SetRequests(int64_t running, int64_t waiting, int64_t swapped) {
  if (running < 0 || waiting < 0 || swapped < 0) return Reject("SetRequests");
  running_->Set(static_cast<double>(running));
  waiting_->Set(static_cast<double>(waiting));
  swapped_->Set(static_cast<double>(swapped));
  vllm_.running->Set(static_cast<double>(running));
  vllm_.waiting->Set(static_cast<double>(waiting));
  vllm_.swapped->Set(static_cast<double>(swapped));
}

void Metrics::SetKvUsage(double device_fraction, double cpu_fraction) {
  if (!Valid(device_fraction) || !Valid(cpu_fraction) || device_fraction > 1 || cpu_fraction > 1) {
    return Reject("SetKvUsage");
  }
  kv_device_->Set(device_fraction);
  kv_cpu_->Set(cpu_fraction);
  vllm_.gpu_cache->Set(device_fraction);
  vllm_.kv_cache->Set(device_fraction);
  vllm_.cpu_cache->Set(cpu_fraction);
}

void Metrics::AddPrefixCache(int64_t query_tokens, int64_t hit_tokens) {
  if (query_tokens < 0 || hit_tokens < 0 || hit_tokens > query_tokens) {
    return Reject("AddPrefixCache");
  }
  prefix_queries_->Increment(static_cast<double>(query_tokens));
  prefix_hits_->Increment(static_cast<double>(hit_tokens));
  for (prometheus::Counter* c : {vllm_.prefix_queries, vllm_.gpu_prefix_queries}) {
    c->Increment(static_cast<double>(query_tokens));
  }
  for (prometheus::Counter* c : {vllm_.prefix_hits, vllm_.gpu_prefix_hits}) {
    c->Increment(static_cast<double>(hit_tokens));
  }
  const double queried = prefix_queries_->Value();
  if (queried > 0) vllm_.prefix_hit_rate->Set(prefix_hits_->Value() / queried);
}

void Metrics::AddPreemption(MetricsPreemptionMode mode) {
  (mode == MetricsPreemptionMode::kSwap ? preempt_swap_ : preempt_recompute_)->Increment();
  vllm_.preemptions->Increment();
}

void Metrics::AddPromptTokens(int64_t n) {
  if (n < 0) return Reject("AddPromptTokens");
  prompt_tokens_->Increment(static_cast<double>(n));
}

void Metrics::AddRequestPromptTokens(int64_t n) {
  if (n < 0) return Reject("AddRequestPromptTokens");
  vllm_.prompt_tokens->Increment(static_cast<double>(n));
}

void Metrics::AddGenerationTokens(int64_t n) {
  if (n < 0) return Reject("AddGenerationTokens");
  generation_tokens_->Increment(static_cast<double>(n));
  vllm_.generation_tokens->Increment(static_cast<double>(n));
}

void Metrics::AddSpecDecode(int64_t drafts, int64_t draft_tokens, int64_t accepted, int64_t emitted,
                            const std::vector<int64_t>& accepted_per_pos) {
  if (drafts < 0 || draft_tokens < 0 || accepted < 0 || emitted < 0) return Reject("AddSpecDecode");
  spec_drafts_->Increment(static_cast<double>(drafts));
  spec_draft_tokens_->Increment(static_cast<double>(draft_tokens));
  spec_accepted_->Increment(static_cast<double>(accepted));
  spec_emitted_->Increment(static_cast<double>(emitted));
  if (vllm_.spec_drafts != nullptr) {
    vllm_.spec_drafts->Increment(static_cast<double>(drafts));
    vllm_.spec_draft_tokens->Increment(static_cast<double>(draft_tokens));
    vllm_.spec_accepted->Increment(static_cast<double>(accepted));
  }
  for (size_t j = 0; j < accepted_per_pos.size(); ++j) {
    if (accepted_per_pos[j] <= 0) continue;
    const std::string pos = std::to_string(j);
    spec_per_pos_->Add({{"position", pos}}).Increment(static_cast<double>(accepted_per_pos[j]));
    if (vllm_.spec_per_pos != nullptr) {
      std::map<std::string, std::string> l = vllm_.labels;
      l["position"] = pos;
      vllm_.spec_per_pos->Add(l).Increment(static_cast<double>(accepted_per_pos[j]));
    }
  }
}

void Metrics::AddFailedHandshake(std::string_view reason) {
  if (reason == "auth") return handshake_auth_->Increment();
  if (reason == "protocol") return handshake_protocol_->Increment();
  if (reason == "other") return handshake_other_->Increment();
  Reject("AddFailedHandshake");
}

void Metrics::AddHttpResponse(int status) {
  if (status < 100 || status > 599) return Reject("AddHttpResponse");
  // Family::Add returns the one series of these labels (prometheus-cpp locks).
  http_responses_->Add({{"status", std::to_string(status)}}).Increment();
}

void Metrics::RequestFinished(const FinishedRequest& q) {
  int reason = static_cast<int>(q.reason);
  bool produced = q.ttft_s >= 0;
  // Either all of ttft/prefill/decode are given (a token was produced) or none.
  bool consistent = produced ? Valid(q.ttft_s) && Valid(q.prefill_s) && Valid(q.decode_s)
                             : q.prefill_s < 0 && q.decode_s < 0;
  if (reason < 0 || reason > 3 || !Valid(q.e2e_s) || std::isnan(q.queue_s) ||
      std::isinf(q.queue_s) || !consistent || std::isnan(q.ttft_s) || q.prompt_len < 0 ||
      q.generation_len < 0 || (!produced && q.generation_len > 0) ||
      q.max_generation_len > q.generation_len) {
    return Reject("RequestFinished");
  }
  finished_[reason]->Increment();
  e2e_->Observe(q.e2e_s);
  if (q.queue_s >= 0) queue_->Observe(q.queue_s);
  prompt_len_->Observe(static_cast<double>(q.prompt_len));
  generation_len_->Observe(static_cast<double>(q.generation_len));
  if (produced) {
    ttft_->Observe(q.ttft_s);
    prefill_->Observe(q.prefill_s);
    decode_->Observe(q.decode_s);
  }
  Vllm& v = vllm_;
  v.success[reason]->Increment();
  v.e2e->Observe(q.e2e_s);
  if (q.queue_s >= 0) v.queue->Observe(q.queue_s);
  v.prompt_len->Observe(static_cast<double>(q.prompt_len));
  v.generation_len->Observe(static_cast<double>(q.generation_len));
  v.max_generation_len->Observe(
      static_cast<double>(q.max_generation_len >= 0 ? q.max_generation_len : q.generation_len));
  if (produced) {
    v.ttft->Observe(q.ttft_s);
    v.prefill->Observe(q.prefill_s);
    v.decode->Observe(q.decode_s);
    v.inference->Observe(q.prefill_s + q.decode_s);
    if (q.prompt_len > 0) v.prefill_per_token->Observe(q.prefill_s / q.prompt_len);
  }
}

void Metrics::ObserveInterTokenLatency(double seconds) {
  if (!Valid(seconds)) return Reject("ObserveInterTokenLatency");
  itl_->Observe(seconds);
  vllm_.tpot->Observe(seconds);
  vllm_.itl->Observe(seconds);
}

void Metrics::ObserveStepTokens(int64_t n) {
  if (n < 0) return Reject("ObserveStepTokens");
  step_tokens_->Observe(static_cast<double>(n));
  vllm_.iteration_tokens->Observe(static_cast<double>(n));
}

void Metrics::ObserveRankStep(int rank, double step_s, double collective_s) {
  if (rank < 0 || !Valid(step_s) || !Valid(collective_s) || collective_s > step_s) {
    return Reject("ObserveRankStep");
  }
  RankHistogram(rank_step_, rank).Observe(step_s);
  RankHistogram(rank_collective_, rank).Observe(collective_s);
}

std::string Metrics::Serialize() const {
  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, registry_->Collect());
  return out.str();
}

}  // namespace pagedserve
