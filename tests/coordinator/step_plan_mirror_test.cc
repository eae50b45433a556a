// StepPlanMirror: the worker-side state rebuilt from incremental step plans.
// Deltas apply as documented (tails, copy-on-write rewrites, forks reading the
// parent's state from before the plan, drops), and every malformed delta is an
// InvalidArgument naming the sequence, never a crash.
#include "runtime/common/step_plan_mirror.h"

#include <gtest/gtest.h>

namespace pagedserve {
namespace {

constexpr int32_t kBs = 4;

SequenceStep Start(SeqId id, std::vector<int32_t> tokens, std::vector<int32_t> blocks) {
  SequenceStep s;
  s.seq_id = id;
  s.new_state = true;
  s.token_ids = std::move(tokens);
  s.block_table = std::move(blocks);
  s.num_prompt_tokens = static_cast<int32_t>(s.token_ids.size());
  s.sample_index = 0;
  s.sampling.temperature = 0.5f;
  return s;
}

SequenceStep Decode(SeqId id, int32_t token, int32_t pos, int32_t bt_start,
                    std::vector<int32_t> tail = {}) {
  SequenceStep s;
  s.seq_id = id;
  s.token_ids = {token};
  s.start_pos = pos;
  s.block_table_start = bt_start;
  s.block_table = std::move(tail);
  s.sampling.temperature = 9.0f;  // not a start: must be ignored
  return s;
}

absl::Status ApplyOne(StepPlanMirror& m, uint64_t step, std::vector<SequenceStep> seqs,
                      std::vector<SeqId> finished = {}) {
  StepPlan p;
  p.step_id = step;
  p.seqs = std::move(seqs);
  p.finished = std::move(finished);
  return m.Apply(p);
}

TEST(StepPlanMirrorTest, DeltasRebuildRowsHistoriesAndSlots) {
  StepPlanMirror m(kBs, 100);
  ASSERT_TRUE(ApplyOne(m, 1, {Start(1, {10, 11, 12, 13}, {7})}).ok());
  // Decode at position 4 opens a new block: one entry from index 1.
  StepPlan p;
  p.step_id = 2;
  p.seqs = {Decode(1, 14, 4, 1, {9})};
  ASSERT_TRUE(m.Apply(p).ok());
  const StepPlanMirror::Sequence* s = m.Find(1);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->block_table, (std::vector<int32_t>{7, 9}));
  EXPECT_EQ(s->history, (std::vector<int32_t>{10, 11, 12, 13, 14}));
  EXPECT_EQ(s->sampling.temperature, 0.5f);  // from the start, not the decode entry
  std::vector<int64_t> slots;
  m.AppendSlotMapping(p, &slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{9 * kBs + 0}));
  // Unchanged row: start == length, no entries.
  ASSERT_TRUE(ApplyOne(m, 3, {Decode(1, 15, 5, 2)}).ok());
  EXPECT_EQ(m.Find(1)->block_table, (std::vector<int32_t>{7, 9}));
  // Copy-on-write of the last block: that entry again.
  ASSERT_TRUE(ApplyOne(m, 4, {Decode(1, 16, 6, 1, {20})}).ok());
  EXPECT_EQ(m.Find(1)->block_table, (std::vector<int32_t>{7, 20}));
  // Dropped on finished.
  ASSERT_TRUE(ApplyOne(m, 5, {}, {1, 999}).ok());
  EXPECT_EQ(m.Find(1), nullptr);
  EXPECT_EQ(m.size(), 0u);
}

TEST(StepPlanMirrorTest, ForkCopiesTheParentAsItWasBeforeThePlan) {
  StepPlanMirror m(kBs, 100);
  ASSERT_TRUE(ApplyOne(m, 1, {Start(1, {1, 2, 3}, {5})}).ok());
  // The parent decodes (writes token 4) while a sibling forks in the same plan
  // and writes its own token 8 at the same position into a copied block.
  SequenceStep child = Decode(2, 8, 3, 0, {6});
  child.fork_from = 1;
  child.sample_index = 1;
  child.sampling.temperature = 0.7f;
  ASSERT_TRUE(ApplyOne(m, 2, {Decode(1, 4, 3, 1), child}).ok());
  EXPECT_EQ(m.Find(1)->history, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(m.Find(2)->history, (std::vector<int32_t>{1, 2, 3, 8}));
  EXPECT_EQ(m.Find(2)->block_table, (std::vector<int32_t>{6}));
  EXPECT_EQ(m.Find(2)->sample_index, 1);
  EXPECT_EQ(m.Find(2)->sampling.temperature, 0.7f);
}

// Entries dropped out of the sliding window (kDroppedBlock) arrive when a
// row is sent in full again (after swap in); they are kept but never written.
TEST(StepPlanMirrorTest, DroppedBlocksAreAcceptedButNeverWritten) {
  StepPlanMirror m(kBs, 100);
  SequenceStep resumed = Start(1, {1, 2, 3, 4, 5, 6, 7, 8, 9}, {kDroppedBlock, 5, 6});
  resumed.token_ids = {9};  // positions 0..7 cached, 8 fed into block 2
  resumed.start_pos = 8;
  resumed.cached_prefix_token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  ASSERT_TRUE(ApplyOne(m, 1, {resumed}).ok());
  std::vector<int64_t> slots;
  StepPlan p;
  p.seqs = {resumed};
  m.AppendSlotMapping(p, &slots);
  EXPECT_EQ(slots, (std::vector<int64_t>{6 * kBs}));
  SequenceStep bad = Start(2, {1, 2, 3}, {kDroppedBlock});
  absl::Status st = ApplyOne(m, 2, {bad});
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("dropped block"), std::string::npos) << st;
  EXPECT_EQ(ApplyOne(m, 3, {Start(3, {1}, {-2})}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(StepPlanMirrorTest, MalformedDeltasAreInvalidArgument) {
  StepPlanMirror m(kBs, 10);
  ASSERT_TRUE(ApplyOne(m, 1, {Start(1, {1, 2, 3, 4}, {0})}).ok());
  struct Case {
    const char* what;
    SequenceStep step;
  };
  SequenceStep fork = Decode(3, 1, 4, 0, {1, 2});
  fork.fork_from = 42;
  const Case cases[] = {
      {"unknown continuing sequence", Decode(2, 1, 0, 0, {1})},
      {"fork from an unknown sequence", fork},
      {"start_pos beyond the history", Decode(1, 5, 9, 1, {1, 2, 3})},
      {"block_table_start beyond the row", Decode(1, 5, 4, 3, {1})},
      {"block outside the pool", Decode(1, 5, 4, 1, {10})},
      {"negative block", Decode(1, 5, 4, 1, {-1})},
      {"row too short for the context", Decode(1, 5, 4, 1)},
  };
  for (const Case& c : cases) {
    absl::Status s = ApplyOne(m, 2, {c.step});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.what << ": " << s;
    EXPECT_NE(s.message().find("sequence"), std::string::npos) << c.what << ": " << s;
  }
  // Sequence 1 is still usable: a correct delta applies.
  ASSERT_TRUE(ApplyOne(m, 3, {Decode(1, 5, 4, 1, {3})}).ok());
  EXPECT_EQ(m.Find(1)->block_table, (std::vector<int32_t>{0, 3}));
}

}  // namespace
}  // namespace pagedserve
