#include "runtime/common/field_error.h"

#include <cstdio>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {
absl::string_view Url() { return {kFieldPayloadUrl.data(), kFieldPayloadUrl.size()}; }
}  // namespace

absl::Status FieldError(absl::string_view field, absl::string_view message, absl::StatusCode code) {
  absl::Status s(code, message);
  s.SetPayload(Url(), absl::Cord(field));
  return s;
}

std::string FieldOf(const absl::Status& status) {
  const auto field = status.GetPayload(Url());  // absl::optional<absl::Cord>
  return field ? std::string(*field) : std::string();
}

absl::Status ValidateVisibleAscii(absl::string_view field, std::string_view value,
                                  size_t max_bytes) {
  if (value.empty()) return FieldError(field, absl::StrCat(field, " must be a non-empty string"));
  if (value.size() > max_bytes) {
    return FieldError(field, absl::StrCat(field, " is ", value.size(), " bytes; at most ",
                                          max_bytes, " are allowed"));
  }
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x21 || c > 0x7E) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", c);
      return FieldError(
          field,
          absl::StrCat(field, " byte ", i, " is ", hex,
                       "; only visible ASCII characters (0x21..0x7E, e.g. base64url) are allowed"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
