// Client protocol v1: parsing and validation of request messages and
// serialization of replies. One JSON object per ZeroMQ message; every message in
// either direction carries "version": 1. The full catalogue with examples is in
// docs/protocol.md; this header is the C++ contract.
//
// Parsing never throws and never crashes on any byte string: a failure is a
// ParseResult carrying the ErrorReply to send back (stable code + readable
// message naming the field, the request id echoed when it could be read).
// Serialization never throws either: strings that are not valid UTF-8 are written
// with U+FFFD replacements.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_PROTOCOL_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/common/finish_reason.h"
#include "runtime/common/sampling_params.h"
#include "runtime/frontend/request_fields.h"
#include "runtime/frontend/tool_calls.h"

namespace pagedserve::protocol {

inline constexpr int kVersion = 1;

// Stable error codes; the wire form is the snake_case string of ErrorCodeName().
enum class ErrorCode {
  kInvalidJson,         // "invalid_json": bytes are not one JSON text
  kInvalidRequest,      // "invalid_request": a field is missing, of the wrong type or out of range
  kUnsupportedVersion,  // "unsupported_version": "version" missing or not 1
  kUnknownType,         // "unknown_type": "type" is not generate/abort/health/stats
  kMessageTooLarge,     // "message_too_large": over ParseOptions::max_message_bytes
  kPromptTooLong,       // "prompt_too_long": prompt (+ max_tokens) over max_model_len
  kDuplicateId,         // "duplicate_id": the client already has a request in flight with this id
  kBusy,                // "busy": the waiting queue is full; retry later
  kNotFound,            // "not_found": abort of an id with no request in flight
  kUnavailable,         // "unavailable": the server admits nothing more (draining or
                        // shutting down, or a worker rank was lost); send it elsewhere
  kInternal,            // "internal": the server failed; the request was dropped
};                      // kInternal stays last: ParseReply scans the codes up to it
std::string_view ErrorCodeName(ErrorCode code);

// ---------------------------------------------------------------------------
// Requests (client -> server)
// ---------------------------------------------------------------------------
struct ChatMessage {
  std::string role;  // "system", "user", "assistant" or "tool"
  std::string content;
  // Tool calling in history, as pagedserve::ChatMessage holds them
  // (runtime/tokenizer/chat_template.h): tool_calls as JSON text ("" none).
  std::string tool_calls = {};
  std::string tool_call_id = {};
  std::string name = {};
  bool operator==(const ChatMessage&) const = default;
};

// Exactly one prompt form: text, token ids, or chat messages (rendered through the
// model's chat template by the server).
using Prompt = std::variant<std::string, std::vector<int32_t>, std::vector<ChatMessage>>;

struct GenerateRequest {
  std::string id;  // non-empty, <= kMaxIdBytes; unique among the client's in-flight requests
  Prompt prompt;
  SamplingParams sampling;  // validated with SamplingParams::Validate()
  // "max_tokens" was sent. Unset: sampling.max_tokens is the default (16),
  // which the server lowers to the context's room; a value sent beyond the
  // room is refused (EngineRequest::max_tokens_is_default). The encoder
  // writes max_tokens only when this is set.
  bool max_tokens_given = false;
  bool stream = false;  // true: delta messages, then a final message
  // Prefix-cache isolation (runtime/common/cache_salt.h): empty = none; else
  // 1..256 visible ASCII bytes (ValidateCacheSalt). Goes to EngineRequest.
  std::string cache_salt;
  // vLLM's "priority" (lower first): 0 unless ParseOptions::priority_scheduling.
  int32_t priority = 0;
  // Chat tool calling (`messages` prompts only): `tools`, `tool_choice`,
  // `parallel_tool_calls` by the rules the HTTP API shares
  // (request_fields.h). The server renders the tools through the chat
  // template, constrains "required" / named choices to calls of the tools
  // (its tool-call format) and parses each output into tool calls.
  ToolFields tools;
  // `messages` prompts only: "chat_template_kwargs" and "reasoning_effort" as
  // the chat template's extra variables (request_fields.h
  // TemplateKwargsFromJson: one JSON object text, "" for none).
  std::string chat_template_kwargs;
  bool operator==(const GenerateRequest&) const = default;
};

struct AbortRequest {
  std::string id;  // id of the client's generate request to abort
  bool operator==(const AbortRequest&) const = default;
};

// health / stats: the id is optional (empty = none) and echoed in the reply.
struct HealthRequest {
  std::string id;
  bool operator==(const HealthRequest&) const = default;
};
struct StatsRequest {
  std::string id;
  bool operator==(const StatsRequest&) const = default;
};

using Request = std::variant<GenerateRequest, AbortRequest, HealthRequest, StatsRequest>;

inline constexpr size_t kMaxIdBytes = 256;

// ---------------------------------------------------------------------------
// Replies (server -> client)
// ---------------------------------------------------------------------------
struct ErrorReply {
  std::string id;  // the request id when known, else empty (omitted on the wire)
  ErrorCode code = ErrorCode::kInternal;
  std::string message;
  bool operator==(const ErrorReply&) const = default;
};

// Logprobs of one generated token (raw model distribution, see sampler.h).
struct TokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  std::vector<int32_t> top_token_ids;  // best first
  std::vector<float> top_logprobs;
  bool operator==(const TokenLogprob&) const = default;
};

