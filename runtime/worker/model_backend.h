// The seam between the one Llama forward pass (runtime/worker/llama_model.h)
// and the hardware it runs on. The forward pass owns the model logic: batch
// validation, the decode/prefill split, the layer loop, the tensor-parallel
// all-reduce calls and the logits rows. A ModelBackend owns memory and
// arithmetic: weights in the form it runs them, activation buffers, the KV and
// swap pools, and the operations below. Backends: CpuBackend
// (runtime/worker/cpu_backend.h) and the CUDA backend
// (runtime/worker/cuda/cuda_backend.h). The split follows llama.cpp's graph
// over ggml backends and FlashInfer's plan/run split: the per-step metadata is
// computed once on the host (ForwardPlan) and handed to the backend once per
// step (BeginStep), never per layer.
//
// Conventions for every operation:
//   - Pointers named y, residual, q, k, v, gate, up are fp32
//     activation buffers from Buffer() (backend memory: host for the CPU,
//     device for CUDA), row-major, one row per token. The activations that
//     feed a GEMM (the normed rows, the attention output, the SwiGLU product,
//     the logits rows) are GemmInput buffers from GemmInputBuffer(), in the
//     element type the backend chooses (gemm_input_type(): fp32 on the CPU,
//     the weights' 16-bit type on CUDA, as vLLM runs activations in the model
//     dtype), written by the operation before the GEMM in that type so that
//     no conversion runs between them. The forward pass only hands them on.
//     Likewise the row-parallel outputs (o_proj, down_proj) that the
//     tensor-parallel group sums are PartialSums, in partial_sum_type():
//     fp32, except on CUDA with more than one rank and 16-bit weights, where
//     the GEMM writes them in the weights' type, the all-reduce payload (as
//     vLLM all-reduces in the model dtype), and the add + norm reads them so.
//   - Operations run in order on the backend's one stream; a pointer may be
//     passed to the next operation at once. Results reach the host only
//     through LmHead (which waits for the step).
//   - Errors are absl::Status: InvalidArgument for arguments the contract
//     rules out, kernel validation errors pass through, Internal for device
//     runtime errors, ResourceExhausted for allocations. After an error the
//     step is abandoned; the backend stays usable for the next BeginStep.
//   - Not thread-safe: one forward pass at a time per backend.
#ifndef PAGEDSERVE_RUNTIME_WORKER_MODEL_BACKEND_H_
#define PAGEDSERVE_RUNTIME_WORKER_MODEL_BACKEND_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/types.h"
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
  // The row stride of block_tables: at least every sequence's block count
  // (the worker rounds it up to a multiple of 16, so that it changes
  // rarely; a device backend re-uploads the whole table when it changes).
  int max_blocks_per_seq = 0;
  // Token rows whose logits are wanted (e.g. each sampled sequence's last row).
  std::span<const int32_t> logits_rows;

  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  int num_tokens() const { return static_cast<int>(token_ids.size()); }
};

// The padded shape of a decode step a backend may capture and replay
// (ForwardPlan::graph; runtime/worker/decode_graph.h chooses it).
struct DecodeGraphKey {
  int batch = 0;    // sequences (= tokens = logits rows) after padding
  int context = 0;  // the attention's max_seq_len; a multiple of the block size
  bool operator==(const DecodeGraphKey&) const = default;
};

