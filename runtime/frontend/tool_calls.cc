#include "runtime/frontend/tool_calls.h"

#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/json_limits.h"

namespace pagedserve {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralMarker = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kPythonTag = "<|python_tag|>";

size_t SkipSpace(std::string_view s, size_t pos) {
  while (pos < s.size() && (s[pos] == ' ' || s[pos] == '\n' || s[pos] == '\t' || s[pos] == '\r'))
    ++pos;
  return pos;
}

// The end (one past the closing bracket) of the JSON object or array that
// starts at s[pos], scanning strings and escapes; npos when it does not close.
size_t JsonValueEnd(std::string_view s, size_t pos) {
  if (pos >= s.size() || (s[pos] != '{' && s[pos] != '[')) return std::string_view::npos;
  int depth = 0;
  bool in_string = false;
  for (size_t i = pos; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// JSON text within the limits every front end applies, parsed keeping key order.
std::optional<ordered_json> ParseJson(std::string_view text) {
  if (!CheckJsonText(text).ok()) return std::nullopt;
  try {
    return ordered_json::parse(text.begin(), text.end());
  } catch (const ordered_json::exception&) {
    return std::nullopt;
  }
}

// {"name": string, "arguments" (or "parameters"): object} -> a call.
std::optional<ToolCall> CallOf(const ordered_json& j) {
  if (!j.is_object()) return std::nullopt;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get_ref<const std::string&>().empty())
    return std::nullopt;
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall call;
  call.name = name->get<std::string>();
  if (args == j.end() || args->is_null()) {
    call.arguments = "{}";
  } else if (args->is_object()) {
    call.arguments = args->dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  } else {
    return std::nullopt;
  }
  call.id = NewToolCallId();
  return call;
}

// One JSON value at s[pos] (object: one call; array: calls); advances pos.
bool ReadCalls(std::string_view s, size_t* pos, std::vector<ToolCall>* out) {
  const size_t end = JsonValueEnd(s, *pos);
  if (end == std::string_view::npos) return false;
  std::optional<ordered_json> j = ParseJson(s.substr(*pos, end - *pos));
  if (!j.has_value()) return false;
  *pos = end;
  if (j->is_array()) {
    if (j->empty()) return false;
    for (const ordered_json& e : *j) {
      std::optional<ToolCall> c = CallOf(e);
      if (!c.has_value()) return false;
      out->push_back(*std::move(c));
    }
    return true;
  }
  std::optional<ToolCall> c = CallOf(*j);
  if (!c.has_value()) return false;
  out->push_back(*std::move(c));
  return true;
}

bool ParseHermes(std::string_view text, ParsedToolCalls* out) {
  size_t at = text.find(kHermesOpen);
  if (at == std::string_view::npos) return false;
  out->content = std::string(text.substr(0, at));
  while (at != std::string_view::npos) {
    size_t pos = SkipSpace(text, at + kHermesOpen.size());
    if (!ReadCalls(text, &pos, &out->calls)) return false;
    pos = SkipSpace(text, pos);
    if (text.substr(pos, kHermesClose.size()) == kHermesClose) {
      pos = SkipSpace(text, pos + kHermesClose.size());
    } else if (pos != text.size()) {
      return false;  // an unclosed block is accepted only at the end (vLLM)
    }
    if (pos == text.size()) return true;
    if (text.substr(pos, kHermesOpen.size()) != kHermesOpen) return false;
    at = pos;
  }
  return true;
}

bool ParseLlama3(std::string_view text, ParsedToolCalls* out) {
  size_t pos = SkipSpace(text, 0);
  if (text.substr(pos, kPythonTag.size()) == kPythonTag)
    pos = SkipSpace(text, pos + kPythonTag.size());
  if (pos >= text.size() || text[pos] != '{') return false;
  while (true) {
    if (!ReadCalls(text, &pos, &out->calls)) return false;
    pos = SkipSpace(text, pos);
    if (pos == text.size()) return true;
    if (text[pos] != ';') return false;
    pos = SkipSpace(text, pos + 1);
  }
}

bool ParseMistral(std::string_view text, ParsedToolCalls* out) {
  size_t at = text.find(kMistralMarker);
  if (at == std::string_view::npos) return false;
  out->content = std::string(text.substr(0, at));
  size_t pos = at;
  while (pos < text.size()) {
    if (text.substr(pos, kMistralMarker.size()) != kMistralMarker) return false;
    pos = SkipSpace(text, pos + kMistralMarker.size());
    if (pos < text.size() && text[pos] == '[') {
      if (!ReadCalls(text, &pos, &out->calls)) return false;
    } else {
      // v11: NAME[ARGS]{...}
      const size_t args = text.find(kMistralArgs, pos);
      if (args == std::string_view::npos || args == pos) return false;
      ordered_json call = {{"name", std::string(text.substr(pos, args - pos))}};
      pos = SkipSpace(text, args + kMistralArgs.size());
      const size_t end = JsonValueEnd(text, pos);
      if (end == std::string_view::npos) return false;
      std::optional<ordered_json> a = ParseJson(text.substr(pos, end - pos));
      if (!a.has_value()) return false;
      call["arguments"] = *std::move(a);
      std::optional<ToolCall> c = CallOf(call);
      if (!c.has_value()) return false;
      out->calls.push_back(*std::move(c));
      pos = end;
    }
    pos = SkipSpace(text, pos);
  }
  return true;
}

// Longest suffix of text that is a proper prefix of marker.
size_t PartialMarker(std::string_view text, std::string_view marker) {
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == marker.substr(0, k)) return k;
  }
  return 0;
}

