#include "runtime/frontend/request_fields.h"

#include <string>

#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"

namespace pagedserve {

absl::StatusOr<std::optional<uint64_t>> SeedFromJson(const nlohmann::json& seed) {
  // nlohmann keeps integers beyond both 64-bit ranges as floating point.
  if (!seed.is_number_integer()) {
    std::string shown = seed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    return FieldError("seed",
                      "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got " + shown);
  }
  if (seed.is_number_unsigned()) return std::optional<uint64_t>(seed.get<uint64_t>());
  const int64_t v = seed.get<int64_t>();
  if (v == -1) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(v));
}

}  // namespace pagedserve
