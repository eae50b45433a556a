#include "runtime/frontend/protocol.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/common/cache_salt.h"
#include "runtime/common/json_limits.h"
#include "runtime/frontend/chat_messages.h"
#include "runtime/frontend/request_fields.h"

namespace pagedserve::protocol {

namespace {

using json = nlohmann::json;

// Failure inside the parser: code + message. The id is attached by the caller.
struct Failure {
  ErrorCode code;
  std::string message;
};
using Check = std::optional<Failure>;

Failure Invalid(std::string message) { return {ErrorCode::kInvalidRequest, std::move(message)}; }

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A shared reader's error (request_fields.h) as a parse failure.
Check Checked(const absl::Status& s) {
  if (s.ok()) return std::nullopt;
  return Invalid(std::string(s.message()));
}

Failure WrongType(absl::string_view field, absl::string_view expected, const json& got) {
  return Invalid(std::string(WrongTypeError(field, expected, got).message()));
}

// Floats go on the wire in their shortest round-trip form (0.7, not 0.699999988).
double WireFloat(float f) {
  if (!std::isfinite(f)) return static_cast<double>(f);
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), f);
  *r.ptr = '\0';
  return std::strtod(buf, nullptr);
}

Check ReadString(const json& j, absl::string_view field, std::string& out) {
  return Checked(StringFromJson(j, field, &out));
}

Check ReadInt(const json& j, absl::string_view field, int& out) {
  return Checked(IntFromJson(j, field, &out));
}

Check ReadBool(const json& j, absl::string_view field, bool& out) {
  return Checked(BoolFromJson(j, field, &out));
}

Check ReadTokenIds(const json& j, absl::string_view field, int32_t vocab_size,
                   std::vector<int32_t>& out) {
  return Checked(TokenIdsFromJson(j, field, vocab_size, &out));
}

Check RejectUnknownFields(const json& obj, const std::set<absl::string_view>& known,
                          absl::string_view type) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!known.count(it.key())) {
      const std::string key = TruncateUtf8(it.key(), 64);
      return Invalid(absl::StrCat("unknown field ", Dump(json(key)), " in ", type, " request"));
    }
  }
  return std::nullopt;
}

// Reads the optional id of health/stats/abort requests; required ones check emptiness.
Check ReadId(const json& obj, bool required, std::string& out) {
  auto it = obj.find("id");
  if (it == obj.end() || it->is_null()) {
    if (required) return Invalid("missing field 'id'");
    return std::nullopt;
  }
  if (!it->is_string()) return WrongType("id", "a string", *it);
  out = it->get<std::string>();
  if (out.empty() && required) return Invalid("field 'id' must be a non-empty string");
  if (out.size() > kMaxIdBytes) {
    out.clear();
    return Invalid(absl::StrCat("field 'id' is longer than ", kMaxIdBytes, " bytes"));
  }
  return std::nullopt;
}

