// A worker rank: one tensor-parallel shard of the model, its paged KV pool and
// its CPU swap pool. It applies a step plan exactly as the coordinator decided
// (swap out, swap in, copy-on-write copies, forward pass) and, on TP rank 0,
// samples the next tokens. Workers never decide placement.
#ifndef PAGEDSERVE_RUNTIME_WORKER_WORKER_H_
#define PAGEDSERVE_RUNTIME_WORKER_WORKER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "kernels/types.h"
#include "runtime/common/step_plan.h"
#include "runtime/common/step_plan_mirror.h"
#include "runtime/model/weights.h"
#include "runtime/sampling/sampler.h"
#include "runtime/worker/constraint_rows.h"
#include "runtime/worker/draft_model.h"
#include "runtime/worker/llama_model.h"

namespace pagedserve {

struct WorkerOptions {
  std::string model_path;               // .gguf file or Hugging Face directory
  int block_size = 16;                  // tokens per KV block (8, 16 or 32)
  int64_t kv_cache_memory = 1LL << 30;  // bytes for the KV pool (all layers, K and V)
  int64_t swap_space = 1LL << 30;       // bytes for the CPU swap pool
  int64_t max_num_blocks = 0;           // cap on the device pool (0 = only the budget)
  // How the weights are held (--dtype; runtime/model/weights.h). CPU
  // worker: kAuto runs GGUF/safetensors matrices in their stored formats
  // (kernels::Linear), kFloat32 dequantizes them at load (OpenBLAS sgemm: the
  // exact path the transformers-fp32 fixtures are checked with), kFloat16 /
  // kBFloat16 convert them to 16-bit rows. CUDA worker: matrices are
  // converted at load to kFloat32 (cuBLAS SGEMM), kFloat16 or kBFloat16
  // (cublasGemmEx on tensor cores, fp32 accumulation); kAuto means the
  // checkpoint's 16-bit type there (ResolveWeightDType: fp16 for fp16
  // checkpoints, else bf16).
  WeightDType dtype = WeightDType::kAuto;
  // Element type of the KV and swap pools (--kv-cache-dtype); nullopt = auto,
  // following the resolved weight dtype: fp32 for kFloat32, bf16 for
  // kBFloat16, fp16 otherwise (so bf16 on CUDA by default). Both workers take
  // fp32, fp16, bf16, fp8_e4m3 and fp8_e5m2 pools. The block count follows:
  // blocks = budget / bytes_per_block() of that type (1-byte elements for fp8).
  // fp8 pools use k_scale = v_scale = 1.0 in every layer: vLLM's default when
  // a checkpoint carries no KV scales (kernels/types.h).
  std::optional<kernels::DType> kv_cache_dtype;
  // The backend of the forward pass (runtime/worker/model_backend.h), i.e.
  // where the weights and the KV pool live. kCPU: CpuBackend, host pools of
  // kv_cache_memory bytes. kCUDA: the CUDA backend on device `cuda_device`,
  // weights and KV pool in device memory, the pool sized from
  // gpu_memory_utilization (ModelBackend::KvCacheBudgetBytes;
  // kv_cache_memory is then unused), the swap pool in pinned host memory;
  // needs a CUDA build, and a communicator that is a group of one or NCCL
  // (runtime/worker/cuda/cuda_backend.h).
  kernels::Device device = kernels::Device::kCPU;
  int cuda_device = 0;
  double gpu_memory_utilization = 0.9;  // fraction of the device's memory in all (vLLM's meaning)
  // Decode steps replayed from CUDA graphs (--enforce-eager,
  // --max-seq-len-to-capture; runtime/worker/decode_graph.h). Only the CUDA
  // backend captures; the CPU worker ignores this.
  DecodeGraphOptions graphs;
  // Structured output: the model's token bytes and end ids, loaded by the
  // sampling worker the first time a sequence has a constraint
  // (runtime/worker/constraint_rows.h). Empty: constrained sequences fail.
  ConstraintVocabularyLoader constraint_vocabulary;
  // The longest sequence the server admits (--max-model-len, or the model's
  // context when that flag is 0), as requested before the engine fits it to
  // the KV pool. Picks LongRoPE's factor set (SelectLongRopeFactors: long
  // when above the model's original_max_position_embeddings). 0: the
  // model's max_position_embeddings.
  int64_t max_model_len = 0;
  // Speculative decoding with a draft model (--speculative-config's "model";
  // runtime/worker/draft_model.h): its path, loaded beside the target with
  // the same weight dtype, sharding and KV element type, or empty for none.
  // CPU worker only, and not for a model whose every layer has a sliding
  // window (whose out-of-window blocks the coordinator frees: the draft's
  // K/V lives in them too). The KV budget then holds both pools: bytes_per_block()
  // is the target's block plus the draft's, and both pools have
  // num_device_blocks() blocks.
  std::string draft_model_path;
  // Weight-load progress (LoadLlamaWeights), called on the loading thread by
  // the worker of tensor-parallel rank 0 only (one report per model, not one
  // per shard). Empty: none.
  LoadProgressFn load_progress;
};

// The weight dtype Worker::Create loads for `options`: options.dtype, except
// kAuto on CUDA, which is the checkpoint's precision when that is fp16
// (`model`'s checkpoint_dtype "float16") and kBFloat16 otherwise (bf16
// checkpoints, GGUF files, and fp32 checkpoints, whose range bf16 keeps).
// `model` may be null (then as for a GGUF file).
WeightDType ResolveWeightDType(const WorkerOptions& options, const ModelConfig* model = nullptr);

// The KV pool's element type Worker::Create uses for `options`: the
// kv_cache_dtype rule above (auto follows ResolveWeightDType). Lets the
// coordinator name it (the startup line) without a worker of its own: under
// mpirun the workers run the same flags (and options.device is the
// coordinator's guess of theirs).
kernels::DType ResolveKvCacheDType(const WorkerOptions& options,
                                   const ModelConfig* model = nullptr);

class Worker {
 public:
  // Loads this rank's shard (rank/size from `comm`, not owned, must outlive the
  // worker) and allocates the KV and swap pools: blocks = budget / (bytes of one
  // block across all layers, K and V). Errors: model loading errors (naming the
  // file), InvalidArgument for a bad block size or a budget below one block,
  // and DraftModel::Create's errors and the refusals of draft_model_path;
  // with device kCUDA also FailedPrecondition in builds without CUDA,
  // Unimplemented for a weight the CUDA backend does not
  // run, and the errors of MakeCudaBackend / LlamaModel::Create /
  // AllocateCaches. One path for both devices: only the backend differs.
  static absl::StatusOr<std::unique_ptr<Worker>> Create(const WorkerOptions& options,
                                                        Communicator* comm);
  ~Worker();

