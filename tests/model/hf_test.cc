// Hugging Face directories: config.json parsing (architectures, rope_scaling),
// safetensors (single and sharded), F32/F16/BF16, and the tensor-parallel
// split of a tiny random-weight Llama / Qwen2 generated here.
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "nlohmann/json.hpp"
#include "runtime/model/generation_config.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

using nlohmann::json;

struct Tensor {
  std::string dtype;  // F32, F16 or BF16
  std::vector<int64_t> shape;
  std::vector<float> values;   // what the loader must produce
  std::vector<uint8_t> bytes;  // encoded
};

// Tiny model: 2 layers, hidden 32, 8 query heads of 4, 2 KV heads, MLP 48, vocab 40.
constexpr int kLayers = 2, kHidden = 32, kHeads = 8, kKv = 2, kHead = 4, kInter = 48, kVocab = 40;

Tensor F32(std::mt19937& rng, const std::vector<int64_t>& shape) {
  Tensor t{"F32", shape, {}, {}};
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t i = 0; i < n; ++i) t.values.push_back(u(rng));
  t.bytes.resize(n * 4);
  std::memcpy(t.bytes.data(), t.values.data(), n * 4);
  return t;
}

// BF16: fp32 values whose low 16 bits are zero are exact.
Tensor Bf16(std::mt19937& rng, const std::vector<int64_t>& shape) {
  Tensor t = F32(rng, shape);
  t.dtype = "BF16";
  std::vector<uint8_t> b;
  for (float& v : t.values) {
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    bits &= 0xffff0000u;
    std::memcpy(&v, &bits, 4);
    uint16_t hi = static_cast<uint16_t>(bits >> 16);
    b.push_back(hi & 0xff);
    b.push_back(hi >> 8);
  }
  t.bytes = b;
  return t;
}

// F16 with bit patterns 0x3c00 + j, i.e. the values 1 + j / 1024.
Tensor F16Ones(std::mt19937& rng, int64_t n) {
  Tensor t{"F16", {n}, {}, {}};
  for (int64_t i = 0; i < n; ++i) {
    uint16_t j = rng() % 1024;
    t.values.push_back(1.0f + j / 1024.0f);
    uint16_t bits = 0x3c00 + j;
    t.bytes.push_back(bits & 0xff);
    t.bytes.push_back(bits >> 8);
  }
  return t;
}

using TensorMap = std::map<std::string, Tensor>;

TensorMap MakeModel(bool qkv_bias, bool tied, uint32_t seed) {
  std::mt19937 rng(seed);
  TensorMap m;
  m["model.embed_tokens.weight"] = Bf16(rng, {kVocab, kHidden});
  m["model.norm.weight"] = F16Ones(rng, kHidden);
  if (!tied) m["lm_head.weight"] = F32(rng, {kVocab, kHidden});
  for (int l = 0; l < kLayers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    m[p + "input_layernorm.weight"] = F16Ones(rng, kHidden);
    m[p + "post_attention_layernorm.weight"] = F16Ones(rng, kHidden);
    m[p + "self_attn.q_proj.weight"] = F32(rng, {kHeads * kHead, kHidden});
    m[p + "self_attn.k_proj.weight"] = F32(rng, {kKv * kHead, kHidden});
    m[p + "self_attn.v_proj.weight"] = F32(rng, {kKv * kHead, kHidden});
    m[p + "self_attn.o_proj.weight"] = F32(rng, {kHidden, kHeads * kHead});
    m[p + "mlp.gate_proj.weight"] = F32(rng, {kInter, kHidden});
    m[p + "mlp.up_proj.weight"] = F32(rng, {kInter, kHidden});
    m[p + "mlp.down_proj.weight"] = F32(rng, {kHidden, kInter});
    if (qkv_bias) {
      m[p + "self_attn.q_proj.bias"] = F32(rng, {kHeads * kHead});
      m[p + "self_attn.k_proj.bias"] = F32(rng, {kKv * kHead});
      m[p + "self_attn.v_proj.bias"] = F32(rng, {kKv * kHead});
    }
  }
  return m;
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary);
  out << data;
}

std::string Safetensors(const TensorMap& m, const std::vector<std::string>& names) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::string data;
  for (const std::string& n : names) {
    const Tensor& t = m.at(n);
    header[n] = {{"dtype", t.dtype},
                 {"shape", t.shape},
                 {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  std::string h = header.dump();
  uint64_t n = h.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + h + data;
}

json Config(const std::string& arch, bool tied) {
  return {{"architectures", {arch}},       {"num_hidden_layers", kLayers},
          {"hidden_size", kHidden},        {"intermediate_size", kInter},
          {"num_attention_heads", kHeads}, {"num_key_value_heads", kKv},
          {"vocab_size", kVocab},          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},         {"max_position_embeddings", 256},
          {"tie_word_embeddings", tied},   {"bos_token_id", 1},
          {"eos_token_id", {2, 3}},        {"rope_scaling", nullptr}};
}

// Writes the model as one file or as two shards with an index.
std::string WriteModel(const TensorMap& m, const json& config, bool sharded) {
  std::string dir = ::pagedserve::testing::MakeTempDir();
  WriteFile(dir + "/config.json", config.dump(2));
  std::vector<std::string> names;
  for (const auto& [n, t] : m) names.push_back(n);
  if (!sharded) {
    WriteFile(dir + "/model.safetensors", Safetensors(m, names));
  } else {
    std::vector<std::string> a(names.begin(), names.begin() + names.size() / 2);
    std::vector<std::string> b(names.begin() + names.size() / 2, names.end());
    WriteFile(dir + "/model-00001-of-00002.safetensors", Safetensors(m, a));
    WriteFile(dir + "/model-00002-of-00002.safetensors", Safetensors(m, b));
    json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", json::object()}};
    for (const auto& n : a) index["weight_map"][n] = "model-00001-of-00002.safetensors";
    for (const auto& n : b) index["weight_map"][n] = "model-00002-of-00002.safetensors";
    WriteFile(dir + "/model.safetensors.index.json", index.dump());
  }
  return dir;
}

// Rows [r0, r1) and columns [c0, c1) of a row-major [rows, cols] tensor.
std::vector<float> Slice(const Tensor& t, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
  int64_t cols = t.shape.size() == 2 ? t.shape[1] : 1;
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t c = c0; c < c1; ++c) out.push_back(t.values[r * cols + c]);
  return out;
}

void ExpectMatrix(const Matrix& m, int64_t rows, int64_t cols, const std::vector<float>& want,
                  const std::string& what) {
  EXPECT_EQ(m.rows, rows) << what;
  EXPECT_EQ(m.cols, cols) << what;
  EXPECT_EQ(m.data, want) << what;
}

