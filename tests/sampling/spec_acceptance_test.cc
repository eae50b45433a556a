// Speculative decoding's sampled acceptance (runtime/coordinator/speculative.h)
// against the target distribution: the n-gram draft is a point mass q = δ_x,
// so the rejection rule of Leviathan et al. / Chen et al. accepts x with
// probability p(x) and otherwise samples p with x removed. The scheduler
// implements it as "the worker draws y ~ p with the sampler (every penalty
// and filter applied), the draft token is kept iff y == x, and the step emits
// the target's draws up to and including the first mismatch".
//
// Checked here on a small random distribution shaped by temperature, top-k,
// top-p and a repetition penalty (Sampler::Process gives p): over 100,000
// seeded draws (uniform keyed by (seed = trial, sample 0, position)), the
// first emitted token's empirical distribution equals p by Pearson's
// chi-square at significance 1e-3, the acceptance rate equals p(x) within 4.5
// standard deviations, and given a rejection the emitted token follows p
// without x (chi-square). Negative control: a rule that accepts every draft
// token emits x every time, and the same chi-square test rejects it.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/coordinator/speculative.h"
#include "runtime/sampling/sampler.h"

namespace pagedserve {
namespace {

constexpr int32_t kVocab = 12;
constexpr int kTrials = 100000;

// Upper quantile of chi-square with `df` degrees of freedom at significance
// alpha = 1e-3 (Wilson-Hilferty; within ~1% of the exact value for df >= 3).
double ChiSquareCritical(int df) {
  const double z = 3.090232;  // standard normal upper 1e-3 quantile
  const double k = df;
  const double t = 1.0 - 2.0 / (9.0 * k) + z * std::sqrt(2.0 / (9.0 * k));
  return k * t * t * t;
}

// Pearson's statistic of `counts` (over the support's token ids) against
// probabilities `probs` for `n` draws; draws outside the support count as an
// infinite statistic.
double ChiSquare(const std::vector<int64_t>& counts, const ProcessedDistribution& d,
                 const std::vector<double>& probs, int64_t n) {
  double stat = 0;
  int64_t inside = 0;
  for (size_t i = 0; i < d.token_ids.size(); ++i) {
    const double expected = probs[i] * static_cast<double>(n);
    const double c = static_cast<double>(counts[d.token_ids[i]]);
    inside += counts[d.token_ids[i]];
    if (expected > 0) stat += (c - expected) * (c - expected) / expected;
  }
  return inside == n ? stat : INFINITY;
}

class SpecAcceptanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.5f);
    for (int32_t v = 0; v < kVocab; ++v) logits_.push_back(normal(rng));
    params_.temperature = 0.9f;
    params_.top_k = 9;
    params_.top_p = 0.97f;
    params_.repetition_penalty = 1.3f;
    history_ = {1, 2, 3, 3, 5};
    row_.params = &params_;
    row_.token_history = history_;
    row_.prompt_len = 3;
    row_.position = static_cast<int64_t>(history_.size());
    auto d = sampler_.Process(logits_, row_);
    ASSERT_TRUE(d.ok()) << d.status();
    dist_ = *d;
    ASSERT_GE(dist_.token_ids.size(), 5u);
    // The draft: the second most likely token (accepted often, not always).
    draft_ = dist_.token_ids[1];
    p_draft_ = dist_.probs[1];
  }

  // The first emitted token of a one-token draft over kTrials seeded trials,
  // with the scheduler's rule (or, accept_all, the broken one).
  void Run(bool accept_all, std::vector<int64_t>* emitted, std::vector<int64_t>* after_reject,
           int64_t* accepted) {
    emitted->assign(kVocab, 0);
    after_reject->assign(kVocab, 0);
    *accepted = 0;
    for (int t = 0; t < kTrials; ++t) {
      params_.seed = static_cast<uint64_t>(t);
      auto y = sampler_.Sample(logits_, std::span<const SamplerRow>(&row_, 1));
      ASSERT_TRUE(y.ok()) << y.status();
      const int32_t target[1] = {(*y)[0].token_id};
      const int32_t draft[1] = {draft_};
      const int32_t a = accept_all ? 1 : AcceptedDraftLength(draft, target);
      // Emitted: the accepted drafts, then the target's sample at the first
      // mismatch; the first emitted token is the draft when accepted.
      const int32_t first = a > 0 ? draft_ : target[0];
      ++(*emitted)[first];
      *accepted += a;
      if (a == 0) ++(*after_reject)[first];
    }
  }

  Sampler sampler_{kVocab};
  std::vector<float> logits_;
  SamplingParams params_;
  std::vector<int32_t> history_;
  SamplerRow row_;
  ProcessedDistribution dist_;
  int32_t draft_ = 0;
  double p_draft_ = 0;
};

TEST_F(SpecAcceptanceTest, EmittedTokenFollowsTheTargetDistribution) {
  std::vector<int64_t> emitted, after_reject;
  int64_t accepted = 0;
  Run(/*accept_all=*/false, &emitted, &after_reject, &accepted);
  const int df = static_cast<int>(dist_.token_ids.size()) - 1;
  const double stat = ChiSquare(emitted, dist_, dist_.probs, kTrials);
  EXPECT_LT(stat, ChiSquareCritical(df)) << "df " << df;
  // P(accept) = p(x).
  const double sd = std::sqrt(p_draft_ * (1 - p_draft_) * kTrials);
  EXPECT_NEAR(static_cast<double>(accepted), p_draft_ * kTrials, 4.5 * sd);
  // Given a rejection: p without x, renormalized.
  std::vector<double> residual = dist_.probs;
  residual[1] = 0;
  for (double& q : residual) q /= 1.0 - p_draft_;
  const int64_t rejected = kTrials - accepted;
  EXPECT_LT(ChiSquare(after_reject, dist_, residual, rejected), ChiSquareCritical(df - 1));
  std::printf("p(draft) %.4f, accepted %lld / %d, chi-square %.2f (critical %.2f, df %d)\n",
              p_draft_, static_cast<long long>(accepted), kTrials, stat, ChiSquareCritical(df), df);
}

TEST_F(SpecAcceptanceTest, NegativeControlAcceptingEveryDraftFails) {
  std::vector<int64_t> emitted, after_reject;
  int64_t accepted = 0;
  Run(/*accept_all=*/true, &emitted, &after_reject, &accepted);
  const int df = static_cast<int>(dist_.token_ids.size()) - 1;
  EXPECT_GT(ChiSquare(emitted, dist_, dist_.probs, kTrials), ChiSquareCritical(df));
}

}  // namespace
}  // namespace pagedserve
