// CPU backend (contract in cpu_backend.h and model_backend.h).
#include "runtime/worker/cpu_backend.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <optional>
#include <span>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/vec_ops.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "runtime/common/status_macros.h"
#include "spdlog/spdlog.h"

namespace pagedserve {

namespace cpu_ops {

// Elementwise loops fork the OpenMP team only above these element counts: below
// them a fork/join (a futex wake per thread under OMP_WAIT_POLICY=PASSIVE)
// costs more than the loop (decode at small batches). Every element is computed
// the same way on any thread, so the results do not depend on the split.
constexpr int64_t kMinParallelElems = 1 << 16;
constexpr int64_t kMinParallelSiluElems = 1 << 14;  // expf makes each element dearer

void AddRmsNorm(float* residual, const float* add, const int32_t* rows, int64_t n, int dim,
                const float* weight, double eps, float* out) {
#pragma omp parallel for schedule(static) if (n * dim >= kMinParallelElems)
  for (int64_t t = 0; t < n; ++t) {
    const int64_t r = rows != nullptr ? rows[t] : t;
    float* o = out + t * dim;
    const float* xr = residual + r * dim;
    if (add != nullptr) {
      const float* ar = add + r * dim;
      // The sum goes to the residual stream (a full pass) or, for a gather, to out.
      float* dst = rows == nullptr ? residual + r * dim : o;
      for (int i = 0; i < dim; ++i) dst[i] = xr[i] + ar[i];
      xr = dst;
    }
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

void HeadRmsNorm(float* x, int64_t rows, int dim, const float* weight, double eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= kMinParallelElems)
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(v[i]) * v[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) v[i] = v[i] * inv * weight[i];
  }
}

void AddPostRmsNorm(float* residual, const float* add, int64_t n, int dim, const float* weight,
                    double eps) {
#pragma omp parallel for schedule(static) if (n * dim >= kMinParallelElems)
  for (int64_t t = 0; t < n; ++t) {
    const float* a = add + t * dim;
    float* r = residual + t * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(a[i]) * a[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int i = 0; i < dim; ++i) r[i] += a[i] * inv * weight[i];
  }
}

void GeluTanhMul(const float* gate, const float* up, int64_t count, float* out) {
  const float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
  const float k1 = 0.044715f;
#pragma omp parallel for schedule(static) if (count >= kMinParallelSiluElems)
  for (int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.0f + std::tanh(k0 * (g + k1 * g * g * g))) * up[i];
  }
}

void ApplyRope(float* x, int64_t n, int heads, int head_size, int rotary_half, int64_t token_stride,
               const float* cos_t, const float* sin_t) {
  const int half = rotary_half;
#pragma omp parallel for schedule(static) if (n * heads * head_size >= kMinParallelElems)
  for (int64_t t = 0; t < n; ++t) {
    const float* c = cos_t + t * half;
    const float* s = sin_t + t * half;
    for (int h = 0; h < heads; ++h) {
      float* v = x + t * token_stride + static_cast<int64_t>(h) * head_size;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = b * c[i] + a * s[i];
      }
    }
  }
}

void MoeCombine(const float* pair_out, const int32_t* token_pairs, const float* pair_weights,
                int64_t n, int top_k, int64_t hidden, const float* shared_out,
                const float* shared_logit, float* y) {
#pragma omp parallel for schedule(static) if (n * hidden * top_k >= (1 << 16))
  for (int64_t t = 0; t < n; ++t) {
    float* dst = y + t * hidden;
    std::fill_n(dst, hidden, 0.0f);
    for (int j = 0; j < top_k; ++j) {
      const int64_t i = token_pairs[t * top_k + j];
      const float wt = pair_weights[i];
      const float* src = pair_out + i * hidden;
      for (int64_t c = 0; c < hidden; ++c) dst[c] += wt * src[c];
    }
    if (shared_out != nullptr) {
      const float g = 1.0f / (1.0f + std::exp(-shared_logit[t]));
      const float* src = shared_out + t * hidden;
      for (int64_t c = 0; c < hidden; ++c) dst[c] += g * src[c];
    }
  }
}

void SiluMul(const float* gate, const float* up, int64_t count, float* out) {
  // Chunks of whole vectors (kernels::cpu::SiluAndMul), so that each element is
  // computed the same way whatever the split.
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (count >= kMinParallelSiluElems)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk;
    kernels::cpu::SiluAndMul(gate + begin, up + begin, std::min(kChunk, count - begin),
                             out + begin);
  }
}

