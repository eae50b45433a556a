// The Llama-family forward pass of one tensor-parallel rank over the paged KV
// cache, written once over a ModelBackend (runtime/worker/model_backend.h):
// embedding, RMSNorm (fused with the residual add), rotary embeddings, Q/K/V
// projections, attention over the paged cache (reshape_and_cache, decode
// paged_attention and prefill attention), SwiGLU MLP, final norm and LM head
// on the rows whose logits are wanted. The backend decides where and in which
// format this runs (CpuBackend: stored-format weights, fp32/fp16/bf16 KV;
// the CUDA backend: fp32 weights and KV in device memory).
//
// One step: validate the batch, build the ForwardPlan once (decode/prefill
// split, prefill query_start_loc, max lengths, rotary tables), hand it to the
// backend (BeginStep), then run the layer loop:
//   h = norm(x)                                  (AddRmsNorm, no add)
//   (Gemma: x = embedding * embedding_scale)
//   per layer: q,k,v = h W_qkv (+b); (Qwen3, Gemma 3: q, k = per-head
//              RMSNorm(q, k)); RoPE(q, k) (Gemma 3's local layers: their own
//              tables); attn = Attention(q, k, v) (within the layer's
//              sliding window, ModelConfig::LayerSlidingWindow; Gemma 2:
//              scores soft-capped)
//              o = attn W_o; all-reduce(o); h = norm(x += o) (Gemma:
//              x += post_norm(o))
//              o = act(h W_gate) * (h W_up) W_down (SiLU; Gemma: tanh GELU),
//                  or for a mixture of experts (ModelConfig::moe) the routed
//                  experts' weighted sum (ModelBackend::MoeMlp); all-reduce(o)
//              h = norm_next(x += o)  (Gemma: x += post_norm(o); the last
//              layer: final norm of the logits rows only, gathered)
//   logits = h W_lm_head (Gemma 2: soft-capped by the backend's LmHead,
//            ForwardPlan::final_logit_softcap)
//
// Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): Q/K/V, gate and up are
// column-parallel (this rank holds num_heads/tp query heads, its KV heads and
// intermediate_size/tp MLP columns); o_proj and down_proj are row-parallel and
// followed by an all-reduce (sum) over the TP communicator. Experts are
// sharded as the dense MLP: each rank holds a slice of every expert's width
// (weights.h), routes every token itself (replicated router) and the one
// all-reduce after MoeMlp sums the slices. The token embedding
// and the LM head are replicated on every rank, so every rank computes the full
// logits; only TP rank 0 samples.
#ifndef PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_
#define PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "kernels/types.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"
#include "runtime/worker/decode_graph.h"
#include "runtime/worker/model_backend.h"

namespace pagedserve {

class LlamaModel {
 public:
  // Hands this rank's weight shard (and its file mapping) to `backend`, which
  // the model owns. `comm` (not owned) spans the TP group; it must outlive the
  // model. Errors: InvalidArgument for a shard/communicator mismatch or a
  // layer count that differs from the config, Unimplemented for a head size
  // the attention kernels do not support, and the backend's LoadWeights
  // errors (e.g. Unimplemented for a stored type the CPU linear kernels do
  // not run, ResourceExhausted when device memory is short).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            Communicator* comm,
                                                            std::unique_ptr<ModelBackend> backend);
  // The same over the CPU backend (MakeCpuBackend(comm)).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            Communicator* comm);

  const ModelConfig& config() const { return config_; }
  int local_num_heads() const { return shard_.num_heads; }
  int local_num_kv_heads() const { return shard_.num_kv_heads; }
  ModelBackend& backend() { return *backend_; }
  const ModelBackend& backend() const { return *backend_; }

