#include "runtime/model/model_config.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/half.h"
#include "nlohmann/json.hpp"
#include "runtime/common/status_macros.h"
#include "runtime/model/gguf.h"
#include "runtime/model/json_object.h"

namespace pagedserve {

std::string ModelArchName(ModelArch arch) {
  switch (arch) {
    case ModelArch::kLlama: return "llama";
    case ModelArch::kMistral: return "mistral";
    case ModelArch::kQwen2: return "qwen2";
    case ModelArch::kQwen3: return "qwen3";
    case ModelArch::kGemma2: return "gemma2";
    case ModelArch::kGemma3: return "gemma3";
    case ModelArch::kPhi3: return "phi3";
    case ModelArch::kMixtral: return "mixtral";
    case ModelArch::kQwen3Moe: return "qwen3_moe";
    case ModelArch::kQwen2Moe: return "qwen2_moe";
  }
  return "unknown";
}

namespace {

// Upper bounds on the dimensions, far above every released checkpoint (at
// most 126 layers, head size 256, 128 heads, 64K hidden) and low enough
// that the per-layer and per-dimension work a config implies (sliding-window
// flags, rotary tables) is instant: a crafted file must not stall a load.
// Zero (not yet read) passes; Validate() checks positivity.
absl::Status CheckDimensionBounds(const ModelConfig& c) {
  for (auto [name, v, most] :
       {std::tuple<const char*, int64_t, int64_t>{"num_layers", c.num_layers, 4096},
        {"hidden_size", c.hidden_size, 1 << 20},
        {"intermediate_size", c.intermediate_size, 1 << 22},
        {"num_heads", c.num_heads, 1 << 14},
        {"num_kv_heads", c.num_kv_heads, 1 << 14},
        {"head_size", c.head_size, 4096},
        {"num_experts", c.moe.num_experts, 4096}}) {
    if (v > most) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", name, " ", v, " is above the bound ", most));
    }
  }
  return absl::OkStatus();
}

// kLongRope's fields (model_config.h): RotaryDim() / 2 factors in [1e-3,
// 1e6] in each set, an attention factor in (0, 16] and a positive original
// context; no factors or attention factor for the other types.
absl::Status ValidateLongRope(const RopeScaling& rs, int rotary_dim) {
  if (rs.type != RopeScaling::Type::kLongRope) {
    if (!rs.short_factor.empty() || !rs.long_factor.empty() || rs.attention_factor != 1.0) {
      return absl::InvalidArgumentError(
          "model config: LongRoPE factors or an attention factor without rope type longrope");
    }
    return absl::OkStatus();
  }
  const size_t half = static_cast<size_t>(rotary_dim / 2);
  for (const auto* set : {&rs.short_factor, &rs.long_factor}) {
    const char* name = set == &rs.short_factor ? "short_factor" : "long_factor";
    if (set->size() != half) {
      return absl::InvalidArgumentError(absl::StrCat("model config: longrope ", name, " has ",
                                                     set->size(), " entries for rotary_dim ",
                                                     rotary_dim, " (need rotary_dim / 2)"));
    }
    for (size_t i = 0; i < set->size(); ++i) {
      if (!((*set)[i] >= 1e-3 && (*set)[i] <= 1e6)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model config: longrope ", name, "[", i, "] is ", (*set)[i], ", outside [1e-3, 1e6]"));
      }
    }
  }
  // Sanity ranges (real checkpoints: attention factors 1-1.3, factors 1-100):
  // outside them the rotary tables overflow or vanish.
  if (!(rs.attention_factor > 0 && rs.attention_factor <= 16) ||
      rs.original_max_position_embeddings <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: longrope needs an attention factor in (0, 16] (got ",
                     rs.attention_factor, ") and a positive original_max_position_embeddings (got ",
                     rs.original_max_position_embeddings, ")"));
  }
  return absl::OkStatus();
}

}  // namespace

float ModelConfig::AttentionScale() const {
  const double scalar = query_pre_attn_scalar > 0 ? query_pre_attn_scalar : head_size;
  return static_cast<float>(1.0 / std::sqrt(scalar));
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
  PS_RETURN_IF_ERROR(CheckDimensionBounds(*this));
  if (num_heads % num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: num_heads ", num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   num_kv_heads));
  }
  if (head_size % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: head_size ", head_size, " must be even for rotary"));
  }
  if (rotary_dim < 0 || rotary_dim > head_size || rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("model config: rotary_dim ", rotary_dim,
                                                   " must be even and in [0, head_size ", head_size,
                                                   "] (0 = head_size)"));
  }
  if (auto s = ValidateLongRope(rope_scaling, RotaryDim()); !s.ok()) return s;
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
  for (auto [name, v] :
       {std::pair<const char*, double>{"attn_logit_softcapping", attn_logit_softcapping},
        {"final_logit_softcapping", final_logit_softcapping},
        {"query_pre_attn_scalar", query_pre_attn_scalar},
        {"rope_local_theta", rope_local_theta},
        {"embedding_scale", embedding_scale}}) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", name, " must be >= 0 (0 = none), got ", v));
    }
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
  if (moe.enabled() &&
      (moe.top_k < 1 || moe.top_k > moe.num_experts || moe.expert_intermediate_size <= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: a mixture of ", moe.num_experts, " experts needs 1 <= top_k (", moe.top_k,
        ") <= num_experts and a positive expert width (", moe.expert_intermediate_size, ")"));
  }
  if (moe.shared_expert_intermediate_size < 0 ||
      (moe.shared_expert_intermediate_size > 0 && !moe.enabled())) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: a shared expert (width ", moe.shared_expert_intermediate_size,
                     ") needs a mixture of experts and a positive width"));
  }
  if (moe.num_experts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model config: num_experts must be >= 0, got ", moe.num_experts));
  }
  if (!rope_scaling.freq_factors.empty()) {
    if (rope_scaling.freq_factors.size() != static_cast<size_t>(RotaryDim() / 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model config: ", rope_scaling.freq_factors.size(),
          " rope frequency factors for rotary_dim ", RotaryDim(), " (need rotary_dim / 2)"));
    }
    for (float f : rope_scaling.freq_factors) {
      if (!std::isfinite(f) || !(f > 0)) {
        return absl::InvalidArgumentError(
            absl::StrCat("model config: rope frequency factor ", f, " is not positive"));
      }
    }
  }
  for (double f : RopeInverseFrequencies(*this)) {
    if (!std::isnormal(f) || f < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: the rope scaling gives a rotary frequency of ", f,
                       " (not finite and positive)"));
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

