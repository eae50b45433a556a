// RouteTokens (runtime/worker/moe_routing.h) against a double-precision naive
// routing: softmax over all experts, top-k by probability (ties to the lower
// index), weights renormalised or not; the grouping by expert; non-finite
// rows (their token alone poisoned) and a bad configuration.
#include "runtime/worker/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

MoeConfig Moe(int experts, int top_k, bool norm) {
  MoeConfig m;
  m.num_experts = experts;
  m.top_k = top_k;
  m.expert_intermediate_size = 1;
  m.norm_topk_prob = norm;
  return m;
}

// The naive routing of one token in double.
void Naive(const float* logits, const MoeConfig& moe, std::vector<int32_t>* experts,
           std::vector<double>* weights) {
  const int n = moe.num_experts;
  double mx = -INFINITY, sum = 0;
  for (int e = 0; e < n; ++e) mx = std::max(mx, static_cast<double>(logits[e]));
  std::vector<double> p(n);
  for (int e = 0; e < n; ++e) sum += p[e] = std::exp(logits[e] - mx);
  for (double& v : p) v /= sum;
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  experts->assign(order.begin(), order.begin() + moe.top_k);
  double top = 0;
  for (int j = 0; j < moe.top_k; ++j) top += p[order[j]];
  weights->clear();
  for (int j = 0; j < moe.top_k; ++j)
    weights->push_back(moe.norm_topk_prob ? p[order[j]] / top : p[order[j]]);
}

TEST(MoeRoutingTest, MatchesNaiveDoubleRoutingAndGroupsByExpert) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  for (const MoeConfig& moe :
       {Moe(8, 2, true), Moe(8, 2, false), Moe(128, 8, true), Moe(5, 1, true), Moe(4, 4, false)}) {
    const int64_t n = 37;
    std::vector<float> logits(n * moe.num_experts);
    for (float& v : logits) v = dist(rng);
    MoeRouting r;
    ASSERT_TRUE(RouteTokens(logits.data(), n, moe, &r).ok());
    ASSERT_EQ(r.experts.size(), static_cast<size_t>(n * moe.top_k));
    std::vector<int32_t> want_e;
    std::vector<double> want_w;
    for (int64_t t = 0; t < n; ++t) {
      Naive(logits.data() + t * moe.num_experts, moe, &want_e, &want_w);
      double sum = 0;
      for (int j = 0; j < moe.top_k; ++j) {
        EXPECT_EQ(r.experts[t * moe.top_k + j], want_e[j]) << "token " << t << " slot " << j;
        EXPECT_NEAR(r.weights[t * moe.top_k + j], want_w[j], 2e-6) << "token " << t;
        sum += r.weights[t * moe.top_k + j];
      }
      if (moe.norm_topk_prob) {
        EXPECT_NEAR(sum, 1.0, 1e-6);
      }
      if (!moe.norm_topk_prob && moe.top_k < moe.num_experts) {
        EXPECT_LT(sum, 1.0 - 1e-3);
      }
    }
    // Grouping: every (token, expert, weight) once, tokens ascending per expert.
    ASSERT_EQ(r.offsets.size(), static_cast<size_t>(moe.num_experts) + 1);
    EXPECT_EQ(r.offsets.front(), 0);
    EXPECT_EQ(r.offsets.back(), n * moe.top_k);
    for (int e = 0; e < moe.num_experts; ++e) {
      for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
        const int32_t t = r.tokens[i];
        if (i > r.offsets[e]) {
          EXPECT_LT(r.tokens[i - 1], t);
        }
        const auto* row = r.experts.data() + t * moe.top_k;
        const auto* at = std::find(row, row + moe.top_k, e);
        ASSERT_NE(at, row + moe.top_k)
            << "token " << t << " grouped under an expert it did not choose";
        EXPECT_EQ(r.token_weights[i], r.weights[t * moe.top_k + (at - row)]);
      }
    }
  }
}

TEST(MoeRoutingTest, TiesGoToTheLowerIndex) {
  const MoeConfig moe = Moe(4, 2, true);
  const std::vector<float> logits = {1.0f, 3.0f, 1.0f, 3.0f};
  MoeRouting r;
  ASSERT_TRUE(RouteTokens(logits.data(), 1, moe, &r).ok());
  EXPECT_EQ(r.experts, (std::vector<int32_t>{1, 3}));
  EXPECT_FLOAT_EQ(r.weights[0], 0.5f);
}

// A row whose softmax is no distribution (NaN, +inf, every logit -inf) is
// not an error of the step: its token alone gets experts 0..k-1 with NaN
// weights (its output NaN, for the sampler to fail its sequence), the other
// tokens route as they would alone, and the grouping stays whole.
TEST(MoeRoutingTest, NonFiniteRowPoisonsOnlyItsToken) {
  const MoeConfig moe = Moe(4, 2, true);
  const float kInf = INFINITY;
  const std::vector<float> logits = {
      0.5f,  3.0f,  -1.0f, 2.0f,   // token 0: finite
      0.0f,  NAN,   1.0f,  2.0f,   // token 1: a NaN
      1.0f,  2.0f,  kInf,  0.0f,   // token 2: +inf
      -kInf, -kInf, -kInf, -kInf,  // token 3: every logit -inf
      2.0f,  -kInf, 4.0f,  1.0f,   // token 4: finite with a -inf (a valid distribution)
  };
  MoeRouting r;
  ASSERT_TRUE(RouteTokens(logits.data(), 5, moe, &r).ok());
  for (int64_t t : {0, 4}) {
    MoeRouting alone;
    ASSERT_TRUE(RouteTokens(logits.data() + t * 4, 1, moe, &alone).ok());
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(r.experts[t * 2 + j], alone.experts[j]) << "token " << t;
      EXPECT_EQ(r.weights[t * 2 + j], alone.weights[j]) << "token " << t;
      EXPECT_TRUE(std::isfinite(r.weights[t * 2 + j])) << "token " << t;
    }
  }
  EXPECT_EQ(r.experts[0], 1);
  EXPECT_EQ(r.experts[8], 2);
  for (int64_t t : {1, 2, 3}) {
    for (int j = 0; j < 2; ++j) {
      EXPECT_EQ(r.experts[t * 2 + j], j) << "token " << t;
      EXPECT_TRUE(std::isnan(r.weights[t * 2 + j])) << "token " << t;
    }
  }
  ASSERT_EQ(r.offsets.size(), 5u);
  EXPECT_EQ(r.offsets.back(), 10);
  ASSERT_EQ(r.tokens.size(), 10u);
  for (int e = 0; e < 4; ++e) {
    for (int64_t i = r.offsets[e]; i < r.offsets[e + 1]; ++i) {
      const int32_t t = r.tokens[i];
      const bool chose = r.experts[t * 2] == e || r.experts[t * 2 + 1] == e;
      EXPECT_TRUE(chose) << "token " << t << " grouped under expert " << e;
      EXPECT_EQ(std::isnan(r.token_weights[i]), t >= 1 && t <= 3) << "token " << t;
    }
  }
}

TEST(MoeRoutingTest, BadConfigIsRefused) {
  MoeRouting r;
  const std::vector<float> ok = {0.0f, 1.0f, 2.0f};
  EXPECT_EQ(RouteTokens(ok.data(), 1, Moe(3, 4, true), &r).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RouteTokens(ok.data(), 1, Moe(0, 0, true), &r).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagedserve
