#include "runtime/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/status_macros.h"
#include "runtime/model/gguf.h"

namespace pagedserve {

std::string ModelArchName(ModelArch arch) {
  switch (arch) {
    case ModelArch::kLlama: return "llama";
    case ModelArch::kMistral: return "mistral";
    case ModelArch::kQwen2: return "qwen2";
    case ModelArch::kQwen3: return "qwen3";
  }
  return "unknown";
}

absl::Status ModelConfig::Validate() const {
  auto positive = [](const char* name, int64_t v) -> absl::Status {
    if (v <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", name, " must be positive, got ", v));
    }
    return absl::OkStatus();
  };
  for (auto [name, v] : {std::pair<const char*, int64_t>{"num_layers", num_layers},
                         {"hidden_size", hidden_size},
                         {"intermediate_size", intermediate_size},
                         {"num_heads", num_heads},
                         {"num_kv_heads", num_kv_heads},
                         {"head_size", head_size},
                         {"vocab_size", vocab_size},
                         {"max_position_embeddings", max_position_embeddings}}) {
    if (auto s = positive(name, v); !s.ok()) return s;
  }
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: num_heads ", num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (head_size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_size ", head_size, " must be even for rotary"));
  }
  if (!(rms_norm_eps > 0) || !std::isfinite(rms_norm_eps)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rms_norm_eps must be positive, got ", rms_norm_eps));
  }
  if (!(rope_theta > 0) || !std::isfinite(rope_theta)) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: rope_theta must be positive, got ", rope_theta));
  }
  if (rope_scaling.type != RopeScaling::Type::kNone && !(rope_scaling.factor > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: rope_scaling.factor must be positive, got ", rope_scaling.factor));
  }
  if (rope_scaling.type == RopeScaling::Type::kLlama3 &&
      (!(rope_scaling.high_freq_factor > rope_scaling.low_freq_factor) ||
       !(rope_scaling.low_freq_factor > 0) || rope_scaling.original_max_position_embeddings <= 0)) {
    return absl::InvalidArgumentError(
        "model config: llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor and "
        "original_max_position_embeddings > 0");
  }
  if (sliding_window < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: sliding_window must be >= 0 (0 = none), got ", sliding_window));
  }
  if (!sliding_layers.empty() && sliding_layers.size() != static_cast<size_t>(num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat("model config: ", sliding_layers.size(),
                                                   " sliding-window layer flags for ", num_layers,
                                                   " layers"));
  }
  if (!rope_scaling.freq_factors.empty()) {
    if (rope_scaling.freq_factors.size() != static_cast<size_t>(head_size / 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", rope_scaling.freq_factors.size(),
          " rope frequency factors for head_size ", head_size, " (need head_size / 2)"));
    }
    for (float f : rope_scaling.freq_factors) {
      if (!std::isfinite(f) || !(f > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model config: rope frequency factor ", f, " is not positive"));
      }
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// GGUF
// ---------------------------------------------------------------------------

namespace {

absl::Status GetIntField(const GgufFile& g, const std::string& key, int* out) {
  auto v = g.GetInt(key);
  if (!v.ok()) return v.status();
  if (*v <= 0 || *v > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": metadata '", key, "': value ", *v, " out of range"));
  }
  *out = static_cast<int>(*v);
  return absl::OkStatus();
}

// llama.cpp's rope_freqs.weight: F32 [head_size / 2], every factor finite
// and positive (the rotary frequencies are divided by them).
absl::StatusOr<std::vector<float>> ReadRopeFreqFactors(const GgufFile& g, const GgufTensorInfo& t,
                                                       int head_size) {
  const uint64_t half = head_size > 0 ? static_cast<uint64_t>(head_size / 2) : 0;
  if (t.type != GgmlType::kF32 || t.dims.size() != 1 || t.dims[0] != half) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": tensor 'rope_freqs.weight' must be F32 of head_size / 2 = ", half,
                     " elements (got ", GgmlTypeName(t.type), " of ", t.num_elements, ")"));
  }
  std::span<const uint8_t> bytes = g.TensorData(t);
  std::vector<float> factors(half);
  std::memcpy(factors.data(), bytes.data(), half * sizeof(float));
  for (size_t i = 0; i < factors.size(); ++i) {
    if (!std::isfinite(factors[i]) || !(factors[i] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(g.path(),
                                                     ": tensor 'rope_freqs.weight': factor ", i,
                                                     " is ", factors[i], ", not positive"));
    }
  }
  return factors;
}

