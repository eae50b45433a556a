// Request fields whose rules every front end shares (the OpenAI HTTP API and
// ZeroMQ protocol v1), read from the request's JSON. The chat messages have
// their own pair (chat_messages.h); the ranges of the sampling fields are
// SamplingParams::Validate's.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json_fwd.hpp"
#include "runtime/common/sampling_params.h"
#include "runtime/common/structured_output.h"
#include "runtime/frontend/tool_calls.h"

namespace pagedserve {

// The largest magnitude any floating-point sampling field may have on either
// front end (temperature, top_p, min_p, penalties, length_penalty); their own
// ranges are SamplingParams::Validate's. Beyond it a value is refused as out of
// range before it is rounded to float.
inline constexpr double kMaxSamplingMagnitude = 1e6;

// "seed": any integer in [-2^63, 2^64), written as a JSON integer or as a
// whole number (42.0, 1e3; IntFromJson's rule). -1 means no seed (vLLM's
// convention: sampling is then not reproducible), giving nullopt; another
// negative value is taken modulo 2^64 (OpenAI accepts any integer). Errors:
// InvalidArgument naming the field "seed" (field_error.h) for a non-integer
// (a fraction, a non-number) or an integer out of that range.
absl::StatusOr<std::optional<uint64_t>> SeedFromJson(const nlohmann::json& seed);

// Typed readers of one JSON value of a request, the same on every front end.
// `field` names the value in the error (e.g. "top_k", "stop[2]"). Errors:
// InvalidArgument naming `field` (field_error.h): "field 'F' must be <what>,
// got <JSON kind> <the value, cut at 40 bytes>", or "field 'F' is out of
// range, got V" for a number beyond the type's range.
//   IntFromJson      a JSON integer within int32, or a number without a fractional
//                    part (16.0, 1e3: that integer; vLLM's lax reading);
//   NumberFromJson   any JSON number, finite, of magnitude <= kMaxSamplingMagnitude;
//   BoolFromJson     true or false;
//   StringFromJson   a string;
//   TokenIdsFromJson an array of integers in [0, vocab_size) (vocab_size <= 0:
//                    [0, 2^31 - 1)), each read as IntFromJson reads one (3.0 is
//                    token 3); the element is named "F[i]". Every list of token
//                    ids a request holds goes through it (prompt token ids on
//                    both front ends, stop_token_ids, /detokenize's tokens).
absl::Status IntFromJson(const nlohmann::json& v, absl::string_view field, int* out);
absl::Status NumberFromJson(const nlohmann::json& v, absl::string_view field, float* out);
absl::Status BoolFromJson(const nlohmann::json& v, absl::string_view field, bool* out);
absl::Status StringFromJson(const nlohmann::json& v, absl::string_view field, std::string* out);
absl::Status TokenIdsFromJson(const nlohmann::json& v, absl::string_view field, int32_t vocab_size,
                              std::vector<int32_t>* out);
// vLLM's "priority": an integer within int32 (IntFromJson), lower = more
// important. Anything but 0 is InvalidArgument naming "priority" unless
// `priority_scheduling` (the server runs --scheduling-policy priority; vLLM's
// rule). Null is 0.
absl::Status PriorityFromJson(const nlohmann::json& v, bool priority_scheduling, int32_t* out);
// s cut to at most n (>= 4) bytes without splitting a UTF-8 sequence, "..." marking a cut.
std::string TruncateUtf8(std::string s, size_t n);
// A JSON value as error messages quote it: compact, cut at 40 bytes without
// splitting a UTF-8 sequence (invalid UTF-8 replaced).
std::string ShowJson(const nlohmann::json& v);
// Its kind as a reader would say it: "integer", "number", "string", "array", ...
std::string JsonKindName(const nlohmann::json& v);
// The error of a value of the wrong type: "field 'F' must be <expected>, got
// <kind> [<value>]", naming `field`.
absl::Status WrongTypeError(absl::string_view field, absl::string_view expected,
                            const nlohmann::json& got);

// The sampling fields that every front end names and reads alike (types
// here; ranges and their messages in SamplingParams::Validate). An absent or
// null member leaves *p unchanged:
//   temperature, top_p, min_p, repetition_penalty, presence_penalty,
//   frequency_penalty, length_penalty   numbers (NumberFromJson);
//   top_k                               integer; 0 means off, as -1 (vLLM's rule);
//   best_of                             integer;
//   seed                                SeedFromJson;
//   stop                                a string or an array of strings;
//   stop_token_ids                      TokenIdsFromJson with vocab_size;
//   ignore_eos, use_beam_search         booleans;
//   early_stopping                      true, false or "never";
// and with use_beam_search and no temperature, temperature 0 (its only valid
// value). Front-end-specific fields (n, max_tokens and its aliases,
// logprobs) are read by each front end with the readers above. Errors: those
// of the readers, naming the field.
absl::Status ReadSamplingFields(const nlohmann::json& body, int32_t vocab_size, SamplingParams* p);

// Structured output (constrained decoding) from a request body, the same on
// both front ends:
//   response_format  {"type": "text"} (none), {"type": "json_object"},
//                    {"type": "json_schema", "json_schema": {"name", "schema",
//                    "strict"}} (OpenAI; schema required, an object or boolean);
//   guided_json (a schema object or its JSON text), guided_regex (string),
//   guided_choice (array of strings), guided_grammar (vLLM, legacy names);
//   structured_outputs {"json" | "regex" | "choice" | "grammar" | "json_object"}
//                    (vLLM's current name).
// At most one of them may constrain a request. `grammar` / `guided_grammar`
// is a GBNF grammar (llama.cpp's format, runtime/grammar/gbnf.h);
// `structural_tag` is refused as not supported. `field` is the member the constraint came
// from (for error reports). Errors: InvalidArgument naming the field
// (field_error.h) for a wrong type, a missing schema, two constraints, or an
// unsupported kind. Whether the constraint compiles is checked at admission
// (Engine::CheckRequest, field "structured_output").
struct StructuredOutputField {
  StructuredOutput constraint;
  std::string field;  // "" when the request has none
};
// `body_text`: the body's JSON text ("" = none); given, a JSON Schema keeps the
// client's key order (object members are generated in the order of
// `properties`, as XGrammar and OpenAI's strict mode do); without it, the
// members of `body` come sorted by name.
absl::StatusOr<StructuredOutputField> StructuredOutputFromJson(const nlohmann::json& body,
                                                               std::string_view body_text = {});

// The logit processors and output options of issue 32, the same on every
// front end (an absent or null field leaves *p unchanged):
//   logit_bias                  object: token id as a decimal string -> number,
//                               ids in [0, vocab_size), at most
//                               SamplingParams::kMaxLogitBias entries (OpenAI);
//   min_tokens                  integer >= 0;
//   bad_words                   array of strings (SamplingParams::bad_words;
//                               the engine tokenizes them);
//   skip_special_tokens         boolean;
//   include_stop_str_in_output  boolean.
// vocab_size <= 0: token ids have no upper bound.
// Ranges that need other fields (min_tokens <= max_tokens, the beam-search
// rules) are SamplingParams::Validate's. Errors: InvalidArgument naming the
// field (field_error.h).
absl::Status ReadLogitProcessorFields(const nlohmann::json& body, int32_t vocab_size,
                                      SamplingParams* p);

// Chat tool calling, the same on both front ends: `tools` (at most 128
// {"type": "function", "function": {"name": non-empty, "description",
// "parameters": object or null}}), `tool_choice` ("none", "auto", "required"
// or {"type": "function", "function": {"name"}}; default "auto" with tools,
// "none" without) and `parallel_tool_calls` (boolean). `body_text`: the body's
// JSON text, so that tools_json keeps the client's key order (the chat
// template renders it). Errors: InvalidArgument naming the field
// (field_error.h): a malformed tool, an unknown tool_choice, a choice other
// than "none" without tools.
struct ToolFields {
  std::string tools_json;       // the tools array as JSON text; "" = none
  std::string choice = "none";  // "none", "auto", "required" or "function"
  std::string function;         // choice "function": the function's name
  bool parallel_tool_calls = true;
  // The output is parsed into tool calls (every choice but "none").
  bool parse_tool_calls() const { return choice != "none"; }
  bool operator==(const ToolFields&) const = default;
};
absl::StatusOr<ToolFields> ToolFieldsFromJson(const nlohmann::json& body,
                                              std::string_view body_text);
// The chat template's extra variables of a chat request, as one JSON object
// text ("" when there are none): vLLM's "chat_template_kwargs" (an object,
// e.g. Qwen3's {"enable_thinking": false}; members in the client's order,
// read from `body_text` when given, as `body` has them sorted) and OpenAI's
// "reasoning_effort" ("low", "medium" or "high": the variable of that name,
// as transformers' apply_chat_template passes keyword arguments; it wins over
// a kwargs member of the same name). Errors: InvalidArgument naming the field
// (field_error.h): not an object, a member named like a variable the server
// sets (IsReservedTemplateVariable: messages, tools, ...), another effort.
absl::StatusOr<std::string> TemplateKwargsFromJson(const nlohmann::json& body,
                                                   std::string_view body_text);
// The constraint of choice "required" / "function" (ToolChoiceConstraint in
// tool_calls.h) in `format`; none (kNone) for "none" / "auto". Errors:
// InvalidArgument naming "tool_choice" for a function that is not a tool.
absl::StatusOr<StructuredOutput> ToolFieldsConstraint(const ToolFields& t, ToolCallFormat format);

// The body's keys that `known` does not hold, sorted (for one
// warning log line naming them, as vLLM logs ignored fields).
std::vector<std::string> UnknownFields(const nlohmann::json& body,
                                       std::span<const std::string_view> known);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_FIELDS_H_
