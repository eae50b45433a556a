#include "runtime/frontend/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <span>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/cache_salt.h"
#include "runtime/common/field_error.h"
#include "runtime/common/json_limits.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/frontend/chat_messages.h"
#include "runtime/frontend/request_fields.h"

namespace pagedserve::openai {
namespace {

using json = nlohmann::json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A request body as one JSON object, after the limits every front end applies
// before parsing (runtime/common/json_limits.h). A syntax error says why and
// where (nlohmann's line, column and last bytes read, and the byte offset).
bool ParseBody(std::string_view text, json* out, ApiError* err) {
  if (absl::Status s = CheckJsonText(text); !s.ok()) {
    *err = BadRequest(absl::StrCat("the request body is refused: ", s.message()));
    return false;
  }
  try {
    *out = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    // parse_error (syntax, with its byte) or out_of_range (a number beyond
    // double, e.g. 1e309): every exception of the parser is a client error.
    std::string what = e.what();
    if (const size_t pos = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && pos != std::string::npos) {
      what = what.substr(pos + 2);
    }
    const auto* syntax = dynamic_cast<const json::parse_error*>(&e);
    *err = BadRequest(absl::StrCat(
        "the request body is not valid JSON: ", what,
        syntax != nullptr ? absl::StrCat(" (byte ", syntax->byte, ")") : std::string()));
    return false;
  }
  if (!out->is_object()) {
    *err = BadRequest(
        absl::StrCat("the request body must be one JSON object, got ", out->type_name()));
    return false;
  }
  return true;
}

// Field readers: absent or null leaves *out unchanged; a wrong type is an error.
bool ReadBool(const json& body, const char* key, bool* out, ApiError* err) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_boolean()) {
    *err = BadRequest(absl::StrCat("'", key, "' must be a boolean"), key);
    return false;
  }
  *out = it->get<bool>();
  return true;
}

// The param of an EncodeChat error: the field it names ("messages" or
// "chat_template_kwargs"), "messages" when it names none.
std::string ChatErrorField(const absl::Status& s) {
  std::string field = FieldOf(s);
  return field.empty() ? "messages" : field;
}

// Chat: the template's extra variables (request_fields.h TemplateKwargsFromJson).
bool ReadTemplateKwargs(const json& body, std::string_view text, std::string* out, ApiError* err) {
  absl::StatusOr<std::string> kwargs = TemplateKwargsFromJson(body, text);
  if (!kwargs.ok()) {
    *err = BadRequest(std::string(kwargs.status().message()), FieldOf(kwargs.status()));
    return false;
  }
  *out = *std::move(kwargs);
  return true;
}

// vLLM's `request_id`: the response's id becomes "cmpl-" / "chatcmpl-" and
// it; 1 to kMaxRequestIdBytes visible ASCII bytes (it is echoed and logged).
constexpr size_t kMaxRequestIdBytes = 256;
bool ReadRequestId(const json& body, std::string* out, ApiError* err) {
  auto it = body.find("request_id");
  if (it == body.end() || it->is_null()) return true;
  if (!it->is_string()) {
    *err = BadRequest(std::string(WrongTypeError("request_id", "a string", *it).message()),
                      "request_id");
    return false;
  }
  const std::string& id = it->get_ref<const std::string&>();
  if (absl::Status s = ValidateVisibleAscii("request_id", id, kMaxRequestIdBytes); !s.ok()) {
    *err = BadRequest(std::string(s.message()), "request_id");
    return false;
  }
  *out = id;
  return true;
}

// vLLM's `priority` (request_fields.h PriorityFromJson).
bool ReadPriority(const json& body, const ServedModel& model, int32_t* out, ApiError* err) {
  auto it = body.find("priority");
  if (it == body.end()) return true;
  if (absl::Status s = PriorityFromJson(*it, model.priority_scheduling, out); !s.ok()) {
    *err = BadRequest(std::string(s.message()), "priority");
    return false;
  }
  return true;
}

// A list of token ids, each in [0, vocab): the rule of every front end
// (request_fields.h TokenIdsFromJson; its message names the element, e.g.
// "prompt[1]"), reported under `param`.
bool ReadIds(const json& v, const std::string& field, const char* param, int32_t vocab,
             std::vector<int32_t>* out, ApiError* err) {
  if (absl::Status s = TokenIdsFromJson(v, field, vocab, out); !s.ok()) {
    *err = BadRequest(std::string(s.message()), param);
    return false;
  }
  return true;
}