absl::Status EmbeddingGather(const Matrix& table, const int32_t* ids, int64_t n, float* out) {
  const int64_t hidden = table.cols;
  for (int64_t t = 0; t < n; ++t) {
    if (table.is_fp32()) {
      std::copy_n(table.row(ids[t]), hidden, out + t * hidden);
    } else {
      PS_RETURN_IF_ERROR(table.RowToFloat(ids[t], out + t * hidden));
    }
  }
  return absl::OkStatus();
}

}  // namespace cpu_ops

namespace {

// The kernels' view of a matrix: its stored rows, or its fp32 values (the
// float32 path) as an F32 weight.
kernels::WeightView StoredView(const Matrix& w) {
  kernels::WeightView v;
  v.rows = w.rows;
  v.cols = w.cols;
  if (w.is_fp32()) {
    v.type = kernels::WeightType::kF32;
    v.data = w.data.data();
    v.row_stride_bytes = static_cast<uint64_t>(w.cols) * sizeof(float);
    return v;
  }
  v.type = static_cast<kernels::WeightType>(static_cast<uint32_t>(w.type));
  v.data = w.bytes();
  v.row_stride_bytes = w.row_bytes;
  return v;
}

// Checks that a stored matrix is one kernels::Linear runs.
absl::Status CheckStored(const Matrix& w, const std::string& what) {
  if (w.empty() || w.is_fp32()) return absl::OkStatus();
  if (!kernels::IsWeightType(static_cast<uint32_t>(w.type)))
    return absl::UnimplementedError(absl::StrCat("LlamaModel: ", what, " has type ",
                                                 GgmlTypeName(w.type),
                                                 ", which the linear kernels do not run"));
  absl::Status s = kernels::ValidateWeightView(StoredView(w));
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("LlamaModel: ", what, ": ", s.message()));
  return absl::OkStatus();
}

// fp32 [n] <-> the KV cache's 16-bit element type (round to nearest even;
// kernels/cpu/vec_ops.h), in chunks over the team above 16384 elements.
constexpr int64_t kConvertChunk = 8192;
void ToCacheType(const float* src, int64_t n, kernels::DType t, uint16_t* dst) {
  const int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kConvertChunk;
    kernels::cpu::FloatsTo16(src + b, std::min(kConvertChunk, n - b), t, dst + b);
  }
}
void FromCacheType(const uint16_t* src, int64_t n, kernels::DType t, float* dst) {
  const int64_t chunks = (n + kConvertChunk - 1) / kConvertChunk;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kConvertChunk;
    kernels::cpu::Floats16ToFloat(src + b, std::min(kConvertChunk, n - b), t, dst + b);
  }
}

BackendMatrix Handle(const Matrix& m) { return BackendMatrix{&m, m.rows, m.cols}; }
BackendVector Handle(const std::vector<float>& v) {
  return BackendVector{v.empty() ? nullptr : v.data(), static_cast<int64_t>(v.size())};
}

// One thread's buffers for an expert of MoeMlp: its tokens' rows, gate, up.
struct ExpertScratch {
  std::vector<float> x, gate, up;
};

class CpuBackend final : public ModelBackend {
 public:
  CpuBackend(Communicator* comm, MoeRoutingObserver observer)
      : comm_(comm), moe_observer_(std::move(observer)) {}

  kernels::Device device() const override { return kernels::Device::kCPU; }
  const char* name() const override { return "cpu"; }

