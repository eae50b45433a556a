// Naive double-precision attention on gathered (contiguous, unpaged) K/V: the
// correctness reference of the kernel tests (CPU and CUDA). Header-only.
//
//   out = sum_j softmax_j(cap(scale * q . k_j + slope * (j - qpos))) v_j
//
// where cap(s) = softcap * tanh(s / softcap) when softcap > 0 (Gemma 2's
// attention soft-capping), else s.
// over keys j in [0, n_keys) (or [first_key, n_keys): a sliding window). ALiBi follows vLLM's
// convention (bias slope * (key position - query position), i.e. slope * (j - seq_len + 1) for
// decode, where the query sits at position seq_len - 1).
#ifndef PAGEDSERVE_TESTS_KERNELS_REFERENCE_ATTENTION_H_
#define PAGEDSERVE_TESTS_KERNELS_REFERENCE_ATTENTION_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace pagedserve::kernels::testing {

// Gathered K or V of one sequence: element (token j, kv head h, dim d) at
// data[(j * num_kv_heads + h) * head_size + d].
struct GatheredKV {
  const float* data = nullptr;
  int num_kv_heads = 0;
  int head_size = 0;
  const float* at(int64_t token, int kv_head) const {
    return data + (token * num_kv_heads + kv_head) * head_size;
  }
};

// Attention of one query vector q (head_size values) of query head `head` to
// keys/values [0, n_keys) of its KV head (GQA: head / (num_heads /
// num_kv_heads)); writes head_size doubles to out.
// Keys [first_key, n_keys) only (a sliding window); see ReferenceAttendOne.
inline void ReferenceAttendRange(const float* q, int head, int num_heads, const GatheredKV& k,
                                 const GatheredKV& v, int first_key, int n_keys, int qpos,
                                 double scale, double alibi_slope, double* out,
                                 double softcap = 0.0) {
  const int hs = k.head_size;
  const int kvh = head / (num_heads / k.num_kv_heads);
  std::vector<double> logits(n_keys, 0.0);
  double mx = -std::numeric_limits<double>::infinity();
  for (int j = first_key; j < n_keys; ++j) {
    const float* kj = k.at(j, kvh);
    double dot = 0.0;
    for (int d = 0; d < hs; ++d) dot += static_cast<double>(q[d]) * kj[d];
    logits[j] = scale * dot + alibi_slope * (j - qpos);
    if (softcap > 0) logits[j] = softcap * std::tanh(logits[j] / softcap);
    mx = std::max(mx, logits[j]);
  }
  double sum = 0.0;
  for (int j = first_key; j < n_keys; ++j) {
    logits[j] = std::exp(logits[j] - mx);
    sum += logits[j];
  }
  for (int d = 0; d < hs; ++d) out[d] = 0.0;
  for (int j = first_key; j < n_keys; ++j) {
    const float* vj = v.at(j, kvh);
    const double w = logits[j] / sum;
    for (int d = 0; d < hs; ++d) out[d] += w * vj[d];
  }
}

inline void ReferenceAttendOne(const float* q, int head, int num_heads, const GatheredKV& k,
                               const GatheredKV& v, int n_keys, int qpos, double scale,
                               double alibi_slope, double* out) {
  ReferenceAttendRange(q, head, num_heads, k, v, 0, n_keys, qpos, scale, alibi_slope, out);
}

// The first key a query at position qpos sees under a sliding window of
// `window` tokens (0 = none): Hugging Face's mask, keys (qpos - window, qpos].
inline int WindowFirstKey(int qpos, int window) {
  return window > 0 ? std::max(0, qpos + 1 - window) : 0;
}

// Decode reference for one sequence: q [num_heads, head_size] attends to all
// seq_len tokens (the last `window` of them when window > 0); returns
// [num_heads, head_size].
inline std::vector<double> ReferenceDecode(const float* q, int num_heads, const GatheredKV& k,
                                           const GatheredKV& v, int seq_len, double scale,
                                           const float* alibi_slopes, int window = 0,
                                           double softcap = 0.0) {
  const int hs = k.head_size;
  std::vector<double> out(static_cast<size_t>(num_heads) * hs);
  for (int h = 0; h < num_heads; ++h)
    ReferenceAttendRange(q + static_cast<int64_t>(h) * hs, h, num_heads, k, v,
                         WindowFirstKey(seq_len - 1, window), seq_len, seq_len - 1, scale,
                         alibi_slopes ? alibi_slopes[h] : 0.0,
                         out.data() + static_cast<size_t>(h) * hs, softcap);
  return out;
}

}  // namespace pagedserve::kernels::testing

#endif  // PAGEDSERVE_TESTS_KERNELS_REFERENCE_ATTENTION_H_
