// Separate translation unit: monitoring/metrics.h cannot be included next to
// the engine / scheduler headers (both declare pagedserve::FinishReason).
#include "tests/engine/metrics_probe.h"

#include "monitoring/metrics.h"

namespace pagedserve::testing {

std::shared_ptr<Metrics> MakeProbeMetrics() {
  MetricsOptions options;
  options.model_name = "probe";
  auto m = Metrics::Create(options);
  if (!m.ok()) return nullptr;
  return std::shared_ptr<Metrics>(std::move(*m));
}

std::string SerializeMetrics(const Metrics& m) { return m.Serialize(); }

}  // namespace pagedserve::testing