TEST(HfConfigTest, ParsesLlamaConfig) {
  auto c = ModelConfigFromHfJson(Config("LlamaForCausalLM", true).dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kLlama);
  EXPECT_EQ(c->num_layers, kLayers);
  EXPECT_EQ(c->head_size, kHead);
  EXPECT_EQ(c->num_kv_heads, kKv);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(c->max_position_embeddings, 256);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->checkpoint_dtype, "");  // absent

  // The checkpoint's precision: torch_dtype, or dtype (its newer name).
  json fp16 = Config("LlamaForCausalLM", true);
  fp16["torch_dtype"] = "float16";
  auto h = ModelConfigFromHfJson(fp16.dump(), "config.json");
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->checkpoint_dtype, "float16");
  json newer = Config("LlamaForCausalLM", true);
  newer["dtype"] = "bfloat16";
  auto b = ModelConfigFromHfJson(newer.dump(), "config.json");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->checkpoint_dtype, "bfloat16");
  newer["torch_dtype"] = 16;
  auto bad = ModelConfigFromHfJson(newer.dump(), "config.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("torch_dtype"), std::string::npos) << bad.status();

  auto q = ModelConfigFromHfJson(Config("Qwen2ForCausalLM", false).dump(), "config.json");
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->arch, ModelArch::kQwen2);
  EXPECT_TRUE(q->qkv_bias);
  auto mi = ModelConfigFromHfJson(Config("MistralForCausalLM", false).dump(), "config.json");
  ASSERT_TRUE(mi.ok());
  EXPECT_EQ(mi->arch, ModelArch::kMistral);
  EXPECT_FALSE(mi->qk_norm);
  // Qwen3: q/k norms, no bias unless attention_bias says so.
  json q3 = Config("Qwen3ForCausalLM", false);
  auto qwen3 = ModelConfigFromHfJson(q3.dump(), "config.json");
  ASSERT_TRUE(qwen3.ok()) << qwen3.status();
  EXPECT_EQ(qwen3->arch, ModelArch::kQwen3);
  EXPECT_TRUE(qwen3->qk_norm);
  EXPECT_FALSE(qwen3->qkv_bias);
  q3["attention_bias"] = true;
  auto biased = ModelConfigFromHfJson(q3.dump(), "config.json");
  ASSERT_TRUE(biased.ok()) << biased.status();
  EXPECT_TRUE(biased->qkv_bias);
  EXPECT_FALSE(q->qk_norm);
}

// Gemma 2 / 3 configs as the Hub ships them (model_config.h): defaults of
// Gemma2Config / Gemma3TextConfig when fields are absent, the window
// pattern, rope_local_base_freq, HF's normalizer rounded to the dtype,
// transformers 5's rope_parameters, and a GELU other than the tanh one refused.
TEST(HfConfigTest, Gemma) {
  auto parse = [](const json& j) { return ModelConfigFromHfJson(j.dump(), "config.json"); };
  json g2 = Config("Gemma2ForCausalLM", true);
  g2.erase("tie_word_embeddings");
  g2["num_hidden_layers"] = 4;
  g2["hidden_size"] = 3072;
  g2["head_dim"] = 64;
  g2["torch_dtype"] = "bfloat16";
  g2["attn_logit_softcapping"] = 50.0;
  g2["final_logit_softcapping"] = 30.0;
  g2["hidden_activation"] = "gelu_pytorch_tanh";
  auto gemma2 = parse(g2);
  ASSERT_TRUE(gemma2.ok()) << gemma2.status();
  EXPECT_EQ(gemma2->arch, ModelArch::kGemma2);
  EXPECT_TRUE(gemma2->tie_word_embeddings);  // the Gemma default
  EXPECT_TRUE(gemma2->norm_weight_plus_one && gemma2->post_norms && !gemma2->qk_norm);
  EXPECT_EQ(gemma2->mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_EQ(gemma2->attn_logit_softcapping, 50.0);
  EXPECT_EQ(gemma2->final_logit_softcapping, 30.0);
  EXPECT_FLOAT_EQ(gemma2->AttentionScale(), 1.0f / 16.0f);  // query_pre_attn_scalar 256
  EXPECT_EQ(gemma2->embedding_scale, 55.5f);                // sqrt(3072) = 55.43 in bfloat16
  for (int l = 0; l < 4; ++l) EXPECT_EQ(gemma2->LayerSlidingWindow(l), l % 2 ? 0 : 4096) << l;
  EXPECT_EQ(gemma2->rope_local_theta, 0.0);
  g2["torch_dtype"] = "float32";
  EXPECT_EQ(parse(g2)->embedding_scale, std::sqrt(3072.0f));

  json g3 = Config("Gemma3ForCausalLM", true);
  g3.erase("rope_theta");
  g3["num_hidden_layers"] = 8;
  g3["head_dim"] = 64;
  g3["query_pre_attn_scalar"] = 64;
  g3["sliding_window"] = 512;
  g3["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 8.0}};
  auto gemma3 = parse(g3);
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(gemma3->arch, ModelArch::kGemma3);
  EXPECT_TRUE(gemma3->qk_norm);
  EXPECT_EQ(gemma3->rope_theta, 1e6);
  EXPECT_EQ(gemma3->rope_local_theta, 10000.0);
  EXPECT_EQ(gemma3->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(gemma3->attn_logit_softcapping, 0.0);
  for (int l = 0; l < 8; ++l) {
    EXPECT_EQ(gemma3->LayerSlidingWindow(l), l == 5 ? 0 : 512) << l;
    EXPECT_EQ(gemma3->LayerLocalRope(l), l != 5) << l;
  }
  // Local layers: base 10000, unscaled; global: 1e6 and the linear factor.
  EXPECT_DOUBLE_EQ(RopeLocalInverseFrequencies(*gemma3)[1], std::pow(10000.0, -2.0 / 64));
  EXPECT_DOUBLE_EQ(RopeInverseFrequencies(*gemma3)[1], std::pow(1e6, -2.0 / 64) / 8);
  g3["sliding_window_pattern"] = 2;
  g3["rope_local_base_freq"] = 20000.0;
  auto pattern2 = parse(g3);
  ASSERT_TRUE(pattern2.ok()) << pattern2.status();
  for (int l = 0; l < 8; ++l) EXPECT_EQ(pattern2->LayerSlidingWindow(l), l % 2 ? 0 : 512) << l;
  EXPECT_EQ(pattern2->rope_local_theta, 20000.0);
  // transformers 5 writes rope_parameters per attention type.
  json v5 = g3;
  v5.erase("rope_scaling");
  v5["rope_parameters"] = {
      {"full_attention", {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 5e5}}},
      {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 30000.0}}}};
  auto tf5 = parse(v5);
  ASSERT_TRUE(tf5.ok()) << tf5.status();
  EXPECT_EQ(tf5->rope_theta, 5e5);
  EXPECT_EQ(tf5->rope_scaling.factor, 4.0);
  EXPECT_EQ(tf5->rope_local_theta, 30000.0);
  g3["hidden_activation"] = "gelu";
  auto exact_gelu = parse(g3);
  EXPECT_EQ(exact_gelu.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(exact_gelu.status().message().find("hidden_activation 'gelu'"), std::string::npos)
      << exact_gelu.status();
}

// Mixtures of experts: Mixtral (experts of intermediate_size, always
// renormalised) and Qwen3-MoE (moe_intermediate_size, norm_topk_prob);
// shared experts and dense layers among the sparse ones are refused naming
// the feature; the TP split needs the expert width divisible.
TEST(HfConfigTest, MixtureOfExperts) {
  auto parse = [](const json& j) { return ModelConfigFromHfJson(j.dump(), "config.json"); };
  json mx = Config("MixtralForCausalLM", false);
  mx["num_local_experts"] = 8;
  mx["num_experts_per_tok"] = 2;
  auto mixtral = parse(mx);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->arch, ModelArch::kMixtral);
  EXPECT_EQ(mixtral->moe.num_experts, 8);
  EXPECT_EQ(mixtral->moe.top_k, 2);
  EXPECT_EQ(mixtral->moe.expert_intermediate_size, kInter);
  EXPECT_TRUE(mixtral->moe.norm_topk_prob);
  EXPECT_FALSE(mixtral->qk_norm);
  mx["num_experts_per_tok"] = 9;  // more than there are experts
  EXPECT_FALSE(parse(mx).ok());
  mx.erase("num_local_experts");
  auto missing = parse(mx);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("num_local_experts"), std::string::npos);

  json qm = Config("Qwen3MoeForCausalLM", false);
  qm["num_experts"] = 4;
  qm["num_experts_per_tok"] = 2;
  qm["moe_intermediate_size"] = 16;
  auto qwen = parse(qm);
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_EQ(qwen->arch, ModelArch::kQwen3Moe);
  EXPECT_TRUE(qwen->qk_norm);
  EXPECT_EQ(qwen->moe.expert_intermediate_size, 16);
  EXPECT_FALSE(qwen->moe.norm_topk_prob);  // transformers' default
  qm["norm_topk_prob"] = true;
  EXPECT_TRUE(parse(qm)->moe.norm_topk_prob);
  EXPECT_TRUE(ComputeShardLayout(*parse(qm), 1, 2).ok());
  EXPECT_EQ(ComputeShardLayout(*parse(qm), 1, 2)->first_expert_intermediate, 8);
  qm["moe_intermediate_size"] = 15;
  auto odd = ComputeShardLayout(*parse(qm), 0, 2);
  ASSERT_FALSE(odd.ok());
  EXPECT_NE(odd.status().message().find("experts' intermediate size"), std::string::npos);
  qm["moe_intermediate_size"] = 16;
  qm["mlp_only_layers"] = {0};
  auto dense = parse(qm);
  ASSERT_FALSE(dense.ok());
  EXPECT_EQ(dense.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(dense.status().message().find("mlp_only_layers"), std::string::npos);

  // Qwen2-MoE: a gated shared expert of shared_expert_intermediate_size
  // (required), Q/K/V biases unless qkv_bias false, sharded like the dense MLP.
  json q2 = qm;
  q2["architectures"] = {"Qwen2MoeForCausalLM"};
  q2.erase("mlp_only_layers");
  auto no_shared = parse(q2);
  ASSERT_FALSE(no_shared.ok());
  EXPECT_NE(no_shared.status().message().find("shared_expert_intermediate_size"), std::string::npos)
      << no_shared.status();
  q2["shared_expert_intermediate_size"] = 24;
  auto q2c = parse(q2);
  ASSERT_TRUE(q2c.ok()) << q2c.status();
  EXPECT_EQ(q2c->arch, ModelArch::kQwen2Moe);
  EXPECT_TRUE(q2c->qkv_bias);
  EXPECT_EQ(q2c->moe.shared_expert_intermediate_size, 24);
  EXPECT_EQ(ComputeShardLayout(*q2c, 1, 2)->first_shared_expert_intermediate, 12);
  q2["shared_expert_intermediate_size"] = 25;
  auto odd_shared = ComputeShardLayout(*parse(q2), 0, 2);
  ASSERT_FALSE(odd_shared.ok());
  EXPECT_NE(odd_shared.status().message().find("shared expert"), std::string::npos);
  q2["shared_expert_intermediate_size"] = 0;
  EXPECT_FALSE(parse(q2).ok());
  q2["shared_expert_intermediate_size"] = 24;
  q2["qkv_bias"] = false;
  EXPECT_FALSE(parse(q2)->qkv_bias);
  q2["qkv_bias"] = "false";
  EXPECT_FALSE(parse(q2).ok());
  q2["qkv_bias"] = true;
  // Typed like transformers: a boolean given as a string or number is an
  // error naming the field, never read as false.
  for (const char* key : {"norm_topk_prob", "use_sliding_window"}) {
    for (const json& v : {json("true"), json(1)}) {
      json typed = q2;
      typed[key] = v;
      auto t = parse(typed);
      ASSERT_FALSE(t.ok()) << key << " = " << v.dump();
      EXPECT_NE(t.status().message().find(key), std::string::npos) << t.status();
    }
  }
  json dense_str = q2;
  dense_str["mlp_only_layers"] = "0";
  EXPECT_NE(parse(dense_str).status().message().find("mlp_only_layers"), std::string::npos);
  // transformers' Qwen2MoeConfig windows the even layers below
  // max_window_layers (not Qwen2's layers from it on).
  q2["num_hidden_layers"] = 6;
  q2["use_sliding_window"] = true;
  q2["sliding_window"] = 32;
  q2["max_window_layers"] = 4;
  auto windowed = parse(q2);
  ASSERT_TRUE(windowed.ok()) << windowed.status();
  EXPECT_EQ(windowed->sliding_layers, (std::vector<bool>{true, false, true, false, false, false}));
}