// The per-step metadata, computed once on the host by the forward pass
// (LlamaModel) from a validated ForwardBatch and consumed by the backend
// (BeginStep). Host memory; `batch` must outlive the step.
struct ForwardPlan {
  const ForwardBatch* batch = nullptr;
  int64_t num_tokens = 0;
  int num_seqs = 0;
  // The batch split: the leading run of single-token sequences with cached
  // context (seq_len > 1) runs decode attention (paged_attention), sequences
  // [num_decode, num_seqs) run prefill attention over token rows
  // [prefill_row0, num_tokens).
  int num_decode = 0;
  int max_decode_len = 0;  // max seq_len over the decode sequences
  int num_prefill = 0;
  int prefill_row0 = 0;
  int max_prefill_query_len = 0;
  int max_prefill_len = 0;  // max seq_len over the prefill sequences
  // [num_prefill + 1] query_start_loc of the prefill part, relative to
  // prefill_row0; empty when num_prefill == 0.
  std::vector<int32_t> prefill_query_start_loc;
  // Rotary tables [num_tokens, rope_half]: (float)(a * cos/sin(position *
  // inv_freq[i])), angle in double (RopeInverseFrequencies), a the config's
  // rope_scaling.attention_factor (1 but for LongRoPE). rope_half =
  // ModelConfig::RotaryDim() / 2.
  int rope_half = 0;
  std::vector<float> rope_cos, rope_sin;
  // The same for the local layers (LayerAttention::local_rope; Gemma 3's
  // rope_local_theta, RopeLocalInverseFrequencies); empty when the config
  // has no local RoPE.
  std::vector<float> rope_cos_local, rope_sin_local;
  float attention_scale = 0.0f;  // ModelConfig::AttentionScale (1 / sqrt(head_size))
  // The soft cap of the logits LmHead and LmHeadSample return
  // (ModelConfig::final_logit_softcapping, Gemma 2; 0 = none): see
  // SoftcapLogit.
  double final_logit_softcap = 0.0;
  // Set for a decode step padded to a captured shape (only when the backend
  // SupportsBodyGraphs): the batch is padded to graph->batch sequences, all
  // decode (num_decode == num_seqs, padded ones with seq_len 1), and
  // max_decode_len == graph->context.
  std::optional<DecodeGraphKey> graph;
};

// A weight as the backend holds it. `handle` is backend-private (CPU: the
// host Matrix in its stored format; CUDA: a device copy in fp32, fp16 or
// bf16, --dtype); rows/cols are
// the logical shape [out_features, in_features].
struct BackendMatrix {
  const void* handle = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};
// A vector of fp32 values in backend memory (norm weights, biases); data is
// null (size 0) for an absent bias.
struct BackendVector {
  const float* data = nullptr;
  int64_t size = 0;
};
// What one layer's attention needs beyond the plan (the layer loop passes its
// layer's): the sliding window (ModelConfig::LayerSlidingWindow) -- the
// kernels' sliding_window, 0 = the whole causal context; the scores'
// soft cap (ModelConfig::attn_logit_softcapping, the kernels'
// logit_softcap, 0 = none); whether RoPE uses the plan's local tables
// (ModelConfig::LayerLocalRope).
struct LayerAttention {
  int sliding_window = 0;
  float logit_softcap = 0.0f;
  bool local_rope = false;
};

// One layer's experts (LayerWeights::router / expert_*): the replicated
// router [num_experts, hidden] and per expert this rank's slice of its gate
// and up [Iel, hidden] and down [hidden, Iel]. Empty for a dense layer.
// Qwen2-MoE's shared expert (LayerWeights::shared_*): this rank's slice of
// its gate / up [Isl, hidden] and down [hidden, Isl], and the replicated
// gate vector shared_expert_gate [1, hidden]; null handles without one.
struct BackendExperts {
  BackendMatrix router;
  std::vector<BackendMatrix> gate, up, down;
  BackendMatrix shared_gate, shared_up, shared_down, shared_expert_gate;
  bool empty() const { return gate.empty(); }
  bool has_shared() const { return shared_gate.handle != nullptr; }
  // InvalidArgument (naming the counts) unless there are moe.num_experts
  // experts and a router of that many rows: what every MoeMlp checks first.
  absl::Status CheckAgainst(const MoeConfig& moe) const;
};

