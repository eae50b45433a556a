#include "runtime/worker/llama_model.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/paged_attention.h"
#include "runtime/common/status_macros.h"
#include "runtime/worker/cpu_backend.h"

namespace pagedserve {

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(LlamaWeights weights,
                                                               Communicator* comm) {
  return Create(std::move(weights), comm, MakeCpuBackend(comm));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(
    LlamaWeights weights, Communicator* comm, std::unique_ptr<ModelBackend> backend) {
  PS_RETURN_IF_ERROR(weights.config.Validate());
  if (comm == nullptr) return absl::InvalidArgumentError("LlamaModel: null communicator");
  if (backend == nullptr) return absl::InvalidArgumentError("LlamaModel: null backend");
  if (weights.shard.tp_size != comm->size() || weights.shard.tp_rank != comm->rank())
    return absl::InvalidArgumentError(absl::StrCat(
        "LlamaModel: weights are shard ", weights.shard.tp_rank, "/", weights.shard.tp_size,
        " but the communicator is rank ", comm->rank(), "/", comm->size()));
  if (static_cast<int>(weights.layers.size()) != weights.config.num_layers)
    return absl::InvalidArgumentError("LlamaModel: layer count does not match the config");
  if (weights.config.moe.enabled())
    for (const LayerWeights& L : weights.layers)
      if (static_cast<int>(L.expert_gate.size()) != weights.config.moe.num_experts ||
          L.router.rows != weights.config.moe.num_experts ||
          (weights.config.moe.shared_expert_intermediate_size > 0) !=
              (L.shared_gate.rows > 0 && L.shared_expert_gate.rows == 1))
        return absl::InvalidArgumentError(
            "LlamaModel: a mixture-of-experts layer does not hold num_experts experts and router "
            "rows (and the shared expert the config declares)");
  if (!kernels::IsSupportedHeadSize(weights.config.head_size))
    return absl::UnimplementedError(absl::StrCat("LlamaModel: head size ", weights.config.head_size,
                                                 " is not supported by the attention kernels"));
  auto model = std::unique_ptr<LlamaModel>(new LlamaModel(weights, std::move(backend)));
  PS_ASSIGN_OR_RETURN(model->w_, model->backend_->LoadWeights(std::move(weights)));
  return model;
}

LlamaModel::LlamaModel(const LlamaWeights& weights, std::unique_ptr<ModelBackend> backend)
    : config_(weights.config),
      shard_(weights.shard),
      backend_(std::move(backend)),
      inv_freq_(RopeInverseFrequencies(weights.config)),
      inv_freq_local_(RopeLocalInverseFrequencies(weights.config)) {}

absl::Status LlamaModel::ValidateBatch(const ForwardBatch& b,
                                       std::span<const kernels::KVCacheView> kv_layers) const {
  const int n = b.num_tokens();
  if (b.positions.size() != static_cast<size_t>(n) ||
      b.slot_mapping.size() != static_cast<size_t>(n))
    return absl::InvalidArgumentError(
        "ForwardBatch: token_ids, positions and slot_mapping differ in length");
  if (b.query_start_loc.size() != static_cast<size_t>(b.num_seqs()) + 1 ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != n)
    return absl::InvalidArgumentError(
        "ForwardBatch: query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
  if (b.block_tables.size() != static_cast<size_t>(b.num_seqs()) * b.max_blocks_per_seq)
    return absl::InvalidArgumentError(
        "ForwardBatch: block_tables must be num_seqs * max_blocks_per_seq");
  if (kv_layers.size() != static_cast<size_t>(config_.num_layers))
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", kv_layers.size(),
                                                   " KV cache layers for a model of ",
                                                   config_.num_layers));
  for (size_t l = 0; l < kv_layers.size(); ++l) {
    const kernels::KVCacheShape& shape = kv_layers[l].shape;
    if (shape.num_kv_heads != shard_.num_kv_heads || shape.head_size != config_.head_size)
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: KV cache layer ", l, " holds ", shape.num_kv_heads,
                       " KV heads of ", shape.head_size, "; this rank's shard has ",
                       shard_.num_kv_heads, " of ", config_.head_size));
    if (absl::Status s = backend_->CheckKvCache(kv_layers[l]); !s.ok())
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: KV cache layer ", l, ": ", s.message()));
  }
  const int vocab = config_.vocab_size;
  for (int t = 0; t < n; ++t)
    if (b.token_ids[t] < 0 || b.token_ids[t] >= vocab)
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: token id ", b.token_ids[t],
                                                     " at row ", t, " outside vocabulary [0, ",
                                                     vocab, ")"));
  for (int32_t r : b.logits_rows)
    if (r < 0 || r >= n)
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: logits row ", r, " outside [0, ", n, ")"));
  // The CUDA reshape_and_cache skips out-of-pool slots silently, the CPU one
  // rejects them: reject here so that every backend fails the same way.
  if (!kv_layers.empty()) {
    const int64_t slots = kv_layers[0].shape.num_blocks * kv_layers[0].shape.block_size;
    for (int t = 0; t < n; ++t)
      if (b.slot_mapping[t] >= slots)
        return absl::InvalidArgumentError(
            absl::StrCat("reshape_and_cache: slot_mapping[", t, "] = ", b.slot_mapping[t],
                         " is outside the pool (num_blocks * block_size = ", slots, ")"));
  }
  return absl::OkStatus();
}

