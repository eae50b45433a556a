#include "runtime/common/step_plan_mirror.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedserve {

StepPlanMirror::StepPlanMirror(int32_t block_size, int64_t num_device_blocks)
    : block_size_(std::max(block_size, 1)), num_device_blocks_(num_device_blocks) {}

const StepPlanMirror::Sequence* StepPlanMirror::Find(SeqId id) const {
  auto it = seqs_.find(id);
  return it == seqs_.end() ? nullptr : &it->second;
}

absl::Status StepPlanMirror::Apply(const StepPlan& plan) {
  // Forks copy their parent as it was before this plan (the parent may be in
  // the same plan, e.g. a sibling forked while the parent decodes).
  absl::flat_hash_map<SeqId, Sequence> forked;
  for (const SequenceStep& s : plan.seqs) {
    if (s.fork_from == kNoSeq) continue;
    auto parent = seqs_.find(s.fork_from);
    if (parent == seqs_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("step ", plan.step_id, ": sequence ", s.seq_id,
                                                     " forks from unknown sequence ", s.fork_from));
    }
    forked.emplace(s.seq_id, parent->second);
  }
  for (const SequenceStep& s : plan.seqs) {
    if (absl::Status st = ApplyOne(plan.step_id, s, forked); !st.ok()) return st;
  }
  for (SeqId id : plan.finished) seqs_.erase(id);
  return absl::OkStatus();
}

absl::Status StepPlanMirror::ApplyOne(uint64_t step_id, const SequenceStep& s,
                                      const absl::flat_hash_map<SeqId, Sequence>& forked) {
  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step_id, ": sequence ", s.seq_id, " ", parts...));
  };
  Sequence* m;
  if (s.fork_from != kNoSeq) {
    m = &(seqs_[s.seq_id] = forked.at(s.seq_id));
  } else if (s.new_state) {
    m = &(seqs_[s.seq_id] = Sequence{});
    m->history = s.cached_prefix_token_ids;
  } else {
    auto it = seqs_.find(s.seq_id);
    if (it == seqs_.end()) return bad("has no state on this worker (no new_state entry seen)");
    m = &it->second;
  }
  if (s.starts()) {
    m->sampling = s.sampling;
    m->num_prompt_tokens = s.num_prompt_tokens;
    m->sample_index = s.sample_index;
  }
  if (s.start_pos < 0 || static_cast<int64_t>(m->history.size()) < s.start_pos) {
    return bad("starts at position ", s.start_pos, " but this worker knows ", m->history.size(),
               " of its tokens");
  }
  m->history.resize(s.start_pos);
  m->history.insert(m->history.end(), s.token_ids.begin(), s.token_ids.end());

  if (s.block_table_start < 0 || static_cast<size_t>(s.block_table_start) > m->block_table.size()) {
    return bad("changes its block table from entry ", s.block_table_start, " but the worker holds ",
               m->block_table.size(), " entries");
  }
  for (int32_t b : s.block_table) {
    if (b == kDroppedBlock) continue;  // out of the sliding window: never read
    if (b < 0 || (num_device_blocks_ > 0 && b >= num_device_blocks_)) {
      return bad("names block ", b, " outside the device pool of ", num_device_blocks_);
    }
  }
  m->block_table.resize(s.block_table_start);
  m->block_table.insert(m->block_table.end(), s.block_table.begin(), s.block_table.end());
  if (static_cast<int64_t>(m->block_table.size()) * block_size_ < s.context_len()) {
    return bad("has ", m->block_table.size(), " blocks of ", block_size_,
               " tokens for a context of ", s.context_len());
  }
  for (int64_t i = s.start_pos / block_size_; i * block_size_ < s.context_len(); ++i) {
    if (m->block_table[i] == kDroppedBlock) {
      return bad("writes tokens into block-table entry ", i, ", a dropped block");
    }
  }
  return absl::OkStatus();
}

absl::Status StepPlanMirror::SetProposedTokens(SeqId id, int32_t first_pos,
                                               std::span<const int32_t> tokens) {
  auto it = seqs_.find(id);
  if (it == seqs_.end())
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, " has no state"));
  std::vector<int32_t>& h = it->second.history;
  if (first_pos < 0 || static_cast<size_t>(first_pos) + tokens.size() > h.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", id, ": proposed tokens at ",
                                                   first_pos, " past its history of ", h.size()));
  }
  std::copy(tokens.begin(), tokens.end(), h.begin() + first_pos);
  return absl::OkStatus();
}

void StepPlanMirror::AppendSlotMapping(const StepPlan& plan, std::vector<int64_t>* slots) const {
  const int64_t bs = block_size_;
  for (const SequenceStep& s : plan.seqs) {
    const std::vector<int32_t>& row = seqs_.at(s.seq_id).block_table;
    for (int32_t pos = s.start_pos; pos < s.context_len(); ++pos) {
      slots->push_back(static_cast<int64_t>(row[pos / bs]) * bs + pos % bs);
    }
  }
}

}  // namespace pagedserve