// A per-frequency factor tensor (llama.cpp's rope_freqs.weight,
// rope_factors_long / _short.weight): F32 [rotary_dim / 2], every factor
// finite and positive (the rotary frequencies are divided by them).
absl::StatusOr<std::vector<float>> ReadRopeFactorTensor(const GgufFile& g, const GgufTensorInfo& t,
                                                        int rotary_dim) {
  const uint64_t half = rotary_dim > 0 ? static_cast<uint64_t>(rotary_dim / 2) : 0;
  if (t.type != GgmlType::kF32 || t.dims.size() != 1 || t.dims[0] != half) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": tensor '", t.name, "' must be F32 of rotary_dim / 2 = ", half,
                     " elements (got ", GgmlTypeName(t.type), " of ", t.num_elements, ")"));
  }
  std::span<const uint8_t> bytes = g.TensorData(t);
  std::vector<float> factors(half);
  std::memcpy(factors.data(), bytes.data(), half * sizeof(float));
  for (size_t i = 0; i < factors.size(); ++i) {
    if (!std::isfinite(factors[i]) || !(factors[i] > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(g.path(), ": tensor '", t.name, "': factor ",
                                                     i, " is ", factors[i], ", not positive"));
    }
  }
  return factors;
}

// llama.cpp's integer window pattern (llama_hparams::set_swa_pattern, not
// dense-first): layer l is windowed when n == 0 or l % n < n - 1.
void SetSlidingPattern(int64_t n, ModelConfig* c) {
  c->sliding_layers.clear();
  for (int l = 0; l < c->num_layers; ++l) c->sliding_layers.push_back(n == 0 || l % n < n - 1);
}

// {arch}.attention.sliding_window and its per-layer pattern (model_config.h).
// default_pattern > 0: the architecture's integer pattern (gemma2 2, gemma3
// 6), used when the file has none and taking an integer pattern; 0: a
// missing pattern means every layer and an integer one is Unimplemented.
absl::Status ReadGgufSlidingWindow(const GgufFile& g, const std::string& p, int default_pattern,
                                   ModelConfig* c) {
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
  if (c->sliding_window == 0) return absl::OkStatus();
  if (default_pattern > 0 && (pattern == nullptr || !pattern->is_array())) {
    int64_t n = default_pattern;
    if (pattern != nullptr) {
      PS_ASSIGN_OR_RETURN(n, g.GetInt(pkey));
    }
    if (n < 0 || n > INT32_MAX) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.path(), ": metadata '", pkey, "': value ", n, " out of range"));
    }
    SetSlidingPattern(n, c);
    return absl::OkStatus();
  }
  if (pattern == nullptr) return absl::OkStatus();
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

// Adds the id of the token whose text is `text` (if the vocabulary has one)
// to the end ids: llama.cpp finds end-of-turn tokens by their text
// (llama-vocab.cpp's end-of-generation list) where its converter writes no
// eot id (Gemma's <end_of_turn>, Phi-3's <|end|>).
absl::Status AddEndTokenByText(const GgufFile& g, std::string_view text, ModelConfig* c) {
  const GgufValue* toks = g.Find("tokenizer.ggml.tokens");
  if (toks == nullptr || !toks->is_array() || toks->array_type() != GgufValueType::kString)
    return absl::OkStatus();
  for (size_t i = 0; i < toks->array_size() && i <= static_cast<size_t>(INT32_MAX); ++i) {
    PS_ASSIGN_OR_RETURN(const GgufValue tok, toks->At(i));
    PS_ASSIGN_OR_RETURN(const std::string_view t, tok.AsString());
    if (t != text) continue;
    const auto id = static_cast<int32_t>(i);
    if (std::find(c->eos_token_ids.begin(), c->eos_token_ids.end(), id) == c->eos_token_ids.end())
      c->eos_token_ids.push_back(id);
    break;
  }
  return absl::OkStatus();
}

// As llama.cpp: the head size is attention.key_length (default
// embedding_length / head_count), the rotated part rope.dimension_count
// (default the head size); phi3 alone rotates part of a head. Needs c->arch,
// num_heads and hidden_size.
absl::Status ReadGgufHeadSize(const GgufFile& g, const std::string& p, ModelConfig* c) {
  c->head_size = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
  if (g.Find(p + "attention.key_length")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.key_length", &c->head_size));
  }
  if (!g.Find(p + "rope.dimension_count")) return absl::OkStatus();
  PS_RETURN_IF_ERROR(GetIntField(g, p + "rope.dimension_count", &c->rotary_dim));
  if (c->rotary_dim == c->head_size) c->rotary_dim = 0;
  if (c->rotary_dim != 0 && c->arch != ModelArch::kPhi3) {
    return absl::UnimplementedError(absl::StrCat(
        g.path(), ": '", p, "rope.dimension_count' ", c->rotary_dim, " differs from the head size ",
        c->head_size, ": partial rotary embeddings are supported for phi3 only"));
  }
  return absl::OkStatus();
}