struct BackendLayer {
  BackendVector input_layernorm, post_attention_layernorm;
  BackendMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  BackendVector q_bias, k_bias, v_bias;
  BackendVector q_norm, k_norm;  // [head_size] each; null unless the config has qk_norm
  // [hidden] each; null unless the config has post_norms (Gemma): the norms
  // of the attention and MLP outputs (LayerWeights::attn_post_norm, ...).
  BackendVector attn_post_norm, mlp_post_norm;
  BackendExperts experts;  // a MoE layer's (then gate/up/down_proj are empty)
};
// One output of ModelBackend::LinearGroup: y = x w^T (+ bias).
struct LinearOut {
  BackendMatrix w;
  BackendVector bias;
  float* y = nullptr;
};
// All weights of one rank's shard, valid as long as the backend.
struct BackendWeights {
  BackendMatrix embed_tokens;
  BackendMatrix lm_head;  // the embedding again when tied
  BackendVector final_norm;
  std::vector<BackendLayer> layers;
};

// The activation buffers the forward pass asks for (one allocation each,
// reused across steps: grown, never shrunk). fp32 ones come from Buffer(),
// GEMM inputs (gemm_input_type() elements) from GemmInputBuffer().
enum class BufferId {
  kResidual,     // fp32 [n, hidden] the residual stream
  kNormed,       // GEMM input [n, hidden] RMSNorm output
  kQuery,        // fp32 [n, q_dim]
  kKey,          // fp32 [n, kv_dim]
  kValue,        // fp32 [n, kv_dim]
  kAttention,    // GEMM input [n, q_dim] attention output
  kProjection,   // partial sums [n, hidden] o_proj / down_proj output (all-reduced)
  kGate,         // fp32 [n, intermediate]
  kUp,           // fp32 [n, intermediate]
  kActivated,    // GEMM input [n, intermediate] silu(gate) * up
  kLogitsInput,  // GEMM input [logits_rows, hidden] final-norm output of the logits rows
  kCount
};

// True for the ids GemmInputBuffer() serves (kNormed, kAttention,
// kActivated, kLogitsInput).
bool IsGemmInput(BufferId id);
// True for the ids Buffer() serves: neither a GEMM input nor kProjection
// (PartialSumBuffer()).
bool IsFp32Buffer(BufferId id);

// The element type of GEMM-input activations and of partial sums
// (ModelBackend::gemm_input_type, partial_sum_type).
enum class ActivationType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// A GEMM-input activation buffer from GemmInputBuffer(): row-major, one row
// per token, elements of the backend's gemm_input_type(). A distinct type so
// that an fp32 buffer cannot be passed where one is expected, or back.
struct GemmInput {
  void* data = nullptr;
};

// The kProjection buffer from PartialSumBuffer(): a row-parallel layer's
// output [n, hidden], this rank's partial sums until AllReduceSum, in the
// backend's partial_sum_type(). data is null for "none" (AddRmsNorm's add).
struct PartialSums {
  void* data = nullptr;
};

// How ModelBackend::LmHeadSample may reduce one logits row to tokens.
struct RowSampling {
  enum class Mode : uint8_t {
    kLogits,  // return the row's logits (the host sampler takes it)
    kGreedy,  // the argmax (a greedy row without penalties or logprobs)
    kSample,  // the sampler's steps 1-7 (and its raw logprobs): any row without beams
  };
  Mode mode = Mode::kLogits;
  // kSample: the row's SamplingParams (valid, SamplingParams::Validate;
  // temperature < 1e-5 is greedy: every draw is the penalized argmax).
  float temperature = 1.0f;
  int32_t top_k = -1;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // kSample: what the penalties read (SamplerRow's token_history and
  // prompt_len). Not owned.
  std::span<const int32_t> token_history;
  int32_t prompt_len = 0;
  // kSample: one uniform in [0, 1) per draw (the sampler's: seeded rows use
  // Sampler::SeededUniform; unused by greedy rows), 1 to 64 of them. Not
  // owned.
  std::span<const double> uniforms;
  // kSample: SamplingParams::logprobs (-1 none, 0 the drawn tokens' only,
  // N in [1, 20] also the row's top N).
  int32_t logprobs = -1;

  // Entries the row takes in LmHeadSample's tokens.
  int64_t draws() const {
    return mode == Mode::kSample ? static_cast<int64_t>(uniforms.size()) : 1;
  }
};

