// The coordinator's engine: one iteration = schedule (Scheduler) -> execute
// (Executor) -> process results (stop conditions, incremental detokenization,
// stop strings held back until they cannot match, usage) -> outputs for the
// front end. Single-threaded: the caller (the serve loop or the generate
// command) calls AddRequest / Abort / Step from one thread. The engine never
// touches tensors.
#ifndef PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_
#define PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/common/sampling_params.h"
#include "runtime/coordinator/scheduler.h"
#include "runtime/engine/executor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {

class Metrics;

struct EngineOptions {
  SchedulerConfig scheduler;   // block counts are taken from the executor
  bool skip_special_tokens = true;
};

struct EngineRequest {
  std::string request_id;                 // unique among in-flight requests
  std::vector<int32_t> prompt_token_ids;  // already tokenized (chat templates applied)
  SamplingParams params;                  // validated by AddRequest
  int32_t priority = 0;
};

// New output of one sequence (sample index) of a request since the last Step.
struct SequenceDelta {
  int32_t index = 0;
  std::string text;                 // new text; never a broken UTF-8 sequence,
                                    // never text that may still become a stop string
  std::vector<int32_t> token_ids;   // new token ids
  std::vector<float> logprobs;      // per new token, when requested
  bool finished = false;
  std::string finish_reason;        // "stop", "length", "abort", "error" when finished
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;    // summed over the n sequences
  int32_t cached_prompt_tokens = 0;
};

struct EngineOutput {
  std::string request_id;
  std::vector<SequenceDelta> deltas;  // only sequences with news
  bool finished = false;              // every sequence finished
  Usage usage;                        // meaningful when finished
  absl::Status error;                 // non-OK when the request failed
};

class Engine {
 public:
  // `tokenizer` (not owned) must outlive the engine; `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options,
                                                        const Tokenizer* tokenizer,
                                                        std::unique_ptr<Executor> executor,
                                                        std::vector<int32_t> eos_token_ids,
                                                        Metrics* metrics = nullptr);

  // Validates the parameters and admission bound (prompt + max_tokens vs the
  // pool and max_model_len) and queues the request. Errors: InvalidArgument
  // (bad parameters, prompt too long), AlreadyExists (duplicate id).
  absl::Status AddRequest(EngineRequest request);
  // Aborts a request: its blocks are freed in the next step and a final output
  // with finish_reason "abort" is produced by the next Step. NotFound if unknown.
  absl::Status Abort(const std::string& request_id);

  bool HasUnfinishedRequests() const;
  // One iteration. An error is fatal (the executor failed): call FailAll.
  absl::StatusOr<std::vector<EngineOutput>> Step();
  // Final outputs with `error` for every in-flight request (after a fatal error
  // or at shutdown), and forgets them.
  std::vector<EngineOutput> FailAll(const absl::Status& error);

  SchedulerStats stats() const;
  const SchedulerConfig& scheduler_config() const;
  Executor& executor();
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_
