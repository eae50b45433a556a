// The host-side parts of the backend seam (model_backend.h): the greedy
// reduction every backend shares the rule of.
#include "runtime/worker/model_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pagedserve {

int32_t GreedyArgmax(const float* row, int64_t vocab) {
  int64_t best = -1;
  float best_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i) {
    const float v = row[i];
    if (std::isnan(v) || v == std::numeric_limits<float>::infinity()) return -1;
    if (v > best_v) {
      best_v = v;
      best = i;
    }
  }
  return static_cast<int32_t>(best);  // -1 when every value is -inf
}

void SplitGreedyRows(const std::vector<float>& all, int64_t n, int64_t vocab,
                     std::span<const uint8_t> greedy, std::vector<int32_t>* argmax,
                     std::vector<float>* logits) {
  argmax->assign(static_cast<size_t>(n), -1);
  logits->clear();
  for (int64_t t = 0; t < n; ++t) {
    const float* row = all.data() + t * vocab;
    if (greedy[t] != 0) (*argmax)[t] = GreedyArgmax(row, vocab);
    if ((*argmax)[t] < 0) logits->insert(logits->end(), row, row + vocab);
  }
}

absl::Status ModelBackend::RopeAndAttention(const kernels::KVCacheView& cache, int64_t n,
                                            int num_heads, float* q, float* k, float* v,
                                            float* out) {
  const int D = cache.shape.head_size;
  const int kv_heads = cache.shape.num_kv_heads;
  absl::Status s = ApplyRope(q, n, num_heads, D, static_cast<int64_t>(num_heads) * D);
  if (s.ok()) s = ApplyRope(k, n, kv_heads, D, static_cast<int64_t>(kv_heads) * D);
  if (s.ok()) s = Attention(cache, num_heads, q, k, v, out);
  return s;
}

absl::Status ModelBackend::LmHeadGreedy(const float* x, int64_t n, const BackendMatrix& w,
                                        std::span<const uint8_t> greedy,
                                        std::vector<int32_t>* argmax, std::vector<float>* logits) {
  if (std::none_of(greedy.begin(), greedy.end(), [](uint8_t g) { return g != 0; })) {
    absl::Status s = LmHead(x, n, w, logits);  // every row's logits, as they are
    if (s.ok()) argmax->assign(static_cast<size_t>(n), -1);
    return s;
  }
  absl::Status s = LmHead(x, n, w, &lm_head_rows_);
  if (!s.ok()) return s;
  SplitGreedyRows(lm_head_rows_, n, w.rows, greedy, argmax, logits);
  return absl::OkStatus();
}

}  // namespace pagedserve
