// The worker side of incremental step plans (runtime/common/step_plan.h): the
// per-sequence state a worker rebuilds from the deltas it receives, so that a
// plan need not repeat what did not change (issue 13, "plans carry what
// changed"). Workers (runtime/worker), the coordinator's test harnesses and
// the engine tests' scripted executor all apply plans through this one type.
//
// Per sequence it holds the full block-table row, the token history (every
// token fed so far, positions 0..len-1, for repetition penalties and for the
// test harnesses' context checks) and the constants a sequence starts with
// (sampling parameters, sample index, prompt length). A sequence's state is
// created by a plan entry with new_state (or fork_from, which copies the
// parent's state as it was before the plan) and dropped when its id is in
// plan.finished.
//
// Not thread-safe; one worker thread owns it.
#ifndef PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_MIRROR_H_
#define PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_MIRROR_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "runtime/common/sampling_params.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

class StepPlanMirror {
 public:
  struct Sequence {
    std::vector<int32_t> block_table;  // physical device blocks, logical order
    std::vector<int32_t> history;      // tokens fed so far: prompt + generated
    SamplingParams sampling;
    int32_t num_prompt_tokens = 0;
    int32_t sample_index = 0;
  };

  // block_size: tokens per KV block (>= 1). num_device_blocks: block ids in a
  // plan must lie in [0, num_device_blocks); 0 disables that check.
  StepPlanMirror(int32_t block_size, int64_t num_device_blocks);

  // Applies the plan's sequence entries in order (forks read their parent's
  // state from before the plan), then drops plan.finished. InvalidArgument,
  // naming the step and the sequence, for a fork from an unknown sequence, a
  // continuing sequence the mirror does not hold, a start_pos beyond its
  // history, a block_table_start beyond its row, a block id out of range
  // (kDroppedBlock is allowed, except for a block the step writes) or a row
  // that does not cover the context. After an error the state of the
  // plan's sequences is unspecified (the coordinator fails them); other
  // sequences are untouched.
  absl::Status Apply(const StepPlan& plan);

  // Writes a draft model's proposed tokens over the history of sequence `id`
  // at positions [first_pos, first_pos + tokens.size()) (placeholders of the
  // plan just applied: SequenceStep::num_draft_tokens). InvalidArgument for an
  // unknown sequence or positions outside its history.
  absl::Status SetProposedTokens(SeqId id, int32_t first_pos, std::span<const int32_t> tokens);

  // The state of a sequence, nullptr when unknown. Valid until the next Apply.
  const Sequence* Find(SeqId id) const;
  size_t size() const { return seqs_.size(); }
  int32_t block_size() const { return block_size_; }

  // Appends the slot of every fed token of plan.seqs (flattened in plan
  // order): row[pos / block_size] * block_size + pos % block_size. Call after
  // Apply(plan) succeeded; every plan sequence must be known.
  void AppendSlotMapping(const StepPlan& plan, std::vector<int64_t>* slots) const;

 private:
  absl::Status ApplyOne(uint64_t step_id, const SequenceStep& s,
                        const absl::flat_hash_map<SeqId, Sequence>& forked);

  int32_t block_size_;
  int64_t num_device_blocks_;
  absl::flat_hash_map<SeqId, Sequence> seqs_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_MIRROR_H_