  absl::StatusOr<BackendWeights> LoadWeights(LlamaWeights weights) override {
    PS_RETURN_IF_ERROR(CheckStored(weights.embed_tokens, "embed_tokens"));
    PS_RETURN_IF_ERROR(CheckStored(weights.lm_head, "lm_head"));
    for (size_t l = 0; l < weights.layers.size(); ++l) {
      const LayerWeights& L = weights.layers[l];
      const std::string p = absl::StrCat("layer ", l, " ");
      PS_RETURN_IF_ERROR(CheckStored(L.q_proj, p + "q_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.k_proj, p + "k_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.v_proj, p + "v_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.o_proj, p + "o_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.gate_proj, p + "gate_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.up_proj, p + "up_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.down_proj, p + "down_proj"));
      PS_RETURN_IF_ERROR(CheckStored(L.router, p + "router"));
      for (size_t e = 0; e < L.expert_gate.size(); ++e) {
        const std::string x = absl::StrCat(p, "expert ", e, " ");
        PS_RETURN_IF_ERROR(CheckStored(L.expert_gate[e], x + "gate"));
        PS_RETURN_IF_ERROR(CheckStored(L.expert_up[e], x + "up"));
        PS_RETURN_IF_ERROR(CheckStored(L.expert_down[e], x + "down"));
      }
      PS_RETURN_IF_ERROR(CheckStored(L.shared_gate, p + "shared expert gate"));
      PS_RETURN_IF_ERROR(CheckStored(L.shared_up, p + "shared expert up"));
      PS_RETURN_IF_ERROR(CheckStored(L.shared_down, p + "shared expert down"));
      PS_RETURN_IF_ERROR(CheckStored(L.shared_expert_gate, p + "shared_expert_gate"));
    }
    weights_ = std::move(weights);
    PS_RETURN_IF_ERROR(InterleaveRows());
    BackendWeights h;
    h.embed_tokens = Handle(weights_.embed_tokens);
    h.lm_head = Handle(weights_.output_embeddings());
    h.final_norm = Handle(weights_.final_norm);
    for (const LayerWeights& L : weights_.layers) {
      BackendLayer b;
      b.input_layernorm = Handle(L.input_layernorm);
      b.post_attention_layernorm = Handle(L.post_attention_layernorm);
      b.q_proj = Handle(L.q_proj);
      b.k_proj = Handle(L.k_proj);
      b.v_proj = Handle(L.v_proj);
      b.o_proj = Handle(L.o_proj);
      b.gate_proj = Handle(L.gate_proj);
      b.up_proj = Handle(L.up_proj);
      b.down_proj = Handle(L.down_proj);
      b.q_bias = Handle(L.q_bias);
      b.k_bias = Handle(L.k_bias);
      b.v_bias = Handle(L.v_bias);
      b.q_norm = Handle(L.q_norm);
      b.k_norm = Handle(L.k_norm);
      b.attn_post_norm = Handle(L.attn_post_norm);
      b.mlp_post_norm = Handle(L.mlp_post_norm);
      if (!L.expert_gate.empty()) {
        b.experts.router = Handle(L.router);
        for (size_t e = 0; e < L.expert_gate.size(); ++e) {
          b.experts.gate.push_back(Handle(L.expert_gate[e]));
          b.experts.up.push_back(Handle(L.expert_up[e]));
          b.experts.down.push_back(Handle(L.expert_down[e]));
        }
        if (L.shared_gate.rows > 0) {
          b.experts.shared_gate = Handle(L.shared_gate);
          b.experts.shared_up = Handle(L.shared_up);
          b.experts.shared_down = Handle(L.shared_down);
          b.experts.shared_expert_gate = Handle(L.shared_expert_gate);
        }
      }
      h.layers.push_back(b);
    }
    return h;
  }