// Sliding windows as transformers builds its masks: Mistral on every layer,
// Qwen2/3 from max_window_layers on when use_sliding_window, layer_types when
// given; null or absent = none; bad values named.
TEST(HfConfigTest, SlidingWindow) {
  auto parse = [](const json& j) { return ModelConfigFromHfJson(j.dump(), "config.json"); };
  json m = Config("MistralForCausalLM", false);
  m["sliding_window"] = 4096;
  auto mistral = parse(m);
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);
  for (int l = 0; l < mistral->num_layers; ++l) EXPECT_EQ(mistral->LayerSlidingWindow(l), 4096);
  m["sliding_window"] = nullptr;
  auto unwindowed = parse(m);
  ASSERT_TRUE(unwindowed.ok()) << unwindowed.status();
  EXPECT_EQ(unwindowed->LayerSlidingWindow(0), 0);

  json q = Config("Qwen2ForCausalLM", false);
  q["num_hidden_layers"] = 4;
  q["sliding_window"] = 32768;
  q["max_window_layers"] = 2;
  auto off = parse(q);  // use_sliding_window absent: Qwen2's default false
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(off->LayerSlidingWindow(3), 0);
  q["use_sliding_window"] = true;
  auto on = parse(q);
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->LayerSlidingWindow(0), 0);
  EXPECT_EQ(on->LayerSlidingWindow(1), 0);
  EXPECT_EQ(on->LayerSlidingWindow(2), 32768);
  EXPECT_EQ(on->LayerSlidingWindow(3), 32768);

  q["layer_types"] = {"sliding_attention", "full_attention", "sliding_attention", "full_attention"};
  auto typed = parse(q);
  ASSERT_TRUE(typed.ok()) << typed.status();
  EXPECT_EQ(typed->LayerSlidingWindow(0), 32768);
  EXPECT_EQ(typed->LayerSlidingWindow(1), 0);
  EXPECT_EQ(typed->LayerSlidingWindow(2), 32768);

  q["layer_types"] = {"sliding_attention", "chunked_attention", "full_attention", "full_attention"};
  auto chunked = parse(q);
  EXPECT_EQ(chunked.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(chunked.status().message().find("chunked_attention"), std::string::npos)
      << chunked.status();
  q["layer_types"] = {"full_attention"};
  EXPECT_EQ(parse(q).status().code(), absl::StatusCode::kInvalidArgument);
  q["layer_types"] = {"sliding_attention", "full_attention", "full_attention", "full_attention"};
  q["sliding_window"] = nullptr;
  auto no_window = parse(q);
  EXPECT_EQ(no_window.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_window.status().message().find("sliding_window"), std::string::npos)
      << no_window.status();
  m["sliding_window"] = -1;
  EXPECT_EQ(parse(m).status().code(), absl::StatusCode::kInvalidArgument);
}

