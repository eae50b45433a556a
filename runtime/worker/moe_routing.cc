#include "runtime/worker/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {

// One token's softmax, top-k and weights (moe_routing.h) into experts[top_k]
// and weights[top_k]; `p` is scratch of num_experts floats, `order` of
// num_experts indices. False when the row holds a NaN.
bool RouteOne(const float* logits, const MoeConfig& moe, float* p, int32_t* order, int32_t* experts,
              float* weights) {
  const int e_count = moe.num_experts;
  float mx = -INFINITY;
  for (int e = 0; e < e_count; ++e) {
    if (std::isnan(logits[e])) return false;
    mx = std::max(mx, logits[e]);
  }
  float sum = 0.0f;
  for (int e = 0; e < e_count; ++e) {
    p[e] = std::exp(logits[e] - mx);
    sum += p[e];
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
  return true;
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
    if (!RouteOne(logits + t * e_count, moe, p.data(), order.data(), out->experts.data() + t * k,
                  out->weights.data() + t * k))
      return absl::InvalidArgumentError(
          absl::StrCat("RouteTokens: router logits of token ", t, " hold a NaN"));
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

}  // namespace pagedserve
