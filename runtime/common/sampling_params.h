// Per-request sampling parameters, as a client gives them and as they travel in
// the step plan. Names and meanings follow vLLM's SamplingParams / OpenAI's API.
#ifndef PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_
#define PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "runtime/common/structured_output.h"

namespace pagedserve {

// Beam search's stopping rule (vLLM v0 / Hugging Face `early_stopping`):
//   kFalse  (false)   stop when beam_width hypotheses are finished and the best
//                     live beam, scored at its current length, cannot beat the
//                     worst of them (a heuristic; the default);
//   kTrue   (true)    stop as soon as beam_width hypotheses are finished;
//   kNever  ("never") the same test as kFalse but, when length_penalty > 0,
//                     scoring the best live beam at max_tokens (the canonical
//                     bound: no better hypothesis can exist when it stops).
enum class EarlyStopping { kFalse, kTrue, kNever };

struct SamplingParams {
  int n = 1;                        // parallel samples (or returned beams) per request, [1, 64]
  int max_tokens = 16;              // generated tokens per sample (>= 1)
  float temperature = 1.0f;         // >= 0; 0 (or < 1e-5) means greedy
  float top_p = 1.0f;               // (0, 1]
  int top_k = -1;                   // -1 (off) or >= 1
  float min_p = 0.0f;               // [0, 1]
  float repetition_penalty = 1.0f;  // > 0; 1 = off (CTRL-style, prompt + output)
  float presence_penalty = 0.0f;    // [-2, 2], OpenAI-style, output tokens
  float frequency_penalty = 0.0f;   // [-2, 2], OpenAI-style, output tokens
  std::optional<uint64_t> seed;     // per-request generator; none = nondeterministic
  std::vector<std::string> stop;    // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;  // -1: none; 0: sampled token only; N: also top N (<= 20)
  // vLLM `prompt_logprobs`: -1 none; N in [0, 20]: for every prompt token
  // after the first, its raw logprob given the tokens before it, its rank,
  // and the top N of that position (RequestOutput::prompt_logprobs). The
  // request then skips the prefix cache's lookup (cached tokens have no
  // logits; vLLM V1 does the same). Not with beam search.
  int prompt_logprobs = -1;

  // Beam search (vLLM v0 BeamSearchSampler / Hugging Face BeamSearchScorer;
  // the scheduler runs it, runtime/coordinator/beam_search.h). The request
  // returns the n best of beam_width() finished hypotheses, scored
  // cumulative_logprob / generated_len ** length_penalty. Requires greedy
  // semantics: temperature 0, top_p 1, top_k -1, min_p 0, no penalties, no stop
  // strings, logprobs -1 or 0, 1 <= n <= best_of <= 10.
  bool use_beam_search = false;
  int best_of = 0;              // beams (beam width); 0 = n. Only with use_beam_search
  float length_penalty = 1.0f;  // exponent of the length in the score; finite
  EarlyStopping early_stopping = EarlyStopping::kFalse;

  // Structured output (constrained decoding, runtime/grammar/): the sampler
  // allows only tokens that keep the output a prefix of the constraint's
  // language, and the end token only where the output is complete. Not with
  // beam search (Validate). The front end checks that it compiles
  // (runtime/grammar/compile.h) at admission.
  StructuredOutput structured_output;

  // --- Logit processors and output options (issue 32; vLLM's SamplingParams
  // names). The sampler applies the first three (order: runtime/sampling/sampler.h);
  // none of them may be combined with use_beam_search. ---
  // OpenAI `logit_bias`: (token id, bias) pairs, ids unique and >= 0 (the
  // front end checks them against the vocabulary), bias in [-100, 100]; the
  // bias is added to the token's logit before anything else. At most
  // kMaxLogitBias entries.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // End tokens (EOS unless ignore_eos, and stop_token_ids) are masked until
  // the sample has min_tokens output tokens; stop strings do not end it
  // earlier either (vLLM). [0, max_tokens].
  int min_tokens = 0;
  // vLLM `bad_words`: at most kMaxBadWords non-empty strings of at most
  // kMaxBadWordBytes bytes. The engine tokenizes them into
  // bad_words_token_ids (Engine::AddRequest, BadWordTokenIds); the sampler
  // reads only those.
  std::vector<std::string> bad_words;
  // The bad words as token sequences:
  // the last token of a sequence is masked when the output tokens so far end
  // with the ones before it (a one-token word is always masked). At most
  // 2 * kMaxBadWords sequences, each of 1 to kMaxBadWordTokens ids >= 0.
  std::vector<std::vector<int32_t>> bad_words_token_ids;
  // Detokenization drops special tokens (none: the engine's default, true).
  std::optional<bool> skip_special_tokens;
  // The stop string that ended a sample is kept in its text.
  bool include_stop_str_in_output = false;
  // Not a client field: the end tokens min_tokens masks, filled by the
  // scheduler (EOS unless ignore_eos, plus stop_token_ids) in the parameters
  // it sends to workers, which do not know the EOS ids.
  std::vector<int32_t> min_tokens_end_ids;

  bool operator==(const SamplingParams&) const = default;

  // True when sampling reduces to argmax.
  bool greedy() const { return temperature < 1e-5f; }
  // Live beams per step: best_of, or n when best_of is 0.
  int beam_width() const { return best_of > 0 ? best_of : n; }
  // Sequence slots the request takes while it runs: beam_width() with beam
  // search, else n.
  int max_seqs() const { return use_beam_search ? beam_width() : n; }

  // Checks every field against the ranges above (also: at most kMaxStopStrings
  // stop strings, each non-empty and at most kMaxStopStringBytes bytes (stop
  // matching runs per output token: the bound is a bound on its cost);
  // stop_token_ids >= 0, NaN rejected everywhere; the beam-search rules above,
  // and without use_beam_search: best_of 0 or n, length_penalty 1,
  // early_stopping false, as vLLM v0; structured_output: not with beam search,
  // spec at most StructuredOutput::kMaxSpecBytes). Returns InvalidArgument whose
  // message names the field and the bad value, e.g. "top_p must be in (0, 1], got 1.5",
  // and whose FieldOf payload is the field (runtime/common/field_error.h).
  absl::Status Validate() const;
  static constexpr size_t kMaxStopStrings = 16;
  static constexpr size_t kMaxStopStringBytes = 256;
  static constexpr size_t kMaxLogitBias = 1024;
  static constexpr size_t kMaxBadWords = 64;
  static constexpr size_t kMaxBadWordBytes = 256;
  static constexpr size_t kMaxBadWordTokens = 64;

 private:
  absl::Status ValidateBeamSearch() const;
  absl::Status ValidateLogitProcessors() const;
};

// "false" / "true" / "never", and back (the protocol's spelling).
const char* EarlyStoppingName(EarlyStopping e);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_
