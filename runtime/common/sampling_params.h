// Per-request sampling parameters, as a client gives them and as they travel in
// the step plan. Names and meanings follow vLLM's SamplingParams / OpenAI's API.
#ifndef PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_
#define PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pagedserve {

struct SamplingParams {
  int n = 1;                         // parallel samples per request, [1, 64]
  int max_tokens = 16;               // generated tokens per sample (>= 1)
  float temperature = 1.0f;          // >= 0; 0 (or < 1e-5) means greedy
  float top_p = 1.0f;                // (0, 1]
  int top_k = -1;                    // -1 (off) or >= 1
  float min_p = 0.0f;                // [0, 1]
  float repetition_penalty = 1.0f;   // > 0; 1 = off (CTRL-style, prompt + output)
  float presence_penalty = 0.0f;     // [-2, 2], OpenAI-style, output tokens
  float frequency_penalty = 0.0f;    // [-2, 2], OpenAI-style, output tokens
  std::optional<uint64_t> seed;      // per-request generator; none = nondeterministic
  std::vector<std::string> stop;     // stop strings (not included in the output)
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int logprobs = -1;                 // -1: none; 0: sampled token only; N: also top N (<= 20)

  bool operator==(const SamplingParams&) const = default;

  // True when sampling reduces to argmax.
  bool greedy() const { return temperature < 1e-5f; }

  // Checks every field against the ranges above (also: stop strings non-empty,
  // stop_token_ids >= 0, NaN rejected everywhere). Returns InvalidArgument whose
  // message names the field and the bad value, e.g. "top_p must be in (0, 1], got 1.5".
  absl::Status Validate() const;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_SAMPLING_PARAMS_H_