// generation_config.json's end tokens join config.json's (Llama 3.x lists
// <|end_of_text|>, <|eom_id|>, <|eot_id|> there), each once; bad ids named.
TEST(HfConfigTest, GenerationConfigEosTokens) {
  auto c = ModelConfigFromHfJson(Config("LlamaForCausalLM", false).dump(), "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  c->eos_token_ids = {2};
  ASSERT_TRUE(
      AddGenerationConfigEos(R"({"eos_token_id": [2, 128008, 128009]})", "g.json", &*c).ok());
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 128008, 128009}));
  ASSERT_TRUE(
      AddGenerationConfigEos(R"({"eos_token_id": 7, "temperature": 0.6})", "g.json", &*c).ok());
  EXPECT_EQ(c->eos_token_ids.back(), 7);
  ASSERT_TRUE(AddGenerationConfigEos(R"({"do_sample": false})", "g.json", &*c).ok());
  EXPECT_EQ(c->eos_token_ids.size(), 4u);
  for (const char* bad : {R"({"eos_token_id": "x"})", R"({"eos_token_id": [-1]})", "[1]", "{"}) {
    const absl::Status st = AddGenerationConfigEos(bad, "g.json", &*c);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("g.json"), std::string::npos) << st;
  }
}

// generation_config.json's sampling defaults (vLLM's --generation-config
// auto): the five fields it takes, absent / null ones unset, mistyped named.
TEST(HfConfigTest, GenerationDefaults) {
  auto d = GenerationDefaultsFromJson(
      R"({"temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05,
          "min_p": null, "do_sample": true, "eos_token_id": [1, 2]})",
      "g.json");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_DOUBLE_EQ(*d->temperature, 0.7);
  EXPECT_DOUBLE_EQ(*d->top_p, 0.8);
  EXPECT_EQ(*d->top_k, 20);
  EXPECT_DOUBLE_EQ(*d->repetition_penalty, 1.05);
  EXPECT_FALSE(d->min_p.has_value());
  auto none = GenerationDefaultsFromJson(R"({"bos_token_id": 1})", "g.json");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  // top_k 0 is off, as in a request (transformers and vLLM).
  auto zero = GenerationDefaultsFromJson(R"({"top_k": 0})", "g.json");
  ASSERT_TRUE(zero.ok()) << zero.status();
  EXPECT_EQ(*zero->top_k, -1);
  // Values no request could send are refused here, naming the file and the
  // field (a server would otherwise fail every request that omits them).
  for (const char* bad :
       {R"({"temperature": -1})", R"({"top_p": 5})", R"({"top_p": 0})", R"({"top_k": -7})",
        R"({"min_p": 1.5})", R"({"repetition_penalty": 0})"}) {
    auto s = GenerationDefaultsFromJson(bad, "g.json");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("g.json"), std::string::npos) << s.status();
    const std::string field = json::parse(bad).begin().key();
    EXPECT_NE(s.status().message().find(field), std::string::npos) << s.status();
  }
  for (const char* bad :
       {R"({"temperature": "hot"})", R"({"top_k": 0.5})", R"({"top_k": 99999999999})", "[]", "{"}) {
    auto s = GenerationDefaultsFromJson(bad, "g.json");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.status().message().find("g.json"), std::string::npos) << s.status();
  }
  auto gguf = LoadGenerationDefaults("/nonexistent/model.gguf");
  ASSERT_TRUE(gguf.ok());
  EXPECT_TRUE(gguf->empty());
}

TEST(HfConfigTest, RopeScaling) {
  json j = Config("LlamaForCausalLM", true);
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 4.0}};
  auto lin = ModelConfigFromHfJson(j.dump(), "c.json");
  ASSERT_TRUE(lin.ok()) << lin.status();
  EXPECT_EQ(lin->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(lin->rope_scaling.factor, 4.0);

  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8.0},
                       {"low_freq_factor", 1.0},
                       {"high_freq_factor", 4.0},
                       {"original_max_position_embeddings", 8192}};
  auto l3 = ModelConfigFromHfJson(j.dump(), "c.json");
  ASSERT_TRUE(l3.ok()) << l3.status();
  EXPECT_EQ(l3->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_EQ(l3->rope_scaling.factor, 8.0);
  EXPECT_EQ(l3->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(l3->rope_scaling.original_max_position_embeddings, 8192);

  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ModelConfigFromHfJson(j.dump(), "c.json")->rope_scaling.type, RopeScaling::Type::kNone);

  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  auto yarn = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_EQ(yarn.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(yarn.status().message().find("yarn"), std::string::npos);

  j["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}};
  auto missing = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  // Found by fuzz_hf_config: the message used to read "c.json rope_scaling:
  // field 'low_freq_factor'", unlike every other field error ("c.json: field ...").
  EXPECT_EQ(missing.status().message(), "c.json: field 'rope_scaling.low_freq_factor': missing")
      << missing.status();
}

// Integers that do not fit the field's type are rejected, not wrapped: an
// eos_token_id of 2^32 + 2 used to become 2, and a uint64 above INT64_MAX wrapped
// to a negative int64 before the range check.
TEST(HfConfigTest, OutOfRangeIntegersAreRejected) {
  json j = Config("LlamaForCausalLM", true);
  j["eos_token_id"] = 4294967298LL;
  auto one = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_EQ(one.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(one.status().message().find("c.json: field 'eos_token_id': value 4294967298 out of "
                                        "range"),
            std::string::npos)
      << one.status();
  j["eos_token_id"] = {2, 4294967298LL};
  EXPECT_EQ(ModelConfigFromHfJson(j.dump(), "c.json").status().code(),
            absl::StatusCode::kInvalidArgument);
  j["eos_token_id"] = 2;
  // A float: a whole number in range is that integer, else the error says why.
  j["max_position_embeddings"] = 1e20;
  auto huge = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_NE(huge.status().message().find("'max_position_embeddings': value 1e+20 out of range"),
            std::string::npos)
      << huge.status();
  j["max_position_embeddings"] = 9223372036854775808.0;  // 2^63: just past int64
  EXPECT_NE(ModelConfigFromHfJson(j.dump(), "c.json").status().message().find("out of range"),
            std::string::npos);
  j["max_position_embeddings"] = 4096.5;
  auto fraction = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_NE(fraction.status().message().find("must be an integer, got 4096.5"), std::string::npos)
      << fraction.status();
  j["max_position_embeddings"] = 4096.0;
  auto whole = ModelConfigFromHfJson(j.dump(), "c.json");
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(whole->max_position_embeddings, 4096);
  j.erase("max_position_embeddings");
  j["bos_token_id"] = 18446744073709551615ULL;  // wrapped to -1 before
  auto bos = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_EQ(bos.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bos.status().message().find("'bos_token_id'"), std::string::npos) << bos.status();
}

// Dimensions far above any checkpoint are refused before work scales with
// them (layer_types flags, rotary tables), naming the field.
TEST(HfConfigTest, DimensionsAboveTheBoundsAreRejected) {
  json j = Config("LlamaForCausalLM", true);
  j["head_dim"] = 50000000;
  auto head = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_EQ(head.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(head.status().message().find("c.json: model config: head_size 50000000 is above"),
            std::string::npos)
      << head.status();
  j = Config("LlamaForCausalLM", true);
  j["num_hidden_layers"] = 2147483647;
  auto layers = ModelConfigFromHfJson(j.dump(), "c.json");
  EXPECT_NE(layers.status().message().find("num_layers 2147483647 is above the bound 4096"),
            std::string::npos)
      << layers.status();
}

TEST(HfConfigTest, RopeInverseFrequencies) {
  ModelConfig c;
  c.head_size = 128;
  c.rope_theta = 500000.0;
  std::vector<double> base = RopeInverseFrequencies(c);
  ASSERT_EQ(base.size(), 64u);
  EXPECT_DOUBLE_EQ(base[0], 1.0);
  EXPECT_NEAR(base[1], std::pow(500000.0, -2.0 / 128), 1e-15);
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 4;
  std::vector<double> lin = RopeInverseFrequencies(c);
  for (size_t i = 0; i < base.size(); ++i) EXPECT_DOUBLE_EQ(lin[i], base[i] / 4);
  // Llama 3.1: wavelengths below 8192/4 keep their frequency, above 8192/1 are
  // divided by 8, in between are blended (monotone, strictly between).
  c.rope_scaling = RopeScaling{};
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position_embeddings = 8192;
  std::vector<double> l3 = RopeInverseFrequencies(c);
  int high = 0, low = 0, mid = 0;
  for (size_t i = 0; i < base.size(); ++i) {
    double wavelen = 2 * M_PI / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(l3[i], base[i]);
      ++high;
    } else if (wavelen > 8192.0) {
      EXPECT_DOUBLE_EQ(l3[i], base[i] / 8);
      ++low;
    } else {
      EXPECT_LT(l3[i], base[i]);
      EXPECT_GT(l3[i], base[i] / 8);
      ++mid;
    }
    if (i > 0) {
      EXPECT_LT(l3[i], l3[i - 1]);
    }
  }
  EXPECT_GT(high, 0);
  EXPECT_GT(low, 0);
  EXPECT_GT(mid, 0);
}

// A quantized checkpoint (transformers' quantization_config) is refused at the
// config, naming the method, whatever else the config holds.
TEST(HfConfigTest, QuantizationConfigRefusedNamingTheMethod) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"quant_method", "awq"}, {"bits", 4}, {"group_size", 128}}, "'awq'"},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"desc_act", false}}, "'gptq'"},
      {{{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}, "'fp8'"},
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, "'bitsandbytes'"},
      {{{"load_in_8bit", true}}, "'bitsandbytes'"},
      {{{"quant_method", "compressed-tensors"}}, "'compressed-tensors'"},
      {{{"bits", 4}}, "'unknown'"}};
  for (const auto& [qc, name] : cases) {
    json c = Config("LlamaForCausalLM", true);
    c["quantization_config"] = qc;
    auto r = ModelConfigFromHfJson(c.dump(), "dir/config.json");
    ASSERT_FALSE(r.ok()) << qc.dump();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
    EXPECT_NE(
        r.status().message().find("dir/config.json: quantization_config.quant_method " + name),
        std::string::npos)
        << r.status();
  }
  json plain = Config("LlamaForCausalLM", true);
  plain["quantization_config"] = nullptr;  // explicitly none
  EXPECT_TRUE(ModelConfigFromHfJson(plain.dump(), "config.json").ok());
}