// {arch}.attention.sliding_window and its per-layer pattern (model_config.h).
absl::Status ReadGgufSlidingWindow(const GgufFile& g, const std::string& p, ModelConfig* c) {
  const std::string key = p + "attention.sliding_window";
  if (!g.Find(key)) return absl::OkStatus();
  auto w = g.GetInt(key);
  if (!w.ok()) return w.status();
  if (*w < 0 || *w > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": metadata '", key, "': value ", *w, " out of range"));
  }
  c->sliding_window = static_cast<int>(*w);
  const std::string pkey = p + "attention.sliding_window_pattern";
  const GgufValue* pattern = g.Find(pkey);
  if (c->sliding_window == 0 || pattern == nullptr) return absl::OkStatus();
  if (!pattern->is_array() || pattern->array_type() != GgufValueType::kBool) {
    return absl::UnimplementedError(absl::StrCat(
        g.path(), ": metadata '", pkey,
        "' is not a bool array (one flag per layer); the integer form's layer pattern depends on "
        "the architecture and is not supported for '",
        p.substr(0, p.size() - 1), "'"));
  }
  if (pattern->array_size() != static_cast<size_t>(c->num_layers)) {
    return absl::InvalidArgumentError(absl::StrCat(g.path(), ": metadata '", pkey, "' has ",
                                                   pattern->array_size(), " flags for ",
                                                   c->num_layers, " layers"));
  }
  for (size_t l = 0; l < pattern->array_size(); ++l) {
    PS_ASSIGN_OR_RETURN(const GgufValue flag, pattern->At(l));
    PS_ASSIGN_OR_RETURN(const bool windowed, flag.AsBool());
    c->sliding_layers.push_back(windowed);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& g) {
  auto arch_name = g.GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  ModelConfig c;
  if (*arch_name == "llama") {
    c.arch = ModelArch::kLlama;
  } else if (*arch_name == "qwen2") {
    c.arch = ModelArch::kQwen2;
    c.qkv_bias = true;
  } else if (*arch_name == "qwen3") {
    c.arch = ModelArch::kQwen3;
    c.qk_norm = true;
  } else {
    return absl::UnimplementedError(absl::StrCat(g.path(), ": general.architecture '", *arch_name,
                                                 "' is not supported (llama, qwen2, qwen3)"));
  }
  const std::string p = *arch_name + ".";
  PS_RETURN_IF_ERROR(GetIntField(g, p + "block_count", &c.num_layers));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "embedding_length", &c.hidden_size));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "feed_forward_length", &c.intermediate_size));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.head_count", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  if (g.Find(p + "attention.head_count_kv")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.head_count_kv", &c.num_kv_heads));
  }
  c.head_size = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  if (g.Find(p + "rope.dimension_count")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "rope.dimension_count", &c.head_size));
  }
  if (g.Find(p + "attention.key_length")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.key_length", &c.head_size));
  }
  PS_ASSIGN_OR_RETURN(c.rms_norm_eps, g.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (g.Find(p + "rope.freq_base")) {
    PS_ASSIGN_OR_RETURN(c.rope_theta, g.GetFloat(p + "rope.freq_base"));
  }
  if (g.Find(p + "context_length")) {
    PS_ASSIGN_OR_RETURN(c.max_position_embeddings, g.GetInt(p + "context_length"));
  }
  if (g.Find(p + "vocab_size")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "vocab_size", &c.vocab_size));
  } else if (const GgufValue* toks = g.Find("tokenizer.ggml.tokens"); toks && toks->is_array()) {
    c.vocab_size = static_cast<int>(toks->array_size());
  } else if (const GgufTensorInfo* t = g.FindTensor("token_embd.weight");
             t && t->dims.size() == 2) {
    if (t->dims[1] > static_cast<uint64_t>(INT32_MAX)) {
      return absl::InvalidArgumentError(absl::StrCat(g.path(), ": tensor 'token_embd.weight': ",
                                                     t->dims[1], " rows is not a vocabulary size"));
    }
    c.vocab_size = static_cast<int>(t->dims[1]);
  }
  if (g.Find(p + "rope.scaling.type")) {
    auto type = g.GetString(p + "rope.scaling.type");
    if (!type.ok()) return type.status();
    if (*type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
    } else if (*type != "none") {
      return absl::UnimplementedError(absl::StrCat(g.path(), ": rope.scaling.type '", *type,
                                                   "' is not supported (none, linear)"));
    }
    if (c.rope_scaling.type != RopeScaling::Type::kNone) {
      PS_ASSIGN_OR_RETURN(c.rope_scaling.factor, g.GetFloat(p + "rope.scaling.factor"));
    }
  }
  PS_RETURN_IF_ERROR(ReadGgufSlidingWindow(g, p, &c));
  if (const GgufTensorInfo* t = g.FindTensor("rope_freqs.weight"); t != nullptr) {
    PS_ASSIGN_OR_RETURN(c.rope_scaling.freq_factors, ReadRopeFreqFactors(g, *t, c.head_size));
  }
  c.tie_word_embeddings = g.FindTensor("output.weight") == nullptr;
  // Token ids must fit int32 (a plain cast would wrap them silently).
  // Every end-of-generation id the file declares: eos, and (llama.cpp's
  // "end of turn" / "end of message") eot and eom, e.g. Llama 3's <|eot_id|>.
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    if (!g.Find(key)) continue;
    auto v = g.GetInt(key);
    if (!v.ok()) return v.status();
    if (*v < INT32_MIN || *v > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.path(), ": metadata '", key, "': value ", *v, " out of range"));
    }
    if (key == std::string_view("tokenizer.ggml.bos_token_id")) {
      c.bos_token_id = static_cast<int32_t>(*v);
    } else if (*v >= 0 && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(),
                                    static_cast<int32_t>(*v)) == c.eos_token_ids.end()) {
      c.eos_token_ids.push_back(static_cast<int32_t>(*v));
    }
  }
  if (auto s = c.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(g.path(), ": ", s.message()));
  }
  return c;
}

