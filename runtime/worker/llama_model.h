// The Llama-family forward pass of one tensor-parallel rank over the paged KV
// cache (CPU backend): embedding, RMSNorm, rotary embeddings, Q/K/V projections,
// reshape_and_cache, decode (paged_attention) and prefill attention, SwiGLU MLP,
// final norm and LM head. Projections and the LM head run kernels::Linear over
// the weights in their stored formats (GGUF quantized, F16, BF16), or one
// OpenBLAS sgemm each for fp32 matrices (--dtype float32: the exact path). The
// KV cache may be fp32, fp16 or bf16: queries, keys, values and the attention
// output are converted to the cache's type around the attention kernels
// (softmax and accumulation stay fp32 inside them).
//
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): Q/K/V, gate and up are
// column-parallel (this rank holds num_heads/tp query heads, its KV heads and
// intermediate_size/tp MLP columns); o_proj and down_proj are row-parallel and
// followed by an all-reduce (sum) over the TP communicator. The token embedding
// and the LM head are replicated on every rank, so every rank computes the full
// logits; only TP rank 0 samples.
#ifndef PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_
#define PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "kernels/types.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"

namespace pagedserve {

// One step's flattened variable-length batch (host memory, no padding).
// Sequences are back to back; sequence s owns token rows
// [query_start_loc[s], query_start_loc[s+1]).
struct ForwardBatch {
  std::span<const int32_t> token_ids;        // [num_tokens]
  std::span<const int32_t> positions;        // [num_tokens], absolute positions
  std::span<const int64_t> slot_mapping;     // [num_tokens], see kernels/reshape_and_cache.h
  std::span<const int32_t> query_start_loc;  // [num_seqs + 1]
  std::span<const int32_t> seq_lens;         // [num_seqs], context incl. this step's tokens
  std::span<const int32_t> block_tables;     // [num_seqs * max_blocks_per_seq], -padded with 0
  int max_blocks_per_seq = 0;
  // Token rows whose logits are wanted (e.g. each sampled sequence's last row).
  std::span<const int32_t> logits_rows;

  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
};

class LlamaModel {
 public:
  // Takes ownership of this rank's weight shard (and of its file mapping).
  // `comm` (not owned) spans the TP group; it must outlive the model.
  // Unimplemented when a stored matrix has a type kernels::Linear does not run.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            Communicator* comm);

  const ModelConfig& config() const { return weights_.config; }
  int local_num_heads() const { return local_heads_; }
  int local_num_kv_heads() const { return local_kv_heads_; }

  // Runs the batch, writes this step's K/V into `kv_layers` (num_layers CPU
  // views, all of one dtype: fp32, fp16, bf16 or fp8 e4m3/e5m2) and fp32 logits [logits_rows.size(), vocab_size] row-major into `logits`.
  // Errors: InvalidArgument for inconsistent batch spans or a token id outside
  // the vocabulary; kernel validation errors (bad block ids, lengths) pass
  // through; nothing is written to `logits` on error.
  absl::Status Forward(const ForwardBatch& batch, std::span<const kernels::KVCacheView> kv_layers,
                       std::vector<float>* logits);

 private:
  LlamaModel(LlamaWeights weights, Communicator* comm);

  absl::Status ValidateBatch(const ForwardBatch& b, size_t num_kv_layers) const;

  LlamaWeights weights_;
  Communicator* comm_;
  int local_heads_ = 0;
  int local_kv_heads_ = 0;
  int local_intermediate_ = 0;
  std::vector<double> inv_freq_;
  // Scratch buffers reused across steps (grown, never shrunk).
  std::vector<float> x_, h_, q_, k_, v_, attn_, o_, gate_, up_, cos_, sin_, rows_, normed_;
  std::vector<uint16_t> q16_, k16_, v16_, attn16_;  // attention operands for a 16-bit cache
  std::vector<int32_t> prefill_qsl_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_
