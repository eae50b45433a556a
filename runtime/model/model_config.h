// The architecture description of a Llama-family decoder-only model, read
// from GGUF metadata (llama.* / qwen2.* / qwen3.* keys) or a Hugging Face
// config.json.
//
// Field names follow Hugging Face's LlamaConfig. Supported: LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM (bias on Q/K/V), Qwen3ForCausalLM
// (per-head RMSNorm of q and k before RoPE, no bias, explicit head_dim),
// Gemma2ForCausalLM and Gemma3ForCausalLM (model_type gemma3_text; the
// Gemma fields below), Phi3ForCausalLM (fused projections; LongRoPE and
// partial rotary as Phi-3.5 and Phi-4-mini), the mixture-of-experts MixtralForCausalLM (Mistral
// attention), Qwen3MoeForCausalLM (Qwen3 attention) and Qwen2MoeForCausalLM
// (Qwen2 attention, a gated shared expert), and GGUF
// general.architecture "llama" (which llama.cpp also uses for Mistral and
// Mixtral), "qwen2", "qwen3", "qwen3moe", "qwen2moe", "gemma2", "gemma3" and "phi3". All
// of them: RMSNorm, rotary embeddings (HF rotate_half layout after loading,
// see weights.h), grouped-query attention, a gated MLP (SwiGLU; Gemma:
// GeGLU) -- dense, or a mixture of SwiGLU experts (MoeConfig).
#ifndef PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
#define PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedserve {

class GgufFile;

enum class ModelArch {
  kLlama,
  kMistral,
  kQwen2,
  kQwen3,
  kGemma2,
  kGemma3,
  kPhi3,
  kMixtral,
  kQwen3Moe,
  kQwen2Moe
};
// "llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "mixtral", "qwen3_moe",
// "qwen2_moe".
std::string ModelArchName(ModelArch arch);

// rope_scaling of Hugging Face (transformers' modeling_rope_utils), over the
// d = ModelConfig::RotaryDim() rotated dimensions of each head:
//   kNone:   inv_freq[i] = rope_theta^(-2i/d), i < d/2
//   kLinear: positions divided by `factor` (equivalently inv_freq / factor)
//   kLlama3: Llama 3.1 frequency-dependent scaling with factor,
//            low_freq_factor, high_freq_factor and
//            original_max_position_embeddings (RopeInverseFrequencies below).
//   kLongRope: LongRoPE (Ding et al. 2024, "LongRoPE: Extending LLM Context
//            Window Beyond 2 Million Tokens"; Phi-3 128K, Phi-3.5, Phi-4-mini):
//            inv_freq[i] = rope_theta^(-2i/d) / ext[i] with ext = long_factor
//            when use_long_factor, else short_factor (d/2 each), and cos / sin
//            multiplied by attention_factor (transformers' attention_scaling:
//            sqrt(1 + ln(s) / ln(original_max_position_embeddings)) for
//            s = max_position_embeddings / original > 1, unless the config
//            gives it). transformers picks the set per forward pass from the
//            current length; a server fixes it once for every sequence so that
//            cached keys never mix the two: long when its max_model_len exceeds
//            original_max_position_embeddings (vLLM's rule; llama.cpp's with
//            n_ctx). SelectLongRopeFactors below.
// and, independently of the type, llama.cpp's per-frequency factors (GGUF
// tensor "rope_freqs.weight", d / 2 floats): inv_freq[i] is divided by
// freq_factors[i] after the type's scaling, as ggml's rope does
// (ggml-cpu ops.cpp ggml_rope_cache_init: theta_extrap = theta_base / ff[i];
// then freq_scale multiplies). llama.cpp's convert_hf_to_gguf.py writes them
// for rope_type llama3 (factor 1 for high, `factor` for low frequencies,
// 1 / ((1 - smooth) / factor + smooth) in between), so that a Llama 3.x GGUF
// has the rotary frequencies of its Hugging Face llama3 rope_scaling.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kLongRope };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  std::vector<float> freq_factors;  // empty, or RotaryDim() / 2 positive divisors
  // kLongRope only: RotaryDim() / 2 positive factors each, the set in use,
  // and the multiplier of cos / sin (1 for the other types).
  std::vector<double> short_factor, long_factor;
  bool use_long_factor = false;
  double attention_factor = 1.0;
};

// The gated MLP's activation: down(act(x gate^T) * (x up^T)).
//   kSilu:     SwiGLU (Llama, Qwen, Mistral; HF hidden_act "silu")
//   kGeluTanh: GeGLU with the tanh approximation of GELU (Gemma; HF
//              "gelu_pytorch_tanh"): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
enum class MlpActivation { kSilu, kGeluTanh };

