// The structured-output state of the sampling worker's sequences (TP rank 0):
// per sequence with SamplingParams::structured_output, the constraint compiled
// for this model's vocabulary (runtime/grammar/token_mask.h; cached LRU per
// (kind, spec), so a schema shared by many requests compiles once) and a
// matcher advanced over the sequence's output tokens.
//
// The matcher is brought up to date from the mirrored token history before
// each mask (history[num_prompt_tokens..] = the outputs so far), so every way
// a sequence's tokens arrive is covered by one rule: a new sequence, a fork
// (n > 1: a child starts from its own history), preemption by recompute (the
// sequence comes back with the same outputs) or swap. If the outputs no longer
// extend what the matcher consumed, it is rebuilt from the history.
//
// The vocabulary (token bytes + end ids) is loaded on first use through
// WorkerOptions::constraint_vocabulary. Not thread-safe: the worker thread owns it.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CONSTRAINT_ROWS_H_
#define PAGEDSERVE_RUNTIME_WORKER_CONSTRAINT_ROWS_H_

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/common/step_plan.h"
#include "runtime/common/step_plan_mirror.h"
#include "runtime/grammar/compile.h"
#include "runtime/grammar/token_mask.h"

namespace pagedserve {

using ConstraintVocabularyLoader =
    std::function<absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>>()>;

class ConstraintRows {
 public:
  static constexpr size_t kCachedConstraints = 64;

  explicit ConstraintRows(ConstraintVocabularyLoader loader) : loader_(std::move(loader)) {}

  // The allowed-token mask of sequence `id` (its mirror state `seq`, whose
  // sampling.structured_output is active) for its next token. A sequence whose
  // outputs left the constraint's language (cannot happen when every token was
  // sampled under the mask) gets a mask of only the end ids. Errors:
  // FailedPrecondition when no vocabulary loader was given or it fails;
  // InvalidArgument when the constraint does not compile.
  absl::StatusOr<std::shared_ptr<const grammar::TokenMask>> Mask(
      SeqId id, const StepPlanMirror::Sequence& seq);

  // Forgets finished sequences.
  void Drop(std::span<const SeqId> ids);
  size_t size() const { return rows_.size(); }

 private:
  struct Row {
    std::shared_ptr<grammar::CompiledConstraint> compiled;
    std::unique_ptr<grammar::ConstraintMatcher> matcher;
    std::vector<int32_t> consumed;  // output tokens fed to the matcher
    bool broken = false;
  };
  absl::StatusOr<std::shared_ptr<grammar::CompiledConstraint>> Compiled(const StructuredOutput& so);

  ConstraintVocabularyLoader loader_;
  std::shared_ptr<const grammar::TokenVocabulary> vocab_;
  grammar::ConstraintCache<grammar::CompiledConstraint> cache_{kCachedConstraints};
  absl::flat_hash_map<SeqId, Row> rows_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CONSTRAINT_ROWS_H_
