#include "runtime/grammar/tool_call_grammar.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/json_schema.h"

namespace pagedserve::grammar {
namespace {

using json = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;

// The text around each call and between calls of one format.
struct Envelope {
  const char* args_key;  // "arguments" or "parameters"
  const char* before;    // before each call (after the opening of the list)
  const char* after;     // after each call
  const char* separator;
  const char* open;   // before the first call
  const char* close;  // after the last call
};

absl::StatusOr<Envelope> EnvelopeOf(const std::string& format) {
  if (format == "hermes")
    return Envelope{"arguments", "<tool_call>\n", "\n</tool_call>", "\n", "", ""};
  if (format == "llama3_json") return Envelope{"parameters", "", "", "; ", "", ""};
  if (format == "mistral") return Envelope{"arguments", "", "", ", ", "[TOOL_CALLS][", "]"};
  return absl::InvalidArgumentError(absl::StrCat("tool calls: unknown format '", format, "'"));
}

// The arguments' schema as JSON text: {} for none, "type": "object" added
// where the root says no type.
absl::StatusOr<std::string> ArgumentsSchema(const json& params, const std::string& who) {
  if (params.is_null()) return std::string(R"({"type":"object","additionalProperties":false})");
  if (!params.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(who, ": 'parameters' must be an object"));
  }
  json s = params;
  if (!s.contains("type") && !s.contains("$ref") && !s.contains("anyOf") && !s.contains("oneOf") &&
      !s.contains("allOf") && !s.contains("enum") && !s.contains("const")) {
    s["type"] = "object";
  }
  if (s.contains("type") && s["type"] != "object") {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": 'parameters' must describe an object (\"type\": \"object\")"));
  }
  return s.dump();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileToolCalls(std::string_view spec) {
  const json j = json::parse(spec, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      !j.contains("tools") || !j["tools"].is_array() || j["tools"].empty()) {
    return absl::InvalidArgumentError(
        "tool calls: spec must be {\"format\", \"tools\": non-empty array, \"parallel\"}");
  }
  absl::StatusOr<Envelope> env = EnvelopeOf(j["format"].get<std::string>());
  if (!env.ok()) return env.status();
  const bool parallel = j.value("parallel", true);
  GrammarBuilder b;
  std::vector<Seq> calls;
  for (size_t i = 0; i < j["tools"].size(); ++i) {
    const json& tool = j["tools"][i];
    if (!tool.is_object() || !tool.contains("name") || !tool["name"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("tools[", i, "]: needs a string 'name'"));
    }
    const std::string name = tool["name"].get<std::string>();
    const std::string who = absl::StrCat("tools[", i, "] '", name, "'");
    absl::StatusOr<std::string> schema = ArgumentsSchema(tool.value("parameters", json()), who);
    if (!schema.ok()) return schema.status();
    absl::StatusOr<int32_t> args = AddJsonSchemaRules(b, *schema);
    if (!args.ok())
      return absl::InvalidArgumentError(absl::StrCat(who, ": ", args.status().message()));
    Seq call;
    b.AppendLiteral(call, absl::StrCat(env->before, "{\"name\": ", json(name).dump(), ", \"",
                                       env->args_key, "\": "));
    call.push_back(GrammarBuilder::Ref(*args));
    b.AppendLiteral(call, absl::StrCat("}", env->after));
    calls.push_back(std::move(call));
  }
  const int32_t one = b.Alternatives(calls);
  Seq whole;
  b.AppendLiteral(whole, env->open);
  whole.push_back(GrammarBuilder::Ref(one));
  if (parallel) {
    Seq more;
    b.AppendLiteral(more, env->separator);
    more.push_back(GrammarBuilder::Ref(one));
    whole.push_back(GrammarBuilder::Ref(b.Star(more)));
  }
  b.AppendLiteral(whole, env->close);
  return b.Build(b.Alternatives({whole}));
}

}  // namespace pagedserve::grammar
