// Internal: launchers of the small CUDA kernels of the CUDA backend
// (runtime/worker/cuda/cuda_backend.cc); the kernel bodies and their exact
// contracts are in model_kernels.cuh. Callable from host C++20 and from nvcc
// (C++17); free of Abseil so that nvcc parses little. Every pointer is device
// memory; every launcher enqueues on `stream` and returns the launch error
// (cudaSuccess when there is nothing to do, e.g. n == 0). Any shape and
// alignment is valid; the elementwise launchers vectorize (4 elements per
// access) when the row lengths are multiples of 4 and the pointers aligned
// to 4 elements (PackWidth in model_kernels.cuh), else run the scalar
// variant, with the same results.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace pagedserve::cuda_model {

// Element type of a weight table or a converted buffer.
enum class Elem : int { kF32, kF16, kBF16 };
// Bytes of one element.
inline int ElemBytes(Elem e) { return e == Elem::kF32 ? 4 : 2; }

// out[t, :] = (float)table[ids[t], :] for t < n; table [vocab, hidden] of
// element type `table_type`.
cudaError_t LaunchEmbeddingGather(const void* table, Elem table_type, const int32_t* ids, int n,
                                  int hidden, float* out, cudaStream_t stream);

// out[k] = (out_type)in[k] for k < count (round to nearest even when
// narrowing). in and out must not overlap. cudaErrorInvalidValue when
// in_type == out_type.
cudaError_t LaunchConvert(const void* in, Elem in_type, int64_t count, void* out, Elem out_type,
                          cudaStream_t stream);

// Fused residual add + RMSNorm of n rows (ModelBackend::AddRmsNorm): `add`
// (of `add_type`, the partial sums) may be null (norm only); `rows` null =
// rows 0..n-1 with residual written back, else a gather of rows[t] without
// write-back. out [n, dim] of `out_type` (the fp32 result rounded to nearest
// even once).
cudaError_t LaunchAddRmsNorm(float* residual, const void* add, Elem add_type, const int32_t* rows,
                             const float* weight, int n, int dim, double eps, void* out,
                             Elem out_type, cudaStream_t stream);

// The residual add of a normed output (ModelBackend::AddPostRmsNorm,
// Gemma's post-attention / post-feedforward norms) over n rows:
// residual[t] += add[t] / sqrt(mean(add[t]^2) + eps) * weight, add [n, dim]
// of `add_type` (the partial sums), the sum of squares in double, the
// product and the sum in fp32. add must not be null.
cudaError_t LaunchAddPostRmsNorm(float* residual, const void* add, Elem add_type,
                                 const float* weight, int n, int dim, double eps,
                                 cudaStream_t stream);

// x[k] *= factor in fp32 for k < count (Gemma's embedding scale).
cudaError_t LaunchScale(float* x, int64_t count, float factor, cudaStream_t stream);

// Rotary embedding of n tokens in place (rotate_half layout): the pairs (i, i
// + rot_half), i < rot_half, of each head; tables [n, rot_half]. rot_half is
// head_size / 2, or less for partial rotary (the rest of each head stays).
// cudaErrorInvalidValue unless 1 <= rot_half <= head_size / 2.
cudaError_t LaunchApplyRope(float* x, int n, int heads, int head_size, int rot_half,
                            int64_t token_stride, const float* cos_t, const float* sin_t,
                            cudaStream_t stream);

// y[t, j] += bias[j] for t < n, j < cols.
cudaError_t LaunchAddBias(float* y, const float* bias, int n, int cols, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] for i < count, fp32 rounded once to
// `out_type`; out may be gate when out_type is kF32.
cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count, void* out,
                          Elem out_type, cudaStream_t stream);

// x[k] = SoftcapLogit(x[k], cap) for k < count (the final logit soft cap,
// in double as on the host); cudaErrorInvalidValue unless cap > 0.
cudaError_t LaunchSoftcap(float* x, int64_t count, double cap, cudaStream_t stream);

