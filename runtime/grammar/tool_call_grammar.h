// The grammar of a chat model's tool calls (OpenAI `tool_choice` "required" or
// a named function): the output is one or more calls, in the model's own
// tool-call format, to one of the given functions, with arguments valid for
// that function's `parameters` JSON Schema (runtime/grammar/json_schema.h:
// compact JSON, members in schema order). The frontend's parsers
// (runtime/frontend/tool_calls.h) read every sentence of this grammar back as
// the same calls, so a constrained tool call always parses.
//
// spec (StructuredOutput::Kind::kToolCalls): JSON text
//   {"format": "hermes" | "llama3_json" | "mistral",
//    "tools": [{"name": N, "parameters": schema or null}, ...],   (non-empty)
//    "parallel": bool}                   true: one or more calls; false: one
// Sentences, with CALL = {"name": "N", "arguments": ARGS} (llama3_json:
// "parameters" instead of "arguments") and ARGS an instance of N's schema:
//   hermes       <tool_call>\nCALL\n</tool_call>  (parallel: joined by "\n")
//   llama3_json  CALL                              (parallel: joined by "; ")
//   mistral      [TOOL_CALLS][CALL]                (parallel: CALLs joined by ", ")
// A null or absent schema means no arguments ({}). A schema that does not
// say `type` gets "type": "object" at its root, and one whose type is not
// "object" is refused (the parsers take arguments that are objects only).
// vLLM constrains these tool_choice values to a JSON array of {name,
// parameters} whatever the model's format; this grammar keeps the model's
// format, so the output is the text the model was trained to write.
//
// Errors: InvalidArgument naming the tool ("tools[2] 'get_weather':
// unsupported JSON Schema keyword ...") for a schema that does not compile,
// a malformed spec, or a grammar over the size bound.
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_TOOL_CALL_GRAMMAR_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_TOOL_CALL_GRAMMAR_H_

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

absl::StatusOr<std::shared_ptr<const Grammar>> CompileToolCalls(std::string_view spec);

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_TOOL_CALL_GRAMMAR_H_
