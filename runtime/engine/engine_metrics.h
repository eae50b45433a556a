// Internal to the engine: the calls it makes on monitoring/metrics.h.
//
// monitoring/metrics.h and runtime/coordinator/sequence.h both declare
// pagedserve::FinishReason and pagedserve::PreemptionMode (different enums of
// the same name), so no translation unit can include both. engine.cc talks to
// Metrics through these plain-typed functions, defined in engine_metrics.cc,
// which includes only metrics.h. Every function is a no-op for a null Metrics.
#ifndef PAGEDSERVE_RUNTIME_ENGINE_ENGINE_METRICS_H_
#define PAGEDSERVE_RUNTIME_ENGINE_ENGINE_METRICS_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace pagedserve {

class Metrics;

namespace engine_metrics {

// Scheduler gauges and the counters' increments since the previous step.
struct StepFigures {
  int64_t running = 0, waiting = 0, swapped = 0;
  double device_kv_usage = 0, cpu_kv_usage = 0;
  int64_t prefix_queries = 0, prefix_hits = 0;              // increments, tokens
  int64_t preemptions_swap = 0, preemptions_recompute = 0;  // increments
  int64_t prompt_tokens = 0;              // prefilled this step (including recomputation)
  int64_t first_token_prompt_tokens = 0;  // prompt lengths of requests whose first token came
  int64_t generation_tokens = 0;          // output tokens given to requests this step
  int64_t step_tokens = 0;                // fed to the model this step
  bool executed = false;                  // a forward pass ran (rank figures valid)
  // Speculative decoding increments (SchedulerStats' spec_* counters).
  int64_t spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0, spec_emitted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
  double forward_s = 0, collective_s = 0;
};
void RecordStep(Metrics* m, const StepFigures& f);

void ObserveInterTokenLatency(Metrics* m, double seconds);

// reason: "stop", "length", "abort" or "error". Durations < 0 = not applicable.
struct RequestFigures {
  std::string_view reason;
  double ttft_s = -1, e2e_s = -1, queue_s = -1, prefill_s = -1, decode_s = -1;
  int64_t prompt_len = 0, generation_len = 0;
  int64_t max_generation_len = -1;  // the longest sequence's output tokens
};
void RecordFinished(Metrics* m, const RequestFigures& r);

}  // namespace engine_metrics
}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_ENGINE_METRICS_H_