// out[i] = gelu_tanh(gate[i]) * up[i] for i < count (GeGLU with GELU's tanh
// approximation, ModelBackend::GeluTanhMul), fp32 rounded once to
// `out_type`; out may be gate when out_type is kF32.
cudaError_t LaunchGeluTanhMul(const float* gate, const float* up, int64_t count, void* out,
                              Elem out_type, cudaStream_t stream);

// out[t, i] = silu(y[t, i]) * y[t, inter + i] for t < n, i < inter: SiluMul
// over the output y [n, 2 * inter] (fp32) of one GEMM over stacked gate/up
// rows, without splitting it; out [n, inter] of `out_type`.
cudaError_t LaunchSiluMulStacked(const float* y, int64_t n, int inter, void* out, Elem out_type,
                                 cudaStream_t stream);

// Mixture of experts (CudaBackend::MoeMlp): out [pairs, hidden] =
// x[tokens[i], :] for i < pairs, x and out of `type` (the GEMM input's).
// tokens must lie in [0, rows of x) (checked on the host).
cudaError_t LaunchMoeGatherRows(const void* x, Elem type, const int32_t* tokens, int64_t pairs,
                                int hidden, void* out, cudaStream_t stream);

// Mixture of experts: y [n, hidden] of `y_type` = for each token t, the
// weighted sum of its top_k expert rows of pair_out [pairs, hidden] (fp32)
// at token_pairs[t * top_k + j] with pair_weights, in that order, plus
// sigmoid(shared_logit[t]) * shared_out[t, :] when shared_out is not null
// (model_kernels.cuh MoeCombineBody: the CPU backend's order and precision).
cudaError_t LaunchMoeCombine(const float* pair_out, const int32_t* token_pairs,
                             const float* pair_weights, int64_t n, int top_k, int hidden,
                             const float* shared_out, const float* shared_logit, void* y,
                             Elem y_type, cudaStream_t stream);

// Element type of a paged KV cache.
enum class CacheType : int { kF32, kF16, kBF16, kFp8E4M3, kFp8E5M2 };

// RoPE (rotate_half) of the queries fused with their conversion to the
// attention operand type: out [n, heads * head_size] of `out_type` =
// rope(x[t * token_stride + ...] (+ bias[heads * head_size] when not null))
// with the tables [n, rot_half] (LaunchApplyRope's pairs; the unrotated
// tail converted as is). out may be x when out_type is kF32 (in place).
cudaError_t LaunchRopeConvert(const float* x, int n, int heads, int head_size, int rot_half,
                              int64_t token_stride, const float* bias, const float* cos_t,
                              const float* sin_t, void* out, Elem out_type, cudaStream_t stream);

// RoPE of the keys fused with reshape_and_cache: keys (rotated here) and
// values (fp32 rows key / value[t * token_stride + ...] of num_kv_heads *
// head_size, + k_bias / v_bias when not null) written into the paged cache
// (vLLM's layout, `type` elements; fp8 stores fp8(x / scale)) at
// slot_mapping[t]; slots < 0 or >= num_blocks * block_size are skipped.
// The keys rotate as LaunchApplyRope's pairs (i, i + rot_half); the rest of
// each head is stored unrotated. cudaErrorInvalidValue when token_stride <
// num_kv_heads * head_size or rot_half is outside [1, head_size / 2].
cudaError_t LaunchRopeReshapeAndCache(const float* key, const float* value, int64_t token_stride,
                                      const float* k_bias, const float* v_bias, int n,
                                      int num_kv_heads, int head_size, int rot_half,
                                      const float* cos_t, const float* sin_t,
                                      const int64_t* slot_mapping, int64_t num_blocks,
                                      int block_size, void* key_cache, void* value_cache,
                                      CacheType type, float k_scale, float v_scale,
                                      cudaStream_t stream);

// out[t] = the greedy token of logits row t < n ([n, vocab] fp32): the
// largest logit's index, ties to the lowest, or -1 for a row with a NaN or
// +inf or only -inf (GreedyArgmax in runtime/worker/model_backend.h).
cudaError_t LaunchGreedyArgmax(const float* logits, int n, int64_t vocab, int32_t* out,
                               cudaStream_t stream);

