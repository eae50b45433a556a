#include "runtime/grammar/compile.h"

#include "nlohmann/json.hpp"
#include "runtime/grammar/gbnf.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/regex.h"
#include "runtime/grammar/tool_call_grammar.h"

namespace pagedserve::grammar {
namespace {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileChoice(const std::string& spec) {
  nlohmann::json list = nlohmann::json::parse(spec, nullptr, /*allow_exceptions=*/false);
  if (list.is_discarded() || !list.is_array() || list.empty()) {
    return absl::InvalidArgumentError("choice: must be a non-empty array of strings");
  }
  GrammarBuilder b;
  std::vector<GrammarBuilder::Seq> alts;
  for (const auto& item : list) {
    if (!item.is_string())
      return absl::InvalidArgumentError("choice: every entry must be a string");
    GrammarBuilder::Seq s;
    b.AppendLiteral(s, item.get<std::string>());
    alts.push_back(std::move(s));
  }
  return b.Build(b.Alternatives(alts));
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileWholeRegex(const std::string& spec) {
  GrammarBuilder b;
  auto seq = CompileRegex(b, spec, CharEncoding::kRaw, /*search=*/false);
  if (!seq.ok()) return seq.status();
  const int32_t rule = b.Alternatives({*seq});
  return b.Build(rule);
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileKind(const StructuredOutput& c) {
  if (c.spec.size() > StructuredOutput::kMaxSpecBytes) {
    return absl::InvalidArgumentError("constraint too large: over 256 KiB of text");
  }
  switch (c.kind) {
    case StructuredOutput::Kind::kJsonSchema: return CompileJsonSchema(c.spec);
    case StructuredOutput::Kind::kJsonObject: return CompileJsonObject();
    case StructuredOutput::Kind::kRegex: return CompileWholeRegex(c.spec);
    case StructuredOutput::Kind::kChoice: return CompileChoice(c.spec);
    case StructuredOutput::Kind::kGrammar: return CompileGbnf(c.spec);
    case StructuredOutput::Kind::kToolCalls: return CompileToolCalls(c.spec);
    case StructuredOutput::Kind::kNone: break;
  }
  return absl::InvalidArgumentError("no constraint to compile");
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileConstraint(const StructuredOutput& c) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = CompileKind(c);
  if (g.ok() && (*g)->initial().dead()) {
    return absl::InvalidArgumentError("the constraint matches no output at all");
  }
  return g;
}

}  // namespace pagedserve::grammar
