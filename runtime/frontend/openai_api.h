// The OpenAI-compatible HTTP API (docs/http.md): request bodies of
// /v1/completions and /v1/chat/completions validated into one type, and the
// response / stream-chunk bodies. Pure functions over JSON text, no sockets:
// http_server.cc joins them with the transport (Boost.Beast) and the EngineLoop.
//
// Follows the OpenAI API reference (completions: legacy text format with
// `logprobs` = N; chat: `logprobs` bool + `top_logprobs` N) and vLLM's
// extensions (top_k, min_p, repetition_penalty, ignore_eos, stop_token_ids).
// Unknown fields are ignored (ParseOutcome::ignored_fields), as the OpenAI API
// and vLLM do; a known field of the wrong type or out of range, or one this
// server does not implement, is a 400 naming the field. All functions are
// thread-safe (no shared state); the Tokenizer and ChatTemplate are immutable.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_OPENAI_API_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_OPENAI_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "runtime/common/sampling_params.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/output_accumulator.h"
#include "runtime/frontend/tool_calls.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve::openai {

// OpenAI's error object: {"error": {"message", "type", "param", "code"}} with
// the HTTP status it is sent with.
struct ApiError {
  int status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;  // empty: null
  std::string code;   // empty: null
};
std::string ErrorBody(const ApiError& error);
ApiError BadRequest(std::string message, std::string param = "");

// How a request that Submit accepted ended, as the HTTP API reports it: the
// one mapping from a finish reason to an error, for the JSON reply and the
// Server-Sent Events error event alike. FinishReason::kError (the engine
// failed the request: a step error, a lost worker - EngineLoop::FailAll - or a
// late refusal; `error` its status, OK when unknown) is a failure of the
// server, not of the request: 500 with type "server_error" (OpenAI's and
// vLLM's type for it) and the engine's message. Every other reason (stop,
// length, abort, none) is no error: nullopt. Errors at admission (Submit's
// status) are mapped by their code instead (http_server.cc: 400 / 429 / 503).
std::optional<ApiError> FinishError(FinishReason reason, const absl::Status& error);

enum class Endpoint { kCompletions, kChat };

// The request field a status from validation or admission names (its
// FieldOf payload: runtime/common/field_error.h), as this endpoint calls it:
// on the chat endpoint "prompt" is "messages" and "logprobs" is
// "top_logprobs". "" (null) when the status names no field.
std::string ParamOf(const absl::Status& status, Endpoint endpoint);

// A request validated at the edge: every prompt tokenized, sampling parameters
// checked by SamplingParams::Validate. The admission bound (KV blocks,
// max_model_len) is checked once more by EngineLoop::Submit.
struct ValidatedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;                          // as served (the request's, or the default)
  std::vector<std::vector<int32_t>> prompts;  // completions: 1..N prompts; chat: 1
  SamplingParams params;                      // params.logprobs: -1 none, else top-N
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  // Prefix-cache isolation (runtime/common/cache_salt.h), vLLM's `cache_salt`
  // field: empty = none; else 1..256 visible ASCII bytes (ValidateCacheSalt).
  // Goes to every EngineRequest of the request.
  std::string cache_salt;
  // vLLM's `request_id` (1..256 visible ASCII bytes), "" when absent: the
  // response id is then "cmpl-"/"chatcmpl-" and it, not a generated one.
  std::string request_id;
  // vLLM's `priority` (lower first; 0 unless ServedModel::priority_scheduling).
  int32_t priority = 0;
  // max_tokens (or max_completion_tokens) was in the request; otherwise it is
  // the endpoint's default (16; chat: the rest of the context).
  bool max_tokens_given = false;
  // Completions `echo`: per prompt, its text (the string given, or its token
  // ids decoded), put before each of its choices' text (the first chunk of a
  // stream). Empty without echo. Choice c belongs to prompt c / n.
  std::vector<std::string> echo_texts;
  // Chat tool calling: `tools` as JSON text in the client's key order ("" for
  // none; the chat template renders it), and whether the output is parsed
  // into tool_calls (tools given and tool_choice "auto", its default then),
  // in which format (ServedModel::tool_call_format).
  std::string tools_json;
  bool parse_tool_calls = false;
  ToolCallFormat tool_call_format = ToolCallFormat::kHermes;
  bool parallel_tool_calls = true;  // false: only the first call is returned
};

// The error for a refusal of EngineLoop::Submit (SubmitErrorKindOf): 400
// naming the field for an invalid request or a prompt too long, 429 busy, 503
// unavailable, 500 otherwise. A chat request refused at KV admission whose
// max_tokens the client left out names `n`: each of its n samples may use the
// rest of the context, so n is what the client chose (vLLM admits such a
// request and preempts; this scheduler admits only what can always finish).
ApiError SubmitError(const absl::Status& status, const ValidatedRequest& request);

