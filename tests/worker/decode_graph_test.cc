// Decode steps padded to captured shapes (runtime/worker/decode_graph.h) and
// the forward pass's BeginBody / EndBody protocol, on the CPU: the bucket
// rules and the padding by hand, and the random-weight Llama run through a
// backend that behaves as a CUDA graph does (CaptureBackend in
// decode_graph_harness.h: capture
// records the body's operations without running them, EndBody runs the
// recording, later steps of the key replay it with the arguments of the
// capture) against the same model run eagerly. A replay that read anything
// of the capture step other than what a CUDA graph keeps (the buffers and
// launch sizes) would give other logits; the broken variants show the check
// can fail.
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/worker/decode_graph.h"
#include "tests/worker/decode_graph_harness.h"

namespace pagedserve {
namespace {

using testing::BatchVectors;
using testing::Fault;
using testing::MakeRun;
using testing::MaxAbsDiff;
using testing::ModelRun;
using testing::Part;
using testing::RunSchedule;
using testing::Schedule;
using testing::ScheduleDiff;
using testing::Step;
using testing::TestModel;

TEST(DecodeGraphTest, BatchBucketsAreVllmCaptureSizes) {
  const std::vector<std::pair<int, int>> cases = {
      {1, 1}, {2, 2}, {3, 4}, {4, 4}, {5, 8}, {8, 8}, {9, 16}, {17, 24}, {255, 256}, {256, 256}};
  for (const auto& [n, want] : cases) EXPECT_EQ(DecodeGraphBatchBucket(n), want) << n;
}

TEST(DecodeGraphTest, ContextBucketsGrowByHalfAtMostAndRoundToBlocks) {
  EXPECT_EQ(DecodeGraphContextBucket(2, 16, 8192), 256);
  EXPECT_EQ(DecodeGraphContextBucket(256, 16, 8192), 256);
  EXPECT_EQ(DecodeGraphContextBucket(257, 16, 8192), 384);
  EXPECT_EQ(DecodeGraphContextBucket(385, 16, 8192), 512);
  EXPECT_EQ(DecodeGraphContextBucket(513, 16, 8192), 768);
  EXPECT_EQ(DecodeGraphContextBucket(4097, 16, 8192), 6144);
  EXPECT_EQ(DecodeGraphContextBucket(8192, 16, 8192), 8192);
  // The cap wins, rounded up to whole blocks.
  EXPECT_EQ(DecodeGraphContextBucket(4500, 16, 5000), 5008);
  EXPECT_EQ(DecodeGraphContextBucket(100, 32, 200), 224);
  for (int len = 1; len <= 9000; len += 37) {
    const int b = DecodeGraphContextBucket(len, 16, 9000);
    EXPECT_GE(b, len);
    EXPECT_EQ(b % 16, 0);
    if (len > 256 && b < 9000) {
      EXPECT_LE(b, len * 3 / 2 + 16) << len;
    }
  }
}

// A decode batch of `lens.size()` sequences, block table width `width`.
BatchVectors DecodeBatch(const std::vector<int32_t>& lens, int width) {
  BatchVectors b;
  b.width = width;
  b.lens = lens;
  for (size_t s = 0; s < lens.size(); ++s) {
    b.ids.push_back(static_cast<int32_t>(100 + s));
    b.pos.push_back(lens[s] - 1);
    b.slots.push_back(static_cast<int64_t>(s) * 1000 + lens[s] - 1);
    b.qsl.push_back(static_cast<int32_t>(s + 1));
    b.rows.push_back(static_cast<int32_t>(s));
    for (int i = 0; i < width; ++i) b.tables.push_back(static_cast<int32_t>(s * 100 + i + 1));
  }
  return b;
}

TEST(DecodeGraphTest, ChoosesOnlyPureDecodeStepsWithinTheLimits) {
  const DecodeGraphOptions on;
  BatchVectors b = DecodeBatch({40, 300, 7}, 20);
  auto key = ChooseDecodeGraph(b.view(), 16, on);
  ASSERT_TRUE(key.has_value());
  EXPECT_EQ(key->batch, 4);
  EXPECT_EQ(key->context, 384);

  DecodeGraphOptions eager;
  eager.enforce_eager = true;
  EXPECT_FALSE(ChooseDecodeGraph(b.view(), 16, eager).has_value());
  DecodeGraphOptions short_capture;
  short_capture.max_seq_len_to_capture = 299;
  EXPECT_FALSE(ChooseDecodeGraph(b.view(), 16, short_capture).has_value());
  DecodeGraphOptions small_batch;
  small_batch.max_batch = 2;
  EXPECT_FALSE(ChooseDecodeGraph(b.view(), 16, small_batch).has_value());

  BatchVectors prompt = DecodeBatch({40, 1, 7}, 20);  // a one-token prompt is a prefill
  EXPECT_FALSE(ChooseDecodeGraph(prompt.view(), 16, on).has_value());
  BatchVectors unsampled = DecodeBatch({40, 30, 7}, 20);
  unsampled.rows.pop_back();
  EXPECT_FALSE(ChooseDecodeGraph(unsampled.view(), 16, on).has_value());
  BatchVectors reordered = DecodeBatch({40, 30, 7}, 20);
  std::swap(reordered.rows[0], reordered.rows[1]);
  EXPECT_FALSE(ChooseDecodeGraph(reordered.view(), 16, on).has_value());
  BatchVectors chunk = DecodeBatch({40, 30}, 20);  // a two-token chunk
  chunk.ids.push_back(1);
  chunk.pos.push_back(30);
  chunk.slots.push_back(31);
  chunk.qsl.back() = 3;
  chunk.rows.back() = 2;
  EXPECT_FALSE(ChooseDecodeGraph(chunk.view(), 16, on).has_value());
}

TEST(DecodeGraphTest, PaddingKeepsRealRowsAndAddsInertSequences) {
  BatchVectors b = DecodeBatch({40, 300, 7}, 30);
  const DecodeGraphKey key{4, 384};
  PaddedDecodeBatch padded;
  padded.Pad(b.view(), key, 16);
  const ForwardBatch& p = padded.batch();
  ASSERT_EQ(p.num_seqs(), 4);
  ASSERT_EQ(p.num_tokens(), 4);
  EXPECT_EQ(p.max_blocks_per_seq, 24);
  ASSERT_EQ(p.block_tables.size(), 4u * 24);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(p.token_ids[s], b.ids[s]);
    EXPECT_EQ(p.positions[s], b.pos[s]);
    EXPECT_EQ(p.slot_mapping[s], b.slots[s]);
    EXPECT_EQ(p.seq_lens[s], b.lens[s]);
    for (int i = 0; i < 24; ++i) EXPECT_EQ(p.block_tables[s * 24 + i], s * 100 + i + 1);
  }
  EXPECT_EQ(p.token_ids[3], 0);
  EXPECT_EQ(p.positions[3], 0);
  EXPECT_EQ(p.slot_mapping[3], -1);
  EXPECT_EQ(p.seq_lens[3], 1);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(p.block_tables[3 * 24 + i], 0);
  for (int s = 0; s <= 4; ++s) EXPECT_EQ(p.query_start_loc[s], s);
  for (int s = 0; s < 4; ++s) EXPECT_EQ(p.logits_rows[s], s);

