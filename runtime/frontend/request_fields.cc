#include "runtime/frontend/request_fields.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"

namespace pagedserve {

absl::StatusOr<std::optional<uint64_t>> SeedFromJson(const nlohmann::json& seed) {
  // nlohmann keeps integers beyond both 64-bit ranges as floating point.
  if (!seed.is_number_integer()) {
    std::string shown = seed.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (shown.size() > 40) shown = shown.substr(0, 37) + "...";
    return FieldError("seed",
                      "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got " + shown);
  }
  if (seed.is_number_unsigned()) return std::optional<uint64_t>(seed.get<uint64_t>());
  const int64_t v = seed.get<int64_t>();
  if (v == -1) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(v));
}

namespace {

using json = nlohmann::json;
using Kind = StructuredOutput::Kind;

absl::Status Bad(const std::string& field, const std::string& what) {
  return FieldError(field, "field '" + field + "' " + what);
}

// A JSON Schema given as an object / boolean, or as its JSON text.
absl::StatusOr<std::string> SchemaText(const json& v, const std::string& field) {
  if (v.is_object() || v.is_boolean()) return v.dump();
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
      return Bad(field, "must be a JSON Schema (an object, or its JSON text)");
    }
    return parsed.dump();
  }
  return Bad(field, "must be a JSON Schema (an object, or its JSON text)");
}

absl::StatusOr<std::string> ChoiceText(const json& v, const std::string& field) {
  if (!v.is_array() || v.empty()) return Bad(field, "must be a non-empty array of strings");
  for (const json& c : v) {
    if (!c.is_string()) return Bad(field, "must be a non-empty array of strings");
  }
  return v.dump();
}

absl::StatusOr<StructuredOutput> FromResponseFormat(const json& rf) {
  const std::string field = "response_format";
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return Bad(field, "must be an object with a string 'type'");
  }
  const std::string type = rf["type"].get<std::string>();
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

absl::StatusOr<StructuredOutput> FromStructuredOutputs(const json& so) {
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
      out = {Kind::kRegex, v.get<std::string>()};
    } else if (key == "choice") {
      absl::StatusOr<std::string> t = ChoiceText(v, sub);
      if (!t.ok()) return t.status();
      out = {Kind::kChoice, *t};
    } else if (key == "json_object") {
      if (!v.is_boolean()) return Bad(sub, "must be a boolean");
      if (!v.get<bool>()) continue;
      out = {Kind::kJsonObject, ""};
    } else if (key == "grammar" || key == "structural_tag") {
      return Bad(sub, "is not supported (JSON Schema, regex, choice and json_object are)");
    } else if (key == "disable_fallback" || key == "disable_any_whitespace" ||
               key == "disable_additional_properties" || key == "whitespace_pattern") {
      continue;  // options of vLLM's backends; ours has one fixed policy (compact JSON)
    } else {
      return Bad(sub, "is not a known structured output kind");
    }
    ++count;
  }
  if (count > 1) return Bad(field, "must set exactly one of json, regex, choice, json_object");
  return out;
}

const json* Member(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

absl::Status ReadOptionalBool(const json& body, const char* key, bool* out) {
  const json* j = Member(body, key);
  if (j == nullptr) return absl::OkStatus();
  if (!j->is_boolean()) return FieldError(key, absl::StrCat("'", key, "' must be a boolean"));
  *out = j->get<bool>();
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
    const double bias = it->get<double>();
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

}  // namespace

absl::StatusOr<StructuredOutputField> StructuredOutputFromJson(const nlohmann::json& body) {
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
                                 StructuredOutput{Kind::kRegex, it->get<std::string>()})
                           : absl::StatusOr<StructuredOutput>(Bad(field, "must be a string"));
    } else if (field == "guided_choice") {
      absl::StatusOr<std::string> t = ChoiceText(*it, field);
      so = t.ok() ? absl::StatusOr<StructuredOutput>(StructuredOutput{Kind::kChoice, *t})
                  : absl::StatusOr<StructuredOutput>(t.status());
    } else {
      so = Bad(field, "is not supported (JSON Schema, regex, choice and json_object are)");
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
absl::Status ReadLogitProcessorFields(const json& body, int32_t vocab_size, SamplingParams* p) {
  if (const json* j = Member(body, "logit_bias")) {
    const int32_t vocab = vocab_size > 0 ? vocab_size : INT32_MAX;
    if (absl::Status s = ReadLogitBias(*j, vocab, p); !s.ok()) return s;
  }
  if (const json* j = Member(body, "min_tokens")) {
    if (!j->is_number_integer() || (j->is_number_unsigned() && j->get<uint64_t>() > INT32_MAX) ||
        j->get<int64_t>() < 0 || j->get<int64_t>() > INT32_MAX) {
      return FieldError("min_tokens", "'min_tokens' must be an integer in [0, 2^31)");
    }
    p->min_tokens = static_cast<int>(j->get<int64_t>());
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

std::vector<std::string> UnknownFields(const json& body, std::span<const std::string_view> known) {
  std::vector<std::string> out;
  if (!body.is_object()) return out;
  for (auto it = body.begin(); it != body.end(); ++it) {
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) out.push_back(it.key());
  }
  return out;
}

}  // namespace pagedserve
