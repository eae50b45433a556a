// BeamSearch (runtime/coordinator/beam_search.h) on hand-made top lists: the
// rules that the transformers fixture (tests/engine/engine_model_test.cc,
// BeamSearchMatchesTransformers) exercises only where the random model
// happens to hit them.
#include "runtime/coordinator/beam_search.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

constexpr int32_t kEos = 99;

SampledToken Top(std::vector<int32_t> ids, std::vector<float> lps) {
  SampledToken t;
  t.token_id = ids[0];
  t.logprob = lps[0];
  t.top_token_ids = std::move(ids);
  t.top_logprobs = std::move(lps);
  return t;
}

SamplingParams Beam(int k, int n, float lp = 1.0f, EarlyStopping es = EarlyStopping::kFalse) {
  SamplingParams p;
  p.temperature = 0;
  p.use_beam_search = true;
  p.best_of = k;
  p.n = n;
  p.length_penalty = lp;
  p.early_stopping = es;
  return p;
}

bool IsEos(int32_t t) { return t == kEos; }

struct Beam1 {
  std::vector<int32_t> tokens;
  std::vector<float> lps;
  double cum = 0.0;
};

std::vector<BeamInput> Inputs(const std::vector<Beam1>& beams,
                              const std::vector<SampledToken>& sampled) {
  std::vector<BeamInput> in(beams.size());
  for (size_t i = 0; i < beams.size(); ++i) {
    in[i].cumulative_logprob = beams[i].cum;
    in[i].output_tokens = &beams[i].tokens;
    in[i].output_logprobs = &beams[i].lps;
    in[i].sampled = &sampled[i];
  }
  return in;
}

TEST(BeamSearchTest, EndingCandidateOfRankKOrWorseIsNotAHypothesis) {
  BeamSearch bs(Beam(1, 1), 10);
  std::vector<Beam1> beams(1);
  // k = 1: EOS is the second candidate (rank 1 >= k) -> dropped, not finished.
  std::vector<SampledToken> s = {Top({7, kEos}, {-0.1f, -0.2f})};
  auto live = bs.Step(Inputs(beams, s), 0, IsEos);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].token_id, 7);
  EXPECT_TRUE(bs.finished().empty());
  EXPECT_FALSE(bs.done());
  // EOS first (rank 0): a hypothesis of length 2 (the EOS counts), score cum / 2.
  beams[0] = {{7}, {-0.1f}, -0.1};
  s = {Top({kEos, 8}, {-0.5f, -0.6f})};
  live = bs.Step(Inputs(beams, s), 1, IsEos);
  ASSERT_EQ(bs.finished().size(), 1u);
  EXPECT_EQ(bs.finished()[0].token_ids, (std::vector<int32_t>{7, kEos}));
  EXPECT_NEAR(bs.finished()[0].cumulative_logprob, -0.6, 1e-6);
  EXPECT_NEAR(bs.finished()[0].score, -0.3, 1e-6);
  EXPECT_EQ(bs.finished()[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ(bs.finished()[0].stop_token_id, kEos);
  // Heuristic: the best live beam (7, 8: -0.7 / 2 = -0.35) cannot beat -0.3.
  EXPECT_TRUE(bs.done());
  EXPECT_TRUE(live.empty());
}

TEST(BeamSearchTest, CandidatesComeFromEveryBeamAndParentsFork) {
  BeamSearch bs(Beam(2, 2), 10);
  std::vector<Beam1> beams = {{{1}, {-1.0f}, -1.0}, {{2}, {-1.5f}, -1.5}};
  std::vector<SampledToken> s = {Top({3, 4, 5, 6}, {-2.0f, -2.1f, -2.2f, -2.3f}),
                                 Top({7, 8, 9, 10}, {-0.1f, -3.0f, -3.1f, -3.2f})};
  auto live = bs.Step(Inputs(beams, s), 1, IsEos);
  ASSERT_EQ(live.size(), 2u);
  // -1.5 - 0.1 = -1.6 (beam 1, token 7), then -1 - 2 = -3 (beam 0, token 3).
  EXPECT_EQ(live[0].parent, 1);
  EXPECT_EQ(live[0].token_id, 7);
  EXPECT_NEAR(live[0].cumulative_logprob, -1.6, 1e-6);
  EXPECT_EQ(live[1].parent, 0);
  EXPECT_EQ(live[1].token_id, 3);
}

TEST(BeamSearchTest, MaxTokensEndsTheTopKAndLengthPenaltyRanks) {
  // length_penalty 2: score = cum / len^2. At max tokens (2) the top k = 2
  // candidates become hypotheses; the earlier, shorter EOS hypothesis
  // (-0.9 / 1) loses against -1.2 / 4 = -0.3.
  BeamSearch bs(Beam(2, 2, 2.0f), 2);
  std::vector<Beam1> beams(1);
  std::vector<SampledToken> s = {Top({kEos, 5, 6, 7}, {-0.9f, -1.0f, -1.1f, -5.0f})};
  auto live = bs.Step(Inputs(beams, s), 0, IsEos);
  ASSERT_EQ(live.size(), 2u);
  ASSERT_EQ(bs.finished().size(), 1u);
  EXPECT_NEAR(bs.finished()[0].score, -0.9, 1e-6);
  beams = {{{5}, {-1.0f}, -1.0}, {{6}, {-1.1f}, -1.1}};
  s = {Top({11, 12, 13, 14}, {-0.2f, -0.3f, -4.0f, -4.1f}),
       Top({15, 16, 17, 18}, {-0.05f, -4.0f, -4.0f, -4.0f})};
  live = bs.Step(Inputs(beams, s), 1, IsEos);
  EXPECT_TRUE(bs.done());
  std::vector<BeamHypothesis> r = bs.TakeResults();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].token_ids, (std::vector<int32_t>{6, 15}));  // -1.15 / 4
  EXPECT_EQ(r[1].token_ids, (std::vector<int32_t>{5, 11}));  // -1.2 / 4
  EXPECT_EQ(r[0].finish_reason, FinishReason::kLength);
  EXPECT_NEAR(r[0].score, -1.15 / 4, 1e-6);
}

