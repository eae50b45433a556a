// Reading a model directory's JSON files (config.json, generation_config.json)
// as one JSON object, with errors that say where and why parsing stopped.
#ifndef PAGEDSERVE_RUNTIME_MODEL_JSON_OBJECT_H_
#define PAGEDSERVE_RUNTIME_MODEL_JSON_OBJECT_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pagedserve {

// Parses `text` as one JSON object. Errors (InvalidArgument, prefixed with
// `source`, e.g. the file's path): text that is not JSON, with the parser's
// message and the byte where it stopped (a NaN or Infinity literal, which
// Python's json.dump writes for float('nan') / float('inf') but JSON does not
// have, is named as such); a number beyond double; a top level that is not an
// object (its JSON type named). Thread safety: none needed (no state).
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_JSON_OBJECT_H_
