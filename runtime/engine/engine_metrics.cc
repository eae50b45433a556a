#include "runtime/engine/engine_metrics.h"

#include "monitoring/metrics.h"

namespace pagedserve::engine_metrics {

void RecordStep(Metrics* m, const StepFigures& f) {
  if (m == nullptr) return;
  m->SetRequests(f.running, f.waiting, f.swapped);
  m->SetKvUsage(f.device_kv_usage, f.cpu_kv_usage);
  if (f.prefix_queries > 0) m->AddPrefixCache(f.prefix_queries, f.prefix_hits);
  for (int64_t i = 0; i < f.preemptions_swap; ++i) m->AddPreemption(MetricsPreemptionMode::kSwap);
  for (int64_t i = 0; i < f.preemptions_recompute; ++i)
    m->AddPreemption(MetricsPreemptionMode::kRecompute);
  if (f.prompt_tokens > 0) m->AddPromptTokens(f.prompt_tokens);
  if (f.first_token_prompt_tokens > 0) m->AddRequestPromptTokens(f.first_token_prompt_tokens);
  if (f.generation_tokens > 0) m->AddGenerationTokens(f.generation_tokens);
  if (f.spec_drafts > 0) {
    m->AddSpecDecode(f.spec_drafts, f.spec_draft_tokens, f.spec_accepted_tokens,
                     f.spec_emitted_tokens, f.spec_accepted_per_pos);
  }
  if (f.executed) {
    m->ObserveStepTokens(f.step_tokens);
    m->ObserveRankStep(0, f.forward_s, f.collective_s);
  }
}

void ObserveInterTokenLatency(Metrics* m, double seconds) {
  if (m != nullptr) m->ObserveInterTokenLatency(seconds);
}

void RecordFinished(Metrics* m, const RequestFigures& r) {
  if (m == nullptr) return;
  FinishedRequest f;
  if (r.reason == "stop") {
    f.reason = MetricsFinishReason::kStop;
  } else if (r.reason == "length") {
    f.reason = MetricsFinishReason::kLength;
  } else if (r.reason == "abort") {
    f.reason = MetricsFinishReason::kAbort;
  } else {
    f.reason = MetricsFinishReason::kError;
  }
  f.ttft_s = r.ttft_s;
  f.e2e_s = r.e2e_s;
  f.queue_s = r.queue_s;
  f.prefill_s = r.prefill_s;
  f.decode_s = r.decode_s;
  f.prompt_len = r.prompt_len;
  f.generation_len = r.generation_len;
  f.max_generation_len = r.max_generation_len;
  m->RequestFinished(f);
}

}  // namespace pagedserve::engine_metrics