  // Q4_0 / Q4_1 matrices with rows % 8 == 0 become Q4_0x8 / Q4_1x8 when the
  // active Linear path runs that layout (kernels/linear.h PrefersInterleavedRows8): the
  // interleaved bytes go to `owned` and the mapped source pages are dropped,
  // so one copy stays in memory (issue 34). Every matrix but the embedding
  // table is read by Linear only here; the table (row lookups) stays as
  // stored, and so does a tied LM head, which is the table.
  absl::Status InterleaveRows() {
    std::vector<Matrix*> ms = {&weights_.lm_head};
    for (LayerWeights& L : weights_.layers) {
      for (Matrix* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj,
                        &L.down_proj, &L.router, &L.shared_gate, &L.shared_up, &L.shared_down})
        ms.push_back(m);
      for (auto* experts : {&L.expert_gate, &L.expert_up, &L.expert_down})
        for (Matrix& m : *experts) ms.push_back(&m);
    }
    uint64_t interleaved_bytes = 0;
    for (Matrix* m : ms) {
      if (m->empty() || m->is_fp32()) continue;
      const kernels::WeightView v = StoredView(*m);
      if (!kernels::PrefersInterleavedRows8(v)) continue;
      const uint64_t bytes = static_cast<uint64_t>(v.rows) * *kernels::RowBytes(v.type, v.cols);
      std::vector<uint8_t> packed(bytes);
      PS_RETURN_IF_ERROR(kernels::InterleaveRows8(v, packed.data()));
      if (m->owned.empty() && weights_.drop_resident)
        weights_.drop_resident(m->mapped, static_cast<uint64_t>(v.rows) * v.row_stride_bytes);
      m->owned = std::move(packed);
      m->row_bytes = bytes / static_cast<uint64_t>(v.rows);
      interleaved_[m] = kernels::InterleavedRows8Of(v.type);
      interleaved_bytes += bytes;
    }
    // On the front ends' stderr logger, beside the load progress (stdout may
    // carry generated text); library users without it get no line.
    std::shared_ptr<spdlog::logger> log = spdlog::get("launch");
    if (log && !interleaved_.empty())
      log->info(
          "CPU weights: {} Q4_0/Q4_1 matrices ({:.1f} MiB) interleaved 8 rows at a time for the "
          "{} kernels (PAGEDSERVE_CPU_REPACK=0 keeps the file's layout)",
          interleaved_.size(), static_cast<double>(interleaved_bytes) / (1 << 20),
          kernels::CpuIsaName(kernels::ActiveLinearIsa()));
    if (log && kernels::LinearUsesAmx())
      log->info(
          "CPU weights: quantized steps of 16+ tokens (32+ on interleaved Q4_0/Q4_1; not Q2_K, "
          "Q3_K) on the AMX tiles in bf16 (PAGEDSERVE_CPU_AMX=0: off)");
    return absl::OkStatus();
  }

  // The kernels' view of a matrix this backend holds (its interleaved type
  // where InterleaveRows repacked it).
  kernels::WeightView View(const Matrix& w) const {
    kernels::WeightView v = StoredView(w);
    if (auto it = interleaved_.find(&w); it != interleaved_.end()) v.type = it->second;
    return v;
  }

  int64_t weight_bytes() const override {
    int64_t bytes =
        static_cast<int64_t>(weights_.embed_tokens.size_bytes() + weights_.lm_head.size_bytes());
    for (const LayerWeights& L : weights_.layers) {
      for (const Matrix* m : {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj,
                              &L.down_proj, &L.router})
        bytes += static_cast<int64_t>(m->size_bytes());
      for (const auto* experts : {&L.expert_gate, &L.expert_up, &L.expert_down})
        for (const Matrix& m : *experts) bytes += static_cast<int64_t>(m.size_bytes());
    }
    return bytes;
  }

  absl::StatusOr<int64_t> KvCacheBudgetBytes(int64_t host_bytes, double) const override {
    return host_bytes;
  }

  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                              int64_t num_cpu_blocks) override {
    if (!device_views_.empty() || !cpu_views_.empty())
      return absl::FailedPreconditionError("CpuBackend::AllocateCaches called twice");
    const int num_layers = static_cast<int>(weights_.layers.size());
    auto make_pool = [&](int64_t blocks, std::vector<std::unique_ptr<float[]>>* storage,
                         std::vector<kernels::KVCacheView>* views) {
      if (blocks <= 0) return;
      kernels::KVCacheShape s = shape;
      s.num_blocks = blocks;
      // Storage in floats for alignment; block_bytes() of any dtype is a whole
      // number of them (head sizes are even).
      const size_t elems = s.block_bytes() * blocks / sizeof(float);
      for (int l = 0; l < num_layers; ++l) {
        storage->emplace_back(new float[elems]);
        float* k = storage->back().get();
        storage->emplace_back(new float[elems]);
        float* v = storage->back().get();
        views->push_back(kernels::KVCacheView{k, v, s, kernels::Device::kCPU});
      }
    };
    make_pool(num_device_blocks, &device_storage_, &device_views_);
    make_pool(num_cpu_blocks, &cpu_storage_, &cpu_views_);
    return absl::OkStatus();
  }
  std::span<const kernels::KVCacheView> device_cache() const override { return device_views_; }
  std::span<const kernels::KVCacheView> cpu_cache() const override { return cpu_views_; }

  absl::Status CheckKvCache(const kernels::KVCacheView& view) const override {
    if (view.device != kernels::Device::kCPU)
      return absl::InvalidArgumentError("the CPU backend needs kCPU KV cache views");
    return absl::OkStatus();  // the kernels validate the element type
  }

  absl::Status BeginStep(const ForwardPlan& plan) override {
    plan_ = &plan;
    return absl::OkStatus();
  }

  absl::StatusOr<float*> Buffer(BufferId id, int64_t elems) override {
    if (!IsFp32Buffer(id)) return absl::InvalidArgumentError("Buffer: not an fp32 buffer id");
    return Grow(id, elems);
  }
  ActivationType gemm_input_type() const override { return ActivationType::kFloat32; }
  absl::StatusOr<GemmInput> GemmInputBuffer(BufferId id, int64_t elems) override {
    if (!IsGemmInput(id)) return absl::InvalidArgumentError("GemmInputBuffer: an fp32 buffer id");
    return GemmInput{Grow(id, elems)};
  }
  absl::StatusOr<PartialSums> PartialSumBuffer(int64_t elems) override {
    return PartialSums{Grow(BufferId::kProjection, elems)};
  }

  absl::Status EmbeddingGather(const BackendMatrix& table, float* out) override {
    return cpu_ops::EmbeddingGather(M(table), plan_->batch->token_ids.data(), plan_->num_tokens,
                                    out);
  }

  // y[n, W.rows] = x[n, W.cols] W^T (+ bias) by kernels::Linear over the stored
  // format or the fp32 values (whose sgemm runs single-threaded OpenBLAS on each
  // OpenMP thread's rows: no OpenBLAS worker threads beside OpenMP's).
  absl::Status Linear(GemmInput x, int64_t n, const BackendMatrix& handle,
                      const BackendVector& bias, float* y) override {
    const Matrix& w = M(handle);
    kernels::LinearParams p;
    p.x = F(x);
    p.num_tokens = n;
    p.x_stride = w.cols;
    p.w = View(w);
    p.bias = bias.data;
    p.y = y;
    p.y_stride = w.rows;
    return kernels::Linear(p);
  }

  // One kernels::LinearGroup (one parallel region, the activations quantized
  // once); bit-identical to Linear per member.
  absl::Status LinearGroup(GemmInput x, int64_t n, std::span<const LinearOut> outs) override {
    std::array<kernels::LinearParams, 4> ps;
    if (outs.size() > ps.size()) return ModelBackend::LinearGroup(x, n, outs);
    for (size_t i = 0; i < outs.size(); ++i) {
      const Matrix& w = M(outs[i].w);
      kernels::LinearParams& p = ps[i];
      p.x = F(x);
      p.num_tokens = n;
      p.x_stride = w.cols;
      p.w = View(w);
      p.bias = outs[i].bias.data;
      p.y = outs[i].y;
      p.y_stride = w.rows;
    }
    return kernels::LinearGroup(std::span<const kernels::LinearParams>(ps.data(), outs.size()));
  }

  absl::Status AddRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                          const BackendVector& weight, double eps, bool logits_rows,
                          GemmInput out) override {
    cpu_ops::AddRmsNorm(residual, static_cast<const float*>(add.data),
                        logits_rows ? plan_->batch->logits_rows.data() : nullptr, n, dim,
                        weight.data, eps, F(out));
    return absl::OkStatus();
  }

  absl::Status HeadRmsNorm(float* x, int64_t n, int heads, int head_size,
                           const BackendVector& weight, double eps) override {
    if (weight.size != head_size)
      return absl::InvalidArgumentError(absl::StrCat("HeadRmsNorm: weight of ", weight.size,
                                                     " values for head_size ", head_size));
    cpu_ops::HeadRmsNorm(x, n * heads, head_size, weight.data, eps);
    return absl::OkStatus();
  }

  absl::Status AddPostRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                              const BackendVector& weight, double eps) override {
    if (weight.size != dim)
      return absl::InvalidArgumentError(
          absl::StrCat("AddPostRmsNorm: weight of ", weight.size, " values for dim ", dim));
    cpu_ops::AddPostRmsNorm(residual, static_cast<const float*>(add.data), n, dim, weight.data,
                            eps);
    return absl::OkStatus();
  }

  absl::Status Scale(float* x, int64_t count, float factor) override {
    for (int64_t i = 0; i < count; ++i) x[i] *= factor;
    return absl::OkStatus();
  }

  absl::Status GeluTanhMul(const float* gate, const float* up, int64_t count,
                           GemmInput out) override {
    cpu_ops::GeluTanhMul(gate, up, count, F(out));
    return absl::OkStatus();
  }

  absl::Status ApplyRope(float* x, int64_t n, int heads, int head_size, int64_t token_stride,
                         bool local) override {
    const std::vector<float>& c = local ? plan_->rope_cos_local : plan_->rope_cos;
    const std::vector<float>& s = local ? plan_->rope_sin_local : plan_->rope_sin;
    const int half = plan_->rope_half;
    if (half <= 0 || 2 * half > head_size || c.size() < static_cast<size_t>(n) * half)
      return absl::InvalidArgumentError(
          absl::StrCat("ApplyRope: the plan has no ", local ? "local " : "", "rotary tables for ",
                       n, " tokens of ", half, " pairs within head size ", head_size));
    cpu_ops::ApplyRope(x, n, heads, head_size, half, token_stride, c.data(), s.data());
    return absl::OkStatus();
  }

  absl::Status SiluMul(const float* gate, const float* up, int64_t count, GemmInput out) override {
    cpu_ops::SiluMul(gate, up, count, F(out));
    return absl::OkStatus();
  }

  absl::Status Attention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                         int num_heads, float* q, float* k, float* v, GemmInput out_buf) override {
    float* out = F(out_buf);
    const ForwardPlan& plan = *plan_;
    const ForwardBatch& b = *plan.batch;
    const int64_t n = plan.num_tokens;
    const int D = cache.shape.head_size;
    const int64_t q_dim = static_cast<int64_t>(num_heads) * D;
    const int64_t kv_dim = static_cast<int64_t>(cache.shape.num_kv_heads) * D;
    // Operands in the cache's element type: fp32 as they are; a 16-bit cache
    // gets converted copies (and the output converted back). An fp8 cache
    // takes fp32 operands (io_dtype) and converts inside the kernels.
    const std::optional<kernels::DType> io_dtype =
        kernels::IsFp8(cache.shape.dtype) ? std::optional(kernels::DType::kFloat32) : std::nullopt;
    const kernels::DType dt = kernels::ResolveIoDType(io_dtype, cache.shape.dtype);
    const bool convert = dt != kernels::DType::kFloat32;
    void* qa = q;
    void* ka = k;
    void* va = v;
    void* oa = out;
    if (convert) {
      q16_.resize(n * q_dim);
      k16_.resize(n * kv_dim);
      v16_.resize(n * kv_dim);
      out16_.resize(n * q_dim);
      ToCacheType(q, n * q_dim, dt, q16_.data());
      ToCacheType(k, n * kv_dim, dt, k16_.data());
      ToCacheType(v, n * kv_dim, dt, v16_.data());
      qa = q16_.data();
      ka = k16_.data();
      va = v16_.data();
      oa = out16_.data();
    }

    kernels::ReshapeAndCacheParams rc;
    rc.key = ka;
    rc.value = va;
    rc.slot_mapping = b.slot_mapping.data();
    rc.num_tokens = static_cast<int>(n);
    rc.cache = cache;
    rc.io_dtype = io_dtype;
    PS_RETURN_IF_ERROR(kernels::ReshapeAndCache(rc));

    if (plan.num_decode > 0) {
      kernels::PagedAttentionParams pa;
      pa.out = oa;
      pa.query = qa;
      pa.num_seqs = plan.num_decode;
      pa.num_heads = num_heads;
      pa.cache = cache;
      pa.io_dtype = io_dtype;
      pa.block_tables = b.block_tables.data();
      pa.max_blocks_per_seq = b.max_blocks_per_seq;
      pa.seq_lens = b.seq_lens.data();
      pa.max_seq_len = plan.max_decode_len;
      pa.scale = plan.attention_scale;
      pa.sliding_window = layer.sliding_window;
      pa.logit_softcap = layer.logit_softcap;
      PS_RETURN_IF_ERROR(kernels::PagedAttention(pa));
    }
    if (plan.num_prefill > 0) {
      const int64_t off = static_cast<int64_t>(plan.prefill_row0) * q_dim * kernels::DTypeSize(dt);
      kernels::PrefillAttentionParams pf;
      pf.out = static_cast<uint8_t*>(oa) + off;
      pf.query = static_cast<const uint8_t*>(qa) + off;
      pf.num_seqs = plan.num_prefill;
      pf.num_heads = num_heads;
      pf.query_start_loc = plan.prefill_query_start_loc.data();
      pf.seq_lens = b.seq_lens.data() + plan.num_decode;
      pf.cache = cache;
      pf.io_dtype = io_dtype;
      pf.block_tables =
          b.block_tables.data() + static_cast<int64_t>(plan.num_decode) * b.max_blocks_per_seq;
      pf.max_blocks_per_seq = b.max_blocks_per_seq;
      pf.max_query_len = plan.max_prefill_query_len;
      pf.max_seq_len = plan.max_prefill_len;
      pf.scale = plan.attention_scale;
      pf.sliding_window = layer.sliding_window;
      pf.logit_softcap = layer.logit_softcap;
      PS_RETURN_IF_ERROR(kernels::PrefillAttention(pf));
    }
    if (convert) FromCacheType(out16_.data(), n * q_dim, dt, out);
    return absl::OkStatus();
  }

  absl::Status MoeMlp(GemmInput x, int64_t n, const MoeConfig& moe, const BackendExperts& w,
                      PartialSums y_sums) override {
    PS_RETURN_IF_ERROR(w.CheckAgainst(moe));
    router_logits_.resize(static_cast<size_t>(n) * moe.num_experts);
    PS_RETURN_IF_ERROR(Linear(x, n, w.router, BackendVector{}, router_logits_.data()));
    PS_RETURN_IF_ERROR(RouteTokens(router_logits_.data(), n, moe, &routing_));
    if (moe_observer_) moe_observer_(routing_);
    const int64_t hidden = w.router.cols;
    active_experts_.clear();
    for (int e = 0; e < moe.num_experts; ++e)
      if (routing_.offsets[e + 1] > routing_.offsets[e]) active_experts_.push_back(e);
    pair_out_.resize(routing_.tokens.size() * static_cast<size_t>(hidden));
    PS_RETURN_IF_ERROR(RunExperts(F(x), hidden, w));
    const float* shared_out = nullptr;
    const float* shared_logit = nullptr;
    if (w.has_shared()) {
      PS_RETURN_IF_ERROR(RunSharedExpert(x, n, w));
      shared_out = shared_out_.data();
      shared_logit = shared_weight_.data();
    }
    token_pairs_.resize(routing_.tokens.size());
    TokenPairPositions(routing_, token_pairs_.data());
    cpu_ops::MoeCombine(pair_out_.data(), token_pairs_.data(), routing_.token_weights.data(), n,
                        routing_.top_k, hidden, shared_out, shared_logit,
                        static_cast<float*>(y_sums.data));
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(PartialSums data, int64_t count) override {
    return comm_->AllReduceSum(static_cast<float*>(data.data), static_cast<size_t>(count));
  }

  absl::Status LmHead(GemmInput x, int64_t n, const BackendMatrix& w,
                      std::vector<float>* logits) override {
    logits->resize(static_cast<size_t>(n) * w.rows);
    PS_RETURN_IF_ERROR(Linear(x, n, w, BackendVector{}, logits->data()));
    const double cap = plan_ != nullptr ? plan_->final_logit_softcap : 0.0;
    if (cap > 0)
      for (float& z : *logits) z = SoftcapLogit(z, cap);
    return absl::OkStatus();
  }

 private:
  static const Matrix& M(const BackendMatrix& h) { return *static_cast<const Matrix*>(h.handle); }

  // The experts of MoeMlp that routing_ gave tokens (active_experts_), each
  // writing its tokens' down-projected rows into pair_out_ at their grouped
  // positions. With at least two experts per thread the experts are split
  // over the OpenMP team, each run whole by one thread (kernels::Linear is
  // single-threaded inside a parallel region): one fork/join per layer
  // instead of three per expert, and each expert's weights read by one core.
  // Fewer experts (decode of a top-2 model on many cores) run one after
  // another, each with the whole team inside its kernels.
  absl::Status RunExperts(const float* x, int64_t hidden, const BackendExperts& w) {
    const int count = static_cast<int>(active_experts_.size());
    const int threads = omp_get_max_threads();
    if (count < 2 * threads) {
      expert_scratch_.resize(1);
      for (int e : active_experts_)
        PS_RETURN_IF_ERROR(RunExpert(x, hidden, w, e, &expert_scratch_[0]));
      return absl::OkStatus();
    }
    expert_scratch_.resize(static_cast<size_t>(threads));
    std::vector<absl::Status> status(static_cast<size_t>(count));
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
    for (int i = 0; i < count; ++i) {
      status[i] =
          RunExpert(x, hidden, w, active_experts_[i], &expert_scratch_[omp_get_thread_num()]);
    }
    for (const absl::Status& st : status) PS_RETURN_IF_ERROR(st);
    return absl::OkStatus();
  }

  // Expert e over its tokens: gather their rows of x [n, hidden], gate/up (one
  // LinearGroup), SiluMul, down into pair_out_ rows [offsets[e], offsets[e+1]).
  absl::Status RunExpert(const float* x, int64_t hidden, const BackendExperts& w, int e,
                         ExpertScratch* s) {
    const int64_t begin = routing_.offsets[e], m = routing_.offsets[e + 1] - begin;
    const int64_t inter = w.gate[e].rows;
    s->x.resize(static_cast<size_t>(m) * hidden);
    s->gate.resize(static_cast<size_t>(m) * inter);
    s->up.resize(static_cast<size_t>(m) * inter);
    for (int64_t j = 0; j < m; ++j)
      std::copy_n(x + routing_.tokens[begin + j] * hidden, hidden, s->x.data() + j * hidden);
    const LinearOut gate_up[2] = {{w.gate[e], BackendVector{}, s->gate.data()},
                                  {w.up[e], BackendVector{}, s->up.data()}};
    PS_RETURN_IF_ERROR(LinearGroup(GemmInput{s->x.data()}, m, gate_up));
    cpu_ops::SiluMul(s->gate.data(), s->up.data(), m * inter, s->gate.data());
    return Linear(GemmInput{s->gate.data()}, m, w.down[e], BackendVector{},
                  pair_out_.data() + begin * hidden);
  }

  // Qwen2-MoE's shared expert over all n rows of x: shared_out_ [n, hidden]
  // = down_s(silu(gate_s x[t]) * up_s x[t]) and shared_weight_ [n] = x[t] .
  // shared_expert_gate (its gate's logit; MoeCombine adds sigmoid of it
  // times the row, as transformers' expert_output + shared_output).
  absl::Status RunSharedExpert(GemmInput x, int64_t n, const BackendExperts& w) {
    const int64_t hidden = w.shared_down.rows, inter = w.shared_gate.rows;
    shared_gate_.resize(static_cast<size_t>(n) * inter);
    shared_up_.resize(shared_gate_.size());
    shared_out_.resize(static_cast<size_t>(n) * hidden);
    shared_weight_.resize(static_cast<size_t>(n));
    const LinearOut gate_up[3] = {{w.shared_gate, BackendVector{}, shared_gate_.data()},
                                  {w.shared_up, BackendVector{}, shared_up_.data()},
                                  {w.shared_expert_gate, BackendVector{}, shared_weight_.data()}};
    PS_RETURN_IF_ERROR(LinearGroup(x, n, gate_up));
    cpu_ops::SiluMul(shared_gate_.data(), shared_up_.data(), n * inter, shared_gate_.data());
    return Linear(GemmInput{shared_gate_.data()}, n, w.shared_down, BackendVector{},
                  shared_out_.data());
  }
  static float* F(GemmInput x) { return static_cast<float*>(x.data); }  // fp32 here
  float* Grow(BufferId id, int64_t elems) {
    std::vector<float>& b = buffers_[static_cast<size_t>(id)];
    if (static_cast<int64_t>(b.size()) < elems) b.resize(elems);
    return b.data();
  }

  Communicator* comm_;
  MoeRoutingObserver moe_observer_;
  // MoeMlp's state (reused across layers and steps): router logits, the
  // routing, the experts with tokens, every (token, expert) pair's output
  // row in grouped order, each token's pairs, and per-thread expert scratch.
  std::vector<float> router_logits_, pair_out_;
  // AddSharedExpert's gate / up (then the activation), output rows and gates.
  std::vector<float> shared_gate_, shared_up_, shared_out_, shared_weight_;
  MoeRouting routing_;
  std::vector<int> active_experts_;
  std::vector<int32_t> token_pairs_;
  std::vector<ExpertScratch> expert_scratch_;
  LlamaWeights weights_;
  // Matrices InterleaveRows repacked, and their layout (Q4_0x8, Q4_1x8).
  absl::flat_hash_map<const Matrix*, kernels::WeightType> interleaved_;
  const ForwardPlan* plan_ = nullptr;
  std::array<std::vector<float>, static_cast<size_t>(BufferId::kCount)> buffers_;
  std::vector<uint16_t> q16_, k16_, v16_, out16_;  // attention operands for a 16-bit cache
  std::vector<std::unique_ptr<float[]>> device_storage_, cpu_storage_;  // any dtype
  std::vector<kernels::KVCacheView> device_views_, cpu_views_;
};

}  // namespace

std::unique_ptr<ModelBackend> MakeCpuBackend(Communicator* comm, MoeRoutingObserver observer) {
  return std::make_unique<CpuBackend>(comm, std::move(observer));
}

}  // namespace pagedserve