void LlamaModel::BuildPlan(const ForwardBatch& b, const std::optional<DecodeGraphKey>& graph) {
  ForwardPlan& p = plan_;
  p.batch = &b;
  p.num_tokens = b.num_tokens();
  p.num_seqs = b.num_seqs();

  // Split the batch: the leading run of single-token sequences with cached
  // context uses decode attention (paged_attention), the rest prefill attention.
  p.num_decode = 0;
  p.max_decode_len = 0;
  while (p.num_decode < p.num_seqs &&
         b.query_start_loc[p.num_decode + 1] - b.query_start_loc[p.num_decode] == 1 &&
         b.seq_lens[p.num_decode] > 1) {
    p.max_decode_len = std::max(p.max_decode_len, b.seq_lens[p.num_decode]);
    ++p.num_decode;
  }
  p.num_prefill = p.num_seqs - p.num_decode;
  p.prefill_row0 = b.query_start_loc[p.num_decode];
  p.max_prefill_query_len = 0;
  p.max_prefill_len = 0;
  p.prefill_query_start_loc.resize(p.num_prefill > 0 ? p.num_prefill + 1 : 0);
  if (p.num_prefill > 0) {
    for (int s = 0; s <= p.num_prefill; ++s)
      p.prefill_query_start_loc[s] = b.query_start_loc[p.num_decode + s] - p.prefill_row0;
    for (int s = 0; s < p.num_prefill; ++s) {
      p.max_prefill_query_len = std::max(
          p.max_prefill_query_len, p.prefill_query_start_loc[s + 1] - p.prefill_query_start_loc[s]);
      p.max_prefill_len = std::max(p.max_prefill_len, b.seq_lens[p.num_decode + s]);
    }
  }

  // Rotary tables for this batch's positions (angles in double): the global
  // ones, and the local layers' when the config has them.
  const int half = config_.RotaryDim() / 2;
  p.rope_half = half;
  auto tables = [&](const std::vector<double>& inv, double scale, std::vector<float>* cos_t,
                    std::vector<float>* sin_t) {
    cos_t->resize(inv.empty() ? 0 : static_cast<size_t>(p.num_tokens) * half);
    sin_t->resize(cos_t->size());
    if (inv.empty()) return;
    for (int64_t t = 0; t < p.num_tokens; ++t)
      for (int i = 0; i < half; ++i) {
        const double angle = static_cast<double>(b.positions[t]) * inv[i];
        (*cos_t)[t * half + i] = static_cast<float>(scale * std::cos(angle));
        (*sin_t)[t * half + i] = static_cast<float>(scale * std::sin(angle));
      }
  };
  tables(inv_freq_, config_.rope_scaling.attention_factor, &p.rope_cos, &p.rope_sin);
  tables(inv_freq_local_, 1.0, &p.rope_cos_local, &p.rope_sin_local);
  p.attention_scale = config_.AttentionScale();
  p.final_logit_softcap = config_.final_logit_softcapping;
  p.graph = graph;
  if (graph) {
    // Padded sequences (seq_len 1) run decode attention like the real ones.
    p.num_decode = p.num_seqs;
    p.num_prefill = 0;
    p.prefill_row0 = static_cast<int>(p.num_tokens);
    p.prefill_query_start_loc.clear();
    p.max_decode_len = graph->context;
  }
}

absl::Status LlamaModel::Forward(const ForwardBatch& b,
                                 std::span<const kernels::KVCacheView> kv_layers,
                                 std::vector<float>* logits) {
  GemmInput normed;
  PS_RETURN_IF_ERROR(RunLayers(b, kv_layers, &normed));
  return backend_->LmHead(normed, static_cast<int64_t>(b.logits_rows.size()), w_.lm_head, logits);
}

