// Errors about one field of a request, typed: an absl::Status whose payload
// names the field, so that every front end reports it (OpenAI's error `param`,
// the request log) without parsing message text.
//
// Field names are the engine's: those of SamplingParams (n, max_tokens,
// temperature, top_p, top_k, min_p, repetition_penalty, presence_penalty,
// frequency_penalty, logprobs, stop, stop_token_ids, best_of, length_penalty,
// early_stopping, use_beam_search, logit_bias, min_tokens, bad_words,
// skip_special_tokens, include_stop_str_in_output), "prompt" (the prompt's token ids, length
// and admission) and "cache_salt". A front end maps them to its own names
// (e.g. the OpenAI chat endpoint reports "prompt" as "messages").
#ifndef PAGEDSERVE_RUNTIME_COMMON_FIELD_ERROR_H_
#define PAGEDSERVE_RUNTIME_COMMON_FIELD_ERROR_H_

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pagedserve {

// The payload's type URL (absl::Status::SetPayload); its value is the field name.
inline constexpr std::string_view kFieldPayloadUrl = "type.pagedserve.dev/field";

// An InvalidArgument (or `code`) status with `message`, naming `field`.
absl::Status FieldError(absl::string_view field, absl::string_view message,
                        absl::StatusCode code = absl::StatusCode::kInvalidArgument);

// The field a status names; "" when it names none (also for OK).
std::string FieldOf(const absl::Status& status);

// A request string echoed into logs, responses or cache keys (cache_salt,
// request_id): 1..max_bytes bytes, each visible ASCII 0x21..0x7E (base64,
// base64url, hex, UUIDs and names fit; no spaces, control bytes or
// non-ASCII, so the value is safe to show). Errors: InvalidArgument naming
// `field`: empty, the length, or the first bad byte by offset and hex value
// (never echoing the value).
absl::Status ValidateVisibleAscii(absl::string_view field, std::string_view value,
                                  size_t max_bytes);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_FIELD_ERROR_H_