TEST(HfConfigTest, Errors) {
  json j = Config("GPT2LMHeadModel", true);
  EXPECT_EQ(ModelConfigFromHfJson(j.dump(), "c.json").status().code(),
            absl::StatusCode::kUnimplemented);
  j = Config("LlamaForCausalLM", true);
  j.erase("hidden_size");
  auto s = ModelConfigFromHfJson(j.dump(), "dir/config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dir/config.json"), std::string::npos) << s;
  EXPECT_NE(s.message().find("hidden_size"), std::string::npos) << s;
  j = Config("LlamaForCausalLM", true);
  j["num_key_value_heads"] = 3;
  EXPECT_FALSE(ModelConfigFromHfJson(j.dump(), "c.json").ok());
  j["num_key_value_heads"] = "two";
  EXPECT_FALSE(ModelConfigFromHfJson(j.dump(), "c.json").ok());
  EXPECT_FALSE(ModelConfigFromHfJson("{not json", "c.json").ok());
  EXPECT_EQ(LoadHfConfig("/nonexistent").status().code(), absl::StatusCode::kNotFound);

  // Text that is not one JSON object says where and why, NaN named as such
  // (Python's json.dump writes it), in config.json and generation_config.json.
  auto expect = [](const absl::Status& st, const std::string& want) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(want), std::string::npos) << st << "\nwant: " << want;
  };
  std::string text = Config("LlamaForCausalLM", true).dump();
  text.insert(1, R"("initializer_range": NaN, )");
  expect(ModelConfigFromHfJson(text, "c.json").status(), "c.json: not valid JSON: NaN near byte");
  expect(ModelConfigFromHfJson(R"({"a": -Infinity})", "c.json").status(), "-Infinity near byte");
  expect(GenerationDefaultsFromJson(R"({"temperature": NaN})", "g.json").status(),
         "g.json: not valid JSON: NaN near byte");
  expect(ModelConfigFromHfJson(R"({"a": 1,})", "c.json").status(), "c.json: not valid JSON: ");
  expect(ModelConfigFromHfJson("[1, 2]", "c.json").status(),
         "c.json: the top level must be a JSON object, got array");
  expect(GenerationDefaultsFromJson("3", "g.json").status(),
         "g.json: the top level must be a JSON object, got number");
  // A rope_scaling type of the wrong JSON type is named, not "missing".
  j = Config("LlamaForCausalLM", true);
  j["rope_scaling"] = {{"type", 5}, {"factor", 2.0}};
  expect(ModelConfigFromHfJson(j.dump(), "c.json").status(),
         "'rope_scaling.type': must be a string, got number");
  j["rope_scaling"] = {{"rope_type", nullptr}, {"type", "linear"}, {"factor", 2.0}};
  expect(ModelConfigFromHfJson(j.dump(), "c.json").status(),
         "'rope_scaling.rope_type': must be a string, got null");
  j["rope_scaling"] = {{"factor", 2.0}};
  expect(ModelConfigFromHfJson(j.dump(), "c.json").status(), "'rope_scaling.rope_type': missing");
}

TEST(HfWeightsTest, SingleAndShardedLoadExactly) {
  for (bool sharded : {false, true}) {
    TensorMap m = MakeModel(false, false, 7);
    std::string dir = WriteModel(m, Config("LlamaForCausalLM", false), sharded);
    auto w = LoadLlamaWeights(dir);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->shard.num_heads, kHeads);
    ExpectMatrix(w->embed_tokens, kVocab, kHidden, m["model.embed_tokens.weight"].values, "embed");
    ExpectMatrix(w->lm_head, kVocab, kHidden, m["lm_head.weight"].values, "lm_head");
    EXPECT_EQ(&w->output_embeddings(), &w->lm_head);
    EXPECT_EQ(w->final_norm, m["model.norm.weight"].values);
    ASSERT_EQ(w->layers.size(), size_t{kLayers});
    for (int l = 0; l < kLayers; ++l) {
      std::string p = "model.layers." + std::to_string(l) + ".";
      const LayerWeights& L = w->layers[l];
      EXPECT_EQ(L.input_layernorm, m[p + "input_layernorm.weight"].values);
      EXPECT_EQ(L.post_attention_layernorm, m[p + "post_attention_layernorm.weight"].values);
      ExpectMatrix(L.q_proj, kHeads * kHead, kHidden, m[p + "self_attn.q_proj.weight"].values, p);
      ExpectMatrix(L.k_proj, kKv * kHead, kHidden, m[p + "self_attn.k_proj.weight"].values, p);
      ExpectMatrix(L.v_proj, kKv * kHead, kHidden, m[p + "self_attn.v_proj.weight"].values, p);
      ExpectMatrix(L.o_proj, kHidden, kHeads * kHead, m[p + "self_attn.o_proj.weight"].values, p);
      ExpectMatrix(L.gate_proj, kInter, kHidden, m[p + "mlp.gate_proj.weight"].values, p);
      ExpectMatrix(L.up_proj, kInter, kHidden, m[p + "mlp.up_proj.weight"].values, p);
      ExpectMatrix(L.down_proj, kHidden, kInter, m[p + "mlp.down_proj.weight"].values, p);
      EXPECT_TRUE(L.q_bias.empty());
    }
  }
}

