// A Metrics registry (no HTTP endpoint) for engine tests, and its text.
#ifndef PAGEDSERVE_TESTS_ENGINE_METRICS_PROBE_H_
#define PAGEDSERVE_TESTS_ENGINE_METRICS_PROBE_H_

#include <memory>
#include <string>

namespace pagedserve {
class Metrics;
namespace testing {

std::shared_ptr<Metrics> MakeProbeMetrics();  // null on failure
std::string SerializeMetrics(const Metrics& m);

}  // namespace testing
}  // namespace pagedserve

#endif  // PAGEDSERVE_TESTS_ENGINE_METRICS_PROBE_H_