// Keys llama.cpp applies that this loader does not implement, refused rather
// than ignored: rope.scaling.attn_factor outside phi3's LongRoPE, and a value
// head size (attention.value_length) other than the key head size.
absl::Status RefuseUnsupportedGgufKeys(const GgufFile& g, const std::string& p,
                                       const ModelConfig& c) {
  if (g.Find(p + "rope.scaling.attn_factor") &&
      c.rope_scaling.type != RopeScaling::Type::kLongRope) {
    return absl::UnimplementedError(absl::StrCat(
        g.path(), ": '", p, "rope.scaling.attn_factor' is supported with phi3's LongRoPE only"));
  }
  if (g.Find(p + "attention.value_length")) {
    int v = 0;
    PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.value_length", &v));
    if (v != c.head_size) {
      return absl::UnimplementedError(absl::StrCat(g.path(), ": '", p, "attention.value_length' ",
                                                   v, " differs from the key head size ",
                                                   c.head_size));
    }
  }
  return absl::OkStatus();
}

// phi3 (llama.cpp's converter, conversion/phi.py): LongRoPE as the tensors
// rope_factors_long / rope_factors_short (F32, rotary_dim / 2 each, both or
// neither) with rope.scaling.original_context_length and
// rope.scaling.attn_factor (default 1, as llama.cpp); partial rotary as
// rope.dimension_count (read with the common keys).
absl::Status ReadGgufPhi3(const GgufFile& g, const std::string& p, ModelConfig* c) {
  const GgufTensorInfo* lt = g.FindTensor("rope_factors_long.weight");
  const GgufTensorInfo* st = g.FindTensor("rope_factors_short.weight");
  if ((lt == nullptr) != (st == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        g.path(), ": LongRoPE needs both rope_factors_long.weight and rope_factors_short.weight"));
  }
  if (lt != nullptr && g.FindTensor("rope_freqs.weight") != nullptr) {
    // llama.cpp would use rope_freqs alone; no converter writes both.
    return absl::InvalidArgumentError(absl::StrCat(
        g.path(), ": rope_freqs.weight together with LongRoPE's rope_factors_* tensors"));
  }
  if (lt != nullptr && c->rope_scaling.type != RopeScaling::Type::kNone) {
    return absl::UnimplementedError(absl::StrCat(
        g.path(), ": ", p, "rope.scaling.type together with LongRoPE's rope_factors_* tensors"));
  }
  if (lt != nullptr) {
    RopeScaling& rs = c->rope_scaling;
    rs.type = RopeScaling::Type::kLongRope;
    for (auto [t, out] : {std::pair{lt, &rs.long_factor}, std::pair{st, &rs.short_factor}}) {
      PS_ASSIGN_OR_RETURN(std::vector<float> f, ReadRopeFactorTensor(g, *t, c->RotaryDim()));
      out->assign(f.begin(), f.end());
    }
    rs.original_max_position_embeddings = c->max_position_embeddings;  // llama.cpp's default
    if (g.Find(p + "rope.scaling.original_context_length")) {
      PS_ASSIGN_OR_RETURN(rs.original_max_position_embeddings,
                          g.GetInt(p + "rope.scaling.original_context_length"));
    }
    if (g.Find(p + "rope.scaling.attn_factor")) {
      PS_ASSIGN_OR_RETURN(rs.attention_factor, g.GetFloat(p + "rope.scaling.attn_factor"));
    }
    SelectLongRopeFactors(c->max_position_embeddings, c);
  }
  return AddEndTokenByText(g, "<|end|>", c);
}

// gemma2 / gemma3 keys as llama.cpp's loader reads them (model_config.h).
// Runs after the common keys (num_layers, head sizes) are read.
absl::Status ReadGgufGemma(const GgufFile& g, const std::string& p, ModelConfig* c) {
  c->post_norms = true;
  c->mlp_activation = MlpActivation::kGeluTanh;
  c->embedding_scale = std::sqrt(static_cast<float>(c->hidden_size));
  for (auto [key, out] :
       {std::pair<std::string, double*>{p + "attn_logit_softcapping", &c->attn_logit_softcapping},
        {p + "final_logit_softcapping", &c->final_logit_softcapping}}) {
    if (g.Find(key)) {
      PS_ASSIGN_OR_RETURN(*out, g.GetFloat(key));
    }
  }
  // llama.cpp: LLM_TYPE_27B (46 gemma2 / 62 gemma3 layers) scales by
  // n_embd / n_head (an integer division there too), every other size by
  // the head size.
  const int layers_27b = c->arch == ModelArch::kGemma2 ? 46 : 62;
  const int embd_per_head = c->num_heads > 0 ? c->hidden_size / c->num_heads : 0;
  c->query_pre_attn_scalar =
      c->num_layers == layers_27b && embd_per_head > 0 ? embd_per_head : c->head_size;
  // The end of a chat turn (an HF folder lists it in generation_config.json).
  PS_RETURN_IF_ERROR(AddEndTokenByText(g, "<end_of_turn>", c));
  const bool gemma2 = c->arch == ModelArch::kGemma2;
  if (gemma2 && !g.Find(p + "attention.sliding_window")) c->sliding_window = 4096;
  if (gemma2 && c->sliding_window > 0 && c->sliding_layers.empty()) SetSlidingPattern(2, c);
  if (!gemma2 && c->sliding_window > 0) {
    c->rope_local_theta = 10000.0;
    if (g.Find(p + "rope.freq_base_swa")) {
      PS_ASSIGN_OR_RETURN(c->rope_local_theta, g.GetFloat(p + "rope.freq_base_swa"));
    }
  }
  return absl::OkStatus();
}