// Phi-3's fused qkv_proj ([q | k | v] rows) and gate_up_proj ([gate | up])
// load, whole and per tensor-parallel shard, as the separate matrices they
// stack; Phi-3's partial rotary and LongRoPE configs load as transformers
// reads them (PartialRotaryAndLongRope).
TEST(HfWeightsTest, FusedProjectionsSplitLikeSeparateOnes) {
  TensorMap m = MakeModel(/*qkv_bias=*/false, /*tied=*/false, 13);
  auto stack = [](std::initializer_list<const Tensor*> parts) {
    Tensor t{"F32", {0, kHidden}, {}, {}};
    for (const Tensor* p : parts) {
      t.shape[0] += p->shape[0];
      t.values.insert(t.values.end(), p->values.begin(), p->values.end());
      t.bytes.insert(t.bytes.end(), p->bytes.begin(), p->bytes.end());
    }
    return t;
  };
  TensorMap fused = m;
  for (int l = 0; l < kLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    fused[p + "self_attn.qkv_proj.weight"] =
        stack({&m[p + "self_attn.q_proj.weight"], &m[p + "self_attn.k_proj.weight"],
               &m[p + "self_attn.v_proj.weight"]});
    fused[p + "mlp.gate_up_proj.weight"] =
        stack({&m[p + "mlp.gate_proj.weight"], &m[p + "mlp.up_proj.weight"]});
    for (const char* n : {"self_attn.q_proj.weight", "self_attn.k_proj.weight",
                          "self_attn.v_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"})
      fused.erase(p + n);
  }
  const std::string plain_dir = WriteModel(m, Config("MistralForCausalLM", false), false);
  const std::string fused_dir = WriteModel(fused, Config("Phi3ForCausalLM", false), false);
  for (int tp : {1, 2}) {
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(r));
      auto want = LoadLlamaWeights(plain_dir, r, tp);
      auto got = LoadLlamaWeights(fused_dir, r, tp);
      ASSERT_TRUE(want.ok()) << want.status();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->config.arch, ModelArch::kPhi3);
      EXPECT_TRUE(got->config.fused_projections);
      for (int l = 0; l < kLayers; ++l) {
        const LayerWeights& a = want->layers[l];
        const LayerWeights& b = got->layers[l];
        EXPECT_EQ(b.q_proj.data, a.q_proj.data) << "q, layer " << l;
        EXPECT_EQ(b.k_proj.data, a.k_proj.data) << "k, layer " << l;
        EXPECT_EQ(b.v_proj.data, a.v_proj.data) << "v, layer " << l;
        EXPECT_EQ(b.gate_proj.data, a.gate_proj.data) << "gate, layer " << l;
        EXPECT_EQ(b.up_proj.data, a.up_proj.data) << "up, layer " << l;
        EXPECT_EQ(b.down_proj.data, a.down_proj.data) << "down, layer " << l;
      }
    }
  }
}