// `text`: the body's JSON text (a JSON Schema keeps its key order). n,
// max_tokens / max_completion_tokens and logprobs are this API's fields; the
// rest are read as on every front end (request_fields.h ReadSamplingFields).
bool ReadSampling(const json& body, std::string_view text, Endpoint endpoint, int32_t vocab,
                  SamplingParams* p, ApiError* err) {
  const auto failed = [&](const absl::Status& s) {
    *err = BadRequest(std::string(s.message()), ParamOf(s, endpoint));
    return false;
  };
  const auto member = [&](const char* key) -> const json* {
    auto it = body.find(key);
    return it == body.end() || it->is_null() ? nullptr : &*it;
  };
  if (const json* j = member("n")) {
    if (absl::Status s = IntFromJson(*j, "n", &p->n); !s.ok()) return failed(s);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (const json* j = member(key)) {
      if (absl::Status s = IntFromJson(*j, key, &p->max_tokens); !s.ok()) return failed(s);
    }
  }
  if (absl::Status s = ReadSamplingFields(body, vocab, p); !s.ok()) return failed(s);
  // Structured output: response_format / guided_* / structured_outputs.
  if (absl::StatusOr<StructuredOutputField> so = StructuredOutputFromJson(body, text); !so.ok()) {
    return failed(so.status());
  } else {
    p->structured_output = so->constraint;
  }
  // logprobs: completions N (0..20); chat bool + top_logprobs N.
  const auto top_n = [&](const char* key, int* out) {
    const json* j = member(key);
    if (j == nullptr) return absl::OkStatus();
    if (absl::Status s = IntFromJson(*j, key, out); !s.ok()) return s;
    if (*out < 0 || *out > 20) {
      return FieldError(key, absl::StrCat("'", key, "' must be in [0, 20], got ", *out));
    }
    return absl::OkStatus();
  };
  if (endpoint == Endpoint::kCompletions) {
    if (absl::Status s = top_n("logprobs", &p->logprobs); !s.ok()) return failed(s);
  } else {
    bool want = false;
    if (const json* j = member("logprobs")) {
      if (absl::Status s = BoolFromJson(*j, "logprobs", &want); !s.ok()) return failed(s);
    }
    int n = 0;
    if (absl::Status s = top_n("top_logprobs", &n); !s.ok()) return failed(s);
    if (n > 0 && !want) {
      *err = BadRequest("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      return false;
    }
    p->logprobs = want ? n : -1;
  }
  // vLLM's prompt_logprobs: N in [0, 20] (both endpoints).
  if (absl::Status s = top_n("prompt_logprobs", &p->prompt_logprobs); !s.ok()) return failed(s);
  if (absl::Status s = ReadLogitProcessorFields(body, vocab, p); !s.ok()) {
    *err = BadRequest(std::string(s.message()), FieldOf(s));
    return false;
  }
  if (absl::Status s = p->Validate(); !s.ok()) {
    *err = BadRequest(std::string(s.message()), ParamOf(s, endpoint));
    return false;
  }
  return true;
}

// "messages": the rules every front end shares (chat_messages.h); other keys
// of a message are ignored, as the OpenAI API does.
bool ReadMessages(const json& body, std::vector<ChatMessage>* out, ApiError* err) {
  static const json kMissing;
  auto it = body.find("messages");
  if (absl::Status s = ReadChatMessages(it == body.end() ? kMissing : *it, /*strict=*/false, out);
      !s.ok()) {
    *err = BadRequest(std::string(s.message()), "messages");
    return false;
  }
  return true;
}

// Completions `prompt`: a string, a list of strings, a list of ids, a list of lists of ids.
bool ReadPromptIds(const json& body, const Tokenizer& tok, std::vector<std::vector<int32_t>>* out,
                   ApiError* err);

// `texts` (nullable): per prompt, its text (the string, or the token ids
// decoded), for `echo`.
bool ReadPrompts(const json& body, const Tokenizer& tok, std::vector<std::vector<int32_t>>* out,
                 std::vector<std::string>* texts, ApiError* err) {
  if (!ReadPromptIds(body, tok, out, err)) return false;
  if (texts == nullptr) return true;
  const json& prompt = body["prompt"];
  for (size_t i = 0; i < out->size(); ++i) {
    const json& e = prompt.is_array() && !prompt[0].is_number() ? prompt[i] : prompt;
    if (e.is_string()) {
      texts->push_back(e.get<std::string>());
      continue;
    }
    absl::StatusOr<std::string> decoded = tok.Decode((*out)[i]);
    if (!decoded.ok()) {
      *err = BadRequest(
          absl::StrCat("'echo': prompt ", i, " does not decode: ", decoded.status().message()),
          "prompt");
      return false;
    }
    texts->push_back(*std::move(decoded));
  }
  return true;
}

bool ReadPromptIds(const json& body, const Tokenizer& tok, std::vector<std::vector<int32_t>>* out,
                   ApiError* err) {
  auto it = body.find("prompt");
  const char* kMsg =
      "'prompt' must be a string, an array of strings, an array of token ids "
      "or an array of arrays of token ids";
  if (it == body.end() || it->is_null()) {
    *err = BadRequest("'prompt' is required", "prompt");
    return false;
  }
  if (it->is_string()) {
    out->push_back(tok.Encode(it->get<std::string>()));
    return true;
  }
  if (!it->is_array() || it->empty()) {
    *err = BadRequest(kMsg, "prompt");
    return false;
  }
  // A list starting with a number is one prompt of token ids (each a whole
  // number: 3 or 3.0, as every integer field reads).
  if ((*it)[0].is_number()) {
    out->emplace_back();
    return ReadIds(*it, "prompt", "prompt", tok.vocab_size(), &out->back(), err);
  }
  if (it->size() > 64) {  // before any encoding
    *err = BadRequest("at most 64 prompts per request", "prompt");
    return false;
  }
  // A list holds prompts of one form: all strings or all arrays of ids (the
  // OpenAI schema's string[] | int[][], never a mix).
  const bool strings = (*it)[0].is_string();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& e = (*it)[i];
    if (strings && e.is_string()) {
      out->push_back(tok.Encode(e.get<std::string>()));
    } else if (!strings && e.is_array() && !e.empty()) {
      out->emplace_back();
      if (!ReadIds(e, absl::StrCat("prompt[", i, "]"), "prompt", tok.vocab_size(), &out->back(),
                   err))
        return false;
    } else {
      *err = BadRequest(kMsg, "prompt");
      return false;
    }
  }
  return true;
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}}};
}