TEST(BeamSearchTest, EarlyStoppingTrueStopsOnceKAreFinished) {
  for (EarlyStopping es : {EarlyStopping::kTrue, EarlyStopping::kNever}) {
    BeamSearch bs(Beam(1, 1, 1.0f, es), 100);
    std::vector<Beam1> beams(1);
    // EOS at rank 0 finishes one hypothesis (-2 / 1); the live beam -2.1 at
    // length 1 cannot beat it, but "never" with length_penalty 1 scores it at
    // 100 tokens (-0.021) and goes on.
    std::vector<SampledToken> s = {Top({kEos, 4}, {-2.0f, -2.1f})};
    bs.Step(Inputs(beams, s), 0, IsEos);
    EXPECT_EQ(bs.done(), es == EarlyStopping::kTrue);
  }
}

TEST(BeamSearchTest, StopTokensBelowRankKAreDroppedAndNoLiveBeamEndsTheSearch) {
  // Step 1: the stop tokens are ranks 2 and 3 (>= k): dropped, nothing
  // finished. Step 2: every candidate ends: no live beam is left, the search
  // ends with the top k candidates as the hypotheses.
  SamplingParams p = Beam(2, 2);
  BeamSearch bs(p, 10);
  std::vector<Beam1> beams(1);
  std::vector<SampledToken> s = {Top({1, 2, 3, 4}, {-0.1f, -0.2f, -0.3f, -0.4f})};
  auto stop34 = [](int32_t t) { return t == 3 || t == 4; };
  auto live = bs.Step(Inputs(beams, s), 0, stop34);
  ASSERT_EQ(live.size(), 2u);
  EXPECT_TRUE(bs.finished().empty());  // 3 and 4 were ranks 2 and 3
  beams = {{{1}, {-0.1f}, -0.1}, {{2}, {-0.2f}, -0.2}};
  auto all_stop = [](int32_t t) { return t >= 50; };
  s = {Top({50, 51, 52, 53}, {-1.0f, -1.1f, -9.0f, -9.1f}),
       Top({54, 55, 56, 57}, {-5.0f, -5.1f, -9.0f, -9.1f})};
  live = bs.Step(Inputs(beams, s), 1, all_stop);
  EXPECT_TRUE(live.empty());
  EXPECT_TRUE(bs.done());
  std::vector<BeamHypothesis> r = bs.TakeResults();
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].token_ids, (std::vector<int32_t>{1, 50}));
  EXPECT_EQ(r[1].token_ids, (std::vector<int32_t>{1, 51}));
}

}  // namespace
}  // namespace pagedserve