// What LmHeadSample returns besides the logits of the rows it left.
struct SampledRows {
  // One entry per draw, row t's RowSampling::draws() after those of the rows
  // before it: the token, or -1 in every entry of a row not reduced.
  std::vector<int32_t> tokens;
  // Per draw (tokens.size() entries): the raw logprob of tokens[j] (the
  // sampler's: log-softmax of the row's logits before penalties and
  // filters) for a reduced row with logprobs >= 0; 0 elsewhere.
  std::vector<float> logprobs;
  // Row t's top list is entries [top_begin[t], top_begin[t + 1]) of top_ids
  // / top_logprobs (n + 1 offsets): min(logprobs, vocab) of them, logprob
  // descending, ties to the lower id, for a reduced row with logprobs >= 1;
  // none elsewhere.
  std::vector<int64_t> top_begin;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

class ModelBackend {
 public:
  virtual ~ModelBackend() = default;

  // Where the pools, weights and activations live (kCPU or kCUDA).
  virtual kernels::Device device() const = 0;
  // Short name for messages ("cpu", "cuda").
  virtual const char* name() const = 0;

  // ---- Setup -------------------------------------------------------------
  // Takes this rank's weight shard (ownership: the CPU backend keeps it, the
  // CUDA backend uploads it and drops the host copy) and returns the handles
  // the forward pass uses. Called once, before anything else.
  // Errors: Unimplemented for a stored matrix type the backend does not run;
  // ResourceExhausted when the weights do not fit.
  virtual absl::StatusOr<BackendWeights> LoadWeights(LlamaWeights weights) = 0;
  // Bytes of backend memory the weights occupy.
  virtual int64_t weight_bytes() const = 0;

  // The KV-pool budget in bytes. CPU: `host_bytes` (--kv-cache-memory).
  // CUDA: vLLM's meaning of `gpu_memory_utilization`, the fraction of the
  // device's total memory for weights, activations and KV together:
  // total * utilization - what the device holds now (after the weights) - a
  // reserve for one step's activations and for runtime internals
  // (GpuKvBudgetBytes); may be <= 0 (nothing fits).
  // InvalidArgument unless 0 < gpu_memory_utilization <= 1 (CUDA).
  virtual absl::StatusOr<int64_t> KvCacheBudgetBytes(int64_t host_bytes,
                                                     double gpu_memory_utilization) const = 0;
  // Allocates the per-layer pools: num_device_blocks blocks of `shape` in
  // backend memory (views of device()) and num_cpu_blocks blocks in host
  // memory for swapping (kCPU views; pinned on CUDA); zero blocks gives no
  // views. shape.num_blocks is ignored. Buffers live as long as the backend.
  // Call once. Errors: FailedPrecondition on a second call, InvalidArgument
  // for a dtype the backend's attention does not take, ResourceExhausted
  // naming the pool when an allocation fails.
  virtual absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                                      int64_t num_cpu_blocks) = 0;
  virtual std::span<const kernels::KVCacheView> device_cache() const = 0;
  virtual std::span<const kernels::KVCacheView> cpu_cache() const = 0;
  // OK when `view` is a KV cache layer this backend's attention runs
  // (device and element type); InvalidArgument naming the problem otherwise.
  virtual absl::Status CheckKvCache(const kernels::KVCacheView& view) const = 0;

  // ---- One step --------------------------------------------------------
  // Starts a step: makes the plan's index arrays and rotary tables available
  // to the operations below (CUDA: one packed upload) and prepares attention
  // workspaces. `plan` (and its batch) must stay valid until the step's
  // LmHead returns.
  virtual absl::Status BeginStep(const ForwardPlan& plan) = 0;