// ---- streaming: partial calls ----

// The end of the JSON string token that starts at s[pos] (a quote), one past
// its closing quote; npos when it does not close yet.
size_t StringEnd(std::string_view s, size_t pos) {
  for (size_t i = pos + 1; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

// The compact dump of one complete JSON token (string, number, literal) as it
// appears inside the final dump; nullopt when it is not valid JSON.
std::optional<std::string> DumpToken(std::string_view token) {
  std::optional<ordered_json> j = ParseJson(token);
  if (!j.has_value() || j->is_object() || j->is_array()) return std::nullopt;
  return j->dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

// The dump of an unfinished string token s[pos..] without its closing quote:
// the raw text cut before an unfinished escape, an unpaired \uD800-\uDBFF
// escape or an unfinished UTF-8 sequence (the string may end differently only
// after that point).
std::optional<std::string> DumpOpenString(std::string_view s, size_t pos) {
  size_t cut = pos + 1;  // raw text [pos, cut) is safe
  for (size_t i = pos + 1; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    if (c == '\\') {
      if (i + 1 >= s.size()) break;
      len = s[i + 1] == 'u' ? 6 : 2;
      if (i + len > s.size()) break;
      if (len == 6) {
        const std::string_view hex = s.substr(i + 2, 4);
        const bool high = (hex[0] == 'd' || hex[0] == 'D') &&
                          std::string_view("89abAB").find(hex[1]) != std::string_view::npos;
        if (high) {  // a pair: \uD8xx\uDCxx
          if (i + 12 > s.size()) break;
          len = 12;
        }
      }
    } else if (c >= 0x80) {
      len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      if (i + len > s.size()) break;
    }
    i += len;
    cut = i;
  }
  std::optional<std::string> d = DumpToken(std::string(s.substr(pos, cut - pos)) + "\"");
  if (!d.has_value()) return std::nullopt;
  d->pop_back();  // the closing quote
  return d;
}

// The fixed prefix of the dump of the JSON object that starts at s[pos] (see
// PartialToolCall); *complete when the object closed.
std::string ObjectDumpPrefix(std::string_view s, size_t pos, bool* complete) {
  std::string out;
  int depth = 0;
  *complete = false;
  for (size_t i = pos; i < s.size();) {
    const char c = s[i];
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') {
      ++i;
    } else if (c == '{' || c == '[') {
      out += c;
      ++depth;
      ++i;
    } else if (c == '}' || c == ']') {
      out += c;
      ++i;
      if (--depth == 0) {
        *complete = true;
        return out;
      }
    } else if (c == ':' || c == ',') {
      out += c;
      ++i;
    } else if (c == '"') {
      const size_t end = StringEnd(s, i);
      std::optional<std::string> d =
          end == std::string_view::npos ? DumpOpenString(s, i) : DumpToken(s.substr(i, end - i));
      if (!d.has_value()) return out;
      out += *d;
      if (end == std::string_view::npos) return out;
      i = end;
    } else {
      // A number or literal: fixed once a delimiter follows it.
      size_t end = i;
      while (end < s.size() &&
             std::string_view(" \n\t\r,:]}").find(s[end]) == std::string_view::npos)
        ++end;
      if (end == s.size()) return out;
      std::optional<std::string> d = DumpToken(s.substr(i, end - i));
      if (!d.has_value()) return out;
      out += *d;
      i = end;
    }
    if (depth == 0) return out;  // not an object
  }
  return out;
}

// The JSON string token at s[*pos] decoded, *pos past it; nullopt when it is
// not complete yet or not a string.
std::optional<std::string> ReadString(std::string_view s, size_t* pos) {
  if (*pos >= s.size() || s[*pos] != '"') return std::nullopt;
  const size_t end = StringEnd(s, *pos);
  if (end == std::string_view::npos) return std::nullopt;
  std::optional<ordered_json> j = ParseJson(s.substr(*pos, end - *pos));
  if (!j.has_value() || !j->is_string()) return std::nullopt;
  *pos = end;
  return j->get<std::string>();
}

// A call object at s[*pos] written {"name": N, "arguments"|"parameters": {...}}.
// nullopt until its name is complete (or when it is written otherwise); *end:
// one past the object once its arguments and the object closed, else npos.
std::optional<PartialToolCall> PartialCallObject(std::string_view s, size_t pos, size_t* end) {
  *end = std::string_view::npos;
  if (pos >= s.size() || s[pos] != '{') return std::nullopt;
  pos = SkipSpace(s, pos + 1);
  std::optional<std::string> key = ReadString(s, &pos);
  if (!key.has_value() || *key != "name") return std::nullopt;
  pos = SkipSpace(s, pos);
  if (pos >= s.size() || s[pos] != ':') return std::nullopt;
  pos = SkipSpace(s, pos + 1);
  std::optional<std::string> name = ReadString(s, &pos);
  if (!name.has_value() || name->empty()) return std::nullopt;
  PartialToolCall call;
  call.name = *std::move(name);
  pos = SkipSpace(s, pos);
  if (pos >= s.size() || s[pos] != ',') return call;
  pos = SkipSpace(s, pos + 1);
  key = ReadString(s, &pos);
  if (!key.has_value() || (*key != "arguments" && *key != "parameters")) return call;
  pos = SkipSpace(s, pos);
  if (pos >= s.size() || s[pos] != ':') return call;
  pos = SkipSpace(s, pos + 1);
  if (pos >= s.size() || s[pos] != '{') return call;
  call.arguments_prefix = ObjectDumpPrefix(s, pos, &call.arguments_complete);
  if (call.arguments_complete) {
    const size_t close = SkipSpace(s, JsonValueEnd(s, pos));
    if (close < s.size() && s[close] == '}') *end = close + 1;
  }
  return call;
}

// Calls one after another from s[pos]: call objects separated by `separator`
// (and white space), as long as each can be streamed.
void PartialCallList(std::string_view s, size_t pos, char separator,
                     std::vector<PartialToolCall>* out) {
  while (true) {
    size_t end = 0;
    std::optional<PartialToolCall> c = PartialCallObject(s, pos, &end);
    if (!c.has_value()) return;
    out->push_back(*std::move(c));
    if (end == std::string_view::npos) return;
    pos = SkipSpace(s, end);
    if (pos >= s.size() || s[pos] != separator) return;
    pos = SkipSpace(s, pos + 1);
  }
}

}  // namespace

std::string NewToolCallId() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  const uint64_t hi = gen(), lo = gen();
  std::string id =
      absl::StrCat("call_", absl::Hex(hi, absl::kZeroPad16), absl::Hex(lo, absl::kZeroPad16));
  id.resize(5 + 24);
  return id;
}

