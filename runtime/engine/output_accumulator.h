// What a front end makes of a request's engine outputs: the one place where
// per-sequence deltas become whole completions, where a sequence that ended
// with its request gets its finish reason (EndedWithRequest), and where usage
// and the first-token time are taken. The OpenAI HTTP API, ZeroMQ protocol v1
// and `pagedserve generate` each keep one OutputAccumulator per client request and
// only encode what it holds.
//
// A client request may be several engine requests (the OpenAI API's list of
// prompts): prompt p's sample i is completion p * n + i.
//
// Not thread-safe: one front-end thread owns it (the engine thread only pushes
// EngineOutputs into a RequestChannel, engine_loop.h).
#ifndef PAGEDSERVE_RUNTIME_ENGINE_OUTPUT_ACCUMULATOR_H_
#define PAGEDSERVE_RUNTIME_ENGINE_OUTPUT_ACCUMULATOR_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/common/finish_reason.h"
#include "runtime/engine/engine.h"

namespace pagedserve {

// One completion (one sample of one prompt) as accumulated so far, or one
// engine output's news for it (OutputAccumulator::Apply). Vectors are per token;
// the logprob vectors are empty unless the request asked for logprobs.
struct CompletionOutput {
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<float> logprobs;
  std::vector<std::vector<int32_t>> top_token_ids;  // best first, per token
  std::vector<std::vector<float>> top_logprobs;
  std::optional<double> cumulative_logprob;          // beam search only
  FinishReason finish_reason = FinishReason::kNone;  // kNone while running
};

// The news of one completion in one engine output, for streaming.
struct CompletionNews {
  int32_t choice = 0;  // p * n + sample index
  CompletionOutput delta;
};

class OutputAccumulator {
 public:
  // `engine_ids`: the engine request ids of the client request's prompts, in
  // prompt order (at least one); `n`: samples per prompt (>= 1). The clock
  // for first_token_s / elapsed_s starts now.
  OutputAccumulator(std::vector<std::string> engine_ids, int32_t n);

  // Only the first `count` engine requests were submitted (a later submit
  // failed): the others never produce output, and done() no longer waits for
  // them. `count` <= engine_ids().size().
  void KeepSubmitted(size_t count);

  // Applies one output of one of this request's engine requests: appends each
  // delta to its completion (indices outside [0, n) are ignored), records a
  // reported finish reason, and, on the engine request's final output, adds
  // its usage, keeps its error (the first non-OK one) and gives each of its
  // completions without a reported reason EndedWithRequest's. With `news`,
  // appends one entry per completion with new text, tokens or a finish
  // (finish_reason set only on the delta that reported it). Returns false,
  // changing nothing, when out.request_id is not one of engine_ids().
  bool Apply(const EngineOutput& out, std::vector<CompletionNews>* news = nullptr);

  const std::vector<std::string>& engine_ids() const { return engine_ids_; }
  int32_t n() const { return n_; }
  // p * n + i -> completion; finish reasons are final once done().
  const std::vector<CompletionOutput>& completions() const { return completions_; }
  // Prompt p's scored prompt tokens (EngineOutput::prompt_logprobs), empty
  // until they arrive or when not asked for.
  const std::vector<PromptLogprob>& prompt_logprobs(size_t p) const { return prompt_logprobs_[p]; }
  // Summed over the engine requests that finished.
  const Usage& usage() const { return usage_; }
  // The first error an engine request ended with (OK when none).
  const absl::Status& error() const { return error_; }
  // Every submitted engine request has sent its final output.
  bool done() const { return finished_ == engine_ids_.size(); }
  // Whether any delta (text, tokens or a finish) arrived before the final
  // outputs: false for a request the engine refused before running it.
  bool produced_output() const { return produced_output_; }
  // Seconds from construction to the first generated token; < 0 before it.
  double first_token_s() const;
  // Seconds since construction.
  double elapsed_s() const;

 private:
  std::vector<std::string> engine_ids_;
  int32_t n_;
  std::vector<CompletionOutput> completions_;
  std::vector<std::vector<PromptLogprob>> prompt_logprobs_;  // per prompt
  Usage usage_;
  absl::Status error_;
  size_t finished_ = 0;
  bool produced_output_ = false;
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> first_token_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_OUTPUT_ACCUMULATOR_H_