  // An fp32 activation buffer of at least `elems` elements for this step.
  // The pointer stays valid until the next Buffer call with the same id and a
  // larger size; contents are not preserved on growth. InvalidArgument
  // unless IsFp32Buffer(id).
  virtual absl::StatusOr<float*> Buffer(BufferId id, int64_t elems) = 0;
  // The element type of the GEMM-input buffers (fixed once LoadWeights has
  // returned).
  virtual ActivationType gemm_input_type() const = 0;
  // A GEMM-input buffer (IsGemmInput(id)) of at least `elems` elements of
  // gemm_input_type(), with Buffer's lifetime rules. InvalidArgument for an
  // fp32 id.
  virtual absl::StatusOr<GemmInput> GemmInputBuffer(BufferId id, int64_t elems) = 0;
  // The element type of partial sums (fixed once LoadWeights has returned).
  // This default: fp32.
  virtual ActivationType partial_sum_type() const { return ActivationType::kFloat32; }
  // The kProjection buffer of at least `elems` elements of
  // partial_sum_type(), with Buffer's lifetime rules.
  virtual absl::StatusOr<PartialSums> PartialSumBuffer(int64_t elems) = 0;

  // out[t, :] = table[token_ids[t], :] for the plan's tokens, converted to
  // fp32; out [num_tokens, table.cols].
  virtual absl::Status EmbeddingGather(const BackendMatrix& table, float* out) = 0;

  // y[n, w.rows] (fp32) = x[n, w.cols] w^T (+ bias[w.rows] when bias.data
  // is set), over `w` in the form the backend holds it (stored format on the
  // CPU); x a GEMM input.
  virtual absl::Status Linear(GemmInput x, int64_t n, const BackendMatrix& w,
                              const BackendVector& bias, float* y) = 0;

  // Several Linear calls over the same input x[n, cols] (every outs[i].w has
  // the same cols): outs[i].y = x outs[i].w^T (+ outs[i].bias), the values
  // of calling Linear for each in order up to the GEMM's summation order
  // (CPU: identical). A backend may run them as one launch (CPU: one parallel
  // region and one activation quantization, kernels::LinearGroup). The
  // outputs must not overlap x or one another.
  // This default calls Linear for each.
  virtual absl::Status LinearGroup(GemmInput x, int64_t n, std::span<const LinearOut> outs) {
    for (const LinearOut& o : outs) {
      absl::Status s = Linear(x, n, o.w, o.bias, o.y);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  // The SwiGLU activation of one MLP (Shazeer 2020): out[n, inter] (GEMM
  // input) = silu(x gate_proj^T) * (x up_proj^T), x a GEMM input [n, cols];
  // the values of LinearGroup into gate and up followed by SiluMul (up to
  // the GEMM's summation order). gate and up are fp32 scratch [n, inter]
  // that a backend may leave untouched (CUDA, up to 256 tokens: one GEMM
  // over the stacked gate/up rows and one kernel reading its output, no
  // split). This default runs LinearGroup and SiluMul.
  virtual absl::Status GateUpSiluMul(GemmInput x, int64_t n, const BackendMatrix& gate_proj,
                                     const BackendMatrix& up_proj, float* gate, float* up,
                                     GemmInput out);

  // The mixture-of-experts MLP of one layer (ModelConfig::moe): router
  // logits = x w.router^T (fp32), routed as RouteTokens does
  // (runtime/worker/moe_routing.h: softmax, top_k, norm_topk_prob), then
  //   y[t] = sum over t's chosen experts e, in expert order, of
  //          weight(t, e) * (silu(x[t] gate_e^T) * (x[t] up_e^T)) down_e^T
  //          (+ sigmoid(x[t] shared_expert_gate^T) * the shared expert's
  //          SwiGLU of x[t], when w.has_shared(): MoeConfig)
  // x a GEMM input [n, hidden]; y [n, hidden] this rank's partial sums (its
  // slice of every expert's width) in partial_sum_type(), for AllReduceSum.
  // Tokens are grouped by expert: each expert's weights are read once per
  // call, by one GEMM over its tokens, never per token. Experts no token
  // chose cost nothing. This default: Unimplemented (a backend without the
  // operation cannot run a mixture-of-experts model).
  virtual absl::Status MoeMlp(GemmInput x, int64_t n, const MoeConfig& moe, const BackendExperts& w,
                              PartialSums y);

  // A row-parallel projection (o_proj, down_proj): y[n, w.rows] = x[n,
  // w.cols] w^T, this rank's partial sums for AllReduceSum, the fp32 GEMM
  // result in partial_sum_type() (rounded once). This default calls Linear
  // (partial_sum_type() fp32).
  virtual absl::Status RowParallelLinear(GemmInput x, int64_t n, const BackendMatrix& w,
                                         PartialSums y) {
    return Linear(x, n, w, BackendVector{}, static_cast<float*>(y.data));
  }

  // Fused residual add + RMSNorm (Zhang & Sennrich 2019), one row at a time:
  //   v   = residual[r] (+ add[r] when add.data is not null) (fp32 add of the
  //                                                           all-reduced sums)
  //   out[t] = v / sqrt(mean(v^2) + eps) * weight        (sum of squares in double,
  //                                                        the product in fp32, then
  //                                                        rounded to the GEMM-input type)
  // With logits_rows false: r = t for t < n, and residual[r] = v is written
  // back (the residual stream update). With logits_rows true: r = the plan's
  // logits_rows[t] for t < n = logits_rows.size(), and residual is not written
  // (a gather of the rows whose logits are wanted). out [n, dim] must not
  // alias residual or add.
  virtual absl::Status AddRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                                  const BackendVector& weight, double eps, bool logits_rows,
                                  GemmInput out) = 0;

  // Per-head RMSNorm in place (Qwen3's q_norm / k_norm, HF Qwen3RMSNorm over
  // the head dimension): for t < n and h < heads, the head_size values v of
  // x[t * heads * head_size + h * head_size ...] become
  //   v / sqrt(mean(v^2) + eps) * weight       (weight [head_size]; AddRmsNorm's
  //                                             arithmetic: squares summed in
  //                                             double, the product in fp32)
  // x is an fp32 buffer (kQuery or kKey). This default: Unimplemented (a
  // backend without the operation cannot run a model with q/k norms).
  virtual absl::Status HeadRmsNorm(float* x, int64_t n, int heads, int head_size,
                                   const BackendVector& weight, double eps);

  // Residual add of a normed output (Gemma's post-attention and
  // post-feedforward norms, "sandwich" norms): for t < n,
  //   residual[t] += add[t] / sqrt(mean(add[t]^2) + eps) * weight
  // (AddRmsNorm's arithmetic: squares summed in double, the product in
  // fp32; the sum in fp32). add is the all-reduced output of a row-parallel
  // layer [n, dim]. This default: Unimplemented.
  virtual absl::Status AddPostRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                                      const BackendVector& weight, double eps);

