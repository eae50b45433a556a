// The serve command's Prometheus endpoint, kept out of translation units that
// see the scheduler: monitoring/metrics.h and runtime/coordinator/sequence.h
// both declare pagedserve::FinishReason and pagedserve::PreemptionMode, so no
// file may include both (see runtime/engine/engine_metrics.h). The shared_ptr
// carries its deleter, so callers need only the forward declaration.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_SERVE_METRICS_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_SERVE_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pagedserve {

class Metrics;

struct ServeMetricsOptions {
  std::string host = "127.0.0.1";  // --metrics-host; an IPv6 address is bracketed
  int port = 0;                    // --metrics-port; 0 = no HTTP endpoint
  std::string model_name;          // label model_name on every series (served model name)
  std::string model;               // build_info labels
  int tensor_parallel_size = 1;
  int block_size = 16;
  std::string backend;  // "cpu" or "cuda"
  std::map<std::string, std::string> extra_labels;
  int64_t max_model_len = 0;  // --max-model-len: top of the vllm:request_*_tokens buckets
};

// Metrics::Create with listen address "host:port" (its errors: InvalidArgument
// for a bad address or label, Unavailable when the port cannot be bound).
absl::StatusOr<std::shared_ptr<Metrics>> CreateServeMetrics(const ServeMetricsOptions& options);
// Metrics::AddFailedHandshake (for translation units that must not include
// monitoring/metrics.h): reason "auth", "protocol" or "other".
void RecordFailedHandshake(Metrics& metrics, std::string_view reason);
// Metrics::AddHttpResponse: one HTTP response with this status code.
void RecordHttpResponse(Metrics& metrics, int status);

// The port the exposer listens on (0 when none).
int MetricsListeningPort(const Metrics& metrics);
// The registry in Prometheus text format (what --metrics-port serves); for the
// HTTP API's /metrics. Thread-safe (prometheus-cpp collects under its locks).
std::string SerializeServeMetrics(const Metrics& metrics);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_SERVE_METRICS_H_
