#include "runtime/frontend/serve_metrics.h"

#include "absl/strings/str_cat.h"
#include "monitoring/metrics.h"

namespace pagedserve {

absl::StatusOr<std::shared_ptr<Metrics>> CreateServeMetrics(const ServeMetricsOptions& options) {
  MetricsOptions mo;
  const std::string& host = options.host;
  const bool ipv6 = host.find(':') != std::string::npos && !host.empty() && host.front() != '[';
  mo.listen_address = options.port > 0 ? (ipv6 ? absl::StrCat("[", host, "]:", options.port)
                                               : absl::StrCat(host, ":", options.port))
                                       : "";
  mo.model_name = options.model_name;
  mo.build_info.version = "0.1.0";
  mo.build_info.model = options.model;
  mo.build_info.tensor_parallel_size = options.tensor_parallel_size;
  mo.build_info.block_size = options.block_size;
  mo.build_info.backend = options.backend;
  mo.build_info.extra_labels = options.extra_labels;
  mo.max_model_len = options.max_model_len;
  absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Create(mo);
  if (!m.ok()) return m.status();
  return std::shared_ptr<Metrics>(*std::move(m));
}

int MetricsListeningPort(const Metrics& metrics) { return metrics.listening_port(); }

void RecordFailedHandshake(Metrics& metrics, std::string_view reason) {
  metrics.AddFailedHandshake(reason);
}

void RecordHttpResponse(Metrics& metrics, int status) { metrics.AddHttpResponse(status); }

std::string SerializeServeMetrics(const Metrics& metrics) { return metrics.Serialize(); }

}  // namespace pagedserve
