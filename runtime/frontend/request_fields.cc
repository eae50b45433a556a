#include "runtime/frontend/request_fields.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"
#include "runtime/common/status_macros.h"
#include "runtime/tokenizer/chat_template.h"

namespace pagedserve {
namespace {

using json = nlohmann::json;

absl::Status OutOfRange(absl::string_view field, const json& v) {
  return FieldError(field, absl::StrCat("field '", field, "' is out of range, got ", ShowJson(v)));
}

const json* Member(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

// The one reading of an integer request field: a JSON integer, or a finite
// number without a fractional part (16.0, 1e3) as that integer, as vLLM's
// request models read it (pydantic's lax mode). Integers beyond both 64-bit
// ranges arrive from nlohmann as floating point, and land in kBeyond64.
struct WholeNumber {
  enum Kind {
    kNotWhole,  // not a number, a fraction, or not finite
    kBeyond64,  // whole, outside [-2^63, 2^64)
    kSigned,    // negative: `s`
    kUnsigned,  // >= 0: `u`
  };
  Kind kind = kNotWhole;
  int64_t s = 0;
  uint64_t u = 0;
};

WholeNumber ReadWholeNumber(const json& v) {
  if (v.is_number_unsigned()) return {WholeNumber::kUnsigned, 0, v.get<uint64_t>()};
  if (v.is_number_integer()) {
    const int64_t x = v.get<int64_t>();
    if (x >= 0) return {WholeNumber::kUnsigned, 0, static_cast<uint64_t>(x)};
    return {WholeNumber::kSigned, x, 0};
  }
  if (!v.is_number_float()) return {};
  const double d = v.get<double>();
  if (!std::isfinite(d) || d != std::trunc(d)) return {};
  if (d >= 0x1p64 || d < -0x1p63) return {WholeNumber::kBeyond64};
  // Exact: d is whole and within the target type.
  if (d >= 0) return {WholeNumber::kUnsigned, 0, static_cast<uint64_t>(d)};
  return {WholeNumber::kSigned, static_cast<int64_t>(d), 0};
}

}  // namespace

std::string TruncateUtf8(std::string s, size_t n) {
  if (s.size() <= n) return s;
  size_t cut = n - 3;
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + "...";
}

std::string ShowJson(const json& v) {
  return TruncateUtf8(v.dump(-1, ' ', false, json::error_handler_t::replace), 40);
}

std::string JsonKindName(const json& v) {
  if (v.is_number_integer()) return "integer";
  if (v.is_number_float()) return "number";
  return v.type_name();
}

absl::Status WrongTypeError(absl::string_view field, absl::string_view expected, const json& got) {
  return FieldError(
      field,
      absl::StrCat("field '", field, "' must be ", expected, ", got ", JsonKindName(got),
                   got.is_primitive() && !got.is_null() ? absl::StrCat(" ", ShowJson(got)) : ""));
}

absl::Status PriorityFromJson(const json& v, bool priority_scheduling, int32_t* out) {
  int priority = 0;
  if (!v.is_null()) PS_RETURN_IF_ERROR(IntFromJson(v, "priority", &priority));
  if (priority != 0 && !priority_scheduling) {
    return FieldError("priority",
                      "field 'priority' must be 0: priority scheduling is not enabled (start the "
                      "server with --scheduling-policy priority)");
  }
  *out = priority;
  return absl::OkStatus();
}

absl::Status IntFromJson(const json& v, absl::string_view field, int* out) {
  const WholeNumber w = ReadWholeNumber(v);
  constexpr int kMin = std::numeric_limits<int>::min(), kMax = std::numeric_limits<int>::max();
  switch (w.kind) {
    case WholeNumber::kNotWhole: return WrongTypeError(field, "an integer", v);
    case WholeNumber::kBeyond64: return OutOfRange(field, v);
    case WholeNumber::kSigned:
      if (w.s < kMin) return OutOfRange(field, v);
      *out = static_cast<int>(w.s);
      return absl::OkStatus();
    case WholeNumber::kUnsigned:
      if (w.u > static_cast<uint64_t>(kMax)) return OutOfRange(field, v);
      *out = static_cast<int>(w.u);
      return absl::OkStatus();
  }
  return WrongTypeError(field, "an integer", v);
}

absl::Status NumberFromJson(const json& v, absl::string_view field, float* out) {
  if (!v.is_number()) return WrongTypeError(field, "a number", v);
  const double x = v.get<double>();
  // No sampling number is meaningful beyond kMaxSamplingMagnitude; past it the
  // value is refused before it is rounded to float.
  if (!std::isfinite(x) || std::abs(x) > kMaxSamplingMagnitude) return OutOfRange(field, v);
  *out = static_cast<float>(x);
  return absl::OkStatus();
}

absl::Status BoolFromJson(const json& v, absl::string_view field, bool* out) {
  if (!v.is_boolean()) return WrongTypeError(field, "true or false", v);
  *out = v.get<bool>();
  return absl::OkStatus();
}

absl::Status StringFromJson(const json& v, absl::string_view field, std::string* out) {
  if (!v.is_string()) return WrongTypeError(field, "a string", v);
  *out = v.get<std::string>();
  return absl::OkStatus();
}

absl::Status TokenIdsFromJson(const json& v, absl::string_view field, int32_t vocab_size,
                              std::vector<int32_t>* out) {
  if (!v.is_array()) return WrongTypeError(field, "an array of token ids", v);
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  const int64_t limit = vocab_size > 0 ? vocab_size : std::numeric_limits<int32_t>::max();
  for (size_t i = 0; i < v.size(); ++i) {
    const json& t = v[i];
    const std::string name = absl::StrCat(field, "[", i, "]");
    const WholeNumber w = ReadWholeNumber(t);
    if (w.kind == WholeNumber::kNotWhole) return WrongTypeError(name, "an integer token id", t);
    if (w.kind != WholeNumber::kUnsigned || w.u >= static_cast<uint64_t>(limit)) {
      return FieldError(name, absl::StrCat("field '", name, "' must be a token id in [0, ", limit,
                                           "), got ", ShowJson(t)));
    }
    ids.push_back(static_cast<int32_t>(w.u));
  }
  *out = std::move(ids);
  return absl::OkStatus();
}

absl::Status ReadSamplingFields(const json& body, int32_t vocab_size, SamplingParams* p) {
  struct NumberField {
    const char* name;
    float* value;
  };
  for (const NumberField& f :
       {NumberField{"temperature", &p->temperature}, NumberField{"top_p", &p->top_p},
        NumberField{"min_p", &p->min_p}, NumberField{"repetition_penalty", &p->repetition_penalty},
        NumberField{"presence_penalty", &p->presence_penalty},
        NumberField{"frequency_penalty", &p->frequency_penalty},
        NumberField{"length_penalty", &p->length_penalty}}) {
    if (const json* j = Member(body, f.name)) {
      if (absl::Status s = NumberFromJson(*j, f.name, f.value); !s.ok()) return s;
    }
  }
  if (const json* j = Member(body, "top_k")) {
    if (absl::Status s = IntFromJson(*j, "top_k", &p->top_k); !s.ok()) return s;
    if (p->top_k == 0) p->top_k = -1;  // 0 and -1 both mean off, as in vLLM
  }
  if (const json* j = Member(body, "best_of")) {
    if (absl::Status s = IntFromJson(*j, "best_of", &p->best_of); !s.ok()) return s;
  }
  if (const json* j = Member(body, "seed")) {
    absl::StatusOr<std::optional<uint64_t>> seed = SeedFromJson(*j);
    if (!seed.ok()) return seed.status();
    p->seed = *seed;
  }
  if (const json* j = Member(body, "stop")) {
    if (j->is_string()) {
      p->stop = {j->get<std::string>()};
    } else if (j->is_array()) {
      std::vector<std::string> stop(j->size());
      for (size_t i = 0; i < j->size(); ++i) {
        if (!(*j)[i].is_string())
          return WrongTypeError(absl::StrCat("stop[", i, "]"), "a string", (*j)[i]);
        stop[i] = (*j)[i].get<std::string>();
      }
      p->stop = std::move(stop);  // count and length: SamplingParams::Validate
    } else {
      return WrongTypeError("stop", "a string or an array of strings", *j);
    }
  }
  if (const json* j = Member(body, "stop_token_ids")) {
    if (absl::Status s = TokenIdsFromJson(*j, "stop_token_ids", vocab_size, &p->stop_token_ids);
        !s.ok()) {
      return s;
    }
  }
  if (const json* j = Member(body, "ignore_eos")) {
    if (absl::Status s = BoolFromJson(*j, "ignore_eos", &p->ignore_eos); !s.ok()) return s;
  }
  if (const json* j = Member(body, "use_beam_search")) {
    if (absl::Status s = BoolFromJson(*j, "use_beam_search", &p->use_beam_search); !s.ok()) {
      return s;
    }
  }
  if (const json* j = Member(body, "early_stopping")) {
    if (j->is_boolean()) {
      p->early_stopping = j->get<bool>() ? EarlyStopping::kTrue : EarlyStopping::kFalse;
    } else if (j->is_string() && j->get_ref<const std::string&>() == "never") {
      p->early_stopping = EarlyStopping::kNever;
    } else {
      return WrongTypeError("early_stopping", "true, false or \"never\"", *j);
    }
  }
  if (p->use_beam_search && Member(body, "temperature") == nullptr) p->temperature = 0.0f;
  return absl::OkStatus();
}

absl::StatusOr<std::optional<uint64_t>> SeedFromJson(const nlohmann::json& seed) {
  const WholeNumber w = ReadWholeNumber(seed);
  switch (w.kind) {
    case WholeNumber::kUnsigned: return std::optional<uint64_t>(w.u);
    case WholeNumber::kSigned:
      if (w.s == -1) return std::optional<uint64_t>();
      return std::optional<uint64_t>(static_cast<uint64_t>(w.s));
    case WholeNumber::kNotWhole:
    case WholeNumber::kBeyond64: break;
  }
  return FieldError(
      "seed", "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got " + ShowJson(seed));
}

namespace {

using Kind = StructuredOutput::Kind;

absl::Status Bad(const std::string& field, const std::string& what) {
  return FieldError(field, "field '" + field + "' " + what);
}

// A JSON Schema given as an object / boolean, or as its JSON text.
template <typename J>
absl::StatusOr<std::string> SchemaText(const J& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    J parsed = J::parse(v.template get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
      return Bad(field, "must be a JSON Schema (an object, or its JSON text)");
    }
    return parsed.dump();
  }
  return Bad(field, "must be a JSON Schema (an object, or its JSON text)");
}

template <typename J>
absl::StatusOr<std::string> ChoiceText(const J& v, const std::string& field) {
  if (!v.is_array() || v.empty()) return Bad(field, "must be a non-empty array of strings");
  for (const J& c : v) {
    if (!c.is_string()) return Bad(field, "must be a non-empty array of strings");
  }
  return v.dump();
}

template <typename J>
absl::StatusOr<StructuredOutput> FromResponseFormat(const J& rf) {
  const std::string field = "response_format";
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return Bad(field, "must be an object with a string 'type'");
  }
  const std::string type = rf["type"].template get<std::string>();
  if (type == "text") return StructuredOutput{};
  if (type == "json_object") return StructuredOutput{Kind::kJsonObject, ""};
  if (type != "json_schema") {
    return Bad(field, "type must be 'text', 'json_object' or 'json_schema', got '" + type + "'");
  }
  auto js = rf.find("json_schema");
  if (js == rf.end() || !js->is_object()) {
    return Bad(field, "with type 'json_schema' needs an object 'json_schema'");
  }
  auto schema = js->find("schema");
  if (schema == js->end()) return Bad(field, "json_schema.schema is required");
  absl::StatusOr<std::string> text = SchemaText(*schema, field);
  if (!text.ok()) return text.status();
  return StructuredOutput{Kind::kJsonSchema, *text};
}

template <typename J>
absl::StatusOr<StructuredOutput> FromStructuredOutputs(const J& so) {
  const std::string field = "structured_outputs";
  if (!so.is_object()) return Bad(field, "must be an object");
  StructuredOutput out;
  int count = 0;
  for (const auto& [key, v] : so.items()) {
    if (v.is_null()) continue;
    const std::string sub = absl::StrCat(field, ".", key);
    if (key == "json") {
      absl::StatusOr<std::string> t = SchemaText(v, sub);
      if (!t.ok()) return t.status();
      out = {Kind::kJsonSchema, *t};
    } else if (key == "regex") {
      if (!v.is_string()) return Bad(sub, "must be a string");
      out = {Kind::kRegex, v.template get<std::string>()};
    } else if (key == "choice") {
      absl::StatusOr<std::string> t = ChoiceText(v, sub);
      if (!t.ok()) return t.status();
      out = {Kind::kChoice, *t};
    } else if (key == "json_object") {
      if (!v.is_boolean()) return Bad(sub, "must be a boolean");
      if (!v.template get<bool>()) continue;
      out = {Kind::kJsonObject, ""};
    } else if (key == "grammar") {
      if (!v.is_string()) return Bad(sub, "must be a string (a GBNF grammar)");
      out = {Kind::kGrammar, v.template get<std::string>()};
    } else if (key == "structural_tag") {
      return Bad(sub, "is not supported (JSON Schema, regex, choice, grammar and json_object are)");
    } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties" || key == "whitespace_pattern") {
      continue;  // options of vLLM's backends; ours has one fixed policy (compact JSON)
    } else {
      return Bad(sub, "is not a known structured output kind");
    }
    ++count;
  }
  if (count > 1)
    return Bad(field, "must set exactly one of json, regex, choice, grammar, json_object");
  return out;
}