// A sparse mixture-of-experts MLP (Shazeer et al. 2017; Mixtral, Jiang et al.
// 2024; Qwen3-MoE) in place of the dense one, on every layer:
//   router logits  l = x W_router^T               (W_router [num_experts, hidden])
//   p = softmax(l) over all experts; the top_k experts by p (ties to the lower
//   index, as torch.topk on these values); their weights p_e, divided by their
//   sum when norm_topk_prob (Mixtral always: equal to a softmax over the top-k
//   logits; Qwen3-MoE: config norm_topk_prob);
//   out = sum over the chosen e of weight_e * down_e(silu(gate_e x) * up_e x),
// each expert a SwiGLU MLP of width expert_intermediate_size. Qwen2-MoE adds
// a gated shared expert that every token runs (Qwen team 2024, "Qwen1.5-MoE";
// transformers' Qwen2MoeSparseMoeBlock):
//   out += sigmoid(x w_sg^T) * down_s(silu(gate_s x) * up_s x)
// with w_sg [1, hidden] and a SwiGLU MLP of width
// shared_expert_intermediate_size (0 = no shared expert).
struct MoeConfig {
  int num_experts = 0;               // 0 = a dense MLP
  int top_k = 0;                     // num_experts_per_tok / {arch}.expert_used_count
  int expert_intermediate_size = 0;  // Mixtral: intermediate_size; Qwen3-MoE: moe_intermediate_size
  int shared_expert_intermediate_size = 0;  // Qwen2-MoE / {arch}.expert_shared_feed_forward_length
  bool norm_topk_prob = true;
  bool enabled() const { return num_experts > 0; }
};

struct ModelConfig {
  ModelArch arch = ModelArch::kLlama;
  int num_layers = 0;         // num_hidden_layers / {arch}.block_count
  int hidden_size = 0;        // hidden_size / {arch}.embedding_length
  int intermediate_size = 0;  // MLP width / {arch}.feed_forward_length
  int num_heads = 0;          // query heads
  int num_kv_heads = 0;       // key/value heads (GQA); divides num_heads
  int head_size = 0;          // hidden_size / num_heads unless set (head_dim)
  // Rotary dimensions per head: the first rotary_dim of each head's
  // head_size rotate (pairs (i, i + rotary_dim / 2)), the rest pass through
  // (HF partial_rotary_factor: int(head_size * factor); GGUF
  // rope.dimension_count). 0 = head_size. Below head_size only for Phi-3
  // (Phi-4-mini: 96 of 128).
  int rotary_dim = 0;
  int RotaryDim() const { return rotary_dim > 0 ? rotary_dim : head_size; }
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // LM head = token embedding matrix
  bool qkv_bias = false;             // true for Qwen2
  // Phi-3: q, k and v stored stacked in one qkv_proj (GGUF attn_qkv) and
  // gate and up in one gate_up_proj (GGUF ffn_up, gate first); the loader
  // splits them into the usual matrices (rows, per tensor-parallel shard).
  bool fused_projections = false;
  // Qwen3: q and k RMSNorm-ed per head (weights q_norm / k_norm of head_size,
  // eps rms_norm_eps) after the projections, before RoPE.
  bool qk_norm = false;
  // Sliding-window attention (Mistral, Qwen2/3 with use_sliding_window, and
  // any config with layer_types): a query at position p of a windowed layer
  // attends to the keys at (p - sliding_window, p], as Hugging Face's
  // sliding-window causal mask. 0 = none. sliding_layers[l] says whether
  // layer l is windowed; empty = every layer (when sliding_window > 0).
  int sliding_window = 0;
  std::vector<bool> sliding_layers;
  // The window of layer l (0 = the whole causal context).
  int LayerSlidingWindow(int layer) const {
    if (sliding_window <= 0) return 0;
    if (sliding_layers.empty()) return sliding_window;
    return sliding_layers[static_cast<size_t>(layer)] ? sliding_window : 0;
  }
  // Gemma 2 / 3 (Gemma Team 2024, "Gemma 2: Improving Open Language Models at
  // a Practical Size"; 2025, "Gemma 3 Technical Report"; HF modeling_gemma2 /
  // modeling_gemma3):
  // RMSNorm scales by (1 + w) with w as Hugging Face stores it: the loader
  // adds 1 to every norm weight (fp32, exactly HF's (1.0 + w.float())) when
  // this is set (HF folders); llama.cpp's converter writes 1 + w into the
  // GGUF already, so GGUF configs leave it false.
  bool norm_weight_plus_one = false;
  // Sandwich norms: the attention output and the MLP output are RMSNorm-ed
  // (HF post_attention_layernorm / post_feedforward_layernorm, GGUF
  // post_attention_norm / post_ffw_norm) before their residual adds; the MLP
  // input norm is then HF pre_feedforward_layernorm (GGUF ffn_norm).
  bool post_norms = false;
  MlpActivation mlp_activation = MlpActivation::kSilu;
  // > 0: the token embeddings are multiplied by this before the first layer
  // (Gemma: sqrt(hidden_size) rounded to the checkpoint dtype, as HF's
  // normalizer; GGUF: the fp32 sqrtf(n_embd) of llama.cpp). 0 = none.
  float embedding_scale = 0.0f;
  // > 0: tanh soft-capping, s -> cap * tanh(s / cap), of the attention scores
  // (after the scale, before the mask and softmax) and of the final logits.
  double attn_logit_softcapping = 0.0;
  double final_logit_softcapping = 0.0;
  // > 0: the attention scale is query_pre_attn_scalar^-1/2 instead of
  // head_size^-1/2 (Gemma). 0 = head_size.
  double query_pre_attn_scalar = 0.0;
  // > 0: the sliding-window layers rotate with this RoPE base and no rope
  // scaling (Gemma 3's rope_local_base_freq; HF rope_parameters
  // "sliding_attention"), the others with rope_theta and rope_scaling.
  double rope_local_theta = 0.0;
  // Whether layer l uses the local RoPE (rope_local_theta) tables.
  bool LayerLocalRope(int layer) const {
    return rope_local_theta > 0 && LayerSlidingWindow(layer) > 0;
  }
  // The softmax scale of the attention scores.
  float AttentionScale() const;

