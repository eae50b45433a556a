#include "runtime/common/field_error.h"

#include "absl/strings/cord.h"

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

}  // namespace pagedserve