// The engine's finish reason (kNone never goes on the wire); FinishReasonName
// gives the wire form "stop", "length", "abort", "error".
using ::pagedserve::FinishReason;
using ::pagedserve::FinishReasonName;

// New output of one sequence of a streamed request since the previous delta.
struct SequenceDelta {
  int32_t index = 0;  // 0..n-1
  std::string text;   // UTF-8, never a split character
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;         // one per token id when requested, else empty
  std::optional<FinishReason> finish_reason;  // set on the delta that ends this sequence
  bool operator==(const SequenceDelta&) const = default;
};

struct DeltaReply {
  std::string id;
  std::vector<SequenceDelta> outputs;
  bool operator==(const DeltaReply&) const = default;
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;     // summed over the n sequences
  int64_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  bool operator==(const Usage&) const = default;
};

// One sequence in the final message. For a non-streamed request it carries the
// whole text and token ids; for a streamed one `text`/`token_ids`/`logprobs` are
// empty and omitted (they went out in deltas).
struct SequenceFinal {
  int32_t index = 0;
  FinishReason finish_reason = FinishReason::kStop;
  // What stopped a "stop" sequence: the matched stop string, or the stop / EOS token id.
  std::optional<std::string> stop_string;
  std::optional<int32_t> stop_token_id;
  std::string text;
  std::vector<int32_t> token_ids;
  std::vector<TokenLogprob> logprobs;
  // Beam search (use_beam_search): the beam's sum of raw token logprobs
  // ("cumulative_logprob" in the final message, also when streamed).
  std::optional<double> cumulative_logprob;
  // A request with tools (tool_choice not "none") whose output parsed into
  // calls: the calls (parallel_tool_calls false: the first only) and the text
  // before them; empty / nullopt otherwise (also when streamed: the deltas
  // carried the raw text).
  std::vector<ToolCall> tool_calls = {};
  std::optional<std::string> content = {};
  bool operator==(const SequenceFinal&) const = default;
};

// One prompt token scored (prompt_logprobs): its raw logprob given the
// tokens before it, its rank there (1 = the most likely), the top N.
struct PromptTokenLogprob {
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<int32_t> top_token_ids;  // best first
  std::vector<float> top_logprobs;
  bool operator==(const PromptTokenLogprob&) const = default;
};

struct FinalReply {
  std::string id;
  bool streamed = false;               // true: omit text/token_ids/logprobs of the outputs
  std::vector<SequenceFinal> outputs;  // all n, by index
  // A request with prompt_logprobs: entry i scores prompt token i + 1 (the
  // first prompt token has none). Empty otherwise.
  std::vector<PromptTokenLogprob> prompt_logprobs;
  Usage usage;
  std::string error_message;  // set when some output finished with "error"
  bool operator==(const FinalReply&) const = default;
};

struct AbortReply {  // acknowledges an abort; the request's final message follows
  std::string id;
  bool operator==(const AbortReply&) const = default;
};

struct HealthReply {
  std::string id;
  bool ok = true;  // "status": "ok" or "unhealthy"
  bool operator==(const HealthReply&) const = default;
};

struct StatsReply {
  std::string id;
  int64_t num_waiting = 0;
  int64_t num_running = 0;
  int64_t num_swapped = 0;
  int64_t kv_blocks_total = 0;  // device KV blocks (minimum over ranks)
  int64_t kv_blocks_used = 0;
  double kv_usage = 0.0;      // kv_blocks_used / kv_blocks_total, 0 when total is 0
  int64_t max_num_seqs = 0;   // capacity: running sequences
  int64_t max_model_len = 0;  // capacity: tokens per sequence
  int64_t max_waiting = 0;    // capacity: waiting queue bound (busy beyond)
  bool operator==(const StatsReply&) const = default;
};

using Reply = std::variant<ErrorReply, DeltaReply, FinalReply, AbortReply, HealthReply, StatsReply>;

// ---------------------------------------------------------------------------
// API
// ---------------------------------------------------------------------------
struct ParseOptions {
  size_t max_message_bytes = 1 << 20;  // larger messages: message_too_large, not parsed
  int max_json_depth = 32;             // deeper nesting: invalid_json (bounded recursion)
  int32_t vocab_size = 0;              // > 0: prompt_token_ids / stop_token_ids must be < it
  bool priority_scheduling = false;    // --scheduling-policy priority: "priority" may be non-zero
};

struct ParseResult {
  std::optional<Request> request;  // set on success
  ErrorReply error;                // meaningful when !ok()
  bool ok() const { return request.has_value(); }
};

// Parses one client message. Checks, in order: size, JSON syntax and depth,
// object, version, type, then the fields of the type. Unknown fields are errors
// (typos must not be silently ignored); null counts as absent for optional fields.
ParseResult ParseRequest(std::string_view message, const ParseOptions& options = {});

// Compact JSON, one object, with "version": 1 and "type".
std::string SerializeRequest(const Request& request);
std::string SerializeReply(const Reply& reply);

// Parses one server message (for clients such as `pagedserve client`). Lenient
// where the parser of requests is strict: unknown fields are ignored so that a
// newer server's additions do not break an older client. Errors name the field.
absl::StatusOr<Reply> ParseReply(std::string_view message);

// Convenience for the server: ErrorReply{id, code, message} serialized.
std::string ErrorMessage(std::string_view id, ErrorCode code, std::string_view message);

}  // namespace pagedserve::protocol

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_PROTOCOL_H_
