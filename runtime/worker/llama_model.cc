#include "runtime/worker/llama_model.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/half.h"
#include "kernels/linear.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

// y[n, W.rows] = x[n, W.cols] W^T (+ bias) over fp32 weights: one OpenBLAS sgemm
// (the --dtype float32 path, kept exactly as it was).
void BlasLinear(const float* x, int64_t n, const Matrix& w, const std::vector<float>& bias,
                float* y) {
  if (n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
              static_cast<int>(w.rows), static_cast<int>(w.cols), 1.0f, x,
              static_cast<int>(w.cols), w.data.data(), static_cast<int>(w.cols), 0.0f, y,
              static_cast<int>(w.rows));
  if (!bias.empty()) {
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t j = 0; j < w.rows; ++j) y[t * w.rows + j] += bias[j];
  }
}

kernels::WeightView StoredView(const Matrix& w) {
  kernels::WeightView v;
  v.type = static_cast<kernels::WeightType>(static_cast<uint32_t>(w.type));
  v.rows = w.rows;
  v.cols = w.cols;
  v.data = w.bytes();
  v.row_stride_bytes = w.row_bytes;
  return v;
}

// y[n, W.rows] = x[n, W.cols] W^T (+ bias): BlasLinear for fp32 matrices,
// kernels::Linear over the stored format otherwise.
absl::Status Linear(const float* x, int64_t n, const Matrix& w, const std::vector<float>& bias,
                    float* y) {
  if (w.is_fp32()) {
    BlasLinear(x, n, w, bias, y);
    return absl::OkStatus();
  }
  kernels::LinearParams p;
  p.x = x;
  p.num_tokens = n;
  p.x_stride = w.cols;
  p.w = StoredView(w);
  p.bias = bias.empty() ? nullptr : bias.data();
  p.y = y;
  p.y_stride = w.rows;
  return kernels::Linear(p);
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

// fp32 [n] <-> the KV cache's 16-bit element type (round to nearest even).
void ToCacheType(const float* src, int64_t n, kernels::DType t, uint16_t* dst) {
  const bool bf = t == kernels::DType::kBFloat16;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bf ? kernels::FloatToBFloat16Bits(src[i]) : kernels::FloatToHalfBits(src[i]);
}
void FromCacheType(const uint16_t* src, int64_t n, kernels::DType t, float* dst) {
  const bool bf = t == kernels::DType::kBFloat16;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (int64_t i = 0; i < n; ++i)
    dst[i] = bf ? kernels::BFloat16BitsToFloat(src[i]) : kernels::HalfBitsToFloat(src[i]);
}

// out[t] = x[t] / rms(x[t]) * weight, rms over `dim` values, accumulated in double.
void RmsNorm(const float* x, int64_t n, int dim, const std::vector<float>& weight, double eps,
             float* out) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * dim;
    double ss = 0.0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float inv = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    float* o = out + t * dim;
    for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * weight[i];
  }
}

// Rotary embedding in the rotate_half layout (Su et al. 2021, "RoFormer"; HF
// LlamaRotaryEmbedding): pair (i, i + D/2) of each head rotates by
// position * inv_freq[i]. cos/sin are [n, D/2].
void ApplyRope(float* x, int64_t n, int heads, int head_size, int64_t token_stride,
               const float* cos_t, const float* sin_t) {
  const int half = head_size / 2;
#pragma omp parallel for schedule(static)
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

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaWeights weights,
                                                               Communicator* comm) {
  PS_RETURN_IF_ERROR(weights.config.Validate());
  if (comm == nullptr) return absl::InvalidArgumentError("LlamaModel: null communicator");
  if (weights.shard.tp_size != comm->size() || weights.shard.tp_rank != comm->rank())
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaModel: weights are shard ", weights.shard.tp_rank, "/", weights.shard.tp_size,
        " but the communicator is rank ", comm->rank(), "/", comm->size()));
  if (static_cast<int>(weights.layers.size()) != weights.config.num_layers)
    return absl::InvalidArgumentError("LlamaModel: layer count does not match the config");
  if (!kernels::IsSupportedHeadSize(weights.config.head_size))
    return absl::UnimplementedError(absl::StrCat("LlamaModel: head size ",
                                                 weights.config.head_size,
                                                 " is not supported by the attention kernels"));
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
  }
  return std::unique_ptr<LlamaModel>(new LlamaModel(std::move(weights), comm));
}

