#include "runtime/common/sampling_params.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/common/field_error.h"

namespace pagedserve {

namespace {

constexpr int kMaxN = 64;
constexpr int kMaxLogprobs = 20;
constexpr float kMaxPenalty = 2.0f;
// Workers return the top 2 * beam_width logprobs per beam through the logprobs
// path, which stops at kMaxLogprobs.
constexpr int kMaxBeamWidth = kMaxLogprobs / 2;

absl::Status Bad(absl::string_view field, const std::string& range, auto value) {
  return FieldError(field, absl::StrCat(field, " must be ", range, ", got ", value));
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
  if (prompt_logprobs < -1 || prompt_logprobs > kMaxLogprobs) {
    return Bad("prompt_logprobs", absl::StrCat("in [-1, ", kMaxLogprobs, "]"), prompt_logprobs);
  }
  if (stop.size() > kMaxStopStrings) {
    return FieldError(
        "stop", absl::StrCat("stop has ", stop.size(), " strings, the limit is ", kMaxStopStrings));
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) {
      return FieldError("stop", absl::StrCat("stop[", i, "] must be a non-empty string"));
    }
    if (stop[i].size() > kMaxStopStringBytes) {
      return FieldError(
          "stop", absl::StrCat("stop[", i, "] is longer than ", kMaxStopStringBytes, " bytes"));
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    if (stop_token_ids[i] < 0) {
      return FieldError("stop_token_ids", absl::StrCat("stop_token_ids[", i, "] must be >= 0, got ",
                                                       stop_token_ids[i]));
    }
  }
  if (structured_output.active()) {
    if (use_beam_search) {
      return FieldError("structured_output", "structured output is not supported with beam search");
    }
    if (structured_output.spec.size() > StructuredOutput::kMaxSpecBytes) {
      return FieldError(
          "structured_output",
          absl::StrCat("structured output constraint of ", structured_output.spec.size(),
                       " bytes is over the limit of ", StructuredOutput::kMaxSpecBytes));
    }
  }
  if (absl::Status s = ValidateLogitProcessors(); !s.ok()) return s;
  return ValidateBeamSearch();
}

absl::Status SamplingParams::ValidateLogitProcessors() const {
  if (logit_bias.size() > kMaxLogitBias) {
    return FieldError("logit_bias", absl::StrCat("logit_bias has ", logit_bias.size(),
                                                 " entries, the limit is ", kMaxLogitBias));
  }
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto& [id, bias] = logit_bias[i];
    if (id < 0) return FieldError("logit_bias", absl::StrCat("logit_bias token id ", id, " < 0"));
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return FieldError("logit_bias", absl::StrCat("logit_bias of token ", id,
                                                   " must be in [-100, 100], got ", bias));
    }
    for (size_t j = 0; j < i; ++j) {
      if (logit_bias[j].first == id) {
        return FieldError("logit_bias", absl::StrCat("logit_bias names token ", id, " twice"));
      }
    }
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return FieldError(
        "min_tokens",
        absl::StrCat("min_tokens must be in [0, max_tokens = ", max_tokens, "], got ", min_tokens));
  }
  if (bad_words.size() > kMaxBadWords) {
    return FieldError("bad_words", absl::StrCat("bad_words has ", bad_words.size(),
                                                " words, the limit is ", kMaxBadWords));
  }
  for (size_t i = 0; i < bad_words.size(); ++i) {
    if (bad_words[i].empty() || bad_words[i].size() > kMaxBadWordBytes) {
      return FieldError("bad_words",
                        absl::StrCat("bad_words[", i, "] must be 1 to ", kMaxBadWordBytes,
                                     " bytes, got ", bad_words[i].size()));
    }
  }
  if (bad_words_token_ids.size() > 2 * kMaxBadWords) {
    return FieldError("bad_words",
                      absl::StrCat("bad_words makes ", bad_words_token_ids.size(),
                                   " token sequences, the limit is ", 2 * kMaxBadWords));
  }
  for (size_t i = 0; i < bad_words_token_ids.size(); ++i) {
    const std::vector<int32_t>& w = bad_words_token_ids[i];
    if (w.empty() || w.size() > kMaxBadWordTokens) {
      return FieldError("bad_words", absl::StrCat("bad_words[", i, "] must be 1 to ",
                                                  kMaxBadWordTokens, " tokens, got ", w.size()));
    }
    for (int32_t t : w) {
      if (t < 0) return FieldError("bad_words", absl::StrCat("bad_words[", i, "] holds id ", t));
    }
  }
  for (int32_t t : min_tokens_end_ids) {
    if (t < 0) return FieldError("min_tokens", absl::StrCat("min_tokens end id ", t, " < 0"));
  }
  if (use_beam_search) {
    const char* field = !logit_bias.empty()                                  ? "logit_bias"
                        : min_tokens > 0                                     ? "min_tokens"
                        : !bad_words.empty() || !bad_words_token_ids.empty() ? "bad_words"
                                                                             : nullptr;
    if (field != nullptr) {
      return FieldError(field, absl::StrCat(field, " is not supported with use_beam_search"));
    }
  }
  return absl::OkStatus();
}

