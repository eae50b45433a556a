// The host-side parts of the backend seam (model_backend.h): the buffer
// classes, the greedy reduction every backend shares the rule of, and the
// default operations (HeadRmsNorm) and composite ones (RopeAndAttention, QkvRopeAndAttention,
// GateUpSiluMul, LmHeadSample).
#include "runtime/worker/model_backend.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pagedserve {

bool IsGemmInput(BufferId id) {
  return id == BufferId::kNormed || id == BufferId::kAttention || id == BufferId::kActivated ||
         id == BufferId::kLogitsInput;
}

bool IsFp32Buffer(BufferId id) {
  return !IsGemmInput(id) && id != BufferId::kProjection && id != BufferId::kCount;
}

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

namespace {

// *out for `rows` with every row left as logits: -1 tokens, no logprobs.
void UnreducedRows(std::span<const RowSampling> rows, SampledRows* out) {
  out->tokens.clear();
  for (const RowSampling& r : rows) out->tokens.insert(out->tokens.end(), r.draws(), -1);
  out->logprobs.assign(out->tokens.size(), 0.0f);
  out->top_begin.assign(rows.size() + 1, 0);
  out->top_ids.clear();
  out->top_logprobs.clear();
}

}  // namespace

void SplitSampledRows(const std::vector<float>& all, int64_t n, int64_t vocab,
                      std::span<const RowSampling> rows, SampledRows* out,
                      std::vector<float>* logits) {
  UnreducedRows(rows.first(static_cast<size_t>(n)), out);
  logits->clear();
  size_t draw = 0;
  for (int64_t t = 0; t < n; ++t) {
    const float* row = all.data() + t * vocab;
    const int32_t token =
        rows[t].mode == RowSampling::Mode::kGreedy ? GreedyArgmax(row, vocab) : -1;
    std::fill_n(out->tokens.begin() + draw, rows[t].draws(), token);
    draw += static_cast<size_t>(rows[t].draws());
    if (token < 0) logits->insert(logits->end(), row, row + vocab);
  }
}

absl::Status ModelBackend::HeadRmsNorm(float* x, int64_t n, int heads, int head_size,
                                       const BackendVector& weight, double eps) {
  (void)x, (void)n, (void)heads, (void)head_size, (void)weight, (void)eps;
  return absl::UnimplementedError(
      absl::StrCat("the ", name(), " backend has no per-head q/k RMSNorm (Qwen3)"));
}

absl::Status ModelBackend::AddPostRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                                          const BackendVector& weight, double eps) {
  (void)residual, (void)add, (void)n, (void)dim, (void)weight, (void)eps;
  return absl::UnimplementedError(absl::StrCat(
      "the ", name(), " backend has no norms after attention and MLP (Gemma's post-norms)"));
}

absl::Status ModelBackend::Scale(float* x, int64_t count, float factor) {
  (void)x, (void)count, (void)factor;
  return absl::UnimplementedError(
      absl::StrCat("the ", name(), " backend has no activation scaling (Gemma's embedding scale)"));
}

absl::Status ModelBackend::GeluTanhMul(const float* gate, const float* up, int64_t count,
                                       GemmInput out) {
  (void)gate, (void)up, (void)count, (void)out;
  return absl::UnimplementedError(
      absl::StrCat("the ", name(), " backend has no GeGLU (tanh GELU) activation (Gemma)"));
}

absl::Status BackendExperts::CheckAgainst(const MoeConfig& moe) const {
  if (!empty() && static_cast<int>(gate.size()) == moe.num_experts &&
      router.rows == moe.num_experts)
    return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("MoeMlp: ", gate.size(), " experts and a ",
                                                 router.rows, "-row router for a config of ",
                                                 moe.num_experts));
}

absl::Status ModelBackend::MoeMlp(GemmInput x, int64_t n, const MoeConfig& moe,
                                  const BackendExperts& w, PartialSums y) {
  (void)x, (void)n, (void)moe, (void)w, (void)y;
  return absl::UnimplementedError(
      absl::StrCat("the ", name(), " backend does not run mixture-of-experts layers"));
}

absl::Status ModelBackend::RopeAndAttention(const kernels::KVCacheView& cache,
                                            const LayerAttention& layer, int64_t n, int num_heads,
                                            float* q, float* k, float* v, GemmInput out) {
  const int D = cache.shape.head_size;
  const int kv_heads = cache.shape.num_kv_heads;
  absl::Status s =
      ApplyRope(q, n, num_heads, D, static_cast<int64_t>(num_heads) * D, layer.local_rope);
  if (s.ok())
    s = ApplyRope(k, n, kv_heads, D, static_cast<int64_t>(kv_heads) * D, layer.local_rope);
  if (s.ok()) s = Attention(cache, layer, num_heads, q, k, v, out);
  return s;
}

absl::Status ModelBackend::QkvRopeAndAttention(GemmInput x, int64_t n,
                                               std::span<const LinearOut, 3> qkv,
                                               const kernels::KVCacheView& cache,
                                               const LayerAttention& layer, int num_heads,
                                               GemmInput out) {
  absl::Status s = LinearGroup(x, n, qkv);
  if (s.ok()) s = RopeAndAttention(cache, layer, n, num_heads, qkv[0].y, qkv[1].y, qkv[2].y, out);
  return s;
}

absl::Status ModelBackend::GateUpSiluMul(GemmInput x, int64_t n, const BackendMatrix& gate_proj,
                                         const BackendMatrix& up_proj, float* gate, float* up,
                                         GemmInput out) {
  const LinearOut outs[2] = {{gate_proj, BackendVector{}, gate}, {up_proj, BackendVector{}, up}};
  absl::Status s = LinearGroup(x, n, outs);
  if (s.ok()) s = SiluMul(gate, up, n * gate_proj.rows, out);
  return s;
}

absl::Status ModelBackend::LmHeadSample(GemmInput x, int64_t n, const BackendMatrix& w,
                                        std::span<const RowSampling> rows, SampledRows* out,
                                        std::vector<float>* logits) {
  if (std::none_of(rows.begin(), rows.end(),
                   [](const RowSampling& r) { return r.mode == RowSampling::Mode::kGreedy; })) {
    absl::Status s = LmHead(x, n, w, logits);  // every row's logits, as they are
    if (!s.ok()) return s;
    UnreducedRows(rows, out);
    return s;
  }
  absl::Status s = LmHead(x, n, w, &lm_head_rows_);
  if (!s.ok()) return s;
  SplitSampledRows(lm_head_rows_, n, w.rows, rows, out, logits);
  return absl::OkStatus();
}

}  // namespace pagedserve
