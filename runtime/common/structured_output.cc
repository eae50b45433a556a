#include "runtime/common/structured_output.h"

namespace pagedserve {

const char* StructuredOutputKindName(StructuredOutput::Kind kind) {
  switch (kind) {
    case StructuredOutput::Kind::kNone: return "none";
    case StructuredOutput::Kind::kJsonSchema: return "json";
    case StructuredOutput::Kind::kJsonObject: return "json_object";
    case StructuredOutput::Kind::kRegex: return "regex";
    case StructuredOutput::Kind::kChoice: return "choice";
    case StructuredOutput::Kind::kGrammar: return "grammar";
    case StructuredOutput::Kind::kToolCalls: return "tool_calls";
  }
  return "none";
}

std::optional<StructuredOutput::Kind> StructuredOutputKindFromName(std::string_view name) {
  for (auto k : {StructuredOutput::Kind::kNone, StructuredOutput::Kind::kJsonSchema,
                 StructuredOutput::Kind::kJsonObject, StructuredOutput::Kind::kRegex,
                 StructuredOutput::Kind::kChoice, StructuredOutput::Kind::kGrammar,
                 StructuredOutput::Kind::kToolCalls}) {
    if (name == StructuredOutputKindName(k)) return k;
  }
  return std::nullopt;
}

}  // namespace pagedserve