std::vector<PartialToolCall> StreamableToolCalls(ToolCallFormat format, std::string_view text) {
  std::vector<PartialToolCall> out;
  if (format == ToolCallFormat::kLlama3Json) {
    size_t pos = SkipSpace(text, 0);
    if (text.substr(pos, kPythonTag.size()) == kPythonTag)
      pos = SkipSpace(text, pos + kPythonTag.size());
    PartialCallList(text, pos, ';', &out);
  } else if (format == ToolCallFormat::kHermes) {
    for (size_t at = text.find(kHermesOpen); at != std::string_view::npos;) {
      size_t end = 0;
      std::optional<PartialToolCall> c =
          PartialCallObject(text, SkipSpace(text, at + kHermesOpen.size()), &end);
      if (!c.has_value()) break;
      out.push_back(*std::move(c));
      if (end == std::string_view::npos) break;
      size_t pos = SkipSpace(text, end);
      if (text.substr(pos, kHermesClose.size()) != kHermesClose) break;
      pos = SkipSpace(text, pos + kHermesClose.size());
      at = text.substr(pos, kHermesOpen.size()) == kHermesOpen ? pos : std::string_view::npos;
    }
  } else {
    for (size_t pos = text.find(kMistralMarker); pos != std::string_view::npos;) {
      pos = SkipSpace(text, pos + kMistralMarker.size());
      if (pos >= text.size()) break;
      if (text[pos] == '[') {  // an array of call objects
        PartialCallList(text, SkipSpace(text, pos + 1), ',', &out);
        break;
      }
      const size_t args = text.find(kMistralArgs, pos);  // v11: NAME[ARGS]{...}
      if (args == std::string_view::npos || args == pos) break;
      PartialToolCall c;
      c.name = std::string(text.substr(pos, args - pos));
      pos = SkipSpace(text, args + kMistralArgs.size());
      if (pos < text.size() && text[pos] == '{')
        c.arguments_prefix = ObjectDumpPrefix(text, pos, &c.arguments_complete);
      const bool complete = c.arguments_complete;
      out.push_back(std::move(c));
      if (!complete) break;
      pos = SkipSpace(text, JsonValueEnd(text, pos));
      if (text.substr(pos, kMistralMarker.size()) != kMistralMarker) break;
    }
  }
  return out;
}

absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::kHermes;
  if (name == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (name == "mistral") return ToolCallFormat::kMistral;
  return absl::InvalidArgumentError(absl::StrCat("unknown tool-call parser '", std::string(name),
                                                 "' (known: hermes, llama3_json, mistral)"));
}

const char* ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kHermes: break;
  }
  return "hermes";
}

ToolCallFormat ToolCallFormatOfTemplate(std::string_view source) {
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralMarker) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kPythonTag) != std::string_view::npos ||
      source.find("ipython") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kHermes;
}

ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text) {
  ParsedToolCalls out;
  bool ok = false;
  switch (format) {
    case ToolCallFormat::kHermes: ok = ParseHermes(text, &out); break;
    case ToolCallFormat::kLlama3Json: ok = ParseLlama3(text, &out); break;
    case ToolCallFormat::kMistral: ok = ParseMistral(text, &out); break;
  }
  if (!ok || out.calls.empty()) {
    out.calls.clear();
    out.content = std::string(text);
  }
  return out;
}

size_t ToolCallFreeContentPrefix(ToolCallFormat format, std::string_view text) {
  if (format == ToolCallFormat::kLlama3Json) {
    const std::string_view rest = text.substr(SkipSpace(text, 0));
    if (rest.empty() || rest[0] == '{' || kPythonTag.substr(0, rest.size()) == rest ||
        rest.substr(0, kPythonTag.size()) == kPythonTag) {
      return 0;
    }
    return text.size();
  }
  const std::string_view marker = format == ToolCallFormat::kHermes ? kHermesOpen : kMistralMarker;
  const size_t at = text.find(marker);
  if (at != std::string_view::npos) return at;
  return text.size() - PartialMarker(text, marker);
}

absl::StatusOr<StructuredOutput> ToolChoiceConstraint(ToolCallFormat format,
                                                      std::string_view tools_json,
                                                      std::string_view function, bool parallel) {
  const ordered_json tools = ordered_json::parse(tools_json, nullptr, /*allow_exceptions=*/false);
  ordered_json spec_tools = ordered_json::array();
  if (tools.is_array()) {
    for (const ordered_json& t : tools) {
      auto fn_it = t.is_object() ? t.find("function") : t.end();
      if (fn_it == t.end() || !fn_it->is_object()) continue;
      const ordered_json& fn = *fn_it;
      auto name_it = fn.find("name");
      if (name_it == fn.end() || !name_it->is_string()) continue;
      const std::string& name = name_it->get_ref<const std::string&>();
      if (!function.empty() && name != function) continue;
      spec_tools.push_back(
          {{"name", name}, {"parameters", fn.value("parameters", ordered_json())}});
      if (!function.empty()) break;
    }
  }
  if (spec_tools.empty()) {
    return absl::InvalidArgumentError(
        function.empty() ? std::string("'tool_choice' \"required\" needs 'tools'")
                         : absl::StrCat("'tool_choice' names the function '", std::string(function),
                                        "', which is not one of 'tools'"));
  }
  const ordered_json spec = {{"format", ToolCallFormatName(format)},
                             {"tools", std::move(spec_tools)},
                             {"parallel", function.empty() && parallel}};
  return StructuredOutput{StructuredOutput::Kind::kToolCalls,
                          spec.dump(-1, ' ', false, ordered_json::error_handler_t::replace)};
}

}  // namespace pagedserve