// {arch}.expert_* (model_config.h): the mixture of experts, or none.
absl::Status ReadGgufMoe(const GgufFile& g, const std::string& p, ModelConfig* c) {
  bool shared = g.FindTensor("blk.0.ffn_gate_inp_shexp.weight") != nullptr ||
                g.FindTensor("blk.0.ffn_up_shexp.weight") != nullptr;
  if (g.Find(p + "expert_shared_count")) {
    auto n = g.GetInt(p + "expert_shared_count");
    shared = shared || !n.ok() || *n > 0;
  }
  if (shared && c->arch != ModelArch::kQwen2Moe) {
    return absl::UnimplementedError(
        absl::StrCat(g.path(),
                     ": shared experts (ffn_*_shexp) are supported for qwen2moe only (DeepSeek "
                     "style shared experts without a gate are not)"));
  }
  if (c->arch == ModelArch::kQwen2Moe) {
    if (g.FindTensor("blk.0.ffn_gate_inp_shexp.weight") == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat(g.path(), ": a qwen2moe file needs blk.N.ffn_gate_inp_shexp.weight"));
    }
    c->moe.shared_expert_intermediate_size = c->intermediate_size;  // llama.cpp's default
    if (g.Find(p + "expert_shared_feed_forward_length")) {
      PS_RETURN_IF_ERROR(GetIntField(g, p + "expert_shared_feed_forward_length",
                                     &c->moe.shared_expert_intermediate_size));
    }
  }
  if (!g.Find(p + "expert_count")) return absl::OkStatus();
  auto count = g.GetInt(p + "expert_count");
  if (!count.ok()) return count.status();
  if (*count == 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(GetIntField(g, p + "expert_count", &c->moe.num_experts));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "expert_used_count", &c->moe.top_k));
  // Default: feed_forward_length (Mixtral's converter); qwen2moe: divided by
  // the experts used per token (llama.cpp's qwen2moe loader).
  c->moe.expert_intermediate_size = c->arch == ModelArch::kQwen2Moe && c->moe.top_k > 0
                                        ? c->intermediate_size / c->moe.top_k
                                        : c->intermediate_size;
  if (g.Find(p + "expert_feed_forward_length")) {
    PS_RETURN_IF_ERROR(
        GetIntField(g, p + "expert_feed_forward_length", &c->moe.expert_intermediate_size));
  }
  // llama.cpp renormalises the top-k weights for llama and qwen3moe, not for
  // qwen2moe (transformers' Qwen2-MoE default norm_topk_prob false).
  c->moe.norm_topk_prob = c->arch != ModelArch::kQwen2Moe;
  if (g.Find(p + "expert_weights_norm") != nullptr) {
    PS_ASSIGN_OR_RETURN(c->moe.norm_topk_prob, g.GetBool(p + "expert_weights_norm"));
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
  } else if (*arch_name == "gemma2") {
    c.arch = ModelArch::kGemma2;
  } else if (*arch_name == "gemma3") {
    c.arch = ModelArch::kGemma3;
    c.qk_norm = true;
  } else if (*arch_name == "phi3") {
    c.arch = ModelArch::kPhi3;
    c.fused_projections = true;
  } else if (*arch_name == "qwen3moe") {
    c.arch = ModelArch::kQwen3Moe;
    c.qk_norm = true;
  } else if (*arch_name == "qwen2moe") {
    c.arch = ModelArch::kQwen2Moe;
    c.qkv_bias = true;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        g.path(), ": general.architecture '", *arch_name,
        "' is not supported (llama, qwen2, qwen3, qwen3moe, qwen2moe, gemma2, gemma3, phi3)"));
  }
  const bool gemma = c.arch == ModelArch::kGemma2 || c.arch == ModelArch::kGemma3;
  const std::string p = *arch_name + ".";
  PS_RETURN_IF_ERROR(GetIntField(g, p + "block_count", &c.num_layers));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "embedding_length", &c.hidden_size));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "feed_forward_length", &c.intermediate_size));
  PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.head_count", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  if (g.Find(p + "attention.head_count_kv")) {
    PS_RETURN_IF_ERROR(GetIntField(g, p + "attention.head_count_kv", &c.num_kv_heads));
  }
  PS_RETURN_IF_ERROR(ReadGgufHeadSize(g, p, &c));
  if (auto s = CheckDimensionBounds(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(g.path(), ": ", s.message()));
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
  const int default_pattern =
      c.arch == ModelArch::kGemma2 ? 2 : (c.arch == ModelArch::kGemma3 ? 6 : 0);
  PS_RETURN_IF_ERROR(ReadGgufSlidingWindow(g, p, default_pattern, &c));
  if (gemma) PS_RETURN_IF_ERROR(ReadGgufGemma(g, p, &c));
  if (c.arch == ModelArch::kPhi3) PS_RETURN_IF_ERROR(ReadGgufPhi3(g, p, &c));
  PS_RETURN_IF_ERROR(RefuseUnsupportedGgufKeys(g, p, c));
  PS_RETURN_IF_ERROR(ReadGgufMoe(g, p, &c));
  if ((c.arch == ModelArch::kQwen3Moe || c.arch == ModelArch::kQwen2Moe) && !c.moe.enabled()) {
    return absl::InvalidArgumentError(
        absl::StrCat(g.path(), ": a ", *arch_name, " file needs ", p, "expert_count > 0"));
  }
  if (const GgufTensorInfo* t = g.FindTensor("rope_freqs.weight"); t != nullptr) {
    PS_ASSIGN_OR_RETURN(c.rope_scaling.freq_factors, ReadRopeFactorTensor(g, *t, c.RotaryDim()));
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
    // A float holding a whole number (4096.0; Python writes 1e20 as a float)
    // is that integer, so range errors name it as such.
    if (it->is_number_float()) {
      const double d = it->get<double>();
      if (!std::isfinite(d) || d != std::floor(d)) {
        return FieldError(source, name, absl::StrCat("must be an integer, got ", d));
      }
      if (d < static_cast<double>(std::numeric_limits<T>::min()) ||
          d >= std::ldexp(1.0, std::numeric_limits<T>::digits)) {
        return FieldError(source, name, absl::StrCat("value ", d, " out of range"));
      }
      *out = static_cast<T>(d);
      return absl::OkStatus();
    }
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

// A boolean field: absent or null leaves *out; any other type is an error
// naming the field (transformers refuses those too).
absl::Status ReadFlag(const json& j, absl::string_view source, const char* field, bool* out) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_boolean()) return FieldError(source, field, "must be a boolean");
  *out = it->get<bool>();
  return absl::OkStatus();
}

