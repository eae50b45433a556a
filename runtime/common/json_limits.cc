#include "runtime/common/json_limits.h"

#include "absl/strings/str_cat.h"

namespace pagedserve {

absl::Status CheckJsonText(std::string_view text, const JsonLimits& limits) {
  // One element (array) or member (object) counter per open level, in a
  // fixed-size stack: the depth is checked before a level is pushed.
  constexpr int kMaxTrackedDepth = 256;
  const int max_depth = limits.max_depth < kMaxTrackedDepth ? limits.max_depth : kMaxTrackedDepth;
  size_t elements[kMaxTrackedDepth];
  bool is_array[kMaxTrackedDepth];
  int depth = 0;
  bool in_string = false, escape = false;
  // The next value starts an element of the innermost array, or (a key) a
  // member of the innermost object.
  bool value_pending = false;
  size_t string_start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escape) {
        escape = false;
      } else if (c == '\\') {
        escape = true;
      } else if (c == '"') {
        in_string = false;
      } else if (i - string_start > limits.max_string_bytes) {
        return absl::InvalidArgumentError(
            absl::StrCat("a JSON string is longer than ", limits.max_string_bytes,
                         " bytes (string at byte ", string_start, ")"));
      }
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ':') continue;
    if (c == '}' || c == ']') {
      if (depth > 0) --depth;
      value_pending = false;
      continue;
    }
    if (c == ',') {
      value_pending = depth > 0;
      continue;
    }
    // `c` starts a value (or continues a number or literal, when nothing is pending).
    if (value_pending) {
      value_pending = false;
      const bool array = is_array[depth - 1];
      const size_t most = array ? limits.max_array_elements : limits.max_object_members;
      if (++elements[depth - 1] > most) {
        return absl::InvalidArgumentError(
            absl::StrCat(array ? "a JSON array has more than " : "a JSON object has more than ",
                         most, array ? " elements (at byte " : " members (at byte ", i, ")"));
      }
    }
    if (c == '"') {
      in_string = true;
      string_start = i;
    } else if (c == '{' || c == '[') {
      if (depth >= max_depth) {
        return absl::InvalidArgumentError(
            absl::StrCat("JSON nests deeper than ", max_depth, " levels (at byte ", i, ")"));
      }
      is_array[depth] = c == '[';
      elements[depth] = 0;
      ++depth;
      value_pending = true;
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