std::string TokenString(const Tokenizer& tok, int32_t id) {
  DecodeOptions o;
  o.skip_special_tokens = false;
  o.strip_leading_space = false;
  return tok.TokenBytes(id, /*first=*/false, o);
}

json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json LogprobValue(float lp) { return std::isfinite(lp) ? json(lp) : json(-9999.0); }

// An echoed prompt in the legacy logprobs format (vLLM's echo + logprobs):
// its tokens, null for the first, then each one's logprob and (logprobs N >=
// 1) its position's top N with the token itself.
struct EchoedPrompt {
  const std::vector<int32_t>* ids = nullptr;
  const std::vector<PromptLogprob>* logprobs = nullptr;
};

// `text_offset`: the legacy format's offset of c's first token (the bytes of
// the choice's tokens before it); advanced past c's tokens.
json LogprobsJson(const ValidatedRequest& r, const CompletionOutput& c, const Tokenizer& tok,
                  size_t* text_offset, const EchoedPrompt& echo = {}) {
  if (r.params.logprobs < 0) return nullptr;
  if (r.endpoint == Endpoint::kChat) {
    json content = json::array();
    for (size_t i = 0; i < c.token_ids.size() && i < c.logprobs.size(); ++i) {
      const std::string t = TokenString(tok, c.token_ids[i]);
      json top = json::array();
      if (i < c.top_token_ids.size()) {
        for (size_t k = 0; k < c.top_token_ids[i].size() && k < c.top_logprobs[i].size(); ++k) {
          const std::string tk = TokenString(tok, c.top_token_ids[i][k]);
          top.push_back({{"token", tk},
                         {"logprob", LogprobValue(c.top_logprobs[i][k])},
                         {"bytes", Bytes(tk)}});
        }
      }
      content.push_back({{"token", t},
                         {"logprob", LogprobValue(c.logprobs[i])},
                         {"bytes", Bytes(t)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  size_t& offset = *text_offset;
  for (size_t i = 0; echo.ids != nullptr && i < echo.ids->size(); ++i) {
    const std::string t = TokenString(tok, (*echo.ids)[i]);
    tokens.push_back(t);
    offsets.push_back(offset);
    offset += t.size();
    const PromptLogprob* lp = nullptr;
    if (i > 0 && i - 1 < echo.logprobs->size() &&
        (*echo.logprobs)[i - 1].position == static_cast<int32_t>(i))
      lp = &(*echo.logprobs)[i - 1];
    lps.push_back(lp != nullptr ? LogprobValue(lp->logprob) : json(nullptr));
    if (lp == nullptr || r.params.logprobs == 0) {
      tops.push_back(nullptr);
      continue;
    }
    json top = json::object();
    for (size_t k = 0; k < lp->top_token_ids.size() && k < lp->top_logprobs.size() &&
                       k < static_cast<size_t>(r.params.logprobs);
         ++k) {
      top[TokenString(tok, lp->top_token_ids[k])] = LogprobValue(lp->top_logprobs[k]);
    }
    top[t] = LogprobValue(lp->logprob);
    tops.push_back(std::move(top));
  }
  for (size_t i = 0; i < c.token_ids.size() && i < c.logprobs.size(); ++i) {
    const std::string t = TokenString(tok, c.token_ids[i]);
    tokens.push_back(t);
    lps.push_back(LogprobValue(c.logprobs[i]));
    offsets.push_back(offset);
    offset += t.size();
    json top = json::object();
    if (i < c.top_token_ids.size()) {
      for (size_t k = 0; k < c.top_token_ids[i].size() && k < c.top_logprobs[i].size(); ++k) {
        top[TokenString(tok, c.top_token_ids[i][k])] = LogprobValue(c.top_logprobs[i][k]);
      }
    }
    tops.push_back(r.params.logprobs > 0 ? top : json(nullptr));
  }
  return {{"tokens", tokens},
          {"token_logprobs", lps},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

// vLLM's prompt_logprobs: per prompt token, null for the first, else
// {"<id>": {"logprob", "rank", "decoded_token"}} for the prompt token and its
// position's top N.
json PromptLogprobsJson(const std::vector<int32_t>& prompt, const std::vector<PromptLogprob>& lps,
                        const Tokenizer& tok) {
  json out = json::array();
  out.push_back(nullptr);
  for (size_t i = 1; i < prompt.size(); ++i) {
    const PromptLogprob* lp = i - 1 < lps.size() && lps[i - 1].position == static_cast<int32_t>(i)
                                  ? &lps[i - 1]
                                  : nullptr;
    if (lp == nullptr) {  // not scored (cannot happen unless the request failed)
      out.push_back(nullptr);
      continue;
    }
    json entry = json::object();
    for (size_t k = 0; k < lp->top_token_ids.size() && k < lp->top_logprobs.size(); ++k) {
      const int32_t id = lp->top_token_ids[k];
      entry[std::to_string(id)] = {{"logprob", LogprobValue(lp->top_logprobs[k])},
                                   {"rank", k + 1},
                                   {"decoded_token", TokenString(tok, id)}};
    }
    entry[std::to_string(lp->token_id)] = {{"logprob", LogprobValue(lp->logprob)},
                                           {"rank", lp->rank},
                                           {"decoded_token", TokenString(tok, lp->token_id)}};
    out.push_back(std::move(entry));
  }
  return out;
}

json ToolCallsJson(const std::vector<ToolCall>& calls) {
  json out = json::array();
  for (const ToolCall& c : calls) {
    out.push_back({{"id", c.id},
                   {"type", "function"},
                   {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
  }
  return out;
}

// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request
// (ToolFieldsFromJson). tool_choice "required" or a named function:
// *tool_constraint gets the constraint that makes the output such calls.
bool ReadTools(const json& body, std::string_view text, const ServedModel& model,
               ValidatedRequest* r, StructuredOutput* tool_constraint, ApiError* err) {
  absl::StatusOr<ToolFields> t = ToolFieldsFromJson(body, text);
  absl::StatusOr<StructuredOutput> c =
      t.ok() ? ToolFieldsConstraint(*t, model.tool_call_format) : t.status();
  if (!c.ok()) {
    *err = BadRequest(std::string(c.status().message()), FieldOf(c.status()));
    return false;
  }
  r->tools_json = t->tools_json;
  r->parallel_tool_calls = t->parallel_tool_calls;
  r->parse_tool_calls = t->parse_tool_calls();
  r->tool_call_format = model.tool_call_format;
  *tool_constraint = *std::move(c);
  return true;
}

// The rules that tie the tool fields to the sampling fields, once both are
// read: tool_choice "required" / named sets the constraint (no other one
// allowed), and a stream parsed for tool calls takes no logprobs.
bool FinishToolFields(StructuredOutput tool_constraint, ValidatedRequest* r, ApiError* err) {
  if (tool_constraint.active()) {
    if (r->params.structured_output.active()) {
      *err = BadRequest(
          "'tool_choice' \"required\" or a named function constrains the output to tool calls; "
          "it cannot be combined with another constraint (response_format, guided_*, "
          "structured_outputs)",
          "tool_choice");
      return false;
    }
    r->params.structured_output = std::move(tool_constraint);
  }
  if (r->parse_tool_calls) {
    if (r->stream && r->params.logprobs >= 0) {
      *err =
          BadRequest("'logprobs' is not supported in a stream parsed for tool calls", "logprobs");
      return false;
    }
    // Mistral's [TOOL_CALLS] is a special token: keep it in the text (vLLM).
    if (r->tool_call_format == ToolCallFormat::kMistral && !r->params.skip_special_tokens)
      r->params.skip_special_tokens = false;
  }
  return true;
}

json FinishJson(FinishReason reason) {
  return reason == FinishReason::kNone ? json(nullptr)
                                       : json(std::string(FinishReasonName(reason)));
}

}  // namespace

std::string ParamOf(const absl::Status& status, Endpoint endpoint) {
  std::string field = FieldOf(status);
  if (endpoint == Endpoint::kChat) {
    if (field == "logprobs") return "top_logprobs";
    if (field == "prompt") return "messages";
  }
  return field;
}

ApiError SubmitError(const absl::Status& status, const ValidatedRequest& request) {
  ApiError e;
  e.message = std::string(status.message());
  switch (SubmitErrorKindOf(status)) {
    case SubmitErrorKind::kInvalidRequest:
    case SubmitErrorKind::kPromptTooLong:
      e.param = ParamOf(status, request.endpoint);
      // The client sent no max_tokens: the KV bound is n's doing (chat: each
      // sample may use the rest of the context; completions: 16 each).
      if (e.param == "max_tokens" && !request.max_tokens_given && request.params.n > 1) {
        e.param = "n";
        if (request.endpoint == Endpoint::kChat) {
          absl::StrAppend(&e.message,
                          " (max_tokens was not given, so each of the n = ", request.params.n,
                          " samples may use the rest of the context: lower n or set "
                          "max_tokens)");
        } else {
          absl::StrAppend(&e.message, " (max_tokens was not given: ", request.params.n,
                          " samples of the default ", request.params.max_tokens,
                          " tokens each; lower n)");
        }
      }
      return e;
    case SubmitErrorKind::kBusy:
      e.status = 429;
      e.type = "rate_limit_exceeded";
      e.code = "rate_limit_exceeded";
      return e;
    case SubmitErrorKind::kUnavailable:
      e.status = 503;
      e.type = "service_unavailable";
      return e;
    case SubmitErrorKind::kDuplicateId:
    case SubmitErrorKind::kInternal: break;
  }
  e.status = 500;
  e.type = "server_error";
  return e;
}

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

std::optional<ApiError> FinishError(FinishReason reason, const absl::Status& error) {
  if (reason != FinishReason::kError) return std::nullopt;
  ApiError e;
  e.status = 500;
  e.type = "server_error";
  e.message = error.ok() ? "the engine failed the request"
                         : absl::StrCat("the engine failed the request: ", error.message());
  return e;
}

std::string ErrorBody(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return Dump({{"error", err}});
}

namespace {

// Every field this API knows, on both endpoints: OpenAI's and vLLM's extra
// parameters. Others are ignored and named in ParseOutcome::ignored_fields.
constexpr std::string_view kKnownFields[] = {
    // OpenAI, both endpoints
    "model", "stream", "stream_options", "n", "max_tokens", "temperature", "top_p", "seed", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "user", "metadata", "store",
    "service_tier",
    // OpenAI completions
    "prompt", "echo", "suffix", "best_of",
    // OpenAI chat
    "messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
    "parallel_tool_calls", "functions", "function_call", "modalities", "audio", "prediction",
    "reasoning_effort", "web_search_options",
    // vLLM extra parameters
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids", "use_beam_search",
    "length_penalty", "early_stopping", "min_tokens", "bad_words", "skip_special_tokens",
    "include_stop_str_in_output", "spaces_between_special_tokens", "prompt_logprobs", "cache_salt",
    "allowed_token_ids", "truncate_prompt_tokens", "logits_processors", "add_special_tokens",
    "add_generation_prompt", "continue_final_message", "chat_template", "chat_template_kwargs",
    "documents", "return_tokens_as_token_ids", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_decoding_backend", "structured_outputs", "priority", "request_id"};

std::span<const std::string_view> KnownFields(Endpoint) { return kKnownFields; }

// Known fields this server does not implement: a 400 naming the field when
// one holds anything but null or the value that means "off".
struct NotImplemented {
  std::string_view field;
  const char* off;  // JSON text of the value accepted as a no-op; nullptr: none
};
constexpr NotImplemented kNotImplemented[] = {
    {"suffix", "\"\""},
    {"functions", "[]"},
    {"function_call", "\"none\""},
    {"allowed_token_ids", nullptr},
    {"truncate_prompt_tokens", nullptr},
    {"logits_processors", nullptr},
    {"chat_template", nullptr},
    {"documents", nullptr},
    {"add_generation_prompt", "true"},
    {"continue_final_message", "false"},
    {"return_tokens_as_token_ids", "false"},
    {"spaces_between_special_tokens", "true"},
    {"modalities", R"(["text"])"},
    {"audio", nullptr},
    {"prediction", nullptr},
    {"web_search_options", nullptr},
    // vLLM V1 refuses a per-request backend other than the server's too.
    {"guided_decoding_backend", "\"auto\""},
};

bool CheckNotImplemented(const json& body, ApiError* err) {
  for (const NotImplemented& f : kNotImplemented) {
    const std::string field(f.field);
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) continue;
    if (f.off != nullptr && *it == json::parse(f.off)) continue;
    *err = BadRequest(absl::StrCat("'", field, "' is not supported by this server"), field);
    return false;
  }
  return true;
}

// The request's options besides its prompt and sampling: stream and
// stream_options, cache_salt, echo (completions only), the known fields this
// server refuses, the chat-only fields on completions, request_id and priority.
bool ReadRequestOptions(Endpoint endpoint, const json& body, const ServedModel& model,
                        ValidatedRequest* r, bool* echo, ApiError* err) {
  if (!ReadBool(body, "stream", &r->stream, err)) return false;
  if (auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    if (!it->is_object()) {
      *err = BadRequest("'stream_options' must be an object", "stream_options");
      return false;
    }
    if (!ReadBool(*it, "include_usage", &r->include_usage, err)) return false;
    // As vLLM: stream options without a stream are a client's mistake, not a no-op.
    if (!r->stream) {
      *err = BadRequest("'stream_options' needs 'stream': true", "stream_options");
      return false;
    }
  }
  if (auto it = body.find("cache_salt"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      *err = BadRequest("'cache_salt' must be a string", "cache_salt");
      return false;
    }
    // Never echoes the salt (the message names its length or a byte offset).
    if (absl::Status s = ValidateCacheSalt(it->get_ref<const std::string&>()); !s.ok()) {
      *err = BadRequest(std::string(s.message()), "cache_salt");
      return false;
    }
    r->cache_salt = it->get<std::string>();
  }
  if (!ReadBool(body, "echo", echo, err)) return false;
  if (*echo && endpoint == Endpoint::kChat) {
    *err = BadRequest("'echo' is supported on /v1/completions only", "echo");
    return false;
  }
  if (!CheckNotImplemented(body, err)) return false;
  if (endpoint != Endpoint::kChat) {
    for (const char* chat_only : {"chat_template_kwargs", "reasoning_effort"}) {
      if (auto it = body.find(chat_only); it != body.end() && !it->is_null()) {
        *err = BadRequest(
            absl::StrCat("'", chat_only, "' is supported on /v1/chat/completions only"), chat_only);
        return false;
      }
    }
  }
  if (!ReadRequestId(body, &r->request_id, err)) return false;
  if (!ReadPriority(body, model, &r->priority, err)) return false;
  return true;
}

ParseOutcome ParseRequestOrThrow(Endpoint endpoint, std::string_view text, const ServedModel& model,
                                 const Tokenizer& tok, const ChatTemplate* chat_template) {
  ParseOutcome out;
  json body;
  if (!ParseBody(text, &body, &out.error)) return out;
  ValidatedRequest r;
  r.endpoint = endpoint;
  r.model = model.name;
  if (auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      out.error = BadRequest("'model' must be a string", "model");
      return out;
    }
    if (it->get<std::string>() != model.name) {
      out.error =
          BadRequest(absl::StrCat("The model '", it->get<std::string>(),
                                  "' does not exist; this server serves '", model.name, "'"),
                     "model");
      out.error.status = 404;
      out.error.type = "NotFoundError";
      out.error.code = "model_not_found";
      return out;
    }
  }
  bool echo = false;
  if (!ReadRequestOptions(endpoint, body, model, &r, &echo, &out.error)) return out;
  StructuredOutput tool_constraint;  // tool_choice "required" / a named function
  out.ignored_fields = UnknownFields(body, KnownFields(endpoint));
  if (endpoint == Endpoint::kChat) {
    std::vector<ChatMessage> messages;
    if (!ReadMessages(body, &messages, &out.error)) return out;
    if (!ReadTools(body, text, model, &r, &tool_constraint, &out.error)) return out;
    std::string kwargs;
    if (!ReadTemplateKwargs(body, text, &kwargs, &out.error)) return out;
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodeChat(chat_template, tok, messages, r.tools_json, kwargs);
    if (!ids.ok()) {
      out.error = BadRequest(std::string(ids.status().message()), ChatErrorField(ids.status()));
      return out;
    }
    r.prompts.push_back(*std::move(ids));
  } else if (!ReadPrompts(body, tok, &r.prompts, echo ? &r.echo_texts : nullptr, &out.error)) {
    return out;
  }
  size_t longest = 0;
  for (const auto& p : r.prompts) {
    if (p.empty()) {
      out.error = BadRequest("the prompt tokenizes to no tokens", "prompt");
      return out;
    }
    longest = std::max(longest, p.size());
  }
  // Default max_tokens: 16 for completions (OpenAI), the rest of the context for chat (vLLM).
  if (endpoint == Endpoint::kChat) {
    r.params.max_tokens =
        static_cast<int>(std::max<int64_t>(1, model.max_model_len - static_cast<int64_t>(longest)));
  }
  // The model's sampling defaults fill the fields the request leaves out;
  // not for beam search, which samples nothing (vLLM's beam search takes no
  // generation-config values either).
  const auto beam = body.find("use_beam_search");
  if (beam == body.end() || !beam->is_boolean() || !beam->get<bool>()) {
    const SamplingDefaults& d = model.defaults;
    if (d.temperature) r.params.temperature = *d.temperature;
    if (d.top_p) r.params.top_p = *d.top_p;
    if (d.min_p) r.params.min_p = *d.min_p;
    if (d.repetition_penalty) r.params.repetition_penalty = *d.repetition_penalty;
    if (d.top_k) r.params.top_k = *d.top_k;
  }
  if (!ReadSampling(body, text, endpoint, tok.vocab_size(), &r.params, &out.error)) return out;
  if (!FinishToolFields(std::move(tool_constraint), &r, &out.error)) return out;
  if (r.stream && r.params.prompt_logprobs >= 0) {  // vLLM's rule
    out.error =
        BadRequest("'prompt_logprobs' is not available when 'stream' is true", "prompt_logprobs");
    return out;
  }
  if (echo && r.params.logprobs >= 0) {
    // vLLM: the echoed prompt's tokens get their logprobs too (prompt logprobs).
    if (r.stream) {
      out.error =
          BadRequest("'echo' with 'logprobs' is not available when 'stream' is true", "echo");
      return out;
    }
    r.params.prompt_logprobs = std::max(r.params.prompt_logprobs, r.params.logprobs);
  }
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (auto it = body.find(key); it != body.end() && !it->is_null()) r.max_tokens_given = true;
  }
  out.request = std::move(r);
  return out;
}

}  // namespace

ParseOutcome ParseRequest(Endpoint endpoint, std::string_view text, const ServedModel& model,
                          const Tokenizer& tok, const ChatTemplate* chat_template) {
  try {
    return ParseRequestOrThrow(endpoint, text, model, tok, chat_template);
  } catch (const json::exception& e) {  // a type the checks above missed: still the client's fault
    ParseOutcome out;
    out.error = BadRequest(absl::StrCat("malformed request: ", e.what()));
    return out;
  }
}

std::string CompletionResponse(const ValidatedRequest& r, const std::string& id, int64_t created,
                               const std::vector<CompletionOutput>& choices, const Usage& usage,
                               const Tokenizer& tok,
                               const std::vector<std::vector<PromptLogprob>>& prompt_logprobs) {
  const bool chat = r.endpoint == Endpoint::kChat;
  // Per prompt (choice i belongs to prompt i / n).
  std::vector<json> prompt_lps;
  if (r.params.prompt_logprobs >= 0) {
    for (size_t p = 0; p < r.prompts.size(); ++p) {
      static const std::vector<PromptLogprob> kNone;
      prompt_lps.push_back(PromptLogprobsJson(
          r.prompts[p], p < prompt_logprobs.size() ? prompt_logprobs[p] : kNone, tok));
    }
  }
  json cs = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionOutput& c = choices[i];
    size_t text_offset = 0;
    EchoedPrompt echo;
    if (!chat && !r.echo_texts.empty() && r.params.logprobs >= 0 && !r.prompts.empty()) {
      static const std::vector<PromptLogprob> kNone;
      const size_t p = i / r.params.n % r.prompts.size();
      echo = {&r.prompts[p], p < prompt_logprobs.size() ? &prompt_logprobs[p] : &kNone};
    }
    json choice = {{"index", i},
                   {"logprobs", LogprobsJson(r, c, tok, &text_offset, echo)},
                   {"finish_reason", FinishJson(c.finish_reason)}};
    if (chat) {
      json message = {{"role", "assistant"}, {"content", c.text}};
      if (r.parse_tool_calls) {
        ParsedToolCalls parsed = ParseToolCalls(r.tool_call_format, c.text);
        if (!r.parallel_tool_calls && parsed.calls.size() > 1) parsed.calls.resize(1);
        if (!parsed.calls.empty()) {
          message["content"] = parsed.content.empty() ? json(nullptr) : json(parsed.content);
          message["tool_calls"] = ToolCallsJson(parsed.calls);
          choice["finish_reason"] = "tool_calls";
        }
      }
      choice["message"] = std::move(message);
    } else {
      choice["text"] =
          r.echo_texts.empty()
              ? c.text
              : absl::StrCat(r.echo_texts[i / r.params.n % r.echo_texts.size()], c.text);
      if (!prompt_lps.empty())
        choice["prompt_logprobs"] = prompt_lps[i / r.params.n % prompt_lps.size()];
    }
    cs.push_back(std::move(choice));
  }
  json body = {{"id", id},           {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created}, {"model", r.model},
               {"choices", cs},      {"usage", UsageJson(usage)}};
  if (chat && !prompt_lps.empty()) body["prompt_logprobs"] = prompt_lps[0];  // vLLM: top level
  return Dump(body);
}

std::string StreamChunk(const ValidatedRequest& r, const std::string& id, int64_t created,
                        int index, const CompletionOutput& d, bool first, const Tokenizer& tok,
                        size_t* text_offset) {
  const bool chat = r.endpoint == Endpoint::kChat;
  json choice = {{"index", index},
                 {"logprobs", LogprobsJson(r, d, tok, text_offset)},
                 {"finish_reason", FinishJson(d.finish_reason)}};
  if (chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!d.text.empty() || first) delta["content"] = d.text;
    choice["delta"] = std::move(delta);
  } else if (first && !r.echo_texts.empty()) {
    choice["text"] = absl::StrCat(r.echo_texts[index / r.params.n % r.echo_texts.size()], d.text);
  } else {
    choice["text"] = d.text;
  }
  json chunk = {{"id", id},
                {"object", chat ? "chat.completion.chunk" : "text_completion"},
                {"created", created},
                {"model", r.model},
                {"choices", json::array({choice})}};
  if (r.include_usage) chunk["usage"] = nullptr;
  return Dump(chunk);
}

std::vector<std::string> ToolStreamChunks(const ValidatedRequest& r, const std::string& id,
                                          int64_t created, int index, const std::string& text,
                                          FinishReason finish, ToolStreamState* st) {
  std::vector<std::string> out;
  auto chunk = [&](json delta, json finish_reason) {
    if (!st->role_sent) {
      delta["role"] = "assistant";
      st->role_sent = true;
    }
    json choice = {{"index", index},
                   {"logprobs", nullptr},
                   {"delta", std::move(delta)},
                   {"finish_reason", std::move(finish_reason)}};
    json c = {{"id", id},
              {"object", "chat.completion.chunk"},
              {"created", created},
              {"model", r.model},
              {"choices", json::array({std::move(choice)})}};
    if (r.include_usage) c["usage"] = nullptr;
    out.push_back(Dump(c));
  };
  // Call i's header (once), then its arguments from what was sent to `args`.
  auto send_call = [&](size_t i, const std::string& id, const std::string& name,
                       const std::string& args) {
    if (i >= st->call_ids.size()) {
      st->call_ids.push_back(id);
      st->args_sent.push_back(0);
      chunk({{"tool_calls", json::array({{{"index", i},
                                          {"id", id},
                                          {"type", "function"},
                                          {"function", {{"name", name}, {"arguments", ""}}}}})}},
            nullptr);
    }
    if (args.size() > st->args_sent[i]) {
      chunk({{"tool_calls",
              json::array(
                  {{{"index", i}, {"function", {{"arguments", args.substr(st->args_sent[i])}}}}})}},
            nullptr);
      st->args_sent[i] = args.size();
    }
  };
  if (finish == FinishReason::kNone) {
    const size_t certain = ToolCallFreeContentPrefix(r.tool_call_format, text);
    if (certain > st->sent) {
      chunk({{"content", text.substr(st->sent, certain - st->sent)}}, nullptr);
      st->sent = certain;
    } else if (!st->role_sent) {
      chunk({{"content", ""}}, nullptr);
    }
    std::vector<PartialToolCall> calls =
        StreamableToolCalls(r.tool_call_format, std::string_view(text).substr(st->sent));
    if (!r.parallel_tool_calls && calls.size() > 1) calls.resize(1);
    for (size_t i = 0; i < calls.size(); ++i) {
      const std::string id = i < st->call_ids.size() ? st->call_ids[i] : NewToolCallId();
      send_call(i, id, calls[i].name, calls[i].arguments_prefix);
    }
    return out;
  }
  ParsedToolCalls parsed = ParseToolCalls(r.tool_call_format, text);
  if (!r.parallel_tool_calls && parsed.calls.size() > 1) parsed.calls.resize(1);
  if (parsed.calls.empty()) {
    json delta = json::object();
    if (text.size() > st->sent) delta["content"] = text.substr(st->sent);
    chunk(std::move(delta), FinishJson(finish));
  } else {
    if (parsed.content.size() > st->sent) {
      chunk({{"content", parsed.content.substr(st->sent)}}, nullptr);
    }
    for (size_t i = 0; i < parsed.calls.size(); ++i) {
      const ToolCall& call = parsed.calls[i];
      send_call(i, i < st->call_ids.size() ? st->call_ids[i] : call.id, call.name, call.arguments);
    }
    chunk(json::object(), "tool_calls");
  }
  st->sent = text.size();
  return out;
}

std::string UsageChunk(const ValidatedRequest& r, const std::string& id, int64_t created,
                       const Usage& usage) {
  const bool chat = r.endpoint == Endpoint::kChat;
  return Dump({{"id", id},
               {"object", chat ? "chat.completion.chunk" : "text_completion"},
               {"created", created},
               {"model", r.model},
               {"choices", json::array()},
               {"usage", UsageJson(usage)}});
}

std::string ModelsResponse(const ServedModel& model, int64_t created) {
  json m = {{"id", model.name},   {"object", "model"},
            {"created", created}, {"owned_by", "pagedserve"},
            {"root", model.name}, {"max_model_len", model.max_model_len}};
  return Dump({{"object", "list"}, {"data", json::array({m})}});
}

std::string TokenizeResponse(std::string_view text, const ServedModel& model, const Tokenizer& tok,
                             const ChatTemplate* chat_template, ApiError* err) {
  json body;
  if (!ParseBody(text, &body, err)) return "";
  bool add_special = true;
  if (!ReadBool(body, "add_special_tokens", &add_special, err)) return "";
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    std::vector<ChatMessage> messages;
    if (!ReadMessages(body, &messages, err)) return "";
    std::string kwargs;
    if (!ReadTemplateKwargs(body, text, &kwargs, err)) return "";
    absl::StatusOr<std::vector<int32_t>> encoded =
        EncodeChat(chat_template, tok, messages, /*tools_json=*/{}, kwargs);
    if (!encoded.ok()) {
      *err = BadRequest(std::string(encoded.status().message()), ChatErrorField(encoded.status()));
      return "";
    }
    ids = *std::move(encoded);
  } else {
    auto it = body.find("prompt");
    if (it == body.end() || !it->is_string()) {
      *err = BadRequest("'prompt' (a string) or 'messages' is required", "prompt");
      return "";
    }
    EncodeOptions eo;
    eo.add_special_tokens = add_special;
    ids = tok.Encode(it->get<std::string>(), eo);
  }
  return Dump({{"tokens", ids}, {"count", ids.size()}, {"max_model_len", model.max_model_len}});
}

std::string DetokenizeResponse(std::string_view text, const Tokenizer& tok, ApiError* err) {
  json body;
  if (!ParseBody(text, &body, err)) return "";
  if (!body.contains("tokens") || !body["tokens"].is_array()) {
    *err = BadRequest("'tokens' (an array of token ids) is required", "tokens");
    return "";
  }
  std::vector<int32_t> ids;
  if (!ReadIds(body["tokens"], "tokens", "tokens", tok.vocab_size(), &ids, err)) return "";
  absl::StatusOr<std::string> s = tok.Decode(ids);
  if (!s.ok()) {
    *err = BadRequest(std::string(s.status().message()), "tokens");
    return "";
  }
  return Dump({{"prompt", *s}});
}

}  // namespace pagedserve::openai
