#include "runtime/common/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pagedserve {

namespace {

constexpr int kMaxN = 64;
constexpr int kMaxLogprobs = 20;
constexpr float kMaxPenalty = 2.0f;

absl::Status Bad(absl::string_view field, const std::string& range, auto value) {
  return absl::InvalidArgumentError(
      absl::StrCat(field, " must be ", range, ", got ", value));
}

}  // namespace

absl::Status SamplingParams::Validate() const {
  if (n < 1 || n > kMaxN) return Bad("n", absl::StrCat("in [1, ", kMaxN, "]"), n);
  if (max_tokens < 1) return Bad("max_tokens", ">= 1", max_tokens);
  // Written as !(x >= lo) so that NaN is rejected too.
  if (!(temperature >= 0.0f) || !std::isfinite(temperature)) {
    return Bad("temperature", "a finite number >= 0", temperature);
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return Bad("top_p", "in (0, 1]", top_p);
  if (top_k != -1 && top_k < 1) return Bad("top_k", "-1 (disabled) or >= 1", top_k);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) return Bad("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || !std::isfinite(repetition_penalty)) {
    return Bad("repetition_penalty", "a finite number > 0", repetition_penalty);
  }
  if (!(presence_penalty >= -kMaxPenalty && presence_penalty <= kMaxPenalty)) {
    return Bad("presence_penalty", "in [-2, 2]", presence_penalty);
  }
  if (!(frequency_penalty >= -kMaxPenalty && frequency_penalty <= kMaxPenalty)) {
    return Bad("frequency_penalty", "in [-2, 2]", frequency_penalty);
  }
  if (logprobs < -1 || logprobs > kMaxLogprobs) {
    return Bad("logprobs", absl::StrCat("in [-1, ", kMaxLogprobs, "]"), logprobs);
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("stop[", i, "] must be a non-empty string"));
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("stop_token_ids[", i, "] must be >= 0, got ", stop_token_ids[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