absl::Status SamplingParams::ValidateBeamSearch() const {
  if (!std::isfinite(length_penalty))
    return Bad("length_penalty", "a finite number", length_penalty);
  if (!use_beam_search) {
    if (best_of != 0 && best_of != n) {
      return FieldError("best_of",
                        absl::StrCat("best_of (", best_of, ") different from n (", n,
                                     ") requires use_beam_search: best-of-n sampling is not "
                                     "supported"));
    }
    if (length_penalty != 1.0f) {
      return FieldError("length_penalty",
                        absl::StrCat("length_penalty must be 1 when use_beam_search is false, got ",
                                     length_penalty));
    }
    if (early_stopping != EarlyStopping::kFalse) {
      return FieldError("early_stopping",
                        "early_stopping must be false when use_beam_search is false");
    }
    return absl::OkStatus();
  }
  // `field`: the field the rule is about (the first one the message names).
  auto bad = [](absl::string_view field, auto&&... parts) {
    return FieldError(field, absl::StrCat(parts..., " with use_beam_search"));
  };
  if (best_of < 0) return bad("best_of", "best_of must be >= 1 (or 0 for n), got ", best_of);
  if (best_of != 0 && best_of < n)
    return bad("n", "n (", n, ") must be <= best_of (", best_of, ")");
  if (beam_width() > kMaxBeamWidth) {
    return bad("best_of", "best_of (the beam width, n when unset) must be <= ", kMaxBeamWidth,
               ", got ", beam_width());
  }
  if (!greedy()) return bad("temperature", "temperature must be 0, got ", temperature);
  if (top_p != 1.0f) return bad("top_p", "top_p must be 1, got ", top_p);
  if (top_k != -1) return bad("top_k", "top_k must be -1, got ", top_k);
  if (min_p != 0.0f) return bad("min_p", "min_p must be 0, got ", min_p);
  if (repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f) {
    const char* field = repetition_penalty != 1.0f ? "repetition_penalty"
                        : presence_penalty != 0.0f ? "presence_penalty"
                                                   : "frequency_penalty";
    return bad(field,
               "repetition_penalty, presence_penalty and frequency_penalty are not supported");
  }
  if (!stop.empty()) return bad("stop", "stop strings are not supported (stop_token_ids are)");
  if (logprobs > 0) {
    return bad("logprobs", "logprobs must be -1 or 0 (top alternatives are not returned), got ",
               logprobs);
  }
  if (prompt_logprobs >= 0) {
    return bad("prompt_logprobs", "prompt_logprobs is not supported, got ", prompt_logprobs);
  }
  return absl::OkStatus();
}

const char* EarlyStoppingName(EarlyStopping e) {
  switch (e) {
    case EarlyStopping::kTrue: return "true";
    case EarlyStopping::kNever: return "never";
    case EarlyStopping::kFalse: break;
  }
  return "false";
}

}  // namespace pagedserve
