#include "tests/chat/chat_fuzz_entry.h"

#include <ctime>
#include <string_view>

#include "nlohmann/json.hpp"
#include "runtime/chat/json_value.h"
#include "runtime/chat/template.h"
#include "runtime/common/json_limits.h"

namespace pagedserve::chat {
namespace {

constexpr const char* kDefaultVariables = R"({
  "messages": [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hi <b>&</b> \u00e9\u4e2d"},
    {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "id": "c1",
      "function": {"name": "f", "arguments": {"x": [1, 2.5, null, true]}}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "{\"ok\": 1}"},
    {"role": "user", "content": "  bye\n"}],
  "tools": [{"type": "function", "function": {"name": "f", "description": "d",
    "parameters": {"type": "object", "properties": {"x": {"type": "array", "items": {"type": "number"}}},
                   "required": ["x"]}}}],
  "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})";

Dict Variables(std::string_view json_text) {
  nlohmann::ordered_json json;
  JsonLimits limits;
  limits.max_depth = 16;
  limits.max_string_bytes = 4096;
  limits.max_array_elements = 256;
  if (!json_text.empty() && CheckJsonText(json_text, limits).ok()) {
    json = nlohmann::ordered_json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  }
  if (!json.is_object()) json = nlohmann::ordered_json::parse(kDefaultVariables);
  return FromJson(json).dict();
}

std::tm FixedClock() {
  std::tm tm{};
  tm.tm_year = 125;
  tm.tm_mon = 2;
  tm.tm_mday = 7;
  tm.tm_hour = 14;
  tm.tm_wday = 5;
  tm.tm_yday = 65;
  return tm;
}

std::string CheckError(const absl::Status& status, std::string_view what) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kFailedPrecondition: break;
    default: return std::string(what) + " failed with an unexpected code: " + status.ToString();
  }
  if (status.message().empty()) return std::string(what) + " failed without a message";
  return "";
}

}  // namespace

std::string ChatTemplateFuzzOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string_view json = nul == std::string_view::npos ? "" : input.substr(nul + 1);

  ParseOptions parse;
  parse.max_nesting = 48;
  absl::StatusOr<Template> tmpl = Template::Parse(source, parse);
  if (!tmpl.ok()) return CheckError(tmpl.status(), "Parse");

  RenderLimits limits;
  limits.max_output_bytes = 64 << 10;
  limits.max_work_bytes = 4 << 20;
  limits.max_loop_iterations = 20000;
  limits.max_call_depth = 24;
  limits.max_eval_depth = 256;
  limits.max_value_depth = 48;
  const Dict vars = Variables(json);
  const absl::StatusOr<std::string> first = tmpl->Render(vars, limits, FixedClock);
  const absl::StatusOr<std::string> second = tmpl->Render(vars, limits, FixedClock);
  if (first.ok() != second.ok() || (first.ok() && *first != *second) ||
      (!first.ok() && first.status() != second.status())) {
    return "two renders of one template differ";
  }
  if (!first.ok()) return CheckError(first.status(), "Render");
  if (first->size() > limits.max_output_bytes) return "the output is longer than max_output_bytes";
  return "";
}

}  // namespace pagedserve::chat