// rope_scaling (or one entry of transformers 5's rope_parameters) into *rs;
// `field` names it in errors.
absl::Status ReadHfRopeScaling(const json& rs, absl::string_view source, absl::string_view field,
                               RopeScaling* out) {
  if (!rs.is_object()) return FieldError(source, field, "must be an object or null");
  std::string type;
  // rope_type first (transformers' name), else the older `type`.
  const char* key = rs.contains("rope_type") ? "rope_type" : "type";
  if (!rs.contains(key)) return FieldError(source, absl::StrCat(field, ".rope_type"), "missing");
  if (!rs[key].is_string())
    return FieldError(source, absl::StrCat(field, ".", key),
                      absl::StrCat("must be a string, got ", rs[key].type_name()));
  type = rs[key].get<std::string>();
  const std::string prefix = absl::StrCat(field, ".");
  if (type == "linear") {
    out->type = RopeScaling::Type::kLinear;
    PS_RETURN_IF_ERROR(ReadNumber(rs, source, "factor", true, &out->factor, prefix));
  } else if (type == "llama3") {
    out->type = RopeScaling::Type::kLlama3;
    PS_RETURN_IF_ERROR(ReadNumber(rs, source, "factor", true, &out->factor, prefix));
    PS_RETURN_IF_ERROR(
        ReadNumber(rs, source, "low_freq_factor", true, &out->low_freq_factor, prefix));
    PS_RETURN_IF_ERROR(
        ReadNumber(rs, source, "high_freq_factor", true, &out->high_freq_factor, prefix));
    PS_RETURN_IF_ERROR(ReadNumber(rs, source, "original_max_position_embeddings", true,
                                  &out->original_max_position_embeddings, prefix));
  } else if (type == "longrope" || type == "su") {  // "su": Phi-3's first name for it
    out->type = RopeScaling::Type::kLongRope;
    for (auto [key, set] : {std::pair{"short_factor", &out->short_factor},
                            std::pair{"long_factor", &out->long_factor}}) {
      auto it = rs.find(key);
      if (it == rs.end() || !it->is_array()) {
        return FieldError(source, absl::StrCat(prefix, key), "must be a list of numbers");
      }
      set->clear();
      for (const json& e : *it) {
        if (!e.is_number()) {
          return FieldError(source, absl::StrCat(prefix, key), "must be a list of numbers");
        }
        set->push_back(e.get<double>());
      }
    }
    // factor, attention_factor and original_max_position_embeddings are
    // optional here: FinishHfLongRope fills them as transformers does.
    // (0 = absent; a value given must be positive.)
    out->factor = 0;
    out->attention_factor = 0;
    out->original_max_position_embeddings = 0;
    PS_RETURN_IF_ERROR(ReadNumber(rs, source, "factor", false, &out->factor, prefix));
    PS_RETURN_IF_ERROR(
        ReadNumber(rs, source, "attention_factor", false, &out->attention_factor, prefix));
    PS_RETURN_IF_ERROR(ReadNumber(rs, source, "original_max_position_embeddings", false,
                                  &out->original_max_position_embeddings, prefix));
    for (const char* key : {"factor", "attention_factor", "original_max_position_embeddings"}) {
      if (auto it = rs.find(key); it != rs.end() && !it->is_null() && !(it->get<double>() > 0))
        return FieldError(source, absl::StrCat(prefix, key), "must be positive");
    }
  } else if (type != "default") {
    return absl::UnimplementedError(absl::StrCat(source, ": ", field, " type '", type,
                                                 "' is not supported (linear, llama3, longrope)"));
  }
  return absl::OkStatus();
}

// LongRoPE's defaults as transformers' _compute_longrope_parameters: the
// original context is the config's original_max_position_embeddings (Phi-3's
// top-level field, which transformers' standardize_rope_params puts first),
// else the rope parameters' (vLLM's reading; transformers would take
// Phi3Config's default 4096 there); factor = max_position_embeddings /
// original unless given; attention factor sqrt(1 + ln(factor) / ln(original))
// for factor > 1 (else 1) unless given. The factor set follows
// max_position_embeddings (SelectLongRopeFactors).
absl::Status FinishHfLongRope(const json& j, absl::string_view source, ModelConfig* c) {
  RopeScaling& rs = c->rope_scaling;
  if (rs.type != RopeScaling::Type::kLongRope) return absl::OkStatus();
  const bool nested = rs.original_max_position_embeddings > 0;
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "original_max_position_embeddings", !nested,
                                &rs.original_max_position_embeddings));
  if (rs.original_max_position_embeddings <= 0) {
    return FieldError(source, "original_max_position_embeddings", "must be positive");
  }
  if (!(rs.factor > 0)) {
    rs.factor = static_cast<double>(c->max_position_embeddings) /
                static_cast<double>(rs.original_max_position_embeddings);
  }
  if (!(rs.attention_factor > 0)) {
    rs.attention_factor =
        rs.factor <= 1.0
            ? 1.0
            : std::sqrt(1.0 + std::log(rs.factor) / std::log(static_cast<double>(
                                                        rs.original_max_position_embeddings)));
  }
  SelectLongRopeFactors(c->max_position_embeddings, c);
  return absl::OkStatus();
}