  // Mixture of experts (num_experts 0 = dense MLP of intermediate_size).
  MoeConfig moe;
  int64_t max_position_embeddings = 2048;
  int32_t bos_token_id = -1;           // -1 when unknown
  std::vector<int32_t> eos_token_ids;  // may be empty
  // The checkpoint's own precision: config.json "torch_dtype" (or "dtype",
  // its newer name), e.g. "bfloat16", "float16", "float32"; empty for GGUF
  // files and when absent. Picks the CUDA worker's --dtype auto.
  std::string checkpoint_dtype;

  // Checks positivity, upper bounds far above any real checkpoint (4096
  // layers, head size 4096, ...) and divisibility (num_heads % num_kv_heads,
  // even head_size, ...), sliding_window >= 0 and sliding_layers of num_layers
  // entries (or empty), and for a MoE 1 <= top_k <= num_experts and a
  // positive expert width. InvalidArgument naming the field otherwise.
  absl::Status Validate() const;
};

// From GGUF metadata: general.architecture ("llama", "qwen2", "qwen3",
// "qwen3moe", "qwen2moe", "gemma2", "gemma3", "phi3") and the keys
// {arch}.block_count, .embedding_length, .feed_forward_length,
// .attention.head_count, .attention.head_count_kv (default head_count),
// .attention.layer_norm_rms_epsilon, .rope.freq_base (default 10000),
// .context_length, .attention.key_length (head size, default hidden/heads),
// .rope.dimension_count (rotary_dim; below the head size for phi3 only),
// .vocab_size (else the length of tokenizer.ggml.tokens, else token_embd rows),
// .rope.scaling.{type,factor,original_context_length},
// gemma2 / gemma3 (as llama.cpp's loader reads them): .attn_logit_softcapping,
// .final_logit_softcapping, .rope.freq_base_swa (gemma3's local base,
// default 10000), the window pattern from the integer or bool
// .attention.sliding_window_pattern (default 2 for gemma2, 6 for gemma3:
// layer l is windowed when l % n < n - 1), gemma2's window defaulting to
// 4096, embeddings scaled by sqrtf(embedding_length), and the attention scale
// 1/sqrt(head_size) except llama.cpp's 27B rule (46 gemma2 / 62 gemma3
// layers: 1/sqrt(embedding_length / head_count));
// .attention.sliding_window (0 or absent = none) with
// .attention.sliding_window_pattern as a bool array of block_count entries
// (true = windowed; absent = every layer; llama.cpp's integer form, whose
// meaning depends on the architecture, is Unimplemented); tokenizer.ggml.
// bos_token_id / eos_token_id, and eot_token_id / eom_token_id also into
// eos_token_ids (each id once). tie_word_embeddings = no "output.weight" tensor.
// phi3's LongRoPE: tensors rope_factors_long / rope_factors_short.weight
// (F32, rotary_dim / 2 each) with .rope.scaling.original_context_length and
// .rope.scaling.attn_factor (default 1), the long set for context_length >
// the original one (SelectLongRopeFactors).
// A "rope_freqs.weight" tensor (F32, rotary_dim / 2 elements: llama.cpp's
// per-frequency factors, written for llama3 rope scaling) fills
// rope_scaling.freq_factors; another type or size, or a factor that is not
// finite and positive, is InvalidArgument naming the tensor.
// Mixture of experts: {arch}.expert_count > 0 with .expert_used_count (top_k)
// and .expert_feed_forward_length (default feed_forward_length, as llama.cpp's
// converter writes Mixtral); norm_topk_prob from .expert_weights_norm, else
// true for llama and qwen3moe, false for qwen2moe (as llama.cpp). qwen2moe's
// shared expert: .expert_shared_feed_forward_length and the tensors
// ffn_{gate,up,down}_shexp and ffn_gate_inp_shexp (required); shared experts
// in any other architecture (.expert_shared_count > 0 or ffn_*_shexp
// tensors) are Unimplemented.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

