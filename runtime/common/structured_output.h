// The constraint of a request's structured output (constrained decoding), as it
// travels from a front end through SamplingParams and the step plan to the
// worker that samples: a kind and the constraint's source text. Compiled by
// runtime/grammar/compile.h (on the coordinator to validate at admission, on
// the sampling worker to mask logits).
#ifndef PAGEDSERVE_RUNTIME_COMMON_STRUCTURED_OUTPUT_H_
#define PAGEDSERVE_RUNTIME_COMMON_STRUCTURED_OUTPUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace pagedserve {

struct StructuredOutput {
  enum class Kind : uint8_t {
    kNone,        // unconstrained
    kJsonSchema,  // spec: a JSON Schema as JSON text
    kJsonObject,  // any JSON object; spec empty
    kRegex,       // spec: a regular expression the whole output must match
    kChoice,      // spec: a JSON array of strings; the output is one of them
    kGrammar,     // spec: a GBNF grammar (llama.cpp's format; runtime/grammar/gbnf.h)
    kToolCalls,   // spec: tools and format (runtime/grammar/tool_call_grammar.h);
                  // set by the front ends from tool_choice, never a request's
                  // structured_outputs key
  };
  Kind kind = Kind::kNone;
  std::string spec;

  bool active() const { return kind != Kind::kNone; }
  bool operator==(const StructuredOutput&) const = default;

  // Bound on spec's size (bytes), checked at admission.
  static constexpr size_t kMaxSpecBytes = 256 * 1024;
};

// "none", "json", "json_object", "regex", "choice" (the protocol's spelling,
// vLLM's structured_outputs keys), "tool_calls", and back (nullopt for an
// unknown name).
const char* StructuredOutputKindName(StructuredOutput::Kind kind);
std::optional<StructuredOutput::Kind> StructuredOutputKindFromName(std::string_view name);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_STRUCTURED_OUTPUT_H_
