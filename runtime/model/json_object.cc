#include "runtime/model/json_object.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {

// The non-JSON literal at `byte` (1-based, nlohmann's parse_error::byte, the
// position of the last byte read), if one starts there or just before.
std::string_view NonJsonLiteralAt(std::string_view text, size_t byte) {
  for (const std::string_view lit : {"-Infinity", "Infinity", "NaN"}) {
    for (size_t back = 0; back <= lit.size() && back < byte; ++back) {
      const size_t at = byte - 1 - back;
      if (at < text.size() && text.substr(at).starts_with(lit)) return lit;
    }
  }
  return {};
}

}  // namespace

absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view text, std::string_view source_sv) {
  using nlohmann::json;
  const absl::string_view source(source_sv.data(), source_sv.size());
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    const std::string_view lit = NonJsonLiteralAt(text, e.byte);
    if (!lit.empty())
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": not valid JSON: ", std::string(lit), " near byte ", e.byte,
          " (JSON has no NaN or Infinity; Python's json.dump writes them for float('nan') and "
          "float('inf'): replace the value with a number or null)"));
    std::string what = e.what();
    if (const size_t pos = what.find("] "); pos != std::string::npos) what = what.substr(pos + 2);
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", what));
  } catch (const json::exception& e) {  // out_of_range: a number beyond double
    return absl::InvalidArgumentError(absl::StrCat(source, ": not valid JSON: ", e.what()));
  }
  if (!j.is_object())
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the top level must be a JSON object, got ", j.type_name()));
  return j;
}

}  // namespace pagedserve