// Phi-4-mini's partial rotary: int(head_dim * partial_rotary_factor) even
// dimensions rotate, Phi-3 only. LongRoPE (type "longrope" or its first name
// "su"): head_dim / 2 factors per set, the original context from the config,
// transformers' attention factor sqrt(1 + ln(max / original) / ln(original))
// unless given, the long set for a context past the original one.
TEST(HfConfigTest, PartialRotaryAndLongRope) {
  json partial = Config("Phi3ForCausalLM", false);
  partial["partial_rotary_factor"] = 0.5;
  auto pc = ModelConfigFromHfJson(partial.dump(), "config.json");
  ASSERT_TRUE(pc.ok()) << pc.status();
  EXPECT_EQ(pc->head_size, kHead);
  EXPECT_EQ(pc->RotaryDim(), kHead / 2);
  EXPECT_EQ(RopeInverseFrequencies(*pc).size(), 1u);
  partial["partial_rotary_factor"] = 0.75;  // 3 of 4 dimensions: odd
  auto s = ModelConfigFromHfJson(partial.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("partial_rotary_factor"), std::string::npos) << s;
  json mistral = Config("MistralForCausalLM", false);
  mistral["partial_rotary_factor"] = 0.5;
  s = ModelConfigFromHfJson(mistral.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_NE(s.message().find("partial_rotary_factor"), std::string::npos) << s;

  json longrope = Config("Phi3ForCausalLM", false);  // max_position_embeddings 256
  longrope["original_max_position_embeddings"] = 64;
  longrope["rope_scaling"] = {
      {"type", "su"}, {"short_factor", {1.0, 1.5}}, {"long_factor", {2.0, 8.0}}};
  auto lc = ModelConfigFromHfJson(longrope.dump(), "config.json");
  ASSERT_TRUE(lc.ok()) << lc.status();
  ASSERT_EQ(lc->rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(lc->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_NEAR(lc->rope_scaling.attention_factor, std::sqrt(1 + std::log(4.0) / std::log(64.0)),
              1e-15);
  EXPECT_TRUE(lc->rope_scaling.use_long_factor);
  std::vector<double> inv = RopeInverseFrequencies(*lc);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0 / 2.0);
  EXPECT_DOUBLE_EQ(inv[1], std::pow(10000.0, -0.5) / 8.0);
  SelectLongRopeFactors(64, &*lc);  // a server within the original context
  inv = RopeInverseFrequencies(*lc);
  EXPECT_DOUBLE_EQ(inv[1], std::pow(10000.0, -0.5) / 1.5);
  SelectLongRopeFactors(65, &*lc);
  EXPECT_TRUE(lc->rope_scaling.use_long_factor);

  json given = longrope;
  given["rope_scaling"]["attention_factor"] = 1.25;
  given["rope_scaling"]["type"] = "longrope";
  lc = ModelConfigFromHfJson(given.dump(), "config.json");
  ASSERT_TRUE(lc.ok()) << lc.status();
  EXPECT_EQ(lc->rope_scaling.attention_factor, 1.25);

  json short_set = longrope;
  short_set["rope_scaling"]["short_factor"] = {1.0};
  s = ModelConfigFromHfJson(short_set.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("short_factor"), std::string::npos) << s;
  json no_original = longrope;
  no_original.erase("original_max_position_embeddings");
  s = ModelConfigFromHfJson(no_original.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("original_max_position_embeddings"), std::string::npos) << s;
  json not_numbers = longrope;
  not_numbers["rope_scaling"]["long_factor"] = {"a", "b"};
  s = ModelConfigFromHfJson(not_numbers.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("long_factor"), std::string::npos) << s;

  // Values given must be positive and within the sanity ranges; a tiny
  // factor would make an infinite frequency.
  for (auto [key, value] : {std::pair<const char*, double>{"attention_factor", 0.0},
                            {"attention_factor", -1.0},
                            {"attention_factor", 1e300},
                            {"factor", -5.0},
                            {"original_max_position_embeddings", -5.0}}) {
    json bad = longrope;
    bad["rope_scaling"][key] = value;
    s = ModelConfigFromHfJson(bad.dump(), "config.json").status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key << " " << value << ": " << s;
  }
  json tiny = longrope;
  tiny["rope_scaling"]["long_factor"] = {2.0, 1e-320};
  s = ModelConfigFromHfJson(tiny.dump(), "config.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("long_factor"), std::string::npos) << s;

  // The config's top-level original_max_position_embeddings comes first (as
  // transformers' standardize_rope_params); the nested one is used without it.
  json both = longrope;
  both["rope_scaling"]["original_max_position_embeddings"] = 128;
  EXPECT_EQ(ModelConfigFromHfJson(both.dump(), "config.json")
                ->rope_scaling.original_max_position_embeddings,
            64);
  both.erase("original_max_position_embeddings");
  EXPECT_EQ(ModelConfigFromHfJson(both.dump(), "config.json")
                ->rope_scaling.original_max_position_embeddings,
            128);

  // transformers 5's rope_parameters (a re-saved Phi-4-mini): longrope and
  // partial_rotary_factor inside it; partial_rotary_factor inside rope_scaling.
  json saved = Config("Phi3ForCausalLM", false);
  saved["original_max_position_embeddings"] = 64;
  saved["rope_parameters"] = {
      {"rope_type", "longrope"}, {"rope_theta", 10000.0}, {"partial_rotary_factor", 0.5},
      {"short_factor", {1.5}},   {"long_factor", {8.0}},  {"original_max_position_embeddings", 64}};
  auto sc = ModelConfigFromHfJson(saved.dump(), "config.json");
  ASSERT_TRUE(sc.ok()) << sc.status();
  EXPECT_EQ(sc->RotaryDim(), 2);
  EXPECT_EQ(sc->rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_DOUBLE_EQ(RopeInverseFrequencies(*sc)[0], 1.0 / 8.0);
  json in_scaling = longrope;
  in_scaling["rope_scaling"]["partial_rotary_factor"] = 0.5;
  in_scaling["rope_scaling"]["short_factor"] = {1.5};
  in_scaling["rope_scaling"]["long_factor"] = {8.0};
  auto ic = ModelConfigFromHfJson(in_scaling.dump(), "config.json");
  ASSERT_TRUE(ic.ok()) << ic.status();
  EXPECT_EQ(ic->RotaryDim(), 2);
}

TEST(HfWeightsTest, TensorParallelShardsConcatenateToFull) {
  TensorMap m = MakeModel(/*qkv_bias=*/true, /*tied=*/true, 11);
  std::string dir = WriteModel(m, Config("Qwen2ForCausalLM", true), false);
  for (int tp : {1, 2, 4, 8}) {
    for (int r = 0; r < tp; ++r) {
      SCOPED_TRACE("tp " + std::to_string(tp) + " rank " + std::to_string(r));
      auto w = LoadLlamaWeights(dir, r, tp);
      ASSERT_TRUE(w.ok()) << w.status();
      const ShardLayout& s = w->shard;
      const int hl = kHeads / tp, il = kInter / tp;
      EXPECT_EQ(s.num_heads, hl);
      EXPECT_EQ(s.first_head, r * hl);
      // KV heads: split when tp <= 2, otherwise the one head of this rank's group.
      int kvl = tp <= kKv ? kKv / tp : 1;
      int kv0 = tp <= kKv ? r * kvl : (r * hl) / (kHeads / kKv);
      EXPECT_EQ(s.num_kv_heads, kvl);
      EXPECT_EQ(s.first_kv_head, kv0);
      EXPECT_TRUE(w->lm_head.empty());
      EXPECT_EQ(&w->output_embeddings(), &w->embed_tokens);
      EXPECT_EQ(w->embed_tokens.data, m["model.embed_tokens.weight"].values);
      for (int l = 0; l < kLayers; ++l) {
        std::string p = "model.layers." + std::to_string(l) + ".";
        const LayerWeights& L = w->layers[l];
        const int q0 = r * hl * kHead, q1 = (r + 1) * hl * kHead;
        const int k0 = kv0 * kHead, k1 = (kv0 + kvl) * kHead;
        ExpectMatrix(L.q_proj, q1 - q0, kHidden,
                     Slice(m[p + "self_attn.q_proj.weight"], q0, q1, 0, kHidden), "q");
        ExpectMatrix(L.k_proj, k1 - k0, kHidden,
                     Slice(m[p + "self_attn.k_proj.weight"], k0, k1, 0, kHidden), "k");
        ExpectMatrix(L.v_proj, k1 - k0, kHidden,
                     Slice(m[p + "self_attn.v_proj.weight"], k0, k1, 0, kHidden), "v");
        EXPECT_EQ(L.q_bias, Slice(m[p + "self_attn.q_proj.bias"], q0, q1, 0, 1));
        EXPECT_EQ(L.k_bias, Slice(m[p + "self_attn.k_proj.bias"], k0, k1, 0, 1));
        EXPECT_EQ(L.v_bias, Slice(m[p + "self_attn.v_proj.bias"], k0, k1, 0, 1));
        ExpectMatrix(L.o_proj, kHidden, q1 - q0,
                     Slice(m[p + "self_attn.o_proj.weight"], 0, kHidden, q0, q1), "o");
        ExpectMatrix(L.gate_proj, il, kHidden,
                     Slice(m[p + "mlp.gate_proj.weight"], r * il, (r + 1) * il, 0, kHidden),
                     "gate");
        ExpectMatrix(L.up_proj, il, kHidden,
                     Slice(m[p + "mlp.up_proj.weight"], r * il, (r + 1) * il, 0, kHidden), "up");
        ExpectMatrix(L.down_proj, kHidden, il,
                     Slice(m[p + "mlp.down_proj.weight"], 0, kHidden, r * il, (r + 1) * il),
                     "down");
        EXPECT_EQ(L.input_layernorm, m[p + "input_layernorm.weight"].values);
      }
    }
  }
  auto bad = LoadLlamaWeights(dir, 0, 3);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("num_heads"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadLlamaWeights(dir, 2, 2).ok());
}

// Stored formats: BF16 embeddings and F32 projections stay as stored (mapped
// unless a column slice needs copying) and read back exactly; --dtype bfloat16
// converts the F32 matrices with round-to-nearest-even.
void ExpectStoredMatrix(const Matrix& m, GgmlType type, const std::vector<float>& want,
                        bool to_bf16, const std::string& what) {
  EXPECT_FALSE(m.is_fp32()) << what;
  EXPECT_EQ(m.type, type) << what;
  ASSERT_EQ(static_cast<size_t>(m.rows * m.cols), want.size()) << what;
  std::vector<float> row(m.cols), got;
  for (int64_t r = 0; r < m.rows; ++r) {
    ASSERT_TRUE(m.RowToFloat(r, row.data()).ok()) << what;
    got.insert(got.end(), row.begin(), row.end());
  }
  std::vector<float> expect = want;
  if (to_bf16) {
    for (float& v : expect) v = kernels::BFloat16BitsToFloat(kernels::FloatToBFloat16Bits(v));
  }
  EXPECT_EQ(got, expect) << what;
}

TEST(HfWeightsTest, StoredFormatsStayAsStored) {
  TensorMap m = MakeModel(/*qkv_bias=*/true, /*tied=*/true, 5);
  std::string dir = WriteModel(m, Config("Qwen2ForCausalLM", true), false);
  for (WeightDType dtype : {WeightDType::kAuto, WeightDType::kBFloat16}) {
    const bool bf = dtype == WeightDType::kBFloat16;
    const GgmlType proj = bf ? GgmlType::kBF16 : GgmlType::kF32;
    for (int tp : {1, 2}) {
      for (int r = 0; r < tp; ++r) {
        SCOPED_TRACE(std::string(WeightDTypeName(dtype)) + " tp " + std::to_string(tp) + " rank " +
                     std::to_string(r));
        auto w = LoadLlamaWeights(dir, r, tp, dtype);
        ASSERT_TRUE(w.ok()) << w.status();
        EXPECT_EQ(w->dtype, dtype);
        ExpectStoredMatrix(w->embed_tokens, GgmlType::kBF16, m["model.embed_tokens.weight"].values,
                           false, "embed");
        if (!bf) {
          EXPECT_NE(w->embed_tokens.mapped, nullptr);
        }
        EXPECT_NE(w->mapping, nullptr);  // the BF16 embedding is used in place
        const int hl = kHeads / tp, il = kInter / tp, q0 = r * hl * kHead;
        const int q1 = q0 + hl * kHead;
        for (int l = 0; l < kLayers; ++l) {
          std::string p = "model.layers." + std::to_string(l) + ".";
          const LayerWeights& L = w->layers[l];
          ExpectStoredMatrix(L.q_proj, proj,
                             Slice(m[p + "self_attn.q_proj.weight"], q0, q1, 0, kHidden), bf, "q");
          ExpectStoredMatrix(L.o_proj, proj,
                             Slice(m[p + "self_attn.o_proj.weight"], 0, kHidden, q0, q1), bf, "o");
          ExpectStoredMatrix(L.down_proj, proj,
                             Slice(m[p + "mlp.down_proj.weight"], 0, kHidden, r * il, (r + 1) * il),
                             bf, "down");
          EXPECT_EQ(L.q_bias, Slice(m[p + "self_attn.q_proj.bias"], q0, q1, 0, 1));
          EXPECT_EQ(L.o_proj.owned.empty(), tp == 1 && !bf) << "column slices are copied";
        }
      }
    }
  }
}

// LoadProgressFn: a first report of 0 bytes, one after the embeddings and
// each layer, never decreasing, then total / total; the total is the bytes of
// every tensor in the checkpoint (also its shards). Sharded loads count whole
// tensors, so every rank sees the same figures.
TEST(HfWeightsTest, ProgressReportsBytesOfTensorsRead) {
  for (bool sharded : {false, true}) {
    TensorMap m = MakeModel(false, false, 7);
    uint64_t file_bytes = 0;
    for (const auto& [name, t] : m) file_bytes += t.bytes.size();
    std::string dir = WriteModel(m, Config("LlamaForCausalLM", false), sharded);
    for (int rank : {0, 1}) {
      std::vector<std::pair<uint64_t, uint64_t>> calls;
      auto w = LoadLlamaWeights(
          dir, rank, 2, WeightDType::kFloat32,
          [&](uint64_t loaded, uint64_t total) { calls.emplace_back(loaded, total); });
      ASSERT_TRUE(w.ok()) << w.status();
      ASSERT_EQ(calls.size(), size_t{kLayers} + 3) << "start, embeddings, each layer, end";
      EXPECT_EQ(calls.front().first, 0u);
      for (size_t i = 0; i < calls.size(); ++i) {
        EXPECT_EQ(calls[i].second, file_bytes) << i;
        if (i > 0 && i + 1 < calls.size()) {
          EXPECT_GT(calls[i].first, calls[i - 1].first) << i;  // every step reads tensors
        }
      }
      // Every tensor of this model is read: the last layer's report is the total.
      EXPECT_EQ(calls[calls.size() - 2].first, file_bytes);
      EXPECT_EQ(calls.back().first, file_bytes);
    }
  }
}

TEST(HfWeightsTest, MissingAndMisshapenTensorsNamed) {
  TensorMap m = MakeModel(false, true, 3);
  m.erase("model.layers.1.mlp.up_proj.weight");
  std::string dir = WriteModel(m, Config("LlamaForCausalLM", true), false);
  auto w = LoadLlamaWeights(dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(w.status().message().find("model.layers.1.mlp.up_proj.weight"), std::string::npos)
      << w.status();

  TensorMap m2 = MakeModel(false, true, 3);
  std::mt19937 rng(1);
  m2["model.layers.0.self_attn.k_proj.weight"] = F32(rng, {kHead, kHidden});
  std::string dir2 = WriteModel(m2, Config("LlamaForCausalLM", true), true);
  auto w2 = LoadLlamaWeights(dir2);
  EXPECT_EQ(w2.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w2.status().message().find("k_proj"), std::string::npos) << w2.status();
  EXPECT_NE(w2.status().message().find("[4, 32]"), std::string::npos) << w2.status();
}

std::string WithHeader(const std::string& header, size_t data_bytes) {
  uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + std::string(data_bytes, '\0');
}

absl::Status ParseSt(const std::string& bytes) {
  return SafetensorsFile::FromBytes("bad.safetensors",
                                    std::vector<uint8_t>(bytes.begin(), bytes.end()))
      .status();
}

TEST(SafetensorsTest, Malformed) {
  std::string ok = WithHeader(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}})", 16);
  auto f = SafetensorsFile::FromBytes("ok", std::vector<uint8_t>(ok.begin(), ok.end()));
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_NE((*f)->Find("w"), nullptr);
  EXPECT_EQ((*f)->Find("w")->shape, (std::vector<int64_t>{2, 2}));
  for (size_t n = 0; n < ok.size() - 16; ++n) {
    EXPECT_FALSE(ParseSt(ok.substr(0, n)).ok()) << n;
  }
  std::string huge = ok;
  uint64_t big = ~uint64_t{0} - 4;
  std::memcpy(huge.data(), &big, 8);
  absl::Status s = ParseSt(huge);
  EXPECT_NE(s.message().find("bad.safetensors"), std::string::npos) << s;
  EXPECT_NE(s.message().find("header length"), std::string::npos) << s;
  s = ParseSt(WithHeader(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,32]}})", 16));
  EXPECT_NE(s.message().find("past end of file"), std::string::npos) << s;
  s = ParseSt(WithHeader(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,16]}})", 16));
  EXPECT_NE(s.message().find("need 24"), std::string::npos) << s;
  s = ParseSt(WithHeader(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[8,0]}})", 16));
  EXPECT_FALSE(s.ok());
  s = ParseSt(WithHeader(R"({"w":{"dtype":"Q9","shape":[2,2],"data_offsets":[0,16]}})", 16));
  EXPECT_NE(s.message().find("dtype"), std::string::npos) << s;
  s = ParseSt(WithHeader(
      R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,16]}})", 16));
  EXPECT_FALSE(s.ok());
  s = ParseSt(WithHeader("[1,2]", 0));
  EXPECT_FALSE(s.ok());
  s = ParseSt(WithHeader(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,16]}})", 16));
  EXPECT_FALSE(s.ok());
  // Found with fuzz_safetensors' invariants: after a 0 dimension a uint64 one
  // above INT64_MAX passed the size check and became a negative shape entry.
  s = ParseSt(WithHeader(
      R"({"w":{"dtype":"F32","shape":[0,18446744073709551615],"data_offsets":[0,0]}})", 0));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("bad.safetensors: tensor 'w': field 'shape'"), std::string::npos) << s;
  // I64 parses but cannot be converted to fp32.
  std::string i64 = WithHeader(R"({"w":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16);
  auto g = SafetensorsFile::FromBytes("i64", std::vector<uint8_t>(i64.begin(), i64.end()));
  ASSERT_TRUE(g.ok());
  std::vector<float> out(2);
  EXPECT_EQ((*g)->ReadRows(*(*g)->Find("w"), 0, 2, out.data()).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_FALSE((*g)->ReadRows(*(*g)->Find("w"), 1, 3, out.data()).ok());
}

TEST(SafetensorsTest, CheckpointErrors) {
  std::string dir = ::pagedserve::testing::MakeTempDir();
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir).status().code(), absl::StatusCode::kNotFound);
  WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"../x"}})");
  EXPECT_FALSE(SafetensorsCheckpoint::Open(dir).ok());
  WriteFile(dir + "/model.safetensors.index.json", R"({"weight_map":{"a":"missing.safetensors"}})");
  auto s = SafetensorsCheckpoint::Open(dir).status();
  EXPECT_NE(s.message().find("missing.safetensors"), std::string::npos) << s;
}

}  // namespace
}  // namespace pagedserve