  // A narrower table than the bucket is zero-padded.
  BatchVectors narrow = DecodeBatch({40, 30}, 3);
  padded.Pad(narrow.view(), DecodeGraphKey{2, 256}, 16);
  ASSERT_EQ(padded.batch().max_blocks_per_seq, 16);
  EXPECT_EQ(padded.batch().block_tables[16 + 2], 103);
  EXPECT_EQ(padded.batch().block_tables[16 + 3], 0);
}

TEST(DecodeGraphTest, ReplayedDecodeStepsMatchEagerSteps) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  const Schedule eager = RunSchedule(path, false, Fault::kNone);
  ASSERT_EQ(eager.logits.size(), 24u);
  const Schedule graphed = RunSchedule(path, true, Fault::kNone);
  // Keys (batch, context): (4, 256) for steps 0-7, (8, 256) for 8-19,
  // (8, 384) for 20-23: one warm-up and one capture each, the rest replays.
  EXPECT_EQ(graphed.warmups, 3);
  EXPECT_EQ(graphed.captures, 3);
  EXPECT_EQ(graphed.replays, 24 - 6);
  EXPECT_EQ(graphed.failed_captures, 0);
  // The padded rows must not change the real ones: the CPU kernels compute
  // each row alone, so the logits agree to the last bit.
  EXPECT_EQ(ScheduleDiff(graphed, eager), 0.0);
}