  // x[i] *= factor in fp32, i < count, on an fp32 buffer (Gemma's embedding
  // scale). This default: Unimplemented.
  virtual absl::Status Scale(float* x, int64_t count, float factor);

  // The GeGLU activation (Shazeer 2020) with GELU's tanh approximation
  // (Hendrycks & Gimpel 2016; PyTorch gelu(approximate="tanh")):
  //   out[i] = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * up[i],
  //   g = gate[i], in fp32, rounded to the GEMM-input type, for i < count.
  // This default: Unimplemented.
  virtual absl::Status GeluTanhMul(const float* gate, const float* up, int64_t count,
                                   GemmInput out);

  // Rotary embedding in the rotate_half layout (Su et al. 2021; HF
  // LlamaRotaryEmbedding), in place: for token t, head h < heads and i <
  // r = plan.rope_half the pair (i, i + r) of x[t * token_stride + h *
  // head_size + ...] rotates by the plan's (rope_cos, rope_sin)[t, i], or
  // with `local` by (rope_cos_local, rope_sin_local) (InvalidArgument when the
  // plan has none); dimensions 2r..head_size-1 are left as they are (partial
  // rotary; r = head_size / 2 unless ModelConfig::rotary_dim says).
  virtual absl::Status ApplyRope(float* x, int64_t n, int heads, int head_size,
                                 int64_t token_stride, bool local) = 0;

  // out[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i]
  // in fp32, rounded to the GEMM-input type, for i < count.
  virtual absl::Status SiluMul(const float* gate, const float* up, int64_t count,
                               GemmInput out) = 0;

