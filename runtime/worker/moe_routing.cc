#include "runtime/worker/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {

// One token's softmax, top-k and weights (moe_routing.h) into experts[top_k]
// and weights[top_k]; `p` is scratch of num_experts floats, `order` of
// num_experts indices. A row whose softmax is not a distribution (a NaN or
// +inf logit, or every logit -inf) routes the token to experts 0..top_k-1
// with NaN weights (moe_routing.h).
void RouteOne(const float* logits, const MoeConfig& moe, float* p, int32_t* order, int32_t* experts,
              float* weights) {
  const int e_count = moe.num_experts;
  float mx = -INFINITY;
  for (int e = 0; e < e_count; ++e) mx = std::max(mx, logits[e]);
  float sum = 0.0f;
  for (int e = 0; e < e_count; ++e) {
    p[e] = std::exp(logits[e] -
                    mx);  // NaN for a NaN logit; with mx = +inf, NaN at the +inf logits (sum NaN)
    sum += p[e];
  }
  if (!(sum >= 1.0f)) {  // a finite row's maximum alone gives exp(0) = 1
    for (int j = 0; j < moe.top_k; ++j) {
      experts[j] = j;
      weights[j] = std::numeric_limits<float>::quiet_NaN();
    }
    return;
  }
  for (int e = 0; e < e_count; ++e) p[e] /= sum;
  std::iota(order, order + e_count, 0);
  std::partial_sort(order, order + moe.top_k, order + e_count,
                    [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
  float top_sum = 0.0f;
  for (int j = 0; j < moe.top_k; ++j) top_sum += p[order[j]];
  for (int j = 0; j < moe.top_k; ++j) {
    experts[j] = order[j];
    weights[j] = moe.norm_topk_prob ? p[order[j]] / top_sum : p[order[j]];
  }
}

}  // namespace

absl::Status RouteTokens(const float* logits, int64_t n, const MoeConfig& moe, MoeRouting* out) {
  if (!moe.enabled() || moe.top_k < 1 || moe.top_k > moe.num_experts)
    return absl::InvalidArgumentError(
        absl::StrCat("RouteTokens: top_k ", moe.top_k, " of ", moe.num_experts, " experts"));
  const int k = moe.top_k, e_count = moe.num_experts;
  out->num_tokens = n;
  out->top_k = k;
  out->num_experts = e_count;
  out->experts.resize(static_cast<size_t>(n) * k);
  out->weights.resize(static_cast<size_t>(n) * k);
  std::vector<float> p(e_count);
  std::vector<int32_t> order(e_count);
  for (int64_t t = 0; t < n; ++t) {
    RouteOne(logits + t * e_count, moe, p.data(), order.data(), out->experts.data() + t * k,
             out->weights.data() + t * k);
  }
  // Counting sort by expert (tokens stay ascending within an expert).
  out->offsets.assign(static_cast<size_t>(e_count) + 1, 0);
  for (int32_t e : out->experts) ++out->offsets[e + 1];
  for (int e = 0; e < e_count; ++e) out->offsets[e + 1] += out->offsets[e];
  out->tokens.resize(out->experts.size());
  out->token_weights.resize(out->experts.size());
  std::vector<int64_t> next(out->offsets.begin(), out->offsets.end() - 1);
  for (int64_t t = 0; t < n; ++t) {
    for (int j = 0; j < k; ++j) {
      const int64_t at = next[out->experts[t * k + j]]++;
      out->tokens[at] = static_cast<int32_t>(t);
      out->token_weights[at] = out->weights[t * k + j];
    }
  }
  return absl::OkStatus();
}

void TokenPairPositions(const MoeRouting& r, int32_t* out) {
  // The grouping is by expert, tokens ascending within one: a scan visits
  // each token's pairs in ascending expert order.
  std::vector<int> fill(static_cast<size_t>(r.num_tokens), 0);
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    const int32_t t = r.tokens[i];
    out[static_cast<int64_t>(t) * r.top_k + fill[static_cast<size_t>(t)]++] =
        static_cast<int32_t>(i);
  }
}

}  // namespace pagedserve
