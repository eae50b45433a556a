// ChangedRowRanges (runtime/worker/block_table_update.h): the rows of a block
// table the CUDA backend uploads, by hand and against a brute-force rule on
// random tables (applying the ranges to the held table must give the new
// one, and no range may start or end on an unchanged row unless merged).
#include "runtime/worker/block_table_update.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

TEST(BlockTableUpdateTest, OnlyChangedRowsInAdjacentRuns) {
  const int width = 3;
  const std::vector<int32_t> held = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};  // 4 rows
  std::vector<int32_t> next = held;
  EXPECT_TRUE(ChangedRowRanges(held, next, 4, width, 8).empty());
  // Fewer rows than held: the rest is not looked at.
  EXPECT_TRUE(ChangedRowRanges(held, {next.data(), 6}, 2, width, 8).empty());
  next[4] = 99;   // row 1
  next[11] = 98;  // row 3
  EXPECT_EQ(ChangedRowRanges(held, next, 4, width, 8), (std::vector<RowRange>{{1, 2}, {3, 4}}));
  next[6] = 97;  // row 2: rows 1-3 are one run
  EXPECT_EQ(ChangedRowRanges(held, next, 4, width, 8), (std::vector<RowRange>{{1, 4}}));
  // Rows past the held table always count as changed.
  std::vector<int32_t> grown = held;
  grown.insert(grown.end(), {13, 14, 15, 16, 17, 18});
  EXPECT_EQ(ChangedRowRanges(held, grown, 6, width, 8), (std::vector<RowRange>{{4, 6}}));
  EXPECT_EQ(ChangedRowRanges({}, grown, 6, width, 8), (std::vector<RowRange>{{0, 6}}));
}

TEST(BlockTableUpdateTest, TooManyRunsMergeIntoOne) {
  const int width = 2, rows = 10;
  std::vector<int32_t> held(rows * width, 0), next = held;
  for (int r = 1; r < rows; r += 2) next[r * width] = r;  // rows 1, 3, 5, 7, 9
  EXPECT_EQ(ChangedRowRanges(held, next, rows, width, 5).size(), 5u);
  EXPECT_EQ(ChangedRowRanges(held, next, rows, width, 4), (std::vector<RowRange>{{1, 10}}));
}

TEST(BlockTableUpdateTest, RandomTablesAreRebuiltByTheRanges) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    const int width = 1 + static_cast<int>(rng() % 6);
    const int held_rows = static_cast<int>(rng() % 12), rows = static_cast<int>(rng() % 12);
    std::vector<int32_t> held(static_cast<size_t>(held_rows) * width);
    for (int32_t& v : held) v = static_cast<int32_t>(rng() % 4);
    std::vector<int32_t> next(static_cast<size_t>(rows) * width);
    for (size_t i = 0; i < next.size(); ++i)
      next[i] = (i < held.size() && rng() % 4 != 0) ? held[i] : static_cast<int32_t>(rng() % 4);
    const int max_ranges = 1 + static_cast<int>(rng() % 4);
    const std::vector<RowRange> ranges = ChangedRowRanges(held, next, rows, width, max_ranges);
    ASSERT_LE(static_cast<int>(ranges.size()), max_ranges);
    std::vector<int32_t> applied = held;
    applied.resize(std::max(held.size(), next.size()), -1);
    int prev_end = -1;
    for (const RowRange& r : ranges) {
      ASSERT_LT(r.begin, r.end);
      ASSERT_GT(r.begin, prev_end);  // ascending, disjoint, not adjacent
      prev_end = r.end;
      for (int i = r.begin * width; i < r.end * width; ++i) applied[i] = next[i];
    }
    applied.resize(next.size());
    EXPECT_EQ(applied, next) << "trial " << trial;
  }
}

// The step's table: the longest row rounded up to 16 entries; padding and
// blocks dropped out of a sliding window are block 0.
TEST(BuildBlockTableTest, WidthRoundedUpPaddingAndDroppedBlocksAreZero) {
  StepPlanMirror::Sequence a, b;
  a.block_table = {7, 8, 9};
  b.block_table.assign(17, 5);
  b.block_table[0] = b.block_table[1] = kDroppedBlock;
  const std::vector<const StepPlanMirror::Sequence*> rows = {&a, &b};
  int width = 0;
  const std::vector<int32_t> t = BuildBlockTable(rows, &width);
  ASSERT_EQ(width, 32);
  ASSERT_EQ(t.size(), 64u);
  std::vector<int32_t> want(64, 0);
  want[0] = 7, want[1] = 8, want[2] = 9;
  for (int j = 2; j < 17; ++j) want[32 + j] = 5;
  EXPECT_EQ(t, want);
  const std::vector<const StepPlanMirror::Sequence*> none;
  EXPECT_TRUE(BuildBlockTable(none, &width).empty());
  EXPECT_EQ(width, 16);
}

}  // namespace
}  // namespace pagedserve
