// A small, fixed sequence of Metrics calls used by several monitoring tests,
// with the figures it must produce computed here from the raw observations
// (not from Metrics), so the tests compare two independent computations.
#ifndef PAGEDSERVE_TESTS_MONITORING_WORKLOAD_H_
#define PAGEDSERVE_TESTS_MONITORING_WORKLOAD_H_

#include <memory>
#include <vector>

#include "monitoring/metrics.h"

namespace pagedserve::testing {

struct Workload {
  // Finished requests: three that produced tokens and one aborted in the queue.
  std::vector<FinishedRequest> requests = {
      {MetricsFinishReason::kStop, 0.003, 0.9, 0.001, 0.002, 0.85, 12, 40},
      {MetricsFinishReason::kLength, 0.05, 2.0, 0.02, 0.03, 1.9, 500, 64},
      {MetricsFinishReason::kStop, 3.0, 7.5, 2.0, 1.0, 4.4, 7, 1},
      {MetricsFinishReason::kAbort, -1, 0.4, -1, -1, -1, 30, 0},
  };
  std::vector<double> itl = {0.009, 0.012, 0.012, 0.2, 0.031, 1e-4};
  std::vector<int64_t> step_tokens = {519, 3, 3, 2, 1, 1};
  // (rank, step_s, collective_s)
  struct RankStep {
    int rank;
    double step_s, collective_s;
  };
  std::vector<RankStep> rank_steps = {
      {0, 0.02, 0.005}, {1, 0.03, 0.01}, {1, 0.2, 0.1}, {0, 0.0004, 0.0001}};

  static constexpr int64_t kCachedPromptTokens = 32;
  int64_t prompt_tokens() const {
    int64_t n = 0;
    for (const auto& r : requests) n += r.prompt_len;
    return n;
  }
  int64_t generation_tokens() const {
    int64_t n = 0;
    for (const auto& r : requests) n += r.generation_len;
    return n;
  }

  // Plays the workload, touching every label value of every labelled metric.
  void Play(Metrics& m) const {
    m.SetRequests(3, 5, 1);
    m.SetKvUsage(0.75, 0.5);
    m.AddPrefixCache(100, 32);
    m.AddPrefixCache(64, 0);
    m.AddPreemption(MetricsPreemptionMode::kSwap);
    m.AddPreemption(MetricsPreemptionMode::kSwap);
    m.AddPreemption(MetricsPreemptionMode::kRecompute);
    // 32 prompt tokens came from the prefix cache (AddPrefixCache above): not
    // computed, yet part of the requests' prompts (vLLM's count).
    m.AddPromptTokens(prompt_tokens() - kCachedPromptTokens);
    m.AddRequestPromptTokens(prompt_tokens());
    for (const auto& r : requests) {
      for (int64_t i = 0; i < r.generation_len; ++i) m.AddGenerationTokens(1);
    }
    // Speculative decoding: 4 verifications, 12 drafts, 7 accepted (4 at
    // position 0, 2 at 1, 1 at 2), 11 emitted.
    m.AddSpecDecode(4, 12, 7, 11, {4, 2, 1});
    for (double s : itl) m.ObserveInterTokenLatency(s);
    for (int64_t n : step_tokens) m.ObserveStepTokens(n);
    for (const auto& s : rank_steps) m.ObserveRankStep(s.rank, s.step_s, s.collective_s);
    for (const auto& r : requests) m.RequestFinished(r);
    FinishedRequest failed;
    failed.reason = MetricsFinishReason::kError;
    failed.e2e_s = 0.01;
    failed.queue_s = 0.005;
    failed.prompt_len = 3;
    m.RequestFinished(failed);
    // Drain: everything finished, KV pools empty again.
    m.SetRequests(0, 0, 0);
    m.SetKvUsage(0, 0);
  }
};

inline MetricsOptions TestOptions(std::string listen_address = "") {
  MetricsOptions o;
  o.listen_address = std::move(listen_address);
  o.model_name = "SmolLM2-135M-Instruct.Q4_1.gguf";
  o.build_info.version = "0.1.0-test";
  o.build_info.model = "SmolLM2-135M-Instruct.Q4_1.gguf";
  o.build_info.tensor_parallel_size = 2;
  o.build_info.block_size = 16;
  o.build_info.backend = "cpu";
  o.build_info.extra_labels = {{"max_num_seqs", "8"}, {"preemption_mode", "recompute"}};
  return o;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_MONITORING_WORKLOAD_H_
