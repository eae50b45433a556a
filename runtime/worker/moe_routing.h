// Token routing of one mixture-of-experts layer (ModelConfig::moe): the
// router's top-k with the model's normalisation, and the tokens grouped by
// expert so that a backend reads each expert's weights once per step (a
// gather -> per-expert SwiGLU over its tokens -> weighted scatter-add, as
// vLLM's fused_moe and llama.cpp's ggml_mul_mat_id group rows per expert).
//
// Routing (Shazeer et al. 2017; Mixtral, Jiang et al. 2024; Qwen3-MoE), per
// token, in fp32 as transformers' MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock:
//   p = softmax(logits)                      (over all num_experts, max subtracted)
//   the top_k experts by p, descending; equal values to the lower index
//   w_j = p_j / sum of the top_k p (norm_topk_prob; Mixtral always), else p_j.
#ifndef PAGEDSERVE_RUNTIME_WORKER_MOE_ROUTING_H_
#define PAGEDSERVE_RUNTIME_WORKER_MOE_ROUTING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "runtime/model/model_config.h"

namespace pagedserve {

struct MoeRouting {
  int64_t num_tokens = 0;
  int top_k = 0;
  int num_experts = 0;
  // Per token, [num_tokens, top_k]: the chosen experts by descending weight
  // and their weights.
  std::vector<int32_t> experts;
  std::vector<float> weights;
  // Grouped by expert: expert e's (token, weight) pairs are entries
  // [offsets[e], offsets[e + 1]) of `tokens` / `token_weights` (num_experts
  // + 1 offsets; num_tokens * top_k entries), tokens ascending within an expert.
  std::vector<int64_t> offsets;
  std::vector<int32_t> tokens;
  std::vector<float> token_weights;
};

// Routes `n` tokens from their router logits (host fp32 [n, moe.num_experts],
// row-major) into *out (its vectors are reused: capacity kept). InvalidArgument
// unless moe.enabled() and 1 <= top_k <= num_experts.
//
// A row whose softmax is no distribution (a NaN or +inf logit, or every logit
// -inf: what non-finite weights or activations give) routes its token to
// experts 0..top_k-1 with NaN weights. Its MoE output is then NaN, as a dense
// MLP's is on such input (and transformers' on such logits), and reaches only
// its own sequence: the sampler finds the NaN in that sequence's logits and
// fails its request alone (StepResult::failed). An error here would fail the
// whole step: every request in the batch, and the engine with it.
absl::Status RouteTokens(const float* logits, int64_t n, const MoeConfig& moe, MoeRouting* out);

// Each token's grouped positions in ascending expert order: out[t * top_k +
// j], for t < r.num_tokens and j < r.top_k, is the index into r.tokens /
// r.token_weights of token t's j-th pair (the order a combine sums them in).
// out holds r.num_tokens * r.top_k values.
void TokenPairPositions(const MoeRouting& r, int32_t* out);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_MOE_ROUTING_H_
