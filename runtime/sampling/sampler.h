// The sampler: turns one step's fp32 logits into token ids (plus logprobs) for
// every sequence that samples in the step. Runs on TP rank 0 of a worker.
//
// Per row the logits are processed in the order of Hugging Face transformers'
// generate() and vLLM:
//   0a. logit_bias  OpenAI's: bias added to the raw logit of each listed token
//                   (before everything else; the sum is clamped to +-FLT_MAX).
//   0b. min_tokens  while the row has fewer than min_tokens output tokens, the
//                   end tokens (SamplingParams::min_tokens_end_ids) are set to
//                   -inf (vLLM's MinTokensLogitsProcessor).
//   0c. bad_words   each banned sequence's last token is set to -inf when the
//                   output tokens end with the sequence's other tokens (a
//                   one-token word always; vLLM's bad-words processor, which
//                   also looks at output tokens only).
//                   Ids outside [0, vocab_size) in 0a-0c are skipped.
//   1. penalties   repetition penalty (CTRL, Keskar et al. 2019, as in HF's
//                  RepetitionPenaltyLogitsProcessor): every token id that occurs in
//                  the prompt or the output so far has its logit divided by the
//                  penalty when > 0 and multiplied by it when < 0 (once per id);
//                  then OpenAI's frequency / presence penalties over the output
//                  tokens only: logit -= frequency_penalty * count
//                                      + presence_penalty * (count > 0).
//   1b. mask       structured output (SamplerRow::allowed_tokens): every token
//                  the constraint does not allow gets -inf, so neither greedy nor
//                  sampling can pick it (XGrammar / vLLM apply the bitmask at the
//                  same place: after the logits processors, before sampling).
//   2. greedy      temperature < 1e-5 (SamplingParams::greedy()): argmax of the
//                  penalized logits, ties to the lowest token id; steps 3-6 skipped.
//   3. temperature s_i = (logit_i - max_j logit_j) / temperature, so s_i <= 0 and
//                  exp(s_i) never overflows, whatever the temperature.
//   4. top-k       keep the k largest (ties to the lowest token id); off when -1 or
//                  k >= vocab.
//   5. top-p       nucleus (Holtzman et al. 2019): over the top-k survivors sorted by
//                  probability, keep each token whose preceding mass is < top_p
//                  (the token that crosses top_p is kept; at least one survives).
//   6. min-p       keep tokens with p_i >= min_p * p_max (scale-free, so the
//                  renormalization by the earlier filters does not matter).
//   7. sample      inverse CDF over the survivors with one uniform double in [0, 1).
//
// Logprobs: the values returned (of the sampled token and of the top N) are the
// log-softmax of the RAW model logits of the row, before penalties, temperature and
// filtering. This is vLLM's default (logprobs_mode = raw_logprobs) and what the
// OpenAI API reports; it is well defined for greedy rows too. Top-N is sorted by
// logprob descending, ties to the lowest token id.
//
// Randomness: a row with SamplingParams::seed draws sample j from a std::mt19937_64
// seeded with SplitMix64-mixed (seed, sample_index + j, position) only, so its
// tokens do not depend on the rest of the batch, on the row's place in it, or on
// preemption (a recomputed sequence samples the same position again with the same
// stream). mt19937_64 and the bits-to-double conversion are fully specified, so the
// stream is the same on every platform; the sampled token can differ across
// platforms only if their expf() differ by an ulp at a CDF boundary. Rows without a
// seed draw from an absl::BitGen seeded nondeterministically at construction.
//
// Errors (InvalidArgument): logits shape does not match rows x vocab_size, invalid
// SamplingParams (SamplingParams::Validate), num_samples outside [1, 64] (n's range),
// a token id in the history outside [0, vocab_size), prompt_len outside
// [0, history length], a NaN or +inf logit, a row whose logits are all -inf, or
// a row whose allowed_tokens leave no finite logit, or one that is all -inf
// after the masks of 0b-0c and 1b. No partial result on error.
//
// Thread safety: a Sampler is not thread-safe (it owns the unseeded generator and
// scratch buffers); rows of one call are processed in parallel with OpenMP.
#ifndef PAGEDSERVE_RUNTIME_SAMPLING_SAMPLER_H_
#define PAGEDSERVE_RUNTIME_SAMPLING_SAMPLER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "runtime/common/sampling_params.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// One row of logits to sample from, i.e. one SequenceStep `s` with s.sample:
//   seq_id = s.seq_id, position = s.context_len(), num_samples = s.num_samples,
//   and params, sample_index, token_history and prompt_len from the worker's
//   mirror of the sequence (runtime/common/step_plan_mirror.h: set when it
//   started, copied from s.fork_from when a sibling is forked).
struct SamplerRow {
  SeqId seq_id = 0;                        // copied into every SampledToken
  const SamplingParams* params = nullptr;  // not owned; required
  // Prompt tokens followed by the output tokens generated so far (the step's fed
  // tokens included). Penalties read it; it is not owned.
  std::span<const int32_t> token_history;
  int32_t prompt_len = 0;  // first prompt_len entries are the prompt
  // Position of the token being sampled = SequenceStep::context_len(). Part of the
  // seeded stream's key.
  int64_t position = 0;
  int32_t sample_index = 0;  // draw j uses sample_index + j
  int32_t num_samples = 1;   // SequenceStep::num_samples
  // Structured output: empty = every token allowed; else bit (i & 63) of word
  // i / 64 set = token i allowed (runtime/grammar/token_mask.h); tokens past
  // the span are not allowed. Not owned. Logprobs stay raw (unmasked).
  std::span<const uint64_t> allowed_tokens;
};