  // The attention of one layer over the paged cache `cache` (a view this
  // backend accepts, CheckKvCache): writes the step's keys and values
  // (fp32 [n, kv_dim]) into the cache at the plan's slot_mapping
  // (reshape_and_cache), then computes out (GEMM input [n, q_dim]) from the queries
  // (fp32 [n, q_dim], RoPE applied) with decode attention for the plan's
  // decode sequences and prefill attention (causal) for the rest, scale
  // plan.attention_scale, scores soft-capped by layer.logit_softcap when > 0,
  // limited to layer.sliding_window when > 0. This is the one place where
  // queries, keys, values and the output are converted to and from the element type the attention
  // kernels take for this cache (e.g. fp16/bf16 on the CPU); softmax and
  // accumulation stay fp32 inside the kernels. q, k, v may be overwritten.
  virtual absl::Status Attention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                                 int num_heads, float* q, float* k, float* v, GemmInput out) = 0;

  // One layer's RoPE and attention over the step's n tokens: ApplyRope on q
  // (num_heads heads, token stride num_heads * head_size) and on k (the
  // cache's KV heads, stride num_kv_heads * head_size; both with
  // layer.local_rope), then Attention, with
  // the same results. The
  // forward pass calls this; a backend may fuse the rotation into the
  // conversion of q and into the cache write of k (CUDA: two kernels instead
  // of RoPE, conversions and reshape_and_cache). This default runs the three
  // operations.
  virtual absl::Status RopeAndAttention(const kernels::KVCacheView& cache,
                                        const LayerAttention& layer, int64_t n, int num_heads,
                                        float* q, float* k, float* v, GemmInput out);

  // One layer's q/k/v projections, RoPE and attention: LinearGroup(x, n,
  // qkv) (x a GEMM input; qkv[0..2] the q, k and v projections with their
  // biases, their y fp32 scratch [n, q_dim], [n, kv_dim], [n, kv_dim]) then
  // RopeAndAttention(cache, n, num_heads, q, k, v, out), with the same
  // values. A backend may keep the projections in its own layout (CUDA, up
  // to 256 tokens: the RoPE and cache-write kernels read the stacked q/k/v
  // GEMM output and add the biases, no split), leaving the scratch unused or
  // as scratch of its own. This default runs the two operations.
  virtual absl::Status QkvRopeAndAttention(GemmInput x, int64_t n,
                                           std::span<const LinearOut, 3> qkv,
                                           const kernels::KVCacheView& cache,
                                           const LayerAttention& layer, int num_heads,
                                           GemmInput out);

  // ---- Captured decode steps (CUDA graphs) -----------------------------
  // The body of a step is everything from EmbeddingGather to the final
  // AddRmsNorm into the kLogitsInput buffer. A backend that returns true
  // here gets decode steps padded to DecodeGraphKey shapes
  // (runtime/worker/decode_graph.h; ForwardPlan::graph set), and for those
  // the forward pass calls BeginBody after BeginStep and its Buffer calls,
  // and EndBody after the body. Default: false (CPU).
  virtual bool SupportsBodyGraphs() const { return false; }
  // Device memory the captured graphs hold now, in bytes: for each, the drop
  // of the device's free memory over its capture and instantiation
  // (device-wide, so another process allocating in that window counts too).
  // 0 without graphs. Not thread-safe (the step's thread).
  virtual int64_t graph_bytes() const { return 0; }
  // True when the backend has enqueued the whole body itself by replaying
  // the graph it captured for plan.graph over the same buffers and the same
  // cache views `kv_layers` (it still validates the step's block tables and
  // lengths on the host); the forward pass then skips the body and goes on
  // to the LM head. False when the forward pass must issue the body's
  // operations; the backend may be recording them (capture) instead of
  // running them, and then runs them at EndBody. Errors as the operations'.
  virtual absl::StatusOr<bool> BeginBody(std::span<const kernels::KVCacheView> kv_layers) {
    (void)kv_layers;
    return false;
  }
  // Closes a body BeginBody returned false for; `body_ok` says whether every
  // body operation succeeded. True when the body has run (eagerly, or a
  // capturing backend ended the capture, kept the graph for the key and
  // launched it). False when a capture failed, in an operation (!body_ok) or
  // at its end, so that nothing of the body ran: the forward pass then issues
  // the body again, eagerly (the backend does not capture that key again).
  // Errors: a device error that leaves the backend unable to run the body.
  virtual absl::StatusOr<bool> EndBody(bool body_ok) {
    (void)body_ok;
    return true;
  }

  // Sum over the tensor-parallel group, in place, on backend memory (the
  // output of a row-parallel layer, `count` elements of partial_sum_type()).
  // A no-op for a group of one.
  virtual absl::Status AllReduceSum(PartialSums data, int64_t count) = 0;

  // logits (host, fp32, resized to [n, w.rows]) = x[n, w.cols] w^T (x a GEMM
  // input), each soft-capped by SoftcapLogit when the plan's
  // final_logit_softcap > 0; waits for the step. Ends the step. Nothing is
  // written to `logits` on error.
  virtual absl::Status LmHead(GemmInput x, int64_t n, const BackendMatrix& w,
                              std::vector<float>* logits) = 0;

  // LmHead for a step whose rows may be reduced to tokens where the logits
  // are (`rows` has n entries, RowSampling); the rows are reduced from
  // LmHead's logits (soft-capped when the plan says). out->tokens is resized to the
  // sum of rows[t].draws(); row t's draws follow those of the rows before it:
  //   kGreedy: its one entry is the id of its largest logit, ties to the
  //            lowest id (GreedyArgmax, the sampler's greedy rule);
  //   kSample: entry j is the token the host sampler draws with
  //            uniforms[j] (runtime/sampling/sampler.h, steps 1-7), with the
  //            sampler's logprobs when the row asks (SampledRows), when the
  //            backend samples where the logits are (CUDA); this default
  //            leaves such rows to the host sampler;
  //   kLogits: -1.
  // A row not reduced (kLogits, a kSample row the backend leaves, or a row
  // the sampler refuses: a NaN or +inf logit, or only -inf ones) has -1 in
  // every entry, and its logits are in `logits` (host), compacted in row
  // order ([count, w.rows]), so that reduced rows cost no download and the
  // caller hands the others to the sampler (which reports the errors). Ends
  // the step; nothing is written on error. This default runs LmHead and
  // reduces the greedy rows on the host (SplitSampledRows).
  virtual absl::Status LmHeadSample(GemmInput x, int64_t n, const BackendMatrix& w,
                                    std::span<const RowSampling> rows, SampledRows* out,
                                    std::vector<float>* logits);

 private:
  std::vector<float> lm_head_rows_;  // the default LmHeadSample's full logits (reused)
};