  // The backend's pools (ModelBackend::AllocateCaches).
  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                              int64_t num_cpu_blocks) {
    return backend_->AllocateCaches(shape, num_device_blocks, num_cpu_blocks);
  }
  std::span<const kernels::KVCacheView> device_cache() const { return backend_->device_cache(); }
  std::span<const kernels::KVCacheView> cpu_cache() const { return backend_->cpu_cache(); }

  // Which decode steps run padded to a captured shape when the backend
  // replays captured bodies (ModelBackend::SupportsBodyGraphs; CUDA graphs):
  // runtime/worker/decode_graph.h. Default: DecodeGraphOptions{} (on, batches
  // up to 256, contexts up to 8192). Not thread-safe; between steps.
  void set_graph_options(const DecodeGraphOptions& options) { graph_options_ = options; }
  const DecodeGraphOptions& graph_options() const { return graph_options_; }

  // Runs the batch, writes this step's K/V into `kv_layers` (num_layers views
  // the backend accepts: views of fp32, fp16, bf16 or fp8 (e4m3/e5m2), kCPU on
  // the CPU backend, kCUDA on the CUDA one) and fp32 logits [logits_rows.size(),
  // vocab_size] row-major (host) into `logits`.
  // Errors: InvalidArgument for inconsistent batch spans, a token id outside
  // the vocabulary, a slot outside the pool or a cache view the backend does
  // not take; kernel validation errors (bad block ids, lengths) and backend
  // errors pass through; nothing is written to `logits` on error.
  absl::Status Forward(const ForwardBatch& batch, std::span<const kernels::KVCacheView> kv_layers,
                       std::vector<float>* logits);

  // The same step, with rows reduced to tokens by the backend
  // (ModelBackend::LmHeadSample): `rows` has one entry per logits row;
  // *out holds each row's draws (-1 for a row not reduced) with their
  // logprobs when asked (SampledRows), and `logits`,
  // compacted in row order, the rows not reduced. Errors as above, plus
  // InvalidArgument when rows.size() != logits_rows.size().
  absl::Status Forward(const ForwardBatch& batch, std::span<const kernels::KVCacheView> kv_layers,
                       std::span<const RowSampling> rows, SampledRows* out,
                       std::vector<float>* logits);

 private:
  LlamaModel(const LlamaWeights& weights, std::unique_ptr<ModelBackend> backend);

  absl::Status ValidateBatch(const ForwardBatch& b,
                             std::span<const kernels::KVCacheView> kv_layers) const;
  // The plan of `b`; with `graph`, of a batch padded to it (all decode).
  void BuildPlan(const ForwardBatch& b, const std::optional<DecodeGraphKey>& graph);
  // Everything up to the LM head; *normed = the final-norm rows, the
  // caller's logits rows first (a padded step has more after them).
  absl::Status RunLayers(const ForwardBatch& b, std::span<const kernels::KVCacheView> kv_layers,
                         GemmInput* normed);
  // The step's activation buffers (ModelBackend::Buffer).
  struct StepBuffers {
    float *x, *q, *k, *v, *gate, *up;  // fp32
    GemmInput h, attn, act, normed;    // the GEMM inputs
    PartialSums o;                     // o_proj / down_proj output
  };
  // The body (ModelBackend::BeginBody): embedding, the layers and the final
  // norm of the r logits rows, over the plan's n tokens.
  absl::Status RunBody(int64_t n, int64_t r, const StepBuffers& buf,
                       std::span<const kernels::KVCacheView> kv_layers);
  // x += o, then h = RMSNorm(x) * next_norm; with config.post_norms (Gemma)
  // o is RMSNorm-ed by post_norm before the add (AddPostRmsNorm).
  absl::Status AddResidualAndNorm(float* x, PartialSums o, int64_t n,
                                  const BackendVector& post_norm, const BackendVector& next_norm,
                                  GemmInput h);

  ModelConfig config_;
  ShardLayout shard_;
  std::unique_ptr<ModelBackend> backend_;
  BackendWeights w_;
  std::vector<double> inv_freq_;
  std::vector<double> inv_freq_local_;  // empty unless config.rope_local_theta > 0
  ForwardPlan plan_;                    // this step's (reused: its vectors keep their capacity)
  DecodeGraphOptions graph_options_;
  PaddedDecodeBatch padded_;  // this step's batch padded to its graph key
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_LLAMA_MODEL_H_