// transformers 5's rope_parameters: {rope_type, rope_theta, ...} or, for
// models with local layers (Gemma 3), {"full_attention": {...},
// "sliding_attention": {...}}; overrides rope_theta / rope_scaling /
// rope_local_base_freq.
absl::Status ReadHfRopeParameters(const json& j, absl::string_view source, ModelConfig* c) {
  auto it = j.find("rope_parameters");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) return FieldError(source, "rope_parameters", "must be an object or null");
  const json* global = &*it;
  if (auto f = it->find("full_attention"); f != it->end()) global = &*f;
  PS_RETURN_IF_ERROR(ReadHfRopeScaling(*global, source, "rope_parameters", &c->rope_scaling));
  PS_RETURN_IF_ERROR(
      ReadNumber(*global, source, "rope_theta", false, &c->rope_theta, "rope_parameters."));
  if (auto l = it->find("sliding_attention"); l != it->end()) {
    RopeScaling local;
    PS_RETURN_IF_ERROR(ReadHfRopeScaling(*l, source, "rope_parameters.sliding_attention", &local));
    if (local.type != RopeScaling::Type::kNone) {
      return absl::UnimplementedError(absl::StrCat(
          source, ": rope_parameters.sliding_attention: scaled local RoPE is not supported"));
    }
    PS_RETURN_IF_ERROR(ReadNumber(*l, source, "rope_theta", false, &c->rope_local_theta,
                                  "rope_parameters.sliding_attention."));
  }
  return absl::OkStatus();
}

// partial_rotary_factor (Phi-4-mini; also inside rope_scaling or transformers
// 5's rope_parameters, which win) below 1 rotates the first int(head_dim *
// factor) dimensions of each head, as transformers' Phi3 attention; other
// architectures: Unimplemented.
absl::Status ReadHfPartialRotary(const json& j, absl::string_view source, ModelConfig* c) {
  double f = 1.0;
  for (const char* nested : {"", "rope_scaling", "rope_parameters"}) {  // later ones win
    const json* o = *nested == '\0' ? &j : (j.contains(nested) ? &j[nested] : nullptr);
    if (o == nullptr || !o->is_object()) continue;
    PS_RETURN_IF_ERROR(ReadNumber(*o, source, "partial_rotary_factor", false, &f));
  }
  if (f == 1.0) return absl::OkStatus();
  if (c->arch != ModelArch::kPhi3) {
    return absl::UnimplementedError(absl::StrCat(source, ": partial_rotary_factor ", f,
                                                 " (partial rotary embeddings) is supported for "
                                                 "Phi3ForCausalLM only"));
  }
  if (!(f > 0 && f < 1)) return FieldError(source, "partial_rotary_factor", "must be in (0, 1]");
  c->rotary_dim = static_cast<int>(c->head_size * f);
  if (c->rotary_dim < 2 || c->rotary_dim % 2 != 0) {
    return FieldError(source, "partial_rotary_factor",
                      absl::StrCat("gives ", c->rotary_dim, " rotary dimensions of head_dim ",
                                   c->head_size, " (need an even number >= 2)"));
  }
  return absl::OkStatus();
}

// Gemma 2 / 3 fields (model_config.h). Runs after the common fields.
absl::Status ReadHfGemma(const json& j, absl::string_view source, ModelConfig* c) {
  c->norm_weight_plus_one = true;
  c->post_norms = true;
  std::string act = "gelu_pytorch_tanh";
  for (const char* key : {"hidden_activation", "hidden_act"}) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_string()) return FieldError(source, key, "must be a string");
    act = it->get<std::string>();
    break;
  }
  if (act != "gelu_pytorch_tanh") {
    return absl::UnimplementedError(absl::StrCat(source, ": hidden_activation '", act,
                                                 "' is not supported (gelu_pytorch_tanh)"));
  }
  c->mlp_activation = MlpActivation::kGeluTanh;
  c->query_pre_attn_scalar = 256;
  PS_RETURN_IF_ERROR(
      ReadNumber(j, source, "query_pre_attn_scalar", false, &c->query_pre_attn_scalar));
  PS_RETURN_IF_ERROR(
      ReadNumber(j, source, "attn_logit_softcapping", false, &c->attn_logit_softcapping));
  PS_RETURN_IF_ERROR(
      ReadNumber(j, source, "final_logit_softcapping", false, &c->final_logit_softcapping));
  if (c->arch == ModelArch::kGemma3) {
    c->rope_local_theta = 10000.0;
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "rope_local_base_freq", false, &c->rope_local_theta));
  }
  // HF's normalizer: sqrt(hidden_size) as a tensor of the model's dtype.
  float scale = std::sqrt(static_cast<float>(c->hidden_size));
  if (c->checkpoint_dtype == "bfloat16") {
    scale = kernels::BFloat16BitsToFloat(kernels::FloatToBFloat16Bits(scale));
  } else if (c->checkpoint_dtype == "float16") {
    scale = kernels::HalfBitsToFloat(kernels::FloatToHalfBits(scale));
  }
  c->embedding_scale = scale;
  return absl::OkStatus();
}