// Sampling values a request gets for the fields it leaves out: the model's
// generation_config.json (--generation-config auto, as vLLM); unset fields
// keep SamplingParams' (OpenAI's / vLLM's) defaults. A beam search request
// takes none of them (it samples nothing; its temperature stays 0).
struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
};

struct ServedModel {
  std::string name;  // --served-model-name
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  SamplingDefaults defaults;
  bool priority_scheduling = false;  // --scheduling-policy priority: `priority` may be non-zero
  // --tool-call-parser, or the format the chat template's markers imply.
  ToolCallFormat tool_call_format = ToolCallFormat::kHermes;
};

// Parses a request body. `chat_template` may be null (then `messages` is a 400).
// Errors: 400 (bad JSON, missing / mistyped / out-of-range field, empty
// prompt), 404 (model is not the served one).
// A known field that is not implemented (suffix, functions,
// ...) with anything but null or its "off" value is a 400 naming it; a field
// this API does not know is ignored and named in ignored_fields (the server
// logs one warning line naming them, as vLLM does).
struct ParseOutcome {
  std::optional<ValidatedRequest> request;
  ApiError error;
  std::vector<std::string> ignored_fields;  // unknown top-level fields, sorted
};
ParseOutcome ParseRequest(Endpoint endpoint, std::string_view body, const ServedModel& model,
                          const Tokenizer& tokenizer, const ChatTemplate* chat_template);

// Response builders. `id` is "cmpl-..." / "chatcmpl-...", `created` Unix seconds.
// With params.prompt_logprobs >= 0, `prompt_logprobs` holds per prompt its
// scored tokens (OutputAccumulator::prompt_logprobs): vLLM's
// `prompt_logprobs` (a list per prompt token: null for the first, then
// {"<token id>": {"logprob", "rank", "decoded_token"}} for the prompt token
// and its position's top N) on each completions choice, and at the top level
// of a chat response.
std::string CompletionResponse(const ValidatedRequest& r, const std::string& id, int64_t created,
                               const std::vector<CompletionOutput>& choices, const Usage& usage,
                               const Tokenizer& tokenizer,
                               const std::vector<std::vector<PromptLogprob>>& prompt_logprobs = {});
// One SSE chunk (the JSON only) for the new output `delta` of choice `index`.
// Chat: `first` adds the assistant role to the delta. `text_offset` (per
// choice, 0 before its first chunk): the completions logprobs' text_offset of
// the delta's first token, advanced past the delta's tokens, so that a stream's
// offsets count from the start of the completion as the whole response's do.
std::string StreamChunk(const ValidatedRequest& r, const std::string& id, int64_t created,
                        int index, const CompletionOutput& delta, bool first,
                        const Tokenizer& tokenizer, size_t* text_offset);
// Streaming a chat choice whose output is parsed for tool calls
// (ValidatedRequest::parse_tool_calls): given the choice's whole text so far
// and its finish reason (kNone while running), the chunks to send now.
// Content that cannot be part of a call goes out as it comes
// (ToolCallFreeContentPrefix). Calls go out as OpenAI streams them, while
// they are generated: a delta with index, id, type and the name with empty
// arguments once the name is complete, then argument deltas as the text fixes
// them (StreamableToolCalls: they add up to the final `arguments`). When the
// choice finishes the whole text is parsed (ParseToolCalls): what was not sent
// yet goes out, then finish_reason "tool_calls"; or, when it holds no call, the
// held-back text as content (a call header already sent stays sent: only an
// output that starts a call in a supported format and then breaks it does
// that). No logprobs in these chunks (ParseRequest refuses logprobs with them).
struct ToolStreamState {
  size_t sent = 0;                    // bytes of the text sent as content
  bool role_sent = false;             // the first chunk carries the assistant role
  std::vector<std::string> call_ids;  // per call whose header was sent, its id
  std::vector<size_t> args_sent;      // per such call, bytes of its arguments sent
};
std::vector<std::string> ToolStreamChunks(const ValidatedRequest& r, const std::string& id,
                                          int64_t created, int index, const std::string& text,
                                          FinishReason finish, ToolStreamState* state);
// The final usage chunk of stream_options.include_usage (empty choices).
std::string UsageChunk(const ValidatedRequest& r, const std::string& id, int64_t created,
                       const Usage& usage);

// GET /v1/models, /tokenize, /detokenize bodies.
std::string ModelsResponse(const ServedModel& model, int64_t created);
// /tokenize: {"prompt": str, "add_special_tokens": bool} or {"messages": [...]}.
std::string TokenizeResponse(std::string_view body, const ServedModel& model,
                             const Tokenizer& tokenizer, const ChatTemplate* chat_template,
                             ApiError* error);
// /detokenize: {"tokens": [ids]}.
std::string DetokenizeResponse(std::string_view body, const Tokenizer& tokenizer, ApiError* error);

// The OpenAPI 3.0 document served at /openapi.json (token ids bounded by vocab_size).
std::string OpenApiDocument(const std::string& version, int32_t vocab_size);

}  // namespace pagedserve::openai

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_OPENAI_API_H_
