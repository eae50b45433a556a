// Python's text forms of values: str() (what {{ value }} prints), repr() (the
// items of a printed list or dict), json.dumps (Hugging Face's tojson filter),
// printf-style `%` and str.format.
#ifndef PAGEDSERVE_RUNTIME_CHAT_PY_FORMAT_H_
#define PAGEDSERVE_RUNTIME_CHAT_PY_FORMAT_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

// repr(float): the shortest digits that round-trip, fixed notation for
// exponents in [-4, 16), else d.ddde+XX ("1e+16", "1e-05", "0.1", "2.0").
std::string FloatRepr(double d);
// repr(str): quotes and escapes as CPython.
std::string StringRepr(std::string_view s);
std::string PyRepr(const Value& v);
// markupsafe.escape of a plain string: & < > " ' as entities.
std::string HtmlEscape(std::string_view s);
// str(v): a string as is, None as "None", an undefined as "".
std::string PyStr(const Value& v);

// json.dumps(v, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
struct JsonOptions {
  std::optional<std::string> indent;  // the text of one level; nullopt: one line
  std::string item_separator = ", ";  // Python's default; ',' when indent is set
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};
// InvalidArgument for a value JSON cannot hold (undefined, namespace,
// function), as Python's TypeError.
absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options);

// format % args (args: a tuple, a dict for %(name)s, or one value).
absl::StatusOr<std::string> PercentFormat(std::string_view format, const Value& args);
// Markup % args (markupsafe): the arguments are HTML-escaped first; the result is safe.
absl::StatusOr<std::string> MarkupPercentFormat(std::string_view format, const Value& args);
// format.format(*positional, **keywords).
absl::StatusOr<std::string> StrFormat(std::string_view format, const CallArgs& args);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_PY_FORMAT_H_