// ---------------------------------------------------------------------------
// Hugging Face config.json
// ---------------------------------------------------------------------------

namespace {

using nlohmann::json;

absl::Status FieldError(absl::string_view source, absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "': ", what));
}

// Reads j[field]; errors name `source` and the field as `prefix` + field
// (prefix "rope_scaling." for the members of rope_scaling).
template <typename T>
absl::Status ReadNumber(const json& j, absl::string_view source, const char* field, bool required,
                        T* out, absl::string_view prefix = "") {
  const std::string name = absl::StrCat(prefix, field);
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) {
    if (required) return FieldError(source, name, "missing");
    return absl::OkStatus();
  }
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return FieldError(source, name, "must be an integer");
    if (it->is_number_unsigned() &&
        it->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(source, name, absl::StrCat("value ", it->get<uint64_t>(), " out of range"));
    }
    int64_t v = it->get<int64_t>();
    if (v < std::numeric_limits<T>::min() || v > std::numeric_limits<T>::max()) {
      return FieldError(source, name, absl::StrCat("value ", v, " out of range"));
    }
    *out = static_cast<T>(v);
  } else {
    if (!it->is_number()) return FieldError(source, name, "must be a number");
    *out = it->get<T>();
  }
  return absl::OkStatus();
}

bool HfFlag(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

// The sliding window of a config.json as transformers builds its attention
// masks (model_config.h, ModelConfigFromHfJson). Reads num_layers from *c.
absl::Status ReadHfSlidingWindow(const json& j, absl::string_view source, ModelConfig* c) {
  int window = 0;
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "sliding_window", false, &window));
  if (window < 0) return FieldError(source, "sliding_window", "must be >= 0 or null");
  if (auto it = j.find("layer_types"); it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->size() != static_cast<size_t>(c->num_layers)) {
      return FieldError(source, "layer_types",
                        absl::StrCat("must be a list of ", c->num_layers, " layer types"));
    }
    bool any = false;
    for (const json& t : *it) {
      const std::string type = t.is_string() ? t.get<std::string>() : t.dump();
      if (type != "full_attention" && type != "sliding_attention") {
        return absl::UnimplementedError(
            absl::StrCat(source, ": layer_types entry '", type,
                         "' is not supported (full_attention, sliding_attention)"));
      }
      c->sliding_layers.push_back(type == "sliding_attention");
      any = any || c->sliding_layers.back();
    }
    if (any && window == 0) {
      return FieldError(source, "sliding_window",
                        "missing, but layer_types has sliding_attention layers");
    }
    c->sliding_window = any ? window : 0;
    if (!any) c->sliding_layers.clear();
    return absl::OkStatus();
  }
  if (c->arch == ModelArch::kMistral) {
    c->sliding_window = window;
  } else if ((c->arch == ModelArch::kQwen2 || c->arch == ModelArch::kQwen3) &&
             HfFlag(j, "use_sliding_window") && window > 0) {
    int first = c->num_layers;  // transformers' default max_window_layers is model-specific
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "max_window_layers", true, &first));
    c->sliding_window = window;
    for (int l = 0; l < c->num_layers; ++l) c->sliding_layers.push_back(l >= first);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromHfJson(std::string_view text,
                                                  std::string_view source_sv) {
  absl::string_view source(source_sv.data(), source_sv.size());
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid JSON object"));
  }
  ModelConfig c;
  auto archs = j.find("architectures");
  if (archs == j.end() || !archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
    return FieldError(source, "architectures", "must be a non-empty list of strings");
  }
  std::string arch = (*archs)[0].get<std::string>();
  if (arch == "LlamaForCausalLM") {
    c.arch = ModelArch::kLlama;
  } else if (arch == "MistralForCausalLM") {
    c.arch = ModelArch::kMistral;
  } else if (arch == "Qwen2ForCausalLM") {
    c.arch = ModelArch::kQwen2;
    c.qkv_bias = true;
  } else if (arch == "Qwen3ForCausalLM") {
    c.arch = ModelArch::kQwen3;
    c.qk_norm = true;
  } else {
    return absl::UnimplementedError(
        absl::StrCat(source, ": architecture '", arch,
                     "' is not supported (LlamaForCausalLM, MistralForCausalLM, "
                     "Qwen2ForCausalLM, Qwen3ForCausalLM)"));
  }
  // attention_bias (Llama, Qwen3; default false): biases on q/k/v (and o_proj,
  // which no supported checkpoint sets).
  if ((c.arch == ModelArch::kLlama || c.arch == ModelArch::kQwen3) &&
      j.contains("attention_bias") && j["attention_bias"].is_boolean() &&
      j["attention_bias"].get<bool>()) {
    c.qkv_bias = true;
  }
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "num_hidden_layers", true, &c.num_layers));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "hidden_size", true, &c.hidden_size));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "intermediate_size", true, &c.intermediate_size));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "num_attention_heads", true, &c.num_heads));
  c.num_kv_heads = c.num_heads;
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "num_key_value_heads", false, &c.num_kv_heads));
  c.head_size = c.num_heads > 0 ? c.hidden_size / c.num_heads : 0;
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "head_dim", false, &c.head_size));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "vocab_size", true, &c.vocab_size));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "rms_norm_eps", false, &c.rms_norm_eps));
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "rope_theta", false, &c.rope_theta));
  PS_RETURN_IF_ERROR(
      ReadNumber(j, source, "max_position_embeddings", false, &c.max_position_embeddings));
  for (const char* key : {"torch_dtype", "dtype"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null() || !c.checkpoint_dtype.empty()) continue;
    if (!it->is_string()) return FieldError(source, key, "must be a string");
    c.checkpoint_dtype = it->get<std::string>();
  }
  if (auto it = j.find("tie_word_embeddings"); it != j.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError(source, "tie_word_embeddings", "must be a boolean");
    c.tie_word_embeddings = it->get<bool>();
  }
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "bos_token_id", false, &c.bos_token_id));
  if (auto it = j.find("eos_token_id"); it != j.end() && !it->is_null()) {
    // An id must fit int32 (nlohmann's get<int32_t> would wrap it silently).
    auto push_id = [&](const json& e) -> absl::Status {
      int32_t id = 0;
      PS_RETURN_IF_ERROR(ReadNumber(json{{"eos_token_id", e}}, source, "eos_token_id", true, &id));
      c.eos_token_ids.push_back(id);
      return absl::OkStatus();
    };
    if (it->is_number_integer()) {
      PS_RETURN_IF_ERROR(push_id(*it));
    } else if (it->is_array()) {
      for (const json& e : *it) {
        if (!e.is_number_integer()) {
          return FieldError(source, "eos_token_id", "list elements must be integers");
        }
        PS_RETURN_IF_ERROR(push_id(e));
      }
    } else {
      return FieldError(source, "eos_token_id", "must be an integer or a list of integers");
    }
  }
  if (auto it = j.find("rope_scaling"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return FieldError(source, "rope_scaling", "must be an object or null");
    const json& rs = *it;
    std::string type;
    if (rs.contains("rope_type") && rs["rope_type"].is_string()) {
      type = rs["rope_type"].get<std::string>();
    } else if (rs.contains("type") && rs["type"].is_string()) {
      type = rs["type"].get<std::string>();
    } else {
      return FieldError(source, "rope_scaling.rope_type", "missing");
    }
    constexpr absl::string_view kRs = "rope_scaling.";
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      PS_RETURN_IF_ERROR(ReadNumber(rs, source, "factor", true, &c.rope_scaling.factor, kRs));
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::kLlama3;
      PS_RETURN_IF_ERROR(ReadNumber(rs, source, "factor", true, &c.rope_scaling.factor, kRs));
      PS_RETURN_IF_ERROR(
          ReadNumber(rs, source, "low_freq_factor", true, &c.rope_scaling.low_freq_factor, kRs));
      PS_RETURN_IF_ERROR(
          ReadNumber(rs, source, "high_freq_factor", true, &c.rope_scaling.high_freq_factor, kRs));
      PS_RETURN_IF_ERROR(ReadNumber(rs, source, "original_max_position_embeddings", true,
                                    &c.rope_scaling.original_max_position_embeddings, kRs));
    } else if (type != "default") {
      return absl::UnimplementedError(absl::StrCat(source, ": rope_scaling type '", type,
                                                   "' is not supported (linear, llama3)"));
    }
  }
  PS_RETURN_IF_ERROR(ReadHfSlidingWindow(j, source, &c));
  if (auto v = c.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", v.message()));
  }
  return c;
}