// From the text of a Hugging Face config.json; `source` names it in errors.
// Reads architectures[0], num_hidden_layers, hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads (default num_attention_heads),
// head_dim (optional), vocab_size, rms_norm_eps, rope_theta (default 10000),
// rope_scaling (null, or {"rope_type"|"type": "linear"|"llama3"|"longrope"|"su"|
// "default", ...}; longrope: short_factor / long_factor lists, optional factor,
// attention_factor and original_max_position_embeddings (else the config's),
// defaults as transformers' _compute_longrope_parameters, the long set for
// max_position_embeddings > the original context), partial_rotary_factor
// (Phi3ForCausalLM only: rotary_dim = int(head_dim * factor), even),
// tie_word_embeddings (default false), max_position_embeddings, bos_token_id,
// eos_token_id (int or list), torch_dtype or dtype (optional string), and
// the sliding window as transformers builds its masks: layer_types (a list of
// "full_attention" / "sliding_attention", one per layer) with sliding_window
// when present; else Mistral: sliding_window (int or null) on every layer;
// Qwen2/Qwen3: sliding_window on the layers >= max_window_layers when
// use_sliding_window is true; Gemma2/Gemma3 (model_config.h's Gemma fields):
// hidden_activation (or hidden_act; gelu_pytorch_tanh), query_pre_attn_scalar
// (default 256), attn_logit_softcapping / final_logit_softcapping (number or
// null), tie_word_embeddings (default true), sliding_window (default 4096) on
// every other layer (Gemma 2: even layers) or all but every
// sliding_window_pattern-th (Gemma 3, default 6) unless layer_types says,
// rope_local_base_freq (Gemma 3, default 10000; rope_theta default 1e6).
// Mixtral (as Mistral): num_local_experts,
// num_experts_per_tok, experts of intermediate_size, renormalised top-k.
// Qwen3-MoE (as Qwen3): num_experts (or num_local_experts),
// num_experts_per_tok, moe_intermediate_size, norm_topk_prob (default false,
// transformers'); decoder_sparse_step other than 1 or a non-empty
// mlp_only_layers (dense layers among the sparse ones) are Unimplemented,
// Qwen2-MoE (as Qwen2, qkv_bias default true): Qwen3-MoE's keys plus
// shared_expert_intermediate_size (required). Unknown architectures, rope types and layer
// types give Unimplemented; missing or mistyped fields InvalidArgument naming the field.
absl::StatusOr<ModelConfig> ModelConfigFromHfJson(std::string_view json_text,
                                                  std::string_view source);

// Adds the eos_token_id (int or list of ints) of a generation_config.json
// text to c->eos_token_ids (each id once); `source` names it in errors.
// InvalidArgument for malformed JSON or a mistyped / negative id.
absl::Status AddGenerationConfigEos(std::string_view json_text, std::string_view source,
                                    ModelConfig* c);

// Reads <dir>/config.json, and the eos_token_id of <dir>/generation_config.json
// when that file exists (AddGenerationConfigEos).
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& dir);

// The RotaryDim() / 2 rotary inverse frequencies (radians per position) of
// the config, with its rope scaling applied exactly as Hugging Face computes
// them (double precision). Dimension pair i rotates (x[i], x[i + d/2]), d =
// RotaryDim(), in the rotate_half layout. These are the global layers' (every
// layer's unless rope_local_theta > 0); their cos / sin are multiplied by
// rope_scaling.attention_factor.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);
// LongRoPE's factor set for a server whose sequences may reach max_model_len
// tokens: long when max_model_len > original_max_position_embeddings (see
// RopeScaling). A no-op for the other rope types and for max_model_len <= 0.
// The loaders choose for max_model_len = max_position_embeddings.
void SelectLongRopeFactors(int64_t max_model_len, ModelConfig* config);
// The local layers' (LayerLocalRope): base rope_local_theta, unscaled. Empty
// when rope_local_theta is 0.
std::vector<double> RopeLocalInverseFrequencies(const ModelConfig& config);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