absl::Status ReadOptionalBool(const json& body, const char* key, bool* out) {
  const json* j = Member(body, key);
  if (j == nullptr) return absl::OkStatus();
  if (!j->is_boolean()) return FieldError(key, absl::StrCat("'", key, "' must be a boolean"));
  *out = j->template get<bool>();
  return absl::OkStatus();
}

absl::Status ReadLogitBias(const json& j, int32_t vocab, SamplingParams* p) {
  if (!j.is_object()) {
    return FieldError("logit_bias",
                      "'logit_bias' must be an object mapping token ids (strings) to numbers");
  }
  if (j.size() > SamplingParams::kMaxLogitBias) {
    return FieldError("logit_bias",
                      absl::StrCat("'logit_bias' has ", j.size(), " entries, the limit is ",
                                   SamplingParams::kMaxLogitBias));
  }
  p->logit_bias.clear();
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    char* end = nullptr;
    errno = 0;
    const long long id = key.empty() || key.size() > 10 ? -1 : std::strtoll(key.c_str(), &end, 10);
    if (id < 0 || id >= vocab || errno != 0 || end != key.c_str() + key.size()) {
      std::string shown = key.size() > 20 ? key.substr(0, 17) + "..." : key;
      return FieldError("logit_bias", absl::StrCat("'logit_bias' keys must be token ids in [0, ",
                                                   vocab, "), got \"", shown, "\""));
    }
    if (!it->is_number()) {
      return FieldError("logit_bias", absl::StrCat("'logit_bias' of token ", id,
                                                   " must be a number, got ", it->type_name()));
    }
    const double bias = it->template get<double>();
    if (!(bias >= -100.0 && bias <= 100.0)) {
      return FieldError("logit_bias", absl::StrCat("'logit_bias' of token ", id,
                                                   " must be in [-100, 100], got ", bias));
    }
    p->logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  // "1" and "01" name the same token.
  std::vector<std::pair<int32_t, float>> sorted = p->logit_bias;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    if (sorted[i].first == sorted[i - 1].first) {
      return FieldError("logit_bias",
                        absl::StrCat("'logit_bias' names token ", sorted[i].first, " twice"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadBadWords(const json& j, SamplingParams* p) {
  if (!j.is_array()) return FieldError("bad_words", "'bad_words' must be an array of strings");
  p->bad_words.clear();
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_string()) {
      return FieldError(
          "bad_words", absl::StrCat("bad_words[", i, "] must be a string, got ", j[i].type_name()));
    }
    p->bad_words.push_back(j[i].get<std::string>());
  }
  return absl::OkStatus();  // count and lengths: SamplingParams::Validate
}

template <typename J>
absl::StatusOr<StructuredOutputField> StructuredOutputFromJsonT(const J& body) {
  StructuredOutputField result;
  if (!body.is_object()) return result;
  for (const char* key : {"response_format", "structured_outputs", "guided_json", "guided_regex",
                          "guided_choice", "guided_grammar"}) {
    auto it = body.find(key);
    if (it == body.end() || it->is_null()) continue;
    const std::string field = key;
    absl::StatusOr<StructuredOutput> so;
    if (field == "response_format") {
      so = FromResponseFormat(*it);
    } else if (field == "structured_outputs") {
      so = FromStructuredOutputs(*it);
    } else if (field == "guided_json") {
      absl::StatusOr<std::string> t = SchemaText(*it, field);
      so = t.ok() ? absl::StatusOr<StructuredOutput>(StructuredOutput{Kind::kJsonSchema, *t})
                  : absl::StatusOr<StructuredOutput>(t.status());
    } else if (field == "guided_regex") {
      so = it->is_string() ? absl::StatusOr<StructuredOutput>(
                                 StructuredOutput{Kind::kRegex, it->template get<std::string>()})
                           : absl::StatusOr<StructuredOutput>(Bad(field, "must be a string"));
    } else if (field == "guided_choice") {
      absl::StatusOr<std::string> t = ChoiceText(*it, field);
      so = t.ok() ? absl::StatusOr<StructuredOutput>(StructuredOutput{Kind::kChoice, *t})
                  : absl::StatusOr<StructuredOutput>(t.status());
    } else {  // guided_grammar
      so = it->is_string()
               ? absl::StatusOr<StructuredOutput>(
                     StructuredOutput{Kind::kGrammar, it->template get<std::string>()})
               : absl::StatusOr<StructuredOutput>(Bad(field, "must be a string (a GBNF grammar)"));
    }
    if (!so.ok()) return so.status();
    if (!so->active()) continue;
    if (result.constraint.active()) {
      return Bad(field,
                 "cannot be combined with '" + result.field + "': one constraint per request");
    }
    result.constraint = *std::move(so);
    result.field = field;
  }
  return result;
}

}  // namespace

absl::StatusOr<StructuredOutputField> StructuredOutputFromJson(const nlohmann::json& body,
                                                               std::string_view body_text) {
  absl::StatusOr<StructuredOutputField> r = StructuredOutputFromJsonT(body);
  if (!r.ok() || body_text.empty() || r->constraint.kind != Kind::kJsonSchema) return r;
  // The schema's members in the client's order (`body` has them sorted):
  // object members are generated in the order of `properties`.
  const nlohmann::ordered_json ordered =
      nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded()) return r;
  return StructuredOutputFromJsonT(ordered);
}