// The sliding window of a config.json as transformers builds its attention
// masks (model_config.h, ModelConfigFromHfJson). Reads num_layers from *c.
absl::Status ReadHfSlidingWindow(const json& j, absl::string_view source, ModelConfig* c) {
  const bool gemma = c->arch == ModelArch::kGemma2 || c->arch == ModelArch::kGemma3;
  bool use_sliding_window = false;  // Qwen2/3 (-MoE)
  PS_RETURN_IF_ERROR(ReadFlag(j, source, "use_sliding_window", &use_sliding_window));
  int window = gemma ? 4096 : 0;  // Gemma2Config / Gemma3TextConfig default
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
  if (gemma && window > 0) {
    // Gemma 2: even layers windowed; Gemma 3: all but every
    // sliding_window_pattern-th ((l + 1) % pattern != 0).
    int pattern = c->arch == ModelArch::kGemma2 ? 2 : 6;
    if (c->arch == ModelArch::kGemma3) {
      PS_RETURN_IF_ERROR(ReadNumber(j, source, "sliding_window_pattern", false, &pattern));
      if (pattern <= 0) return FieldError(source, "sliding_window_pattern", "must be positive");
    }
    c->sliding_window = window;
    for (int l = 0; l < c->num_layers; ++l) c->sliding_layers.push_back((l + 1) % pattern != 0);
  } else if (c->arch == ModelArch::kMistral || c->arch == ModelArch::kPhi3 ||
             c->arch == ModelArch::kMixtral) {
    c->sliding_window = window;
  } else if (c->arch == ModelArch::kQwen2Moe && use_sliding_window && window > 0) {
    // transformers' Qwen2MoeConfig: the even layers below max_window_layers.
    int below = c->num_layers;
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "max_window_layers", true, &below));
    c->sliding_window = window;
    for (int l = 0; l < c->num_layers; ++l) c->sliding_layers.push_back(l % 2 == 0 && l < below);
  } else if ((c->arch == ModelArch::kQwen2 || c->arch == ModelArch::kQwen3 ||
              c->arch == ModelArch::kQwen3Moe) &&
             use_sliding_window && window > 0) {
    int first = c->num_layers;  // transformers' default max_window_layers is model-specific
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "max_window_layers", true, &first));
    c->sliding_window = window;
    for (int l = 0; l < c->num_layers; ++l) c->sliding_layers.push_back(l >= first);
  }
  return absl::OkStatus();
}

// A quantized Hugging Face checkpoint (AWQ, GPTQ, FP8, bitsandbytes,
// compressed-tensors ...: transformers' quantization_config) stores packed
// integer or fp8 tensors with their own scales, which the loader does not read;
// refused here, naming the method, instead of failing later on a tensor dtype.
absl::Status RefuseHfQuantization(const json& j, absl::string_view source) {
  auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return absl::OkStatus();
  std::string method = "unknown";
  if (it->is_object()) {
    auto m = it->find("quant_method");
    if (m != it->end()) {
      method = m->is_string() ? m->get<std::string>() : m->dump();
    } else if (it->contains("load_in_4bit") || it->contains("load_in_8bit")) {
      method = "bitsandbytes";
    }
  }
  return absl::UnimplementedError(absl::StrCat(
      source, ": quantization_config.quant_method '", method,
      "' is not supported: pagedserve runs unquantized F32/F16/BF16 safetensors checkpoints and "
      "GGUF files (Q4_0 .. Q8_0, Q2_K .. Q6_K, IQ4_NL, IQ4_XS); use the unquantized checkpoint "
      "or a GGUF conversion of it"));
}

// The experts of MixtralForCausalLM / Qwen3MoeForCausalLM (model_config.h).
absl::Status ReadHfMoe(const json& j, absl::string_view source, ModelConfig* c) {
  MoeConfig& m = c->moe;
  if (c->arch == ModelArch::kMixtral) {
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "num_local_experts", true, &m.num_experts));
    m.expert_intermediate_size = c->intermediate_size;
    m.norm_topk_prob = true;
  } else {
    const char* experts = j.contains("num_experts") ? "num_experts" : "num_local_experts";
    PS_RETURN_IF_ERROR(ReadNumber(j, source, experts, true, &m.num_experts));
    PS_RETURN_IF_ERROR(
        ReadNumber(j, source, "moe_intermediate_size", true, &m.expert_intermediate_size));
    m.norm_topk_prob = false;  // transformers' default
    PS_RETURN_IF_ERROR(ReadFlag(j, source, "norm_topk_prob", &m.norm_topk_prob));
    if (c->arch == ModelArch::kQwen2Moe) {
      PS_RETURN_IF_ERROR(ReadNumber(j, source, "shared_expert_intermediate_size", true,
                                    &m.shared_expert_intermediate_size));
      if (m.shared_expert_intermediate_size <= 0)
        return FieldError(source, "shared_expert_intermediate_size", "must be positive");
    }
    int step = 1;
    PS_RETURN_IF_ERROR(ReadNumber(j, source, "decoder_sparse_step", false, &step));
    auto dense = j.find("mlp_only_layers");
    if (dense != j.end() && !dense->is_null() && !dense->is_array())
      return FieldError(source, "mlp_only_layers", "must be a list of layer indices");
    if (step != 1 || (dense != j.end() && dense->is_array() && !dense->empty())) {
      return absl::UnimplementedError(
          absl::StrCat(source, ": dense MLP layers among the expert layers (decoder_sparse_step ",
                       step, ", mlp_only_layers) are not supported"));
    }
  }
  PS_RETURN_IF_ERROR(ReadNumber(j, source, "num_experts_per_tok", true, &m.top_k));
  if (m.num_experts <= 0) return FieldError(source, "num_experts", "must be positive");
  return absl::OkStatus();
}