// One token of a row's penalty list (LaunchSampleRows): a distinct token id
// of the row's history and how often it occurs in the output part.
struct SamplePenalty {
  int32_t token_id = 0;
  int32_t output_count = 0;
};

// One logits row of LaunchSampleRows: the sampler's steps 1-7
// (runtime/sampling/sampler.h), and its raw logprobs when asked.
struct SampleRowArgs {
  float inv_temperature = 1.0f;  // 1 / temperature (temperature >= 1e-5; 1 when greedy)
  int32_t top_k = -1;            // <= 0 or >= vocab: off
  float top_p = 1.0f;            // in (0, 1]; 1: off
  float min_p = 0.0f;            // in [0, 1]; 0: off
  int32_t greedy = 0;            // 1: every draw is the argmax of the penalized row
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // The row's penalties[penalty_begin, + penalty_count): the repetition
  // penalty applies to each entry (the distinct ids of prompt + output;
  // when it is 1 the list may hold the output's ids only), the additive ones
  // to the entries with output_count > 0.
  int32_t penalty_begin = 0;
  int32_t penalty_count = 0;
  int32_t num_draws = 0;   // draws of this row; 0: the row is skipped
  int32_t first_draw = 0;  // its draws' index in uniforms / tokens / logprobs
  // SamplingParams::logprobs: -1 none; 0 the drawn tokens' only; N in
  // [1, kMaxSampleTopLogprobs] also the row's top N (min(N, vocab) entries
  // from top_begin in top_ids / top_logprobs).
  int32_t logprobs = -1;
  int32_t top_begin = 0;
};

// Largest vocabulary LaunchSampleRows takes (its fixed-point mass sums stay
// below 2^63).
constexpr int64_t kMaxSampleVocab = int64_t{1} << 23;
// Most draws of one row (the sampler's largest num_samples, a request's n).
constexpr int kMaxSampleDraws = 64;
// Largest top-N of a row's logprobs (SamplingParams' limit, vLLM's default
// max_logprobs of 20).
constexpr int kMaxSampleTopLogprobs = 20;

// LaunchSampleRows' device buffers (none owned; device memory).
struct SampleBuffers {
  const SampleRowArgs* args = nullptr;  // [n]
  const double* uniforms = nullptr;     // [draws] in [0, 1), by first_draw
  const SamplePenalty* penalties = nullptr;
  // Scratch, one per penalties entry: the raw logit of a penalized token of
  // a row with logprobs (written and read by the kernel).
  float* penalty_raw = nullptr;
  int32_t* tokens = nullptr;   // [draws] out
  float* logprobs = nullptr;   // [draws] out: written for rows with logprobs >= 0
  int32_t* top_ids = nullptr;  // out, by top_begin (rows with logprobs >= 1)
  float* top_logprobs = nullptr;
};

// Samples each logits row t < n ([n, vocab] fp32) with b.args[t]:
// b.tokens[first_draw + j] = the token the host sampler draws with
// b.uniforms[first_draw + j] for j < num_draws (<= kMaxSampleDraws), or -1 for every draw of a
// row the host sampler refuses (a NaN or +inf logit, or only -inf ones). A
// row with logprobs >= 0 also gets the sampler's raw logprobs (the
// log-softmax of the row before penalties and filters) of its drawn tokens
// in b.logprobs and of its top min(logprobs, vocab) tokens (logprob
// descending, ties to the lower id) in b.top_ids / b.top_logprobs. A row
// with penalties has them applied to its logits in place (the sampler's
// step 1); refused rows and rows with num_draws == 0 are left alone. The
// kernel and how it agrees with the host sampler: sampling_kernels.cuh.
// cudaErrorInvalidValue unless 1 <= vocab <= kMaxSampleVocab.
cudaError_t LaunchSampleRows(float* logits, int n, int64_t vocab, const SampleBuffers& b,
                             cudaStream_t stream);

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_