LlamaModel::LlamaModel(LlamaWeights weights, Communicator* comm)
    : weights_(std::move(weights)), comm_(comm) {
  local_heads_ = weights_.shard.num_heads;
  local_kv_heads_ = weights_.shard.num_kv_heads;
  local_intermediate_ = weights_.shard.intermediate_size;
  inv_freq_ = RopeInverseFrequencies(weights_.config);
}

absl::Status LlamaModel::ValidateBatch(const ForwardBatch& b, size_t num_kv_layers) const {
  const int n = b.num_tokens();
  if (b.positions.size() != static_cast<size_t>(n) || b.slot_mapping.size() != static_cast<size_t>(n))
    return absl::InvalidArgumentError("ForwardBatch: token_ids, positions and slot_mapping differ in length");
  if (b.query_start_loc.size() != static_cast<size_t>(b.num_seqs() + 1) ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != n)
    return absl::InvalidArgumentError("ForwardBatch: query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
  if (b.block_tables.size() != static_cast<size_t>(b.num_seqs()) * b.max_blocks_per_seq)
    return absl::InvalidArgumentError("ForwardBatch: block_tables must be num_seqs * max_blocks_per_seq");
  if (num_kv_layers != static_cast<size_t>(weights_.config.num_layers))
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", num_kv_layers,
                                                   " KV cache layers for a model of ",
                                                   weights_.config.num_layers));
  const int vocab = weights_.config.vocab_size;
  for (int t = 0; t < n; ++t)
    if (b.token_ids[t] < 0 || b.token_ids[t] >= vocab)
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: token id ", b.token_ids[t],
                                                     " at row ", t, " outside vocabulary [0, ", vocab, ")"));
  for (int32_t r : b.logits_rows)
    if (r < 0 || r >= n)
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: logits row ", r, " outside [0, ", n, ")"));
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& b,
                                 std::span<const kernels::KVCacheView> kv_layers,
                                 std::vector<float>* logits) {
  PS_RETURN_IF_ERROR(ValidateBatch(b, kv_layers.size()));
  const ModelConfig& cfg = weights_.config;
  const int64_t n = b.num_tokens();
  const int hidden = cfg.hidden_size;
  const int D = cfg.head_size;
  const int q_dim = local_heads_ * D;
  const int kv_dim = local_kv_heads_ * D;
  const int inter = local_intermediate_;
  // Queries, keys, values and attention outputs go to the kernels in the cache's
  // element type; with a 16-bit cache they are converted around the attention.
  // An fp8 cache takes them as fp32 (io_dtype) and converts inside the kernels.
  const kernels::DType cache_dtype = kv_layers.empty() ? kernels::DType::kFloat32
                                                       : kv_layers[0].shape.dtype;
  const std::optional<kernels::DType> io_dtype =
      kernels::IsFp8(cache_dtype) ? std::optional(kernels::DType::kFloat32) : std::nullopt;
  const kernels::DType kv_dtype = kernels::ResolveIoDType(io_dtype, cache_dtype);
  const bool half_kv = kv_dtype != kernels::DType::kFloat32;

  x_.resize(n * hidden);
  h_.resize(n * hidden);
  q_.resize(n * q_dim);
  k_.resize(n * kv_dim);
  v_.resize(n * kv_dim);
  attn_.resize(n * q_dim);
  o_.resize(n * hidden);
  gate_.resize(n * inter);
  up_.resize(n * inter);
  if (half_kv) {
    q16_.resize(n * q_dim);
    k16_.resize(n * kv_dim);
    v16_.resize(n * kv_dim);
    attn16_.resize(n * q_dim);
  }

  // Embedding: only the looked-up rows are converted.
  const Matrix& emb = weights_.embed_tokens;
  for (int64_t t = 0; t < n; ++t) {
    if (emb.is_fp32()) {
      std::copy_n(emb.row(b.token_ids[t]), hidden, x_.data() + t * hidden);
    } else {
      PS_RETURN_IF_ERROR(emb.RowToFloat(b.token_ids[t], x_.data() + t * hidden));
    }
  }

  // Rotary tables for this batch's positions.
  const int half = D / 2;
  cos_.resize(n * half);
  sin_.resize(n * half);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(b.positions[t]) * inv_freq_[i];
      cos_[t * half + i] = static_cast<float>(std::cos(angle));
      sin_[t * half + i] = static_cast<float>(std::sin(angle));
    }

  // Split the batch: the leading run of single-token sequences with cached
  // context uses decode attention (paged_attention), the rest prefill attention.
  int num_decode = 0;
  int max_decode_len = 0;
  while (num_decode < b.num_seqs() &&
         b.query_start_loc[num_decode + 1] - b.query_start_loc[num_decode] == 1 &&
         b.seq_lens[num_decode] > 1) {
    max_decode_len = std::max(max_decode_len, b.seq_lens[num_decode]);
    ++num_decode;
  }
  const int num_prefill = b.num_seqs() - num_decode;
  const int prefill_row0 = b.query_start_loc[num_decode];
  int max_prefill_q = 0, max_prefill_len = 0;
  prefill_qsl_.resize(num_prefill > 0 ? num_prefill + 1 : 0);
  if (num_prefill > 0) {
    for (int s = 0; s <= num_prefill; ++s)
      prefill_qsl_[s] = b.query_start_loc[num_decode + s] - prefill_row0;
    for (int s = 0; s < num_prefill; ++s) {
      max_prefill_q = std::max(max_prefill_q, prefill_qsl_[s + 1] - prefill_qsl_[s]);
      max_prefill_len = std::max(max_prefill_len, b.seq_lens[num_decode + s]);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  // Element size of the attention buffers (bytes), to offset into them.
  const int64_t esize = static_cast<int64_t>(kernels::DTypeSize(kv_dtype));
  auto* qa = half_kv ? static_cast<void*>(q16_.data()) : static_cast<void*>(q_.data());
  auto* ka = half_kv ? static_cast<void*>(k16_.data()) : static_cast<void*>(k_.data());
  auto* va = half_kv ? static_cast<void*>(v16_.data()) : static_cast<void*>(v_.data());
  auto* oa = half_kv ? static_cast<void*>(attn16_.data()) : static_cast<void*>(attn_.data());

  for (int l = 0; l < cfg.num_layers; ++l) {
    const LayerWeights& w = weights_.layers[l];
    RmsNorm(x_.data(), n, hidden, w.input_layernorm, cfg.rms_norm_eps, h_.data());
    PS_RETURN_IF_ERROR(Linear(h_.data(), n, w.q_proj, w.q_bias, q_.data()));
    PS_RETURN_IF_ERROR(Linear(h_.data(), n, w.k_proj, w.k_bias, k_.data()));
    PS_RETURN_IF_ERROR(Linear(h_.data(), n, w.v_proj, w.v_bias, v_.data()));
    ApplyRope(q_.data(), n, local_heads_, D, q_dim, cos_.data(), sin_.data());
    ApplyRope(k_.data(), n, local_kv_heads_, D, kv_dim, cos_.data(), sin_.data());
    if (half_kv) {
      ToCacheType(q_.data(), n * q_dim, kv_dtype, q16_.data());
      ToCacheType(k_.data(), n * kv_dim, kv_dtype, k16_.data());
      ToCacheType(v_.data(), n * kv_dim, kv_dtype, v16_.data());
    }

    kernels::ReshapeAndCacheParams rc;
    rc.key = ka;
    rc.value = va;
    rc.slot_mapping = b.slot_mapping.data();
    rc.num_tokens = static_cast<int>(n);
    rc.cache = kv_layers[l];
    rc.io_dtype = io_dtype;
    PS_RETURN_IF_ERROR(kernels::ReshapeAndCache(rc));

    if (num_decode > 0) {
      kernels::PagedAttentionParams pa;
      pa.out = oa;
      pa.query = qa;
      pa.num_seqs = num_decode;
      pa.num_heads = local_heads_;
      pa.cache = kv_layers[l];
      pa.io_dtype = io_dtype;
      pa.block_tables = b.block_tables.data();
      pa.max_blocks_per_seq = b.max_blocks_per_seq;
      pa.seq_lens = b.seq_lens.data();
      pa.max_seq_len = max_decode_len;
      pa.scale = scale;
      PS_RETURN_IF_ERROR(kernels::PagedAttention(pa));
    }
    if (num_prefill > 0) {
      const int64_t off = static_cast<int64_t>(prefill_row0) * q_dim * esize;
      kernels::PrefillAttentionParams pf;
      pf.out = static_cast<uint8_t*>(oa) + off;
      pf.query = static_cast<const uint8_t*>(qa) + off;
      pf.num_seqs = num_prefill;
      pf.num_heads = local_heads_;
      pf.query_start_loc = prefill_qsl_.data();
      pf.seq_lens = b.seq_lens.data() + num_decode;
      pf.cache = kv_layers[l];
      pf.io_dtype = io_dtype;
      pf.block_tables = b.block_tables.data() + static_cast<int64_t>(num_decode) * b.max_blocks_per_seq;
      pf.max_blocks_per_seq = b.max_blocks_per_seq;
      pf.max_query_len = max_prefill_q;
      pf.max_seq_len = max_prefill_len;
      pf.scale = scale;
      PS_RETURN_IF_ERROR(kernels::PrefillAttention(pf));
    }
    if (half_kv) FromCacheType(attn16_.data(), n * q_dim, kv_dtype, attn_.data());

    // o_proj (row-parallel) + all-reduce, residual.
    PS_RETURN_IF_ERROR(Linear(attn_.data(), n, w.o_proj, {}, o_.data()));
    PS_RETURN_IF_ERROR(comm_->AllReduceSum(o_.data(), o_.size()));
    for (int64_t i = 0; i < n * hidden; ++i) x_[i] += o_[i];

    // SwiGLU MLP: down(silu(gate(h)) * up(h)), down row-parallel + all-reduce.
    RmsNorm(x_.data(), n, hidden, w.post_attention_layernorm, cfg.rms_norm_eps, h_.data());
    PS_RETURN_IF_ERROR(Linear(h_.data(), n, w.gate_proj, {}, gate_.data()));
    PS_RETURN_IF_ERROR(Linear(h_.data(), n, w.up_proj, {}, up_.data()));
    const int64_t gi = n * inter;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < gi; ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];
    }
    PS_RETURN_IF_ERROR(Linear(gate_.data(), n, w.down_proj, {}, o_.data()));
    PS_RETURN_IF_ERROR(comm_->AllReduceSum(o_.data(), o_.size()));
    for (int64_t i = 0; i < n * hidden; ++i) x_[i] += o_[i];
  }

  // Final norm and LM head on the requested rows only.
  const int64_t r = static_cast<int64_t>(b.logits_rows.size());
  rows_.resize(r * hidden);
  normed_.resize(r * hidden);
  for (int64_t i = 0; i < r; ++i)
    std::copy_n(x_.data() + static_cast<int64_t>(b.logits_rows[i]) * hidden, hidden,
                rows_.data() + i * hidden);
  RmsNorm(rows_.data(), r, hidden, weights_.final_norm, cfg.rms_norm_eps, normed_.data());
  logits->resize(r * cfg.vocab_size);
  return Linear(normed_.data(), r, weights_.output_embeddings(), {}, logits->data());
}

}  // namespace pagedserve