absl::Status LlamaModel::Forward(const ForwardBatch& b,
                                 std::span<const kernels::KVCacheView> kv_layers,
                                 std::span<const RowSampling> rows, SampledRows* out,
                                 std::vector<float>* logits) {
  if (rows.size() != b.logits_rows.size())
    return absl::InvalidArgumentError(absl::StrCat("Forward: ", rows.size(), " row samplings for ",
                                                   b.logits_rows.size(), " logits rows"));
  GemmInput normed;
  PS_RETURN_IF_ERROR(RunLayers(b, kv_layers, &normed));
  const int64_t n = static_cast<int64_t>(b.logits_rows.size());
  return backend_->LmHeadSample(normed, n, w_.lm_head, rows, out, logits);
}

absl::Status LlamaModel::RunLayers(const ForwardBatch& b,
                                   std::span<const kernels::KVCacheView> kv_layers,
                                   GemmInput* normed_out) {
  PS_RETURN_IF_ERROR(ValidateBatch(b, kv_layers));
  ModelBackend& be = *backend_;
  // A decode step the backend can replay from a capture runs padded to the
  // captured shape (decode_graph.h); its first logits rows are the real ones.
  std::optional<DecodeGraphKey> graph;
  const ForwardBatch* run = &b;
  if (be.SupportsBodyGraphs() && !kv_layers.empty()) {
    const int block_size = kv_layers[0].shape.block_size;
    graph = ChooseDecodeGraph(b, block_size, graph_options_);
    if (graph) {
      padded_.Pad(b, *graph, block_size);
      run = &padded_.batch();
    }
  }
  BuildPlan(*run, graph);
  PS_RETURN_IF_ERROR(be.BeginStep(plan_));
  const int64_t n = run->num_tokens();
  const int64_t r = static_cast<int64_t>(run->logits_rows.size());
  const int hidden = config_.hidden_size;
  const int64_t q_dim = static_cast<int64_t>(shard_.num_heads) * config_.head_size;
  const int64_t kv_dim = static_cast<int64_t>(shard_.num_kv_heads) * config_.head_size;
  // A MoE layer's expert activations are the backend's own (MoeMlp).
  const int64_t inter = config_.moe.enabled() ? 1 : shard_.intermediate_size;
  StepBuffers buf;
  PS_ASSIGN_OR_RETURN(buf.x, be.Buffer(BufferId::kResidual, n * hidden));
  PS_ASSIGN_OR_RETURN(buf.h, be.GemmInputBuffer(BufferId::kNormed, n * hidden));
  PS_ASSIGN_OR_RETURN(buf.q, be.Buffer(BufferId::kQuery, n * q_dim));
  PS_ASSIGN_OR_RETURN(buf.k, be.Buffer(BufferId::kKey, n * kv_dim));
  PS_ASSIGN_OR_RETURN(buf.v, be.Buffer(BufferId::kValue, n * kv_dim));
  PS_ASSIGN_OR_RETURN(buf.attn, be.GemmInputBuffer(BufferId::kAttention, n * q_dim));
  PS_ASSIGN_OR_RETURN(buf.o, be.PartialSumBuffer(n * hidden));
  PS_ASSIGN_OR_RETURN(buf.gate, be.Buffer(BufferId::kGate, n * inter));
  PS_ASSIGN_OR_RETURN(buf.up, be.Buffer(BufferId::kUp, n * inter));
  PS_ASSIGN_OR_RETURN(buf.act, be.GemmInputBuffer(BufferId::kActivated, n * inter));
  PS_ASSIGN_OR_RETURN(buf.normed, be.GemmInputBuffer(BufferId::kLogitsInput, r * hidden));

  bool replayed = false;
  if (graph) {
    PS_ASSIGN_OR_RETURN(replayed, be.BeginBody(kv_layers));
  }
  if (!replayed) {
    absl::Status body = RunBody(n, r, buf, kv_layers);
    if (graph) {
      // A capture that failed ran nothing: the body runs again, eagerly (an
      // error of the body's own comes back the same way).
      PS_ASSIGN_OR_RETURN(const bool ran, be.EndBody(body.ok()));
      if (!ran) body = RunBody(n, r, buf, kv_layers);
    }
    PS_RETURN_IF_ERROR(body);
  }
  *normed_out = buf.normed;
  return absl::OkStatus();
}

