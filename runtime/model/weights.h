// Llama-family weights of one tensor-parallel rank, in fp32 or in their stored
// formats (WeightDType).
//
// Orientation: every matrix is row-major [out_features, in_features], exactly
// as nn.Linear.weight in Hugging Face and as GGUF stores it (ggml ne0 = in).
// y = x W^T is therefore one BLAS call per projection:
//   cblas_sgemm(RowMajor, NoTrans, Trans, tokens, W.rows, W.cols,
//               1, x, W.cols, W.data, W.cols, 0, y, W.rows).
//
// Q/K layout: after loading, Q and K rows are in Hugging Face order (apply
// RoPE with rotate_half: pair (i, i + head_size/2) within each head). GGUF files
// of arch "llama" store Q and K rows permuted by llama.cpp's converter
// (convert_hf_to_gguf.py LlamaModel.permute: within each head, row
// a * head_size/2 + b of HF is stored at row 2b + a, the interleaved-pair layout
// of ggml's normal RoPE); the loader undoes that permutation (checked against
// transformers' GGUF reader). qwen2 GGUF files are not permuted.
//
// Tensor parallelism (Megatron-LM style; Shoeybi et al. 2019), rank r of T:
//   query heads   [r*H/T, (r+1)*H/T)                         (H % T == 0)
//   KV heads      T <= KV: [r*KV/T, (r+1)*KV/T)               (KV % T == 0)
//                 T >  KV: the one KV head its query heads use (T % KV == 0),
//                          replicated on T/KV ranks
//   column-parallel (output rows split): q_proj, k_proj, v_proj (+ biases),
//                   gate_proj, up_proj  (intermediate rows [r*I/T, (r+1)*I/T))
//   row-parallel (input columns split): o_proj (columns of the local query
//                   heads), down_proj (columns of the local intermediate slice);
//                   the partial outputs of all ranks must be summed (all-reduce)
//   mixture of experts: every expert sharded as the dense MLP is, over its own
//                   width: rank r holds rows [r*Ie/T, (r+1)*Ie/T) of each
//                   expert's gate/up and those columns of its down (Ie =
//                   expert_intermediate_size, Ie % T == 0), so that every rank
//                   runs every expert on its slice and one all-reduce sums
//                   the weighted expert outputs; the router is replicated
//                   (every rank routes the same tokens the same way). A
//                   shared expert (Qwen2-MoE) is sharded as the dense MLP over
//                   its width Is (Is % T == 0); its gate vector is replicated.
//   replicated: embed_tokens, lm_head, all RMSNorm weights. The embedding and the
//   LM head are replicated (not vocab-parallel) so that every rank can embed
//   tokens and rank 0 can sample without an extra gather; they are small next to
//   the layers for the models served here.
#ifndef PAGEDSERVE_RUNTIME_MODEL_WEIGHTS_H_
#define PAGEDSERVE_RUNTIME_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"

namespace pagedserve {

// Precision the weight matrices are held in (--dtype).
//   kAuto:     each matrix in its stored format (GGUF F32/F16/BF16/Q4_0/Q4_1/
//              Q5_0/Q5_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS;
//              safetensors F32/F16/BF16), memory-mapped where the rows are
//              used as stored. Other GGUF types (the other IQ types, TQ1_0,
//              TQ2_0, MXFP4, ...) are refused at load with an error naming the
//              tensor and its type; nothing is expanded to fp32 silently.
//   kFloat32:  every matrix dequantized to fp32 at load (Matrix::data).
//   kFloat16 / kBFloat16: every matrix converted to fp16 / bf16 at load (round
//              to nearest even); a stored matrix already in that type is mapped.
// RMSNorm weights and biases are always fp32.
enum class WeightDType : uint8_t { kAuto, kFloat32, kFloat16, kBFloat16 };

// "auto", "float32", "float16", "bfloat16".
const char* WeightDTypeName(WeightDType d);
// Inverse of WeightDTypeName; InvalidArgument listing the choices otherwise.
absl::StatusOr<WeightDType> ParseWeightDType(std::string_view name);

// Row-major matrix [rows, cols], held either as fp32 values (`data`, the
// float32 path) or as rows in a stored format (`type`, bytes()): row r is
// row_bytes bytes at bytes() + r * row_bytes, laid out in ggml blocks of `type`
// (F32/F16/BF16 are plain little-endian elements). Exactly one of the two is
// set for a non-empty matrix. Stored bytes point either into `owned` or into a
// file mapping owned by the LlamaWeights the matrix belongs to (`mapped`): such
// a matrix must not outlive its LlamaWeights. Copies and moves are safe (bytes()
// follows `owned`).
struct Matrix {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<float> data;  // rows * cols fp32 values, or empty when stored

