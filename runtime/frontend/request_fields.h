// Request fields whose rules every front end shares (the OpenAI HTTP API and
// ZeroMQ protocol v1), read from the request's JSON. The chat messages have
// their own pair (chat_messages.h); the ranges of the sampling fields are
// SamplingParams::Validate's.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace pagedserve {

// The largest magnitude any floating-point sampling field may have on either
// front end (temperature, top_p, min_p, penalties, length_penalty); their own
// ranges are SamplingParams::Validate's. Beyond it a value is refused as out of
// range before it is rounded to float.
inline constexpr double kMaxSamplingMagnitude = 1e6;

// "seed": any JSON integer in [-2^63, 2^64). -1 means no seed (vLLM's
// convention: sampling is then not reproducible), giving nullopt; another
// negative value is taken modulo 2^64 (OpenAI accepts any integer). Errors:
// InvalidArgument naming the field "seed" (field_error.h) for a non-integer
// or an integer out of that range.
absl::StatusOr<std::optional<uint64_t>> SeedFromJson(const nlohmann::json& seed);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_