// A member of `obj`, or null when absent or JSON null (null = the default).
const json* Member(const json& obj, const char* k) {
  auto it = obj.find(k);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

// "messages": the rules every front end shares (chat_messages.h), strict: a
// message has only 'role' and 'content'.
Check ReadMessages(const json& m, std::vector<ChatMessage>& msgs) {
  std::vector<pagedserve::ChatMessage> read;
  if (absl::Status s = ReadChatMessages(m, /*strict=*/true, &read); !s.ok()) {
    return Invalid(std::string(s.message()));
  }
  msgs.reserve(read.size());
  for (auto& r : read) {
    msgs.push_back(ChatMessage{std::move(r.role), std::move(r.content), std::move(r.tool_calls),
                               std::move(r.tool_call_id), std::move(r.name)});
  }
  return std::nullopt;
}

// The prompt: exactly one of "prompt" (non-empty text), "prompt_token_ids"
// (non-empty, each in the vocabulary) or "messages".
Check ReadPrompt(const json& obj, const ParseOptions& opt, GenerateRequest& req) {
  const json* text = Member(obj, "prompt");
  const json* ids = Member(obj, "prompt_token_ids");
  const json* messages = Member(obj, "messages");
  const int forms = (text != nullptr) + (ids != nullptr) + (messages != nullptr);
  if (forms == 0) {
    return Invalid("missing prompt: one of 'prompt', 'prompt_token_ids' or 'messages' is required");
  }
  if (forms > 1) {
    return Invalid("only one of 'prompt', 'prompt_token_ids' or 'messages' may be given");
  }
  if (text != nullptr) {
    std::string prompt;
    if (Check c = ReadString(*text, "prompt", prompt)) return c;
    if (prompt.empty()) return Invalid("field 'prompt' must be a non-empty string");
    req.prompt = std::move(prompt);
  } else if (ids != nullptr) {
    std::vector<int32_t> prompt;
    if (Check c = ReadTokenIds(*ids, "prompt_token_ids", opt.vocab_size, prompt)) return c;
    if (prompt.empty()) return Invalid("field 'prompt_token_ids' must be a non-empty array");
    req.prompt = std::move(prompt);
  } else {
    std::vector<ChatMessage> msgs;
    if (Check c = ReadMessages(*messages, msgs)) return c;
    req.prompt = std::move(msgs);
  }
  return std::nullopt;
}

// The sampling fields: n, max_tokens and logprobs (this protocol's), then
// those every front end reads alike (request_fields.h ReadSamplingFields).
Check ReadSampling(const json& obj, const ParseOptions& opt, SamplingParams& sp) {
  if (const json* j = Member(obj, "n"))
    if (Check c = ReadInt(*j, "n", sp.n)) return c;
  if (const json* j = Member(obj, "max_tokens"))
    if (Check c = ReadInt(*j, "max_tokens", sp.max_tokens)) return c;
  if (const json* j = Member(obj, "logprobs"))
    if (Check c = ReadInt(*j, "logprobs", sp.logprobs)) return c;
  if (const json* j = Member(obj, "prompt_logprobs"))
    if (Check c = ReadInt(*j, "prompt_logprobs", sp.prompt_logprobs)) return c;
  return Checked(ReadSamplingFields(obj, opt.vocab_size, &sp));
}

// tools / tool_choice / parallel_tool_calls and the chat template's
// chat_template_kwargs / reasoning_effort (request_fields.h's rules): only
// with `messages`; "required" / named exclude another constraint.
Check ReadTools(const json& obj, std::string_view text, GenerateRequest& req) {
  absl::StatusOr<ToolFields> t = ToolFieldsFromJson(obj, text);
  if (!t.ok()) return Invalid(std::string(t.status().message()));
  const bool chat = std::holds_alternative<std::vector<ChatMessage>>(req.prompt);
  if (!t->tools_json.empty() && !chat) return Invalid("field 'tools' needs a 'messages' prompt");
  if ((t->choice == "required" || t->choice == "function") &&
      req.sampling.structured_output.active()) {
    return Invalid(
        "field 'tool_choice' \"required\" or a named function constrains the output to tool "
        "calls; it cannot be combined with another constraint");
  }
  req.tools = *std::move(t);
  // Given at all (even {}), the template's variables need a template to run:
  // refused on a text or token prompt, as HTTP refuses them on completions.
  for (const char* chat_only : {"chat_template_kwargs", "reasoning_effort"}) {
    if (auto it = obj.find(chat_only); it != obj.end() && !it->is_null() && !chat)
      return Invalid(absl::StrCat("field '", chat_only, "' needs a 'messages' prompt"));
  }
  absl::StatusOr<std::string> kwargs = TemplateKwargsFromJson(obj, text);
  if (!kwargs.ok()) return Invalid(std::string(kwargs.status().message()));
  req.chat_template_kwargs = *std::move(kwargs);
  return std::nullopt;
}

// A generate request's members, checked in this order (the first error wins):
// unknown members, the prompt, sampling numbers, structured output, tools and
// the chat template's kwargs, stop and output options, stream, cache_salt,
// priority, then SamplingParams::Validate.
// `text`: the message's JSON text (a JSON Schema keeps its key order).
Check ParseGenerate(const json& obj, std::string_view text, const ParseOptions& opt,
                    GenerateRequest& req) {
  static const std::set<absl::string_view> kKnown = {"version",
                                                     "type",
                                                     "id",
                                                     "prompt",
                                                     "prompt_token_ids",
                                                     "messages",
                                                     "stream",
                                                     "n",
                                                     "max_tokens",
                                                     "temperature",
                                                     "top_p",
                                                     "top_k",
                                                     "min_p",
                                                     "repetition_penalty",
                                                     "presence_penalty",
                                                     "frequency_penalty",
                                                     "seed",
                                                     "stop",
                                                     "stop_token_ids",
                                                     "ignore_eos",
                                                     "logprobs",
                                                     "cache_salt",
                                                     "priority",
                                                     "chat_template_kwargs",
                                                     "reasoning_effort",
                                                     "use_beam_search",
                                                     "best_of",
                                                     "length_penalty",
                                                     "early_stopping",
                                                     "response_format",
                                                     "structured_outputs",
                                                     "guided_json",
                                                     "guided_regex",
                                                     "guided_choice",
                                                     "guided_grammar",
                                                     "logit_bias",
                                                     "min_tokens",
                                                     "bad_words",
                                                     "skip_special_tokens",
                                                     "include_stop_str_in_output",
                                                     "prompt_logprobs",
                                                     "tools",
                                                     "tool_choice",
                                                     "parallel_tool_calls"};
  if (Check c = RejectUnknownFields(obj, kKnown, "generate")) return c;
  if (Check c = ReadPrompt(obj, opt, req)) return c;
  SamplingParams& sp = req.sampling;
  if (Check c = ReadSampling(obj, opt, sp)) return c;
  req.max_tokens_given = Member(obj, "max_tokens") != nullptr;
  if (absl::StatusOr<StructuredOutputField> so = StructuredOutputFromJson(obj, text); !so.ok()) {
    return Invalid(std::string(so.status().message()));
  } else {
    sp.structured_output = so->constraint;
  }
  if (Check c = ReadTools(obj, text, req)) return c;
  // The logit processors and output options: the rules of request_fields.h,
  // shared with the HTTP API.
  if (absl::Status s = ReadLogitProcessorFields(obj, opt.vocab_size, &sp); !s.ok())
    return Invalid(std::string(s.message()));
  if (const json* j = Member(obj, "stream"))
    if (Check c = ReadBool(*j, "stream", req.stream)) return c;
  if (req.stream && sp.prompt_logprobs >= 0)
    return Invalid("'prompt_logprobs' is not available when 'stream' is true");
  if (const json* j = Member(obj, "cache_salt")) {
    if (!j->is_string()) return WrongType("cache_salt", "a string", *j);
    const std::string& salt = j->get_ref<const std::string&>();
    if (absl::Status s = ValidateCacheSalt(salt); !s.ok()) return Invalid(std::string(s.message()));
    req.cache_salt = salt;
  }
  if (const json* j = Member(obj, "priority")) {
    if (absl::Status s = PriorityFromJson(*j, opt.priority_scheduling, &req.priority); !s.ok())
      return Invalid(std::string(s.message()));
  }
  if (absl::Status s = sp.Validate(); !s.ok()) return Invalid(std::string(s.message()));
  return std::nullopt;
}

// Messages quote client bytes (e.g. nlohmann's "last read: '...'"), which may
// be invalid UTF-8: replace those with U+FFFD so the reply is exactly what the
// client will decode.
std::string ValidUtf8(const std::string& s) {
  return json::parse(Dump(json(s))).get<std::string>();
}

ParseResult Fail(std::string id, const Failure& f) {
  ParseResult r;
  r.error = ErrorReply{std::move(id), f.code, ValidUtf8(f.message)};
  return r;
}

ParseResult ParseRequestImpl(absl::string_view message, const ParseOptions& opt) {
  if (message.size() > opt.max_message_bytes) {
    return Fail("", {ErrorCode::kMessageTooLarge,
                     absl::StrCat("message is ", message.size(), " bytes, the limit is ",
                                  opt.max_message_bytes)});
  }
  // The limits every front end applies before parsing (json_limits.h).
  JsonLimits limits;
  limits.max_depth = opt.max_json_depth;
  if (absl::Status s = CheckJsonText(std::string_view(message.data(), message.size()), limits);
      !s.ok()) {
    return Fail("", {ErrorCode::kInvalidJson, absl::StrCat("message: ", s.message())});
  }
  json obj;
  try {
    obj = json::parse(message.begin(), message.end());
  } catch (const json::exception& e) {
    std::string what = e.what();
    if (auto pos = what.find("] ");
        what.rfind("[json.exception", 0) == 0 && pos != std::string::npos) {
      what = what.substr(pos + 2);
    }
    return Fail("", {ErrorCode::kInvalidJson, absl::StrCat("message is not valid JSON: ", what)});
  }
  if (!obj.is_object()) {
    return Fail("",
                Invalid(absl::StrCat("message must be a JSON object, got ", JsonKindName(obj))));
  }
  // The id first, so that every later error can echo it.
  std::string id;
  if (auto it = obj.find("id"); it != obj.end() && it->is_string() &&
                                it->get_ref<const std::string&>().size() <= kMaxIdBytes) {
    id = it->get<std::string>();
  }
  auto v = obj.find("version");
  if (v == obj.end()) {
    return Fail(id, {ErrorCode::kUnsupportedVersion,
                     absl::StrCat("missing field 'version' (this server speaks protocol version ",
                                  kVersion, ")")});
  }
  if (!v->is_number_integer() || v->get<int64_t>() != kVersion) {
    return Fail(id, {ErrorCode::kUnsupportedVersion,
                     absl::StrCat("unsupported protocol version ", ShowJson(*v),
                                  " (this server speaks version ", kVersion, ")")});
  }
  auto t = obj.find("type");
  if (t == obj.end()) return Fail(id, Invalid("missing field 'type'"));
  if (!t->is_string()) return Fail(id, WrongType("type", "a string", *t));
  const std::string& type = t->get_ref<const std::string&>();
  ParseResult r;
  if (type == "generate") {
    GenerateRequest req;
    if (Check c = ReadId(obj, /*required=*/true, req.id)) return Fail(id, *c);
    if (Check c = ParseGenerate(obj, std::string_view(message.data(), message.size()), opt, req))
      return Fail(id, *c);
    r.request = std::move(req);
  } else if (type == "abort") {
    AbortRequest req;
    if (Check c = RejectUnknownFields(obj, {"version", "type", "id"}, "abort")) return Fail(id, *c);
    if (Check c = ReadId(obj, /*required=*/true, req.id)) return Fail(id, *c);
    r.request = std::move(req);
  } else if (type == "health" || type == "stats") {
    std::string rid;
    if (Check c = RejectUnknownFields(obj, {"version", "type", "id"}, type)) return Fail(id, *c);
    if (Check c = ReadId(obj, /*required=*/false, rid)) return Fail(id, *c);
    if (type == "health") {
      r.request = HealthRequest{std::move(rid)};
    } else {
      r.request = StatsRequest{std::move(rid)};
    }
  } else {
    return Fail(id, {ErrorCode::kUnknownType,
                     absl::StrCat("unknown message type ", ShowJson(*t),
                                  " (expected generate, abort, health or stats)")});
  }
  return r;
}

// ---------------------------------------------------------------------------
// Serialization
// ---------------------------------------------------------------------------
json Header(absl::string_view type, absl::string_view id) {
  json j = json::object();
  j["version"] = kVersion;
  j["type"] = type;
  if (!id.empty()) j["id"] = id;
  return j;
}

json LogprobsJson(const std::vector<TokenLogprob>& lps) {
  json arr = json::array();
  for (const TokenLogprob& lp : lps) {
    json e = {{"token_id", lp.token_id}, {"logprob", WireFloat(lp.logprob)}};
    json top = json::array();
    for (size_t i = 0; i < lp.top_token_ids.size() && i < lp.top_logprobs.size(); ++i) {
      top.push_back(
          {{"token_id", lp.top_token_ids[i]}, {"logprob", WireFloat(lp.top_logprobs[i])}});
    }
    e["top"] = std::move(top);
    arr.push_back(std::move(e));
  }
  return arr;
}

json ToJson(const GenerateRequest& r) {
  json j = Header("generate", r.id);
  if (const auto* text = std::get_if<std::string>(&r.prompt)) {
    j["prompt"] = *text;
  } else if (const auto* ids = std::get_if<std::vector<int32_t>>(&r.prompt)) {
    j["prompt_token_ids"] = *ids;
  } else {
    json m = json::array();
    for (const ChatMessage& c : std::get<std::vector<ChatMessage>>(r.prompt)) {
      json message = {{"role", c.role}, {"content", c.content}};
      if (!c.tool_calls.empty()) {
        // The template's form holds the arguments as an object; the wire's
        // (OpenAI's) as JSON text.
        json calls = json::parse(c.tool_calls);
        for (json& call : calls) {
          json& args = call["function"]["arguments"];
          args = args.dump();
        }
        message["tool_calls"] = std::move(calls);
      }
      if (!c.tool_call_id.empty()) message["tool_call_id"] = c.tool_call_id;
      if (!c.name.empty()) message["name"] = c.name;
      m.push_back(std::move(message));
    }
    j["messages"] = std::move(m);
    if (!r.chat_template_kwargs.empty()) {
      j["chat_template_kwargs"] = json::parse(r.chat_template_kwargs);
    }
  }
  const SamplingParams& s = r.sampling;
  j["n"] = s.n;
  if (r.max_tokens_given) j["max_tokens"] = s.max_tokens;
  j["temperature"] = WireFloat(s.temperature);
  j["top_p"] = WireFloat(s.top_p);
  j["top_k"] = s.top_k;
  j["min_p"] = WireFloat(s.min_p);
  j["repetition_penalty"] = WireFloat(s.repetition_penalty);
  j["presence_penalty"] = WireFloat(s.presence_penalty);
  j["frequency_penalty"] = WireFloat(s.frequency_penalty);
  if (s.seed) j["seed"] = *s.seed;
  j["stop"] = s.stop;
  j["stop_token_ids"] = s.stop_token_ids;
  j["ignore_eos"] = s.ignore_eos;
  j["logprobs"] = s.logprobs;
  if (s.prompt_logprobs >= 0) j["prompt_logprobs"] = s.prompt_logprobs;
  if (!r.tools.tools_json.empty()) {
    j["tools"] = json::parse(r.tools.tools_json);
    j["tool_choice"] = r.tools.choice == "function"
                           ? json{{"type", "function"}, {"function", {{"name", r.tools.function}}}}
                           : json(r.tools.choice);
    j["parallel_tool_calls"] = r.tools.parallel_tool_calls;
  }
  // A tool-call constraint is the server's (from tool_choice), never a field.
  if (s.structured_output.active() &&
      s.structured_output.kind != StructuredOutput::Kind::kToolCalls) {
    const StructuredOutput& so = s.structured_output;
    // A schema goes as its JSON text (accepted there too), so that its key
    // order survives `json`'s sorted objects.
    json value = so.kind == StructuredOutput::Kind::kRegex        ? json(so.spec)
                 : so.kind == StructuredOutput::Kind::kJsonSchema ? json(so.spec)
                 : so.kind == StructuredOutput::Kind::kJsonObject ? json(true)
                                                                  : json::parse(so.spec);
    j["structured_outputs"] = {{StructuredOutputKindName(so.kind), std::move(value)}};
  }
  if (s.use_beam_search) {
    j["use_beam_search"] = true;
    j["best_of"] = s.beam_width();
    j["length_penalty"] = WireFloat(s.length_penalty);
    if (s.early_stopping == EarlyStopping::kNever) {
      j["early_stopping"] = "never";
    } else {
      j["early_stopping"] = s.early_stopping == EarlyStopping::kTrue;
    }
  }
  if (!s.logit_bias.empty()) {
    json bias = json::object();
    for (const auto& [id, b] : s.logit_bias) bias[std::to_string(id)] = WireFloat(b);
    j["logit_bias"] = std::move(bias);
  }
  if (s.min_tokens > 0) j["min_tokens"] = s.min_tokens;
  if (!s.bad_words.empty()) j["bad_words"] = s.bad_words;
  if (s.skip_special_tokens.has_value()) j["skip_special_tokens"] = *s.skip_special_tokens;
  if (s.include_stop_str_in_output) j["include_stop_str_in_output"] = true;
  j["stream"] = r.stream;
  if (!r.cache_salt.empty()) j["cache_salt"] = r.cache_salt;
  if (r.priority != 0) j["priority"] = r.priority;
  return j;
}

struct RequestToJson {
  json operator()(const GenerateRequest& r) const { return ToJson(r); }
  json operator()(const AbortRequest& r) const { return Header("abort", r.id); }
  json operator()(const HealthRequest& r) const { return Header("health", r.id); }
  json operator()(const StatsRequest& r) const { return Header("stats", r.id); }
};

struct ReplyToJson {
  json operator()(const ErrorReply& r) const {
    json j = Header("error", r.id);
    j["code"] = ErrorCodeName(r.code);
    j["message"] = r.message;
    return j;
  }
  json operator()(const DeltaReply& r) const {
    json j = Header("delta", r.id);
    json outs = json::array();
    for (const SequenceDelta& d : r.outputs) {
      json o = {{"index", d.index}, {"text", d.text}, {"token_ids", d.token_ids}};
      if (!d.logprobs.empty()) o["logprobs"] = LogprobsJson(d.logprobs);
      if (d.finish_reason) o["finish_reason"] = FinishReasonName(*d.finish_reason);
      outs.push_back(std::move(o));
    }
    j["outputs"] = std::move(outs);
    return j;
  }
  json operator()(const FinalReply& r) const {
    json j = Header("final", r.id);
    j["stream"] = r.streamed;
    json outs = json::array();
    for (const SequenceFinal& f : r.outputs) {
      json o = {{"index", f.index}, {"finish_reason", FinishReasonName(f.finish_reason)}};
      if (f.stop_string) o["stop_string"] = *f.stop_string;
      if (f.stop_token_id) o["stop_token_id"] = *f.stop_token_id;
      if (f.cumulative_logprob) o["cumulative_logprob"] = *f.cumulative_logprob;
      if (!f.tool_calls.empty()) {
        json calls = json::array();
        for (const ToolCall& c : f.tool_calls) {
          calls.push_back({{"id", c.id},
                           {"type", "function"},
                           {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
        }
        o["tool_calls"] = std::move(calls);
        o["content"] = f.content ? json(*f.content) : json(nullptr);
      }
      if (!r.streamed) {
        o["text"] = f.text;
        o["token_ids"] = f.token_ids;
        if (!f.logprobs.empty()) o["logprobs"] = LogprobsJson(f.logprobs);
      }
      outs.push_back(std::move(o));
    }
    j["outputs"] = std::move(outs);
    if (!r.prompt_logprobs.empty()) {
      json lps = json::array();
      for (const PromptTokenLogprob& p : r.prompt_logprobs) {
        json top = json::array();
        for (size_t i = 0; i < p.top_token_ids.size() && i < p.top_logprobs.size(); ++i)
          top.push_back(
              {{"token_id", p.top_token_ids[i]}, {"logprob", WireFloat(p.top_logprobs[i])}});
        lps.push_back({{"token_id", p.token_id},
                       {"logprob", WireFloat(p.logprob)},
                       {"rank", p.rank},
                       {"top", std::move(top)}});
      }
      j["prompt_logprobs"] = std::move(lps);
    }
    j["usage"] = {{"prompt_tokens", r.usage.prompt_tokens},
                  {"completion_tokens", r.usage.completion_tokens},
                  {"cached_prompt_tokens", r.usage.cached_prompt_tokens}};
    if (!r.error_message.empty()) j["error"] = r.error_message;
    return j;
  }
  json operator()(const AbortReply& r) const { return Header("abort_ack", r.id); }
  json operator()(const HealthReply& r) const {
    json j = Header("health", r.id);
    j["status"] = r.ok ? "ok" : "unhealthy";
    return j;
  }
  json operator()(const StatsReply& r) const {
    json j = Header("stats", r.id);
    j["num_waiting"] = r.num_waiting;
    j["num_running"] = r.num_running;
    j["num_swapped"] = r.num_swapped;
    j["kv_blocks_total"] = r.kv_blocks_total;
    j["kv_blocks_used"] = r.kv_blocks_used;
    j["kv_usage"] = r.kv_usage;
    j["max_num_seqs"] = r.max_num_seqs;
    j["max_model_len"] = r.max_model_len;
    j["max_waiting"] = r.max_waiting;
    return j;
  }
};

// ---------------------------------------------------------------------------
// Reply parsing (client side, lenient)
// ---------------------------------------------------------------------------
absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(std::string(what)); }

template <typename T>
absl::Status Get(const json& obj, const char* key, T& out, bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) {
    return required ? Bad(absl::StrCat("reply: missing field '", key, "'")) : absl::OkStatus();
  }
  try {
    out = it->get<T>();
  } catch (const json::exception&) {
    return Bad(
        absl::StrCat("reply: field '", key, "' has the wrong type (", JsonKindName(*it), ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<FinishReason> ParseFinish(const std::string& s) {
  for (FinishReason f :
       {FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort, FinishReason::kError}) {
    if (s == FinishReasonName(f)) return f;
  }
  return Bad(absl::StrCat("reply: unknown finish_reason '", s, "'"));
}

// A final output's "tool_calls" / "content" (absent: none).
absl::Status ParseToolCallsOf(const json& o, SequenceFinal* f) {
  auto it = o.find("tool_calls");
  if (it == o.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Bad("reply: 'tool_calls' must be an array");
  for (const json& c : *it) {
    const json* fn = c.is_object() && c.contains("function") ? &c["function"] : nullptr;
    if (fn == nullptr || !fn->is_object())
      return Bad("reply: 'tool_calls' entries need 'function'");
    ToolCall call;
    if (auto s = Get(c, "id", call.id); !s.ok()) return s;
    if (auto s = Get(*fn, "name", call.name); !s.ok()) return s;
    if (auto s = Get(*fn, "arguments", call.arguments); !s.ok()) return s;
    f->tool_calls.push_back(std::move(call));
  }
  if (auto c = o.find("content"); c != o.end() && c->is_string())
    f->content = c->get<std::string>();
  return absl::OkStatus();
}

absl::Status ParseLogprobs(const json& o, std::vector<TokenLogprob>& out,
                           const char* key = "logprobs") {
  auto it = o.find(key);
  if (it == o.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_array()) return Bad(absl::StrCat("reply: '", key, "' must be an array"));
  for (const json& e : *it) {
    if (!e.is_object()) return Bad(absl::StrCat("reply: '", key, "' entries must be objects"));
    TokenLogprob lp;
    double v = 0;
    if (auto s = Get(e, "token_id", lp.token_id); !s.ok()) return s;
    if (e.contains("logprob") && e["logprob"].is_null()) {
      lp.logprob = -std::numeric_limits<float>::infinity();
    } else if (auto s = Get(e, "logprob", v); !s.ok()) {
      return s;
    } else {
      lp.logprob = static_cast<float>(v);
    }
    if (auto t = e.find("top"); t != e.end() && t->is_array()) {
      for (const json& x : *t) {
        if (!x.is_object()) return Bad("reply: 'top' entries must be objects");
        int32_t id = 0;
        if (auto s = Get(x, "token_id", id); !s.ok()) return s;
        const json& l = x.contains("logprob") ? x["logprob"] : json();
        lp.top_token_ids.push_back(id);
        lp.top_logprobs.push_back(l.is_number() ? static_cast<float>(l.get<double>())
                                                : -std::numeric_limits<float>::infinity());
      }
    }
    out.push_back(std::move(lp));
  }
  return absl::OkStatus();
}

// prompt_logprobs: entries shaped as the tokens' logprobs, plus a rank.
absl::Status ParsePromptLogprobs(const json& j, std::vector<PromptTokenLogprob>* out) {
  std::vector<TokenLogprob> scored;
  if (auto s = ParseLogprobs(j, scored, "prompt_logprobs"); !s.ok()) return s;
  for (size_t i = 0; i < scored.size(); ++i) {
    PromptTokenLogprob p{scored[i].token_id, scored[i].logprob, 0, scored[i].top_token_ids,
                         scored[i].top_logprobs};
    if (auto s = Get(j["prompt_logprobs"][i], "rank", p.rank); !s.ok()) return s;
    out->push_back(std::move(p));
  }
  return absl::OkStatus();
}

absl::StatusOr<Reply> ParseReplyImpl(absl::string_view message) {
  json j;
  try {
    j = json::parse(message.begin(), message.end());
  } catch (const json::exception& e) {
    return Bad(absl::StrCat("reply is not valid JSON: ", e.what()));
  }
  if (!j.is_object()) return Bad("reply must be a JSON object");
  int version = 0;
  if (auto s = Get(j, "version", version); !s.ok()) return s;
  if (version != kVersion)
    return Bad(absl::StrCat("reply: unsupported protocol version ", version));
  std::string type, id;
  if (auto s = Get(j, "type", type); !s.ok()) return s;
  if (auto s = Get(j, "id", id, /*required=*/false); !s.ok()) return s;
  if (type == "error") {
    ErrorReply r{id, ErrorCode::kInternal, ""};
    std::string code;
    if (auto s = Get(j, "code", code); !s.ok()) return s;
    if (auto s = Get(j, "message", r.message); !s.ok()) return s;
    bool known = false;
    for (int c = 0; c <= static_cast<int>(ErrorCode::kInternal); ++c) {
      if (code == ErrorCodeName(static_cast<ErrorCode>(c))) {
        r.code = static_cast<ErrorCode>(c);
        known = true;
      }
    }
    if (!known) return Bad(absl::StrCat("reply: unknown error code '", code, "'"));
    return r;
  }
  if (type == "delta" || type == "final") {
    auto outs = j.find("outputs");
    if (outs == j.end() || !outs->is_array()) return Bad("reply: 'outputs' must be an array");
    if (type == "delta") {
      DeltaReply r{id, {}};
      for (const json& o : *outs) {
        if (!o.is_object()) return Bad("reply: 'outputs' entries must be objects");
        SequenceDelta d;
        if (auto s = Get(o, "index", d.index); !s.ok()) return s;
        if (auto s = Get(o, "text", d.text); !s.ok()) return s;
        if (auto s = Get(o, "token_ids", d.token_ids); !s.ok()) return s;
        if (auto s = ParseLogprobs(o, d.logprobs); !s.ok()) return s;
        std::string fr;
        if (auto s = Get(o, "finish_reason", fr, false); !s.ok()) return s;
        if (!fr.empty()) {
          auto f = ParseFinish(fr);
          if (!f.ok()) return f.status();
          d.finish_reason = *f;
        }
        r.outputs.push_back(std::move(d));
      }
      return r;
    }
    FinalReply r;
    r.id = id;
    if (auto s = Get(j, "stream", r.streamed, false); !s.ok()) return s;
    for (const json& o : *outs) {
      if (!o.is_object()) return Bad("reply: 'outputs' entries must be objects");
      SequenceFinal f;
      std::string fr;
      if (auto s = Get(o, "index", f.index); !s.ok()) return s;
      if (auto s = Get(o, "finish_reason", fr); !s.ok()) return s;
      auto reason = ParseFinish(fr);
      if (!reason.ok()) return reason.status();
      f.finish_reason = *reason;
      std::string ss;
      int32_t st = 0;
      if (o.contains("stop_string")) {
        if (auto s = Get(o, "stop_string", ss); !s.ok()) return s;
        f.stop_string = ss;
      }
      if (o.contains("stop_token_id")) {
        if (auto s = Get(o, "stop_token_id", st); !s.ok()) return s;
        f.stop_token_id = st;
      }
      if (o.contains("cumulative_logprob")) {
        double cl = 0.0;
        if (auto s = Get(o, "cumulative_logprob", cl); !s.ok()) return s;
        f.cumulative_logprob = cl;
      }
      if (auto s = ParseToolCallsOf(o, &f); !s.ok()) return s;
      if (auto s = Get(o, "text", f.text, !r.streamed); !s.ok()) return s;
      if (auto s = Get(o, "token_ids", f.token_ids, !r.streamed); !s.ok()) return s;
      if (auto s = ParseLogprobs(o, f.logprobs); !s.ok()) return s;
      r.outputs.push_back(std::move(f));
    }
    if (auto s = ParsePromptLogprobs(j, &r.prompt_logprobs); !s.ok()) return s;
    auto u = j.find("usage");
    if (u == j.end() || !u->is_object()) return Bad("reply: missing object 'usage'");
    if (auto s = Get(*u, "prompt_tokens", r.usage.prompt_tokens); !s.ok()) return s;
    if (auto s = Get(*u, "completion_tokens", r.usage.completion_tokens); !s.ok()) return s;
    if (auto s = Get(*u, "cached_prompt_tokens", r.usage.cached_prompt_tokens); !s.ok()) return s;
    if (auto s = Get(j, "error", r.error_message, false); !s.ok()) return s;
    return r;
  }
  if (type == "abort_ack") return AbortReply{id};
  if (type == "health") {
    std::string status;
    if (auto s = Get(j, "status", status); !s.ok()) return s;
    return HealthReply{id, status == "ok"};
  }
  if (type == "stats") {
    StatsReply r;
    r.id = id;
    for (auto [key, field] : {std::pair{"num_waiting", &r.num_waiting},
                              {"num_running", &r.num_running},
                              {"num_swapped", &r.num_swapped},
                              {"kv_blocks_total", &r.kv_blocks_total},
                              {"kv_blocks_used", &r.kv_blocks_used},
                              {"max_num_seqs", &r.max_num_seqs},
                              {"max_model_len", &r.max_model_len},
                              {"max_waiting", &r.max_waiting}}) {
      if (auto s = Get(j, key, *field); !s.ok()) return s;
    }
    if (auto s = Get(j, "kv_usage", r.kv_usage); !s.ok()) return s;
    return r;
  }
  return Bad(absl::StrCat("reply: unknown type '", type, "'"));
}

}  // namespace

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidJson: return "invalid_json";
    case ErrorCode::kInvalidRequest: return "invalid_request";
    case ErrorCode::kUnsupportedVersion: return "unsupported_version";
    case ErrorCode::kUnknownType: return "unknown_type";
    case ErrorCode::kMessageTooLarge: return "message_too_large";
    case ErrorCode::kPromptTooLong: return "prompt_too_long";
    case ErrorCode::kDuplicateId: return "duplicate_id";
    case ErrorCode::kBusy: return "busy";
    case ErrorCode::kNotFound: return "not_found";
    case ErrorCode::kUnavailable: return "unavailable";
    case ErrorCode::kInternal: return "internal";
  }
  return "internal";
}

ParseResult ParseRequest(std::string_view message, const ParseOptions& options) {
  try {
    return ParseRequestImpl(absl::string_view(message.data(), message.size()), options);
  } catch (const std::exception& e) {  // e.g. bad_alloc; never escapes the API
    return Fail("",
                {ErrorCode::kInternal, absl::StrCat("could not parse the message: ", e.what())});
  }
}

absl::StatusOr<Reply> ParseReply(std::string_view message) {
  try {
    return ParseReplyImpl(absl::string_view(message.data(), message.size()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("could not parse the reply: ", e.what()));
  }
}

std::string SerializeRequest(const Request& request) {
  const json j = std::visit(RequestToJson{}, request);
  const auto* g = std::get_if<GenerateRequest>(&request);
  if (g == nullptr || (g->chat_template_kwargs.empty() && g->tools.tools_json.empty())) {
    return Dump(j);
  }
  // `tools` and `chat_template_kwargs` keep the client's key order (the chat
  // template renders them in it), which `json` would sort: the message as
  // ordered JSON with those two members as given.
  using ordered_json = nlohmann::ordered_json;
  ordered_json o = ordered_json::parse(Dump(j));
  if (!g->tools.tools_json.empty()) o["tools"] = ordered_json::parse(g->tools.tools_json);
  if (!g->chat_template_kwargs.empty()) {
    o["chat_template_kwargs"] = ordered_json::parse(g->chat_template_kwargs);
  }
  return o.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
}

std::string SerializeReply(const Reply& reply) { return Dump(std::visit(ReplyToJson{}, reply)); }

std::string ErrorMessage(std::string_view id, ErrorCode code, std::string_view message) {
  return SerializeReply(ErrorReply{std::string(id), code, std::string(message)});
}

}  // namespace pagedserve::protocol