absl::StatusOr<std::string> TemplateKwargsFromJson(const json& body, std::string_view body_text) {
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();
  if (const json* j = Member(body, "chat_template_kwargs")) {
    if (!j->is_object()) return WrongTypeError("chat_template_kwargs", "an object", *j);
    for (const auto& [key, value] : j->items()) {
      if (IsReservedTemplateVariable(key)) {
        return FieldError(
            "chat_template_kwargs",
            absl::StrCat("field 'chat_template_kwargs' may not set '", TruncateUtf8(key, 64),
                         "': the server sets it from the request"));
      }
    }
    kwargs = nlohmann::ordered_json(*j);  // sorted; the client's order below when it parses
    if (!body_text.empty()) {
      const nlohmann::ordered_json ordered =
          nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      if (ordered.is_object() && ordered.contains("chat_template_kwargs")) {
        kwargs = ordered["chat_template_kwargs"];
      }
    }
  }
  if (const json* j = Member(body, "reasoning_effort")) {
    if (!j->is_string() || (*j != "low" && *j != "medium" && *j != "high")) {
      return FieldError("reasoning_effort",
                        absl::StrCat("field 'reasoning_effort' must be one of \"low\", "
                                     "\"medium\", \"high\", got ",
                                     ShowJson(*j)));
    }
    kwargs["reasoning_effort"] = j->get<std::string>();
  }
  if (kwargs.empty()) return std::string();
  return kwargs.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

absl::Status ReadLogitProcessorFields(const json& body, int32_t vocab_size, SamplingParams* p) {
  if (const json* j = Member(body, "logit_bias")) {
    const int32_t vocab = vocab_size > 0 ? vocab_size : INT32_MAX;
    if (absl::Status s = ReadLogitBias(*j, vocab, p); !s.ok()) return s;
  }
  if (const json* j = Member(body, "min_tokens")) {
    int min_tokens = 0;
    PS_RETURN_IF_ERROR(IntFromJson(*j, "min_tokens", &min_tokens));
    if (min_tokens < 0) {
      return FieldError("min_tokens", "'min_tokens' must be an integer in [0, 2^31)");
    }
    p->min_tokens = min_tokens;
  }
  if (const json* j = Member(body, "bad_words")) {
    if (absl::Status s = ReadBadWords(*j, p); !s.ok()) return s;
  }
  if (Member(body, "skip_special_tokens") != nullptr) {
    bool skip = true;
    if (absl::Status s = ReadOptionalBool(body, "skip_special_tokens", &skip); !s.ok()) return s;
    p->skip_special_tokens = skip;
  }
  return ReadOptionalBool(body, "include_stop_str_in_output", &p->include_stop_str_in_output);
}

namespace {

absl::Status CheckTools(const json& tools) {
  if (!tools.is_array() || tools.size() > 128) {
    return FieldError("tools", "'tools' must be an array of at most 128 function tools");
  }
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const json* fn = t.is_object() && t.contains("function") ? &t["function"] : nullptr;
    const bool ok = fn != nullptr && t.value("type", std::string("function")) == "function" &&
                    fn->is_object() && fn->contains("name") && (*fn)["name"].is_string() &&
                    !(*fn)["name"].get_ref<const std::string&>().empty() &&
                    (!fn->contains("parameters") || (*fn)["parameters"].is_object() ||
                     (*fn)["parameters"].is_null());
    if (!ok) {
      return FieldError("tools",
                        absl::StrCat("'tools[", i,
                                     "]' must be {\"type\": \"function\", \"function\": "
                                     "{\"name\": non-empty string, \"parameters\": object}}"));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadToolChoice(const json& tc, ToolFields* t) {
  const bool named = tc.is_object() && tc.value("type", std::string()) == "function";
  if (!named && !(tc.is_string() && (tc == "none" || tc == "auto" || tc == "required"))) {
    return FieldError("tool_choice",
                      "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": "
                      "\"function\", \"function\": {\"name\": ...}}");
  }
  if (!named) {
    t->choice = tc.get<std::string>();
    return absl::OkStatus();
  }
  const json* fn = tc.contains("function") ? &tc["function"] : nullptr;
  if (fn == nullptr || !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
    return FieldError(
        "tool_choice",
        "'tool_choice' of type \"function\" needs {\"function\": {\"name\": string}}");
  }
  t->function = (*fn)["name"].get<std::string>();
  t->choice = "function";
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ToolFields> ToolFieldsFromJson(const json& body, std::string_view body_text) {
  ToolFields t;
  if (const json* tools = Member(body, "tools")) {
    if (absl::Status s = CheckTools(*tools); !s.ok()) return s;
    if (!tools->empty()) {
      const nlohmann::ordered_json ordered =
          nlohmann::ordered_json::parse(body_text, nullptr, /*allow_exceptions=*/false);
      const nlohmann::ordered_json& source = ordered.is_object() && ordered.contains("tools")
                                                 ? ordered["tools"]
                                                 : nlohmann::ordered_json(*tools);
      t.tools_json = source.dump(-1, ' ', false, json::error_handler_t::replace);
    }
  }
  t.choice = t.tools_json.empty() ? "none" : "auto";
  if (const json* tc = Member(body, "tool_choice")) {
    if (absl::Status s = ReadToolChoice(*tc, &t); !s.ok()) return s;
    if (t.choice != "none" && t.tools_json.empty()) {
      return FieldError("tool_choice",
                        absl::StrCat("'tool_choice' \"", t.choice, "\" needs 'tools'"));
    }
  }
  if (absl::Status s = ReadOptionalBool(body, "parallel_tool_calls", &t.parallel_tool_calls);
      !s.ok())
    return s;
  return t;
}

absl::StatusOr<StructuredOutput> ToolFieldsConstraint(const ToolFields& t, ToolCallFormat format) {
  if (t.choice != "required" && t.choice != "function") return StructuredOutput{};
  absl::StatusOr<StructuredOutput> c =
      ToolChoiceConstraint(format, t.tools_json, t.function, t.parallel_tool_calls);
  if (!c.ok()) return FieldError("tool_choice", c.status().message());
  return c;
}

std::vector<std::string> UnknownFields(const json& body, std::span<const std::string_view> known) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) out.push_back(it.key());
  }
  return out;
}

}  // namespace pagedserve