  const ModelConfig& model_config() const { return *config_; }
  kernels::Device device() const { return device_; }
  int64_t num_device_blocks() const { return num_device_blocks_; }
  int64_t num_cpu_blocks() const { return num_cpu_blocks_; }
  // Bytes of one block across all layers, K and V (this rank's KV heads),
  // the draft model's included.
  int64_t bytes_per_block() const { return bytes_per_block_; }
  // Element type of the KV and swap pools.
  kernels::DType kv_cache_dtype() const { return kv_dtype_; }

  // Runs one plan: applies swap_out, swap_in and copy, brings its mirror of
  // every sequence up to date from the plan's incremental entries (dropping
  // plan.finished), derives the slot mapping from the mirrored block tables,
  // runs the draft model when there is one (proposing the placeholder draft
  // tokens; StepResult::drafts), runs the forward pass, and (TP rank 0
  // only) samples. Placeholder draft tokens without a draft model are an
  // InvalidArgument error. Other ranks
  // return a result without tokens. Errors leave the worker usable: the plan's
  // sequences should be failed by the coordinator.
  absl::StatusOr<StepResult> Execute(const StepPlan& plan);

  // The device-pool views of every layer (tests compare swapped blocks).
  std::span<const kernels::KVCacheView> device_cache() const { return device_layers_; }
  std::span<const kernels::KVCacheView> cpu_cache() const { return cpu_layers_; }

 private:
  Worker() = default;

  // The LmHeadSample mode of each logits row (sampled_seq[r] indexes
  // plan.seqs and rows; row_back[r] counts the fed tokens after the row's
  // token, > 0 for a speculative sequence's rows before its last), with
  // *uniforms holding the kSample rows' uniforms.
  void PlanRowSampling(const StepPlan& plan, std::span<const StepPlanMirror::Sequence* const> rows,
                       std::span<const int> sampled_seq, std::span<const int> row_back,
                       std::vector<RowSampling>* reduce, std::vector<double>* uniforms);
  // Rank 0: the step's tokens in row order, from the rows the backend
  // reduced (`reduced`, LmHeadSample's tokens and logprobs) and the
  // sampler for the rest.
  absl::Status CollectTokens(const StepPlan& plan,
                             std::span<const StepPlanMirror::Sequence* const> rows,
                             std::span<const int> sampled_seq, std::span<const int> row_back,
                             std::span<const RowSampling> reduce, const SampledRows& reduced,
                             StepResult* result);

  // A prompt token scored this step (SequenceStep::prompt_logprobs): the
  // logits row of the position before it, its sequence (index into
  // plan.seqs), position and id.
  struct PromptRow {
    int32_t row = 0;
    int seq = 0;
    int32_t position = 0;
    int32_t token = 0;
  };
  // Appends sequence i's prompt rows (its chunk starts at batch row
  // `first_row`). InvalidArgument for an entry that cannot score its prompt
  // (draft tokens, no prompt_logprobs in its parameters, a missing or
  // out-of-vocabulary next prompt token).
  absl::Status PlanPromptRows(const StepPlan& plan, int i, const StepPlanMirror::Sequence& st,
                              int32_t first_row, std::vector<PromptRow>* out) const;
  // Rank 0: the prompt rows' PromptLogprobs, from the logits LmHeadSample
  // left (after the unreduced sampling rows among the first
  // num_sampling_rows of `reduce`).
  absl::Status CollectPromptLogprobs(const StepPlan& plan,
                                     std::span<const StepPlanMirror::Sequence* const> rows,
                                     std::span<const PromptRow> prompt_rows,
                                     size_t num_sampling_rows, std::span<const RowSampling> reduce,
                                     const SampledRows& reduced, StepResult* result) const;

  std::unique_ptr<LlamaModel> model_;  // its backend owns the pools
  std::unique_ptr<DraftModel> draft_;  // speculative decoding's draft model, or null
  const ModelConfig* config_ = nullptr;
  kernels::Device device_ = kernels::Device::kCPU;
  Communicator* comm_ = nullptr;
  std::unique_ptr<Sampler> sampler_;
  std::unique_ptr<ConstraintRows> constraints_;  // structured output (rank 0 samples)
  absl::BitGen unseeded_;                        // uniforms of unseeded rows the backend samples
  int64_t num_device_blocks_ = 0;
  int64_t num_cpu_blocks_ = 0;
  int64_t bytes_per_block_ = 0;
  kernels::DType kv_dtype_ = kernels::DType::kFloat32;
  std::vector<kernels::KVCacheView> device_layers_, cpu_layers_;  // the backend's pools
  // Per-sequence block tables, histories and sampling parameters, kept up
  // to date from the plans' deltas.
  std::unique_ptr<StepPlanMirror> mirror_;
  std::vector<float> logits_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_WORKER_H_
