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

std::string NewCallId() {
  thread_local std::mt19937_64 gen(std::random_device{}());
  const uint64_t hi = gen(), lo = gen();
  std::string id =
      absl::StrCat("call_", absl::Hex(hi, absl::kZeroPad16), absl::Hex(lo, absl::kZeroPad16));
  id.resize(5 + 24);
  return id;
}

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
  call.id = NewCallId();
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

}  // namespace

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