TEST(DecodeGraphTest, AFailedCaptureRunsTheStepEagerly) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  const Schedule eager = RunSchedule(path, false, Fault::kNone);
  const Schedule failing = RunSchedule(path, true, Fault::kCaptureFails);
  EXPECT_EQ(failing.failed_captures, 3);
  EXPECT_EQ(failing.replays, 0);
  EXPECT_EQ(ScheduleDiff(failing, eager), 0.0);
}

TEST(DecodeGraphTest, BrokenReplaysAreCaught) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  const Schedule eager = RunSchedule(path, false, Fault::kNone);
  for (Fault f : {Fault::kNoLaunchAfterCapture, Fault::kReplayRunsNothing}) {
    SCOPED_TRACE(static_cast<int>(f));
    const Schedule broken = RunSchedule(path, true, f);
    EXPECT_GT(ScheduleDiff(broken, eager), 1e-3);
  }
}

// A step with a block id outside the pool fails with the attention's
// InvalidArgument whether it runs eagerly, is captured or would replay, and
// the steps after it are unaffected.
TEST(DecodeGraphTest, BadBlockTablesFailTheStepInEveryMode) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  std::vector<std::vector<float>> good[2];
  for (int graphs = 0; graphs < 2; ++graphs) {
    ModelRun r = MakeRun(path, graphs == 1, Fault::kNone);
    ASSERT_NE(r.model, nullptr);
    std::vector<float> logits;
    for (int s = 0; s < 2; ++s) ASSERT_TRUE(Step(r, {Part{s, 0, {5, 6, 7, 8}}}, &logits).ok());
    int len = 4;
    // Steps: warm-up, capture, replay, replay; the bad one at each position.
    for (int step = 0; step < 8; ++step) {
      const bool bad = step % 2 == 1;
      std::vector<Part> parts = {Part{0, len, {9}}, Part{1, len, {10}}};
      const absl::Status st = Step(r, parts, &logits, bad);
      if (bad) {
        EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
        continue;
      }
      ASSERT_TRUE(st.ok()) << st;
      good[graphs].push_back(logits);
      ++len;
    }
    if (r.capture != nullptr) {
      EXPECT_GT(r.capture->replays, 0);
    }
  }
  ASSERT_EQ(good[0].size(), good[1].size());
  for (size_t i = 0; i < good[0].size(); ++i) EXPECT_EQ(MaxAbsDiff(good[0][i], good[1][i]), 0.0);
}

// Cache views whose head layout is not this rank's shard are refused with
// InvalidArgument before any operation runs (the CPU kernels would read the
// step's keys past their rows), and the model keeps serving.
TEST(DecodeGraphTest, CacheViewsOfAnotherHeadLayoutAreRefused) {
  const char* path = TestModel();
  ASSERT_NE(path, nullptr) << "PAGEDSERVE_TEST_MODEL is not set";
  for (bool graphs : {false, true}) {
    ModelRun r = MakeRun(path, graphs, Fault::kNone);
    ASSERT_NE(r.model, nullptr);
    const std::vector<kernels::KVCacheView> good = r.views;
    std::vector<float> logits;
    for (int what = 0; what < 2; ++what) {
      r.views = good;
      kernels::KVCacheShape& shape = r.views.back().shape;
      if (what == 0) {
        shape.num_kv_heads *= 2;
      } else {
        shape.head_size /= 2;
      }
      const absl::Status st = Step(r, {Part{0, 0, {5, 6, 7}}}, &logits);
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
      EXPECT_NE(st.message().find("KV heads of"), std::string::npos) << st;
    }
    r.views = good;
    EXPECT_TRUE(Step(r, {Part{0, 0, {5, 6, 7}}}, &logits).ok());
  }
}

}  // namespace
}  // namespace pagedserve
