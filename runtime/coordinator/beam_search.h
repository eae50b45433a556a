// Beam search over one request's live beams, one decoding step at a time
// (SamplingParams::use_beam_search). Pure bookkeeping: the scheduler feeds it
// what the workers returned and applies its decision through the block
// manager (runtime/coordinator/scheduler.h: fork the chosen parents, free the
// others).
//
// Algorithm (Hugging Face transformers 5.x GenerationMixin._beam_search, the
// vectorized successor of BeamSearchScorer; vLLM v0's BeamSearchSampler picks
// the same candidates), with k = beam_width:
//   1. candidates: over every live beam b and every token t of b's top 2k raw
//      logprobs, score(b, t) = cumulative_logprob(b) + logprob(t | b); keep the
//      best 2k (ties: lower beam, then the worker's order, i.e. lower token id).
//      On the first step there is one live beam (the prompt).
//   2. a candidate *ends* when t is a stop token (EOS unless ignore_eos,
//      stop_token_ids) or when the beam reaches max_tokens (or max_model_len);
//   3. ended candidates of rank < k become finished hypotheses, scored
//      cumulative_logprob / generated_len ** length_penalty, where
//      generated_len counts every generated token including the ending one
//      (transformers 5.x); the k best hypotheses are kept. None is added once
//      early stopping is decided (below) or, with early_stopping true, once k
//      are finished;
//   4. the best k candidates that did not end are the next live beams;
//   5. the search stops when a candidate hit max_tokens (every candidate did),
//      when no live beam is left, with early_stopping true when k hypotheses
//      are finished, or when the early-stop heuristic holds: k hypotheses are
//      finished and the best live beam's cumulative_logprob / L **
//      length_penalty is <= the worst hypothesis' score, with L = the current
//      generated length, or max_tokens for early_stopping "never" when
//      length_penalty > 0 (transformers' _check_early_stop_heuristic; once it
//      holds it stays).
// The result: the n best hypotheses, best first (if fewer than n finished,
// e.g. every candidate ended on a rank >= k, the best live beams fill up).
//
// Not thread-safe; owned by the scheduler thread with its request.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_BEAM_SEARCH_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_BEAM_SEARCH_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "runtime/common/finish_reason.h"
#include "runtime/common/sampling_params.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// A finished beam.
struct BeamHypothesis {
  std::vector<int32_t> token_ids;  // generated tokens, the ending stop token included
  std::vector<float> logprobs;     // per token, raw logprobs
  double cumulative_logprob = 0.0;
  double score = 0.0;                                // cumulative_logprob / len ** length_penalty
  FinishReason finish_reason = FinishReason::kNone;  // kStop (stop token) or kLength
  int32_t stop_token_id = -1;                        // for kStop
};

// One live beam as the step sees it.
struct BeamInput {
  double cumulative_logprob = 0.0;
  const std::vector<int32_t>* output_tokens = nullptr;  // generated so far (not owned)
  const std::vector<float>* output_logprobs = nullptr;  // per generated token (not owned)
  const SampledToken* sampled = nullptr;  // this step's result, with the top lists (not owned)
};

// The next live beam: `parent` (index into the step's inputs) extended by token_id.
struct BeamChoice {
  int32_t parent = 0;
  int32_t token_id = 0;
  float logprob = 0.0f;
  double cumulative_logprob = 0.0;
};

class BeamSearch {
 public:
  // max_output_len: generated tokens at which a beam ends by length
  // (min(max_tokens, max_model_len - prompt_len)), >= 1.
  BeamSearch(const SamplingParams& params, int32_t max_output_len);

  // One decoding step. `beams`: every live beam, each with the same number of
  // generated tokens `output_len` before this step; `is_stop(token)` says
  // whether a token ends a beam. Returns the next live beams (empty when the
  // search is done). Every input's sampled->top lists must hold the beam's
  // best 2 * beam_width tokens, best first.
  std::vector<BeamChoice> Step(std::span<const BeamInput> beams, int32_t output_len,
                               const std::function<bool(int32_t)>& is_stop);

  bool done() const { return done_; }
  // Finished hypotheses, best first; at most beam_width.
  const std::vector<BeamHypothesis>& finished() const { return finished_; }
  // The n results (call once done): the best hypotheses, filled up from the
  // given live beams when fewer than n finished.
  std::vector<BeamHypothesis> TakeResults();

 private:
  void AddHypothesis(BeamHypothesis h);
  double Score(double cumulative_logprob, int32_t len) const;

  int32_t width_;
  int32_t n_;
  int32_t max_output_len_;
  float length_penalty_;
  EarlyStopping early_stopping_;
  bool heuristic_unsatisfied_ = true;
  bool done_ = false;
  std::vector<BeamHypothesis> finished_;
  std::vector<BeamHypothesis> leftovers_;  // live beams when the search stopped, best first
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_BEAM_SEARCH_H_