  GgmlType type = GgmlType::kF32;   // stored format (meaningful when data is empty)
  uint64_t row_bytes = 0;           // bytes of one stored row
  const uint8_t* mapped = nullptr;  // stored rows inside a file mapping, or null
  std::vector<uint8_t> owned;       // stored rows copied (permuted, sliced, converted)

  bool empty() const { return data.empty() && bytes() == nullptr; }
  bool is_fp32() const { return !data.empty(); }  // the float32 representation
  const uint8_t* bytes() const { return owned.empty() ? mapped : owned.data(); }
  // fp32 rows (is_fp32() only).
  float* row(int64_t r) { return data.data() + r * cols; }
  const float* row(int64_t r) const { return data.data() + r * cols; }
  // Row r in fp32 into dst[cols], from either representation. r must be in
  // [0, rows). Errors of DequantizeRow (corrupt type) pass through.
  absl::Status RowToFloat(int64_t r, float* dst) const;
  // Bytes held in memory or mapped: fp32 values or stored rows.
  uint64_t size_bytes() const;
};

// Which part of the model a tensor-parallel rank holds (see the header comment).
struct ShardLayout {
  int tp_rank = 0;
  int tp_size = 1;
  int num_heads = 0;          // local query heads
  int first_head = 0;         // global index of local query head 0
  int num_kv_heads = 0;       // local KV heads
  int first_kv_head = 0;      // global index of local KV head 0
  int intermediate_size = 0;  // local MLP width
  int first_intermediate = 0;
  int expert_intermediate_size = 0;  // local width of each expert (MoE; else 0)
  int first_expert_intermediate = 0;
  int shared_expert_intermediate_size = 0;  // local width of the shared expert (else 0)
  int first_shared_expert_intermediate = 0;
};

// InvalidArgument (naming the counts) when tp_size does not divide the heads,
// the MLP or the experts' width as required above, or tp_rank is outside [0, tp_size).
absl::StatusOr<ShardLayout> ComputeShardLayout(const ModelConfig& config, int tp_rank, int tp_size);

// One decoder layer's local shard. D = head_size, h = hidden_size,
// Hl/KVl/Il = local query heads / KV heads / intermediate (ShardLayout).
struct LayerWeights {
  std::vector<float> input_layernorm;         // [h]  RMSNorm before attention
  Matrix q_proj;                              // [Hl*D, h]
  Matrix k_proj;                              // [KVl*D, h]
  Matrix v_proj;                              // [KVl*D, h]
  std::vector<float> q_bias, k_bias, v_bias;  // [Hl*D], [KVl*D], [KVl*D]; empty unless qkv_bias
  std::vector<float> q_norm, k_norm;          // [D] each (replicated); empty unless qk_norm
  Matrix o_proj;                              // [h, Hl*D]  (row-parallel)
  // [h]  RMSNorm before the MLP (HF Llama post_attention_layernorm; Gemma:
  // pre_feedforward_layernorm)
  std::vector<float> post_attention_layernorm;
  // [h] each; empty unless config.post_norms (Gemma): the RMSNorm of the
  // attention output (HF post_attention_layernorm) and of the MLP output
  // (post_feedforward_layernorm) before their residual adds. Every norm
  // weight holds the factor applied ((1 + w) already for Gemma).
  std::vector<float> attn_post_norm, mlp_post_norm;
  Matrix gate_proj;  // [Il, h]   (dense MLP; empty for a MoE)
  Matrix up_proj;    // [Il, h]
  Matrix down_proj;  // [h, Il]   (row-parallel)
  // Mixture of experts (config.moe.enabled(); else empty). E = num_experts,
  // Iel = the local expert width (ShardLayout::expert_intermediate_size).
  // From a GGUF file each expert's matrix is its slice of the 3-D
  // ffn_{gate,up,down}_exps tensor (the same stored format and mapping).
  Matrix router;                               // [E, h] replicated
  std::vector<Matrix> expert_gate, expert_up;  // E x [Iel, h]
  std::vector<Matrix> expert_down;             // E x [h, Iel] (row-parallel)
  // Qwen2-MoE's shared expert (config.moe.shared_expert_intermediate_size >
  // 0; else empty), Isl = its local width: HF mlp.shared_expert.* and
  // mlp.shared_expert_gate, GGUF ffn_{gate,up,down}_shexp and
  // ffn_gate_inp_shexp (1-D [h] there).
  Matrix shared_gate, shared_up;  // [Isl, h]
  Matrix shared_down;             // [h, Isl] (row-parallel)
  Matrix shared_expert_gate;      // [1, h] replicated
};

struct LlamaWeights {
  WeightDType dtype = WeightDType::kFloat32;  // how the matrices are held
  // Keeps the model file(s) mapped while matrices point into them
  // (Matrix::mapped); null when none does.
  std::shared_ptr<const void> mapping;
  // Drops the resident pages of bytes [p, p + bytes) of the mapping once a
  // backend holds a copy of its own (e.g. the CPU backend's interleaved Q4_0,
  // kernels/linear.h InterleaveRows8), so that the model is not resident
  // twice (MappedFile::DropResident: whole pages inside the range only, and a
  // no-op outside the mapping or for heap-backed files). Null when nothing is
  // mapped; the bytes must not be read through `mapped` afterwards (they
  // would be read from the file again). Thread-safe.
  std::function<void(const uint8_t* p, uint64_t bytes)> drop_resident;
  ModelConfig config;  // full-model description (global head counts)
  ShardLayout shard;
  Matrix embed_tokens;            // [vocab, h], replicated
  Matrix lm_head;                 // [vocab, h]; empty when config.tie_word_embeddings
  std::vector<float> final_norm;  // [h]
  std::vector<LayerWeights> layers;