// The final logit soft cap (ForwardPlan::final_logit_softcap, Gemma 2's
// final_logit_softcapping; HF `logits = tanh(logits / cap) * cap`): for cap
// > 0, (float)(cap * tanh(z / cap)) with the division and tanh in double (a
// NaN stays NaN, +-inf becomes +-cap); z itself for cap <= 0. Every backend
// caps this way (CUDA: the same double arithmetic on the device).
inline float SoftcapLogit(float z, double cap) {
  return cap > 0 ? static_cast<float>(cap * std::tanh(static_cast<double>(z) / cap)) : z;
}

// The greedy reduction of one row of `vocab` logits (LmHeadSample's rule):
// the index of the largest value, ties to the lowest index, or -1 when the row
// holds a NaN or +inf or only -inf values (or vocab < 1).
int32_t GreedyArgmax(const float* row, int64_t vocab);

// Compacts `all` ([n, vocab], every row's logits) into the default
// LmHeadSample's outputs: the kGreedy rows reduced with GreedyArgmax, every
// other row -1 in each of its draws and its logits in *logits, in row order
// (no logprobs: out->logprobs all 0, no top lists).
void SplitSampledRows(const std::vector<float>& all, int64_t n, int64_t vocab,
                      std::span<const RowSampling> rows, SampledRows* out,
                      std::vector<float>* logits);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_MODEL_BACKEND_H_
