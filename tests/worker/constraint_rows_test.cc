// ConstraintRows (runtime/worker/constraint_rows.h): the structured-output state of
// the sampling worker's sequences, brought up to date from the mirrored history.
// Covered: masks follow the outputs; a fork (n > 1) starts from its own history; a
// sequence whose history was replaced (preemption by recompute of another path,
// a reused id) is rebuilt instead of advanced; outputs outside the language give
// an end-only mask; a missing vocabulary is a clear error.
#include "runtime/worker/constraint_rows.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

// Token ids: 0 "<eos>" (end), 1 "a", 2 "b", 3 "c", 4 "ab"; prompt tokens are 5.
std::shared_ptr<const grammar::TokenVocabulary> Vocab() {
  return *grammar::TokenVocabulary::Create({"", "a", "b", "c", "ab", "P"}, {0});
}

StepPlanMirror::Sequence Seq(std::vector<int32_t> outputs) {
  StepPlanMirror::Sequence s;
  s.history = {5, 5};
  s.num_prompt_tokens = 2;
  s.history.insert(s.history.end(), outputs.begin(), outputs.end());
  s.sampling.structured_output = {StructuredOutput::Kind::kRegex, "(ab)+c"};
  return s;
}

std::vector<int32_t> Allowed(const grammar::TokenMask& m) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < 6; ++id) {
    if (grammar::MaskAllows(m, id)) out.push_back(id);
  }
  return out;
}

TEST(ConstraintRowsTest, MasksFollowTheHistoryAndRebuildWhenItChanges) {
  ConstraintRows rows([] { return Vocab(); });
  auto m = rows.Mask(1, Seq({}));
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{1, 4}));  // "a", "ab"
  m = rows.Mask(1, Seq({1}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{2}));  // "b"
  m = rows.Mask(1, Seq({1, 2}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{1, 3, 4}));  // "a", "c", "ab"
  m = rows.Mask(1, Seq({1, 2, 3}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{0}));  // complete: only the end
  // A fork (another id) from its own history; the same id with a different
  // history (recomputed along another path) is rebuilt, not advanced.
  m = rows.Mask(2, Seq({4}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{1, 3, 4}));
  m = rows.Mask(1, Seq({4, 1}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{2}));
  // Outputs outside the language: only the end id.
  m = rows.Mask(3, Seq({2}));
  EXPECT_EQ(Allowed(**m), (std::vector<int32_t>{0}));
  EXPECT_EQ(rows.size(), 3u);
  const std::vector<SeqId> done = {1, 2, 3};
  rows.Drop(done);
  EXPECT_EQ(rows.size(), 0u);
}

TEST(ConstraintRowsTest, ErrorsAreClear) {
  ConstraintRows none(nullptr);
  auto m = none.Mask(1, Seq({}));
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  ConstraintRows rows([] { return Vocab(); });
  StepPlanMirror::Sequence bad = Seq({});
  bad.sampling.structured_output.spec = "(";
  m = rows.Mask(1, bad);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedserve
