// Tool calling (OpenAI `tools` / `tool_calls`): the model's tool-call text
// parsed into calls, for the formats of the models this server loads. Names
// follow vLLM's --tool-call-parser:
//   hermes       Hermes 2 Pro / Qwen 2.5+: `<tool_call>{"name": N, "arguments":
//   {...}}</tool_call>`,
//                one block per call; text before the first block is content.
//   llama3_json  Llama 3.1 / 3.2 JSON tool calling: the whole output is
//                `{"name": N, "parameters": {...}}` (or "arguments"), several
//                separated by ";", optionally after `<|python_tag|>`.
//   mistral      Mistral: `[TOOL_CALLS][{"name": N, "arguments": {...}}, ...]`,
//                or the v11 form `[TOOL_CALLS]N[ARGS]{...}` repeated; text
//                before the marker is content.
// Text that holds no call, or whose calls do not parse (bad JSON, no name,
// arguments not an object), comes back whole as content: never an error.
// Pure functions, thread-safe.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_TOOL_CALLS_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_TOOL_CALLS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/common/structured_output.h"

namespace pagedserve {

enum class ToolCallFormat { kHermes, kLlama3Json, kMistral };

// "hermes", "llama3_json", "mistral" -> the format; InvalidArgument naming the
// accepted names otherwise.
absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name);
const char* ToolCallFormatName(ToolCallFormat format);

// The format a chat template's text implies (the markers its tool branch
// writes): "<tool_call>" hermes, "[TOOL_CALLS]" mistral, "<|python_tag|>" or
// "ipython" llama3_json; hermes when none is found (the most common).
ToolCallFormat ToolCallFormatOfTemplate(std::string_view template_source);

struct ToolCall {
  std::string id;         // "call_" + 24 random lowercase hex digits
  std::string name;       // the function's name
  std::string arguments;  // a JSON object as text, keys in the model's order
  bool operator==(const ToolCall&) const = default;
};

// A fresh call id: "call_" + 24 random lowercase hex digits. Thread-safe.
std::string NewToolCallId();

struct ParsedToolCalls {
  std::string content;  // the text that is not a call ("" when only calls)
  std::vector<ToolCall> calls;
};

// Parses a whole model output. No calls: content = text.
ParsedToolCalls ParseToolCalls(ToolCallFormat format, std::string_view text);

// Streaming: the length of the prefix of `text` (the output so far) that is
// plain content for certain, i.e. before anything that is or may become the
// start of a tool call. A stream sends that prefix as content deltas and
// parses the rest with ParseToolCalls once the output is complete.
size_t ToolCallFreeContentPrefix(ToolCallFormat format, std::string_view text);

// Streaming: a call of the output so far that can be sent already. `name` is
// complete; `arguments_prefix` is the longest prefix of the call's final
// `arguments` (ToolCall::arguments: the compact dump ParseToolCalls gives)
// that the text so far fixes: whole tokens re-serialized as that dump writes
// them, and the complete code points of a string still being written. Growing
// text only extends it, so the deltas of successive prefixes add up to the
// final arguments (exception: an object with a duplicate key, whose final dump
// keeps only the last value). `arguments_complete`: the arguments value ended.
struct PartialToolCall {
  std::string name;
  std::string arguments_prefix;
  bool arguments_complete = false;
};

// The calls of `text` (a partial output) that can be sent, in order, up to the
// first that cannot: a call qualifies once its "name" (written before its
// arguments, as every supported format's models write it; Mistral v11: the
// name before [ARGS]) is complete. A call whose arguments are not an object
// (e.g. null) gets its name only; ParseToolCalls on the whole output decides
// the rest.
std::vector<PartialToolCall> StreamableToolCalls(ToolCallFormat format, std::string_view text);

// The constraint of tool_choice "required" (`function` empty) or of a named
// function (`function` = its name): StructuredOutput::Kind::kToolCalls
// (runtime/grammar/tool_call_grammar.h) over the tools' names and
// `parameters`, in `format`. "required": one or more calls with `parallel`,
// else exactly one; a named function: exactly one call to it. `tools_json`:
// the request's `tools` array as JSON text, each entry already checked to be
// {"type": "function", "function": {"name", "parameters"?}}. Errors:
// InvalidArgument when `function` is not one of the tools. Whether each
// schema compiles is checked where every constraint is (at admission).
absl::StatusOr<StructuredOutput> ToolChoiceConstraint(ToolCallFormat format,
                                                      std::string_view tools_json,
                                                      std::string_view function, bool parallel);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_TOOL_CALLS_H_
