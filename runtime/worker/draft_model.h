// The draft model of speculative decoding on a worker rank
// (runtime/coordinator/speculative.h): a smaller model of the target's
// vocabulary, loaded beside it on the same ranks with the same tensor-parallel
// sharding, with its own paged KV pool.
//
// Paged memory (the design of vLLM's first speculative decoding, where the
// draft worker's cache mirrored the target's block ids): the draft's pool has
// exactly as many blocks as the target's, and a sequence's draft K/V lives in
// the same block ids and slots as its target K/V. So the coordinator's block
// tables, copy-on-write copies, swaps, prefix-cache sharing and rollback of
// rejected tokens (slots simply rewritten later) cover both pools with one
// set of decisions; workers apply every block operation to both.
//
// What the draft's K/V holds. The draft runs only for sequences that
// speculate in a step, and first catches up: it feeds, from the worker's
// token history, every position since the last one whose draft K/V is valid
// (a new sequence's whole prompt at its first speculation, in passes of at
// most 512 tokens; after a fully accepted run d_k, which the draft never fed;
// after a rejection the verified tokens whose slots held rejected drafts;
// after steps without speculation, e.g. under disable_by_batch_size, the
// tokens of those steps). So a step where nothing speculates costs the draft
// nothing. Its state per sequence is one number, the count of positions whose
// draft K/V is valid (`computed_`), clamped to each step's start position;
// a (re)started sequence has none (its cached blocks may come from steps the
// draft did not run). Nothing here affects correctness: the target verifies
// every token (acceptance is exact for any draft), so a stale draft entry
// could only lower the acceptance rate.
//
// Proposing: for every plan entry whose draft tokens are placeholders
// (kNoToken; SequenceStep::num_draft_tokens = k), the draft feeds the
// sequence's last verified token t (after its catch-up tokens) and
// then its own argmax k - 1 times, batched over all such entries; the k
// argmaxes are the draft tokens (greedy: a point mass, which the
// coordinator's acceptance rule needs). Every rank feeds the same tokens:
// rank 0's argmaxes are gathered to all ranks after each draft step.
//
// Not thread-safe; the worker thread owns it.
#ifndef PAGEDSERVE_RUNTIME_WORKER_DRAFT_MODEL_H_
#define PAGEDSERVE_RUNTIME_WORKER_DRAFT_MODEL_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "kernels/types.h"
#include "runtime/common/step_plan.h"
#include "runtime/common/step_plan_mirror.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"

namespace pagedserve {

class DraftModel {
 public:
  // Loads this rank's shard of the model at `path` (.gguf or Hugging Face
  // folder) with `dtype` over the CPU backend, on `comm` (not owned; the
  // target's TP group, which must outlive the draft). `target` is the
  // target's configuration; `max_model_len` picks LongRoPE factors as for the
  // target. Errors: the loader's (naming the file, prefixed "draft model: ");
  // InvalidArgument when the
  // draft's vocabulary size differs from the target's (a draft must share
  // the vocabulary: its token ids are fed to the target as they are; only
  // the size is compared, so pairs whose tokenizers agree but whose
  // embedding tables are padded differently, such as Qwen2.5 0.5B and 7B,
  // are refused).
  static absl::StatusOr<std::unique_ptr<DraftModel>> Create(const std::string& path,
                                                            WeightDType dtype,
                                                            const ModelConfig& target,
                                                            int64_t max_model_len,
                                                            Communicator* comm);

  const ModelConfig& config() const { return model_->config(); }

  // The pool shape of this rank's draft KV heads for `block_size` and
  // `dtype`; bytes of one block across all draft layers, K and V.
  kernels::KVCacheShape CacheShape(int block_size, kernels::DType dtype) const;
  int64_t BytesPerBlock(int block_size, kernels::DType dtype) const;
  // Allocates the draft's device and swap pools: as many blocks as the
  // target's (the block ids are shared). Errors: the backend's.
  absl::Status AllocateCaches(int block_size, kernels::DType dtype, int64_t num_device_blocks,
                              int64_t num_cpu_blocks);

  // The draft's pools (the worker applies each plan's block operations to
  // them right after the target's: ApplyBlockOperations).
  std::span<const kernels::KVCacheView> device_cache() const { return device_layers_; }
  std::span<const kernels::KVCacheView> cpu_cache() const { return cpu_layers_; }

  // Runs the draft over `plan` after `mirror` applied it (the histories hold
  // this step's fed tokens, placeholders included): for each entry with
  // placeholder drafts, catches its draft K/V up to the last verified token
  // and proposes its tokens, writes them into their places in the mirror's
  // histories and appends one ProposedDraft per such entry to *drafts, in
  // plan order (the same on every rank). Then forgets plan.finished. InvalidArgument for an entry
  // with some but not all draft tokens kNoToken, or placeholders on an entry that does not sample;
  // the forward pass's errors pass through (the step fails).
  absl::Status Propose(const StepPlan& plan, StepPlanMirror* mirror,
                       std::vector<ProposedDraft>* drafts);

 private:
  DraftModel() = default;

  // One batched draft forward: row r of `rows` feeds tokens[qsl[r],
  // qsl[r+1]) of sequence plan.seqs[seq[r]] at positions first_pos[r]..;
  // logits_row[r] says whether its last token's argmax is wanted. Returns
  // the argmaxes (rank 0's on every rank), in row order of the wanted ones.
  struct Batch {
    std::vector<int> seq;
    std::vector<int32_t> first_pos, token_ids, positions, qsl{0}, seq_lens, logits_rows;
    std::vector<int64_t> slots;
    std::vector<const StepPlanMirror::Sequence*> rows;
    void Clear();
    // Adds the tokens [begin, end) of `st`'s history, positions begin..end-1.
    void Add(int i, const StepPlanMirror::Sequence& st, int32_t begin, int32_t end,
             bool want_logits, int32_t block_size);
  };
  absl::StatusOr<std::vector<int32_t>> Run(const Batch& b);
  // Propose without forgetting plan.finished.
  absl::Status ProposeSteps(const StepPlan& plan, StepPlanMirror* mirror,
                            std::vector<ProposedDraft>* drafts);
  // Rank 0's values on every rank (the ranks' argmaxes could differ in the
  // last bit of a logit).
  absl::Status AgreeOnRankZero(std::vector<int32_t>* tokens);

  std::unique_ptr<LlamaModel> model_;
  Communicator* comm_ = nullptr;
  int32_t block_size_ = 16;
  std::vector<kernels::KVCacheView> device_layers_, cpu_layers_;
  // Per sequence: its leading positions whose draft K/V is valid.
  absl::flat_hash_map<SeqId, int32_t> computed_;
  Batch batch_;  // reused: its vectors keep their capacity
  std::vector<float> logits_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_DRAFT_MODEL_H_