absl::Status LlamaModel::RunBody(int64_t n, int64_t r, const StepBuffers& buf,
                                 std::span<const kernels::KVCacheView> kv_layers) {
  const ModelConfig& cfg = config_;
  const int hidden = cfg.hidden_size;
  const int heads = shard_.num_heads;
  const double eps = cfg.rms_norm_eps;
  ModelBackend& be = *backend_;
  float *x = buf.x, *q = buf.q, *k = buf.k, *v = buf.v, *gate = buf.gate, *up = buf.up;
  const GemmInput h = buf.h, attn = buf.attn, act = buf.act;
  const PartialSums o = buf.o;

  PS_RETURN_IF_ERROR(be.EmbeddingGather(w_.embed_tokens, x));
  if (cfg.embedding_scale > 0) PS_RETURN_IF_ERROR(be.Scale(x, n * hidden, cfg.embedding_scale));
  PS_RETURN_IF_ERROR(
      be.AddRmsNorm(x, PartialSums{}, n, hidden, w_.layers[0].input_layernorm, eps, false, h));
  for (int l = 0; l < cfg.num_layers; ++l) {
    const BackendLayer& w = w_.layers[l];
    // q/k/v (and gate/up below) read the same normed rows: one backend launch.
    const LinearOut qkv[3] = {
        {w.q_proj, w.q_bias, q}, {w.k_proj, w.k_bias, k}, {w.v_proj, w.v_bias, v}};
    const LayerAttention layer{cfg.LayerSlidingWindow(l),
                               static_cast<float>(cfg.attn_logit_softcapping),
                               cfg.LayerLocalRope(l)};
    if (cfg.qk_norm) {
      // Qwen3, Gemma 3: q and k RMSNorm-ed per head between the projections and RoPE.
      PS_RETURN_IF_ERROR(be.LinearGroup(h, n, qkv));
      PS_RETURN_IF_ERROR(be.HeadRmsNorm(q, n, heads, cfg.head_size, w.q_norm, eps));
      PS_RETURN_IF_ERROR(be.HeadRmsNorm(k, n, shard_.num_kv_heads, cfg.head_size, w.k_norm, eps));
      PS_RETURN_IF_ERROR(be.RopeAndAttention(kv_layers[l], layer, n, heads, q, k, v, attn));
    } else {
      PS_RETURN_IF_ERROR(be.QkvRopeAndAttention(h, n, qkv, kv_layers[l], layer, heads, attn));
    }

    // o_proj (row-parallel) + all-reduce, then residual add + norm (Gemma:
    // the output normed before the add).
    PS_RETURN_IF_ERROR(be.RowParallelLinear(attn, n, w.o_proj, o));
    PS_RETURN_IF_ERROR(be.AllReduceSum(o, n * hidden));
    PS_RETURN_IF_ERROR(
        AddResidualAndNorm(x, o, n, w.attn_post_norm, w.post_attention_layernorm, h));

    // Gated MLP: down(act(gate(h)) * up(h)), down row-parallel + all-reduce;
    // or a mixture of SwiGLU experts (each rank its slice of every expert).
    if (cfg.moe.enabled()) {
      PS_RETURN_IF_ERROR(be.MoeMlp(h, n, cfg.moe, w.experts, o));
    } else {
      if (cfg.mlp_activation == MlpActivation::kGeluTanh) {
        const LinearOut gu[2] = {{w.gate_proj, BackendVector{}, gate},
                                 {w.up_proj, BackendVector{}, up}};
        PS_RETURN_IF_ERROR(be.LinearGroup(h, n, gu));
        PS_RETURN_IF_ERROR(be.GeluTanhMul(gate, up, n * w.gate_proj.rows, act));
      } else {
        PS_RETURN_IF_ERROR(be.GateUpSiluMul(h, n, w.gate_proj, w.up_proj, gate, up, act));
      }
      PS_RETURN_IF_ERROR(be.RowParallelLinear(act, n, w.down_proj, o));
    }
    PS_RETURN_IF_ERROR(be.AllReduceSum(o, n * hidden));
    if (l + 1 < cfg.num_layers) {
      PS_RETURN_IF_ERROR(
          AddResidualAndNorm(x, o, n, w.mlp_post_norm, w_.layers[l + 1].input_layernorm, h));
    } else if (cfg.post_norms) {
      PS_RETURN_IF_ERROR(be.AddPostRmsNorm(x, o, n, hidden, w.mlp_post_norm, eps));
      PS_RETURN_IF_ERROR(
          be.AddRmsNorm(x, PartialSums{}, r, hidden, w_.final_norm, eps, true, buf.normed));
    } else {
      // The last residual add fused with the final norm, on the logits rows only.
      PS_RETURN_IF_ERROR(be.AddRmsNorm(x, o, r, hidden, w_.final_norm, eps, true, buf.normed));
    }
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::AddResidualAndNorm(float* x, PartialSums o, int64_t n,
                                            const BackendVector& post_norm,
                                            const BackendVector& next_norm, GemmInput h) {
  ModelBackend& be = *backend_;
  const int hidden = config_.hidden_size;
  const double eps = config_.rms_norm_eps;
  if (!config_.post_norms) return be.AddRmsNorm(x, o, n, hidden, next_norm, eps, false, h);
  PS_RETURN_IF_ERROR(be.AddPostRmsNorm(x, o, n, hidden, post_norm, eps));
  return be.AddRmsNorm(x, PartialSums{}, n, hidden, next_norm, eps, false, h);
}

}  // namespace pagedserve