// architectures[0] into c->arch (and the flags the architecture implies).
absl::Status ReadHfArchitecture(const json& j, absl::string_view source, ModelConfig* c_ptr) {
  ModelConfig& c = *c_ptr;
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
  } else if (arch == "Gemma2ForCausalLM") {
    c.arch = ModelArch::kGemma2;
  } else if (arch == "Gemma3ForCausalLM") {
    c.arch = ModelArch::kGemma3;
    c.qk_norm = true;
    c.rope_theta = 1000000.0;  // Gemma3TextConfig's default global base
  } else if (arch == "Phi3ForCausalLM") {
    c.arch = ModelArch::kPhi3;
    c.fused_projections = true;
  } else if (arch == "MixtralForCausalLM") {
    c.arch = ModelArch::kMixtral;
  } else if (arch == "Qwen3MoeForCausalLM") {
    c.arch = ModelArch::kQwen3Moe;
    c.qk_norm = true;
  } else if (arch == "Qwen2MoeForCausalLM") {
    c.arch = ModelArch::kQwen2Moe;
    c.qkv_bias = true;  // Qwen2MoeConfig.qkv_bias (default true), read below
  } else {
    return absl::UnimplementedError(
        absl::StrCat(source, ": architecture '", arch,
                     "' is not supported (LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
                     "Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM, Phi3ForCausalLM, "
                     "MixtralForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromHfJson(std::string_view text,
                                                  std::string_view source_sv) {
  absl::string_view source(source_sv.data(), source_sv.size());
  PS_ASSIGN_OR_RETURN(const json j, ParseJsonObject(text, source_sv));
  ModelConfig c;
  PS_RETURN_IF_ERROR(RefuseHfQuantization(j, source));
  PS_RETURN_IF_ERROR(ReadHfArchitecture(j, source, &c));
  const bool gemma = c.arch == ModelArch::kGemma2 || c.arch == ModelArch::kGemma3;
  c.tie_word_embeddings = gemma;  // the Gemma configs' default
  // attention_bias (Llama, Qwen3; default false): biases on q/k/v (and o_proj,
  // which no supported checkpoint sets).
  if ((c.arch == ModelArch::kLlama || c.arch == ModelArch::kQwen3 ||
       c.arch == ModelArch::kQwen3Moe) &&
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
  if (auto s = CheckDimensionBounds(c); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
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
    PS_RETURN_IF_ERROR(ReadHfRopeScaling(*it, source, "rope_scaling", &c.rope_scaling));
  }
  PS_RETURN_IF_ERROR(ReadHfSlidingWindow(j, source, &c));
  if (gemma) PS_RETURN_IF_ERROR(ReadHfGemma(j, source, &c));
  if (auto it = j.find("qkv_bias"); c.arch == ModelArch::kQwen2Moe && it != j.end()) {
    if (!it->is_boolean()) return FieldError(source, "qkv_bias", "must be a boolean");
    c.qkv_bias = it->get<bool>();
  }
  if (c.arch == ModelArch::kMixtral || c.arch == ModelArch::kQwen3Moe ||
      c.arch == ModelArch::kQwen2Moe) {
    PS_RETURN_IF_ERROR(ReadHfMoe(j, source, &c));
  }
  PS_RETURN_IF_ERROR(ReadHfRopeParameters(j, source, &c));  // last: it overrides
  PS_RETURN_IF_ERROR(ReadHfPartialRotary(j, source, &c));
  PS_RETURN_IF_ERROR(FinishHfLongRope(j, source, &c));
  if (auto v = c.Validate(); !v.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", v.message()));
  }
  return c;
}

absl::Status AddGenerationConfigEos(std::string_view json_text, std::string_view source_sv,
                                    ModelConfig* c) {
  absl::string_view source(source_sv.data(), source_sv.size());
  PS_ASSIGN_OR_RETURN(const json j, ParseJsonObject(json_text, source_sv));
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
  if (!in) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) {
      return absl::NotFoundError(
          absl::StrCat("'", dir,
                       "' is not a model: a model is a .gguf file or a Hugging Face folder with "
                       "config.json, and it has no config.json"));
    }
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
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
  const int dim = c.RotaryDim();
  const int half = dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(c.rope_theta, (2.0 * i) / dim);
  }
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kLongRope) {
    const std::vector<double>& ext = rs.use_long_factor ? rs.long_factor : rs.short_factor;
    for (size_t i = 0; i < inv.size() && i < ext.size(); ++i) inv[i] /= ext[i];
  } else if (rs.type == RopeScaling::Type::kLinear) {
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

std::vector<double> RopeLocalInverseFrequencies(const ModelConfig& c) {
  if (!(c.rope_local_theta > 0)) return {};
  ModelConfig local;
  local.head_size = c.head_size;
  local.rotary_dim = c.rotary_dim;
  local.rope_theta = c.rope_local_theta;  // rope_scaling kNone, no frequency factors
  return RopeInverseFrequencies(local);
}

void SelectLongRopeFactors(int64_t max_model_len, ModelConfig* c) {
  RopeScaling& rs = c->rope_scaling;
  if (rs.type != RopeScaling::Type::kLongRope || max_model_len <= 0) return;
  rs.use_long_factor = max_model_len > rs.original_max_position_embeddings;
}

}  // namespace pagedserve
