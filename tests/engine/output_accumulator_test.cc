// OutputAccumulator (runtime/engine/output_accumulator.h): the one rule by
// which every front end turns engine outputs into completions, finish reasons,
// usage and timings. Pure logic, no engine.
#include "runtime/engine/output_accumulator.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace pagedserve {
namespace {

SequenceDelta Delta(int32_t index, std::string text, std::vector<int32_t> ids,
                    FinishReason finished = FinishReason::kNone) {
  SequenceDelta d;
  d.index = index;
  d.text = std::move(text);
  d.token_ids = std::move(ids);
  if (finished != FinishReason::kNone) {
    d.finished = true;
    d.finish_reason = finished;
  }
  return d;
}

EngineOutput Output(std::string id, std::vector<SequenceDelta> deltas) {
  EngineOutput out;
  out.request_id = std::move(id);
  out.deltas = std::move(deltas);
  return out;
}

EngineOutput Final(std::string id, std::vector<SequenceDelta> deltas, Usage usage,
                   absl::Status error = absl::OkStatus()) {
  EngineOutput out = Output(std::move(id), std::move(deltas));
  out.finished = true;
  out.usage = usage;
  out.error = std::move(error);
  return out;
}

TEST(OutputAccumulatorTest, PromptsAndSamplesMapToChoicesAndAccumulate) {
  OutputAccumulator acc({"a", "b"}, 2);
  ASSERT_EQ(acc.completions().size(), 4u);
  EXPECT_LT(acc.first_token_s(), 0);
  std::vector<CompletionNews> news;
  EngineOutput out = Output("b", {Delta(1, "he", {7}), Delta(0, "", {})});
  out.deltas[0].logprobs = {-0.5f};
  out.deltas[0].top_token_ids = {{7, 3}};
  out.deltas[0].top_logprobs = {{-0.5f, -1.5f}};
  ASSERT_TRUE(acc.Apply(out, &news));
  // Only the completion with news; prompt "b" (p = 1), sample 1 -> choice 3.
  ASSERT_EQ(news.size(), 1u);
  EXPECT_EQ(news[0].choice, 3);
  EXPECT_EQ(news[0].delta.text, "he");
  EXPECT_EQ(news[0].delta.logprobs, std::vector<float>{-0.5f});
  EXPECT_EQ(news[0].delta.finish_reason, FinishReason::kNone);
  EXPECT_GE(acc.first_token_s(), 0);
  EXPECT_TRUE(acc.produced_output());

  news.clear();
  ASSERT_TRUE(acc.Apply(Output("b", {Delta(1, "llo", {8, 9}, FinishReason::kStop)}), &news));
  ASSERT_EQ(news.size(), 1u);
  EXPECT_EQ(news[0].delta.text, "llo");  // the news, not the whole text
  EXPECT_EQ(news[0].delta.finish_reason, FinishReason::kStop);
  const CompletionOutput& c = acc.completions()[3];
  EXPECT_EQ(c.text, "hello");
  EXPECT_EQ(c.token_ids, (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(c.logprobs, std::vector<float>{-0.5f});
  EXPECT_EQ(c.top_token_ids, (std::vector<std::vector<int32_t>>{{7, 3}}));
  EXPECT_EQ(c.finish_reason, FinishReason::kStop);
  EXPECT_EQ(acc.completions()[0].text, "");
  EXPECT_FALSE(acc.done());
}

TEST(OutputAccumulatorTest, FinalOutputsSumUsageAndApplyTheEndedWithRequestRule) {
  OutputAccumulator acc({"a", "b"}, 2);
  ASSERT_TRUE(acc.Apply(Final("a", {Delta(0, "x", {1}, FinishReason::kLength)}, {3, 2, 1})));
  // Sample 1 of "a" never reported a reason and "a" ended without an error:
  // it ended with the request (an abort).
  EXPECT_EQ(acc.completions()[0].finish_reason, FinishReason::kLength);
  EXPECT_EQ(acc.completions()[1].finish_reason, FinishReason::kAbort);
  EXPECT_FALSE(acc.done());
  EXPECT_TRUE(acc.error().ok());

  const absl::Status failed = absl::InternalError("worker lost");
  ASSERT_TRUE(acc.Apply(Final("b", {Delta(1, "y", {2}, FinishReason::kStop)}, {4, 1, 0}, failed)));
  EXPECT_EQ(acc.completions()[2].finish_reason, FinishReason::kError);  // ended with a failure
  EXPECT_EQ(acc.completions()[3].finish_reason, FinishReason::kStop);   // a reported reason stands
  EXPECT_TRUE(acc.done());
  EXPECT_EQ(acc.error(), failed);
  EXPECT_EQ(acc.usage().prompt_tokens, 7);
  EXPECT_EQ(acc.usage().completion_tokens, 3);
  EXPECT_EQ(acc.usage().cached_prompt_tokens, 1);
}

TEST(OutputAccumulatorTest, KeepsTheFirstError) {
  OutputAccumulator acc({"a", "b"}, 1);
  ASSERT_TRUE(acc.Apply(Final("a", {}, {}, absl::ResourceExhaustedError("first"))));
  ASSERT_TRUE(acc.Apply(Final("b", {}, {}, absl::InternalError("second"))));
  EXPECT_EQ(acc.error().message(), "first");
}

TEST(OutputAccumulatorTest, UnknownRequestAndOutOfRangeIndicesChangeNothing) {
  OutputAccumulator acc({"a"}, 1);
  std::vector<CompletionNews> news;
  EXPECT_FALSE(
      acc.Apply(Final("other", {Delta(0, "z", {5}, FinishReason::kStop)}, {1, 1, 0}), &news));
  EXPECT_TRUE(news.empty());
  EXPECT_FALSE(acc.done());
  EXPECT_EQ(acc.usage().prompt_tokens, 0);
  ASSERT_TRUE(acc.Apply(Output("a", {Delta(1, "z", {5}), Delta(-1, "z", {5})}), &news));
  EXPECT_TRUE(news.empty());
  EXPECT_EQ(acc.completions()[0].text, "");
  EXPECT_FALSE(acc.produced_output());
}

TEST(OutputAccumulatorTest, RefusedBeforeRunningProducedNoOutput) {
  OutputAccumulator acc({"a"}, 2);
  ASSERT_TRUE(acc.Apply(Final("a", {}, {}, absl::InvalidArgumentError("prompt too long"))));
  EXPECT_TRUE(acc.done());
  EXPECT_FALSE(acc.produced_output());
  EXPECT_EQ(acc.completions()[0].finish_reason, FinishReason::kError);
  EXPECT_EQ(acc.completions()[1].finish_reason, FinishReason::kError);
}

TEST(OutputAccumulatorTest, OnlySubmittedRequestsAreAwaited) {
  OutputAccumulator acc({"a", "b", "c"}, 1);
  acc.KeepSubmitted(1);  // "b" failed to submit; "c" never was
  EXPECT_EQ(acc.engine_ids(), std::vector<std::string>{"a"});
  EXPECT_FALSE(acc.Apply(Final("b", {}, {})));
  ASSERT_TRUE(acc.Apply(Final("a", {Delta(0, "ok", {1}, FinishReason::kStop)}, {1, 1, 0})));
  EXPECT_TRUE(acc.done());
}

TEST(OutputAccumulatorTest, BeamSearchKeepsTheCumulativeLogprob) {
  OutputAccumulator acc({"a"}, 2);
  EngineOutput out = Final(
      "a", {Delta(0, "p", {1}, FinishReason::kStop), Delta(1, "q", {2}, FinishReason::kLength)},
      {1, 2, 0});
  out.deltas[0].cumulative_logprob = -1.25;
  std::vector<CompletionNews> news;
  ASSERT_TRUE(acc.Apply(out, &news));
  EXPECT_EQ(acc.completions()[0].cumulative_logprob, -1.25);
  EXPECT_FALSE(acc.completions()[1].cumulative_logprob.has_value());
  ASSERT_EQ(news.size(), 2u);
  EXPECT_EQ(news[0].delta.cumulative_logprob, -1.25);
}

}  // namespace
}  // namespace pagedserve