  // The LM head matrix: lm_head, or embed_tokens when tied.
  const Matrix& output_embeddings() const { return lm_head.empty() ? embed_tokens : lm_head; }
};

// The model description of `path`: a .gguf file (ModelConfigFromGguf) or a
// Hugging Face directory (LoadHfConfig).
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// Loads the weights of rank tp_rank of tp_size from a .gguf file (any type
// dequant.h accepts) or a Hugging Face directory (safetensors F32/F16/BF16,
// single or sharded), holding the matrices as `dtype` says. Experts: HF
// per-expert tensors (Mixtral block_sparse_moe.{gate, experts.E.w1/w3/w2},
// Qwen3-MoE mlp.{gate, experts.E.gate_proj/up_proj/down_proj}); GGUF
// ffn_gate_inp and the 3-D ffn_gate_exps / ffn_up_exps / ffn_down_exps
// (ggml ne [in, out, E]). Only the rank's
// rows/columns are read. Errors name the file and tensor (missing tensor, wrong
// shape, unsupported type).
//
// Stored formats (kAuto, and kFloat16/kBFloat16 for tensors already in that
// type): a row slice of a row-major matrix is a contiguous byte range and is
// used in place from the mapping (column-parallel q/k/v/gate/up, and every
// matrix at tp_size 1). Copied into `owned` instead: Q/K rows of a permuted
// GGUF (the permutation moves whole rows, so quantized rows move as byte
// blocks), column slices of the row-parallel o_proj/down_proj (each row's
// sub-range; the slice bounds must fall on block boundaries, e.g. multiples of
// 256 for K-quants; a slice that does not is dequantized to fp32 instead), and
// rows whose mapped address is not aligned to their element size (F32/F16/BF16
// in a safetensors file whose header length is not a multiple of 4).
//
// Progress: `progress` (may be empty) is called on the calling thread after the
// embeddings and head, and after each layer, with the stored bytes of the
// tensors read so far (whole tensors, also when this rank reads a shard of
// one) and the total bytes of tensor data in the file(s); a last call reports
// total / total (tensors the model does not use, e.g. GGUF rope_freqs, count
// as loaded then). Not called when loading fails. Memory-mapped stored-format
// tensors count when their view is made: the pages are read by the first use.
using LoadProgressFn = std::function<void(uint64_t loaded_bytes, uint64_t total_bytes)>;
absl::StatusOr<LlamaWeights> LoadLlamaWeights(const std::string& path, int tp_rank = 0,
                                              int tp_size = 1,
                                              WeightDType dtype = WeightDType::kFloat32,
                                              const LoadProgressFn& progress = {});

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_WEIGHTS_H_
