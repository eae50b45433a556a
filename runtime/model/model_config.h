// The architecture description of a Llama-family decoder-only model, read
// from GGUF metadata (llama.* / qwen2.* / qwen3.* keys) or a Hugging Face
// config.json.
//
// Field names follow Hugging Face's LlamaConfig. Supported: LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM (bias on Q/K/V), Qwen3ForCausalLM
// (per-head RMSNorm of q and k before RoPE, no bias, explicit head_dim) and
// GGUF general.architecture "llama" (which llama.cpp also uses for Mistral),
// "qwen2" and "qwen3". All of them: RMSNorm, rotary embeddings (HF rotate_half
// layout after loading, see weights.h), grouped-query attention, SwiGLU MLP.
#ifndef PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
#define PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedserve {

class GgufFile;

enum class ModelArch { kLlama, kMistral, kQwen2, kQwen3 };
// "llama", "mistral", "qwen2", "qwen3".
std::string ModelArchName(ModelArch arch);

// rope_scaling of Hugging Face (transformers' modeling_rope_utils):
//   kNone:   inv_freq[i] = rope_theta^(-2i/head_size)
//   kLinear: positions divided by `factor` (equivalently inv_freq / factor)
//   kLlama3: Llama 3.1 frequency-dependent scaling with factor,
//            low_freq_factor, high_freq_factor and
//            original_max_position_embeddings (RopeInverseFrequencies below).
// and, independently of the type, llama.cpp's per-frequency factors (GGUF
// tensor "rope_freqs.weight", head_size / 2 floats): inv_freq[i] is divided by
// freq_factors[i] after the type's scaling, as ggml's rope does
// (ggml-cpu ops.cpp ggml_rope_cache_init: theta_extrap = theta_base / ff[i];
// then freq_scale multiplies). llama.cpp's convert_hf_to_gguf.py writes them
// for rope_type llama3 (factor 1 for high, `factor` for low frequencies,
// 1 / ((1 - smooth) / factor + smooth) in between), so that a Llama 3.x GGUF
// has the rotary frequencies of its Hugging Face llama3 rope_scaling.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  std::vector<float> freq_factors;  // empty, or head_size / 2 positive divisors
};

struct ModelConfig {
  ModelArch arch = ModelArch::kLlama;
  int num_layers = 0;         // num_hidden_layers / {arch}.block_count
  int hidden_size = 0;        // hidden_size / {arch}.embedding_length
  int intermediate_size = 0;  // MLP width / {arch}.feed_forward_length
  int num_heads = 0;          // query heads
  int num_kv_heads = 0;       // key/value heads (GQA); divides num_heads
  int head_size = 0;          // hidden_size / num_heads unless set (head_dim)
  int vocab_size = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  // LM head = token embedding matrix
  bool qkv_bias = false;             // true for Qwen2
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
  int64_t max_position_embeddings = 2048;
  int32_t bos_token_id = -1;           // -1 when unknown
  std::vector<int32_t> eos_token_ids;  // may be empty
  // The checkpoint's own precision: config.json "torch_dtype" (or "dtype",
  // its newer name), e.g. "bfloat16", "float16", "float32"; empty for GGUF
  // files and when absent. Picks the CUDA worker's --dtype auto.
  std::string checkpoint_dtype;

  // Checks positivity and divisibility (num_heads % num_kv_heads, even
  // head_size, ...), sliding_window >= 0 and sliding_layers of num_layers
  // entries (or empty). InvalidArgument naming the field otherwise.
  absl::Status Validate() const;
};

// From GGUF metadata: general.architecture ("llama", "qwen2" or "qwen3") and the keys
// {arch}.block_count, .embedding_length, .feed_forward_length,
// .attention.head_count, .attention.head_count_kv (default head_count),
// .attention.layer_norm_rms_epsilon, .rope.freq_base (default 10000),
// .context_length, .rope.dimension_count (head size, default hidden/heads),
// .vocab_size (else the length of tokenizer.ggml.tokens, else token_embd rows),
// .rope.scaling.{type,factor,original_context_length},
// .attention.sliding_window (0 or absent = none) with
// .attention.sliding_window_pattern as a bool array of block_count entries
// (true = windowed; absent = every layer; llama.cpp's integer form, whose
// meaning depends on the architecture, is Unimplemented); tokenizer.ggml.
// bos_token_id / eos_token_id, and eot_token_id / eom_token_id also into
// eos_token_ids (each id once). tie_word_embeddings = no "output.weight" tensor.
// A "rope_freqs.weight" tensor (F32, head_size / 2 elements: llama.cpp's
// per-frequency factors, written for llama3 rope scaling) fills
// rope_scaling.freq_factors; another type or size, or a factor that is not
// finite and positive, is InvalidArgument naming the tensor.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& gguf);

// From the text of a Hugging Face config.json; `source` names it in errors.
// Reads architectures[0], num_hidden_layers, hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads (default num_attention_heads),
// head_dim (optional), vocab_size, rms_norm_eps, rope_theta (default 10000),
// rope_scaling (null, or {"rope_type"|"type": "linear"|"llama3"|"default", ...}),
// tie_word_embeddings (default false), max_position_embeddings, bos_token_id,
// eos_token_id (int or list), torch_dtype or dtype (optional string), and
// the sliding window as transformers builds its masks: layer_types (a list of
// "full_attention" / "sliding_attention", one per layer) with sliding_window
// when present; else Mistral: sliding_window (int or null) on every layer;
// Qwen2/Qwen3: sliding_window on the layers >= max_window_layers when
// use_sliding_window is true. Unknown architectures, rope types and layer
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

// The head_size / 2 rotary inverse frequencies (radians per position) of the
// config, with its rope scaling applied exactly as Hugging Face computes them
// (double precision). Dimension pair i rotates (x[i], x[i + head_size/2]) in
// the rotate_half layout.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_MODEL_CONFIG_H_