absl::Status AddGenerationConfigEos(std::string_view json_text, std::string_view source_sv,
                                    ModelConfig* c) {
  absl::string_view source(source_sv.data(), source_sv.size());
  json j = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a valid JSON object"));
  }
  auto it = j.find("eos_token_id");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::vector<json> ids;
  if (it->is_array()) {
    ids.assign(it->begin(), it->end());
  } else {
    ids.push_back(*it);
  }
  for (const json& e : ids) {
    int32_t id = 0;
    PS_RETURN_IF_ERROR(ReadNumber(json{{"eos_token_id", e}}, source, "eos_token_id", true, &id));
    if (id < 0) return FieldError(source, "eos_token_id", absl::StrCat("id ", id, " is negative"));
    if (std::find(c->eos_token_ids.begin(), c->eos_token_ids.end(), id) == c->eos_token_ids.end())
      c->eos_token_ids.push_back(id);
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& dir) {
  std::string path = dir + "/config.json";
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  PS_ASSIGN_OR_RETURN(ModelConfig c, ModelConfigFromHfJson(ss.str(), path));
  // generation_config.json may list more end tokens (Llama 3.x: <|eot_id|>,
  // <|eom_id|>), as vLLM and transformers' generate() stop on.
  const std::string gen_path = dir + "/generation_config.json";
  std::ifstream gen(gen_path, std::ios::binary);
  if (gen) {
    std::stringstream gs;
    gs << gen.rdbuf();
    PS_RETURN_IF_ERROR(AddGenerationConfigEos(gs.str(), gen_path, &c));
  }
  return c;
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& c) {
  const int half = c.head_size / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope_theta, (2.0 * i) / c.head_size);
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLinear) {
    for (double& f : inv) f /= rs.factor;
  } else if (rs.type == RopeScaling::Type::kLlama3) {
    const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
    const double low_freq_wavelen = old_ctx / rs.low_freq_factor;
    const double high_freq_wavelen = old_ctx / rs.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_freq_wavelen) {
        f = f / rs.factor;  // low frequencies: fully interpolated
      } else if (wavelen >= high_freq_wavelen) {
        // medium: smooth blend between interpolated and original
        double smooth =
            (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
        f = (1.0 - smooth) * f / rs.factor + smooth * f;
      }  // high frequencies unchanged
    }
  }
  if (rs.freq_factors.size() == inv.size()) {
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= rs.freq_factors[i];
  }
  return inv;
}

}  // namespace pagedserve