// The distribution a row is drawn from after steps 1-6: surviving token ids and
// their probabilities (renormalized over the survivors, summing to 1), sorted by
// probability descending, ties to the lowest id. A greedy row has one entry with
// probability 1. Exposed for tests and debugging.
struct ProcessedDistribution {
  std::vector<int32_t> token_ids;
  std::vector<double> probs;
};

class Sampler {
 public:
  // vocab_size: the logits row length (the model's LM-head width), >= 1.
  explicit Sampler(int32_t vocab_size);

  int32_t vocab_size() const { return vocab_size_; }

  // A row whose logits cannot be sampled (Sample's `failures`).
  struct RowFailure {
    size_t row = 0;       // index into rows
    absl::Status status;  // InvalidArgument, naming the row and the cause
  };

  // logits: row-major fp32 [rows.size(), vocab_size]. Returns, per row in order,
  // num_samples SampledTokens (seq_id from the row). logprob and the top lists are
  // filled only when params->logprobs >= 0 (top lists when >= 1).
  //
  // failures: null = any error fails the call (the list below). Not null = a
  // row whose logits cannot be sampled (a NaN or +inf logit, all -inf, no
  // finite logit the structured-output mask allows, or all -inf after the
  // min_tokens / bad_words masks) does not: its num_samples entries get
  // token_id kNoToken and {row, error} is appended (a row at most once); the
  // other rows are sampled as usual (what they draw does not depend on the failed
  // row). Malformed rows (the other errors) fail the call either way.
  absl::StatusOr<std::vector<SampledToken>> Sample(std::span<const float> logits,
                                                   std::span<const SamplerRow> rows,
                                                   std::vector<RowFailure>* failures = nullptr);

  // Steps 1-6 for one row (no randomness involved).
  absl::StatusOr<ProcessedDistribution> Process(std::span<const float> logits_row,
                                                const SamplerRow& row) const;

  // Scores `token` in one raw logits row (prompt logprobs, SequenceStep::
  // prompt_logprobs): its log-softmax (fp32 exp, fp64 sum, as the sampled
  // tokens' logprobs), rank (1 + the number of ids whose logit is larger) and
  // the top `top_n` (clamped to the row; logprob descending, ties to the
  // lower id). seq_id and position are left 0. Requires 0 <= token <
  // row.size() and a non-empty row (the worker checks).
  static PromptLogprob ScoreToken(std::span<const float> row, int32_t token, int top_n);

  // The 64-bit key of the seeded stream for (seed, sample_index, position): three
  // rounds of SplitMix64 (Steele et al. 2014, the finalizer of java.util.SplittableRandom).
  static uint64_t StreamKey(uint64_t seed, int64_t sample_index, int64_t position);

  // The uniform double in [0, 1) that a seeded row's draw uses: the top 53 bits of
  // the first output of std::mt19937_64(StreamKey(...)), times 2^-53.
  static double SeededUniform(uint64_t seed, int64_t sample_index, int64_t position);

 private:
  int32_t vocab_size_;
  absl::BitGen unseeded_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_SAMPLING_SAMPLER_H_
