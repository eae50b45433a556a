// The CPU backend of the forward pass (runtime/worker/model_backend.h).
//
// Weights stay in their stored formats: projections and the LM head run
// kernels::Linear over GGUF quantized, F16 or BF16 rows, or one OpenBLAS
// sgemm for fp32 matrices (--dtype float32: the exact path the transformers
// fixtures check). RMSNorm sums squares in double; rotary tables come from
// the plan. Loops run on OpenMP threads. The KV cache may be fp32, fp16 or
// bf16 (host memory); Attention converts queries, keys, values and the output
// to the cache's element type around the kernels:: attention entry points
// (round to nearest even). The TP all-reduce is the communicator's (MPI).
//
// GEMM inputs (GemmInputBuffer) are fp32 here: the stored-format kernels
// quantize or convert activations themselves.
//
// The elementwise operations are also free functions (cpu_ops below) so that
// the CUDA kernels' emulation test (tests/worker/cuda_model_emulation_test.cc)
// checks the device kernels against exactly this arithmetic.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CPU_BACKEND_H_
#define PAGEDSERVE_RUNTIME_WORKER_CPU_BACKEND_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "distributed/communicator.h"
#include "runtime/worker/model_backend.h"
#include "runtime/worker/moe_routing.h"

namespace pagedserve {

namespace cpu_ops {

// ModelBackend::AddRmsNorm on host arrays: for t < n, r = rows ? rows[t] : t,
// v = residual[r] (+ add[r]), out[t] = v / sqrt(sum(v^2)/dim + eps) * weight
// (sum in double, in index order); residual[r] = v is written back only when
// rows is null and add is not. out must not alias residual or add.
void AddRmsNorm(float* residual, const float* add, const int32_t* rows, int64_t n, int dim,
                const float* weight, double eps, float* out);

// ModelBackend::HeadRmsNorm on a host array: each of the `rows` runs of dim
// values of x (x [rows, dim]) becomes v / sqrt(sum(v^2)/dim + eps) * weight,
// in place, with AddRmsNorm's arithmetic.
void HeadRmsNorm(float* x, int64_t rows, int dim, const float* weight, double eps);

// ModelBackend::AddPostRmsNorm on host arrays: residual[t] += add[t] / sqrt(
// sum(add[t]^2)/dim + eps) * weight for t < n (sum in double, in index order).
void AddPostRmsNorm(float* residual, const float* add, int64_t n, int dim, const float* weight,
                    double eps);

// ModelBackend::GeluTanhMul on host arrays (fp32, std::tanh); out may be gate.
void GeluTanhMul(const float* gate, const float* up, int64_t count, float* out);

// ModelBackend::ApplyRope on host arrays: the pairs (i, i + rotary_half),
// i < rotary_half, of each head rotate (2 * rotary_half <= head_size; the
// dimensions past 2 * rotary_half pass through); cos_t/sin_t are [n, rotary_half].
void ApplyRope(float* x, int64_t n, int heads, int head_size, int rotary_half, int64_t token_stride,
               const float* cos_t, const float* sin_t);

// The sum of ModelBackend::MoeMlp on host arrays (fp32): y[t, c] = the sum
// over j < top_k, in j order, of pair_weights[i] * pair_out[i, c] with i =
// token_pairs[t * top_k + j] (TokenPairPositions: the token's pairs in
// ascending expert order, transformers' index_add_ order), then + 1 / (1 +
// exp(-shared_logit[t])) * shared_out[t, c] when shared_out is not null (the
// shared expert, Qwen2-MoE). pair_out [pairs, hidden], shared_out [n,
// hidden]; the same values whatever the thread split.
void MoeCombine(const float* pair_out, const int32_t* token_pairs, const float* pair_weights,
                int64_t n, int top_k, int64_t hidden, const float* shared_out,
                const float* shared_logit, float* y);

// out[i] = gate[i] / (1 + exp(-gate[i])) * up[i], i < count, by
// kernels::cpu::SiluAndMul (fp32; on AVX2 an exp within 1.2e-7 relative), in
// chunks over the OpenMP team from 16384 elements (the same values either
// way). out may be gate (in place).
void SiluMul(const float* gate, const float* up, int64_t count, float* out);

// out[t, :] = table[ids[t], :] as fp32 (a copy for fp32 tables, the row's
// dequantization otherwise); ids must be in [0, table.rows). Errors of
// Matrix::RowToFloat pass through.
absl::Status EmbeddingGather(const Matrix& table, const int32_t* ids, int64_t n, float* out);

}  // namespace cpu_ops

// Called by MoeMlp with each mixture-of-experts layer's routing, in layer
// order within a step, on the forward pass's thread (tests compare the experts
// chosen with transformers'). The routing is valid during the call only.
using MoeRoutingObserver = std::function<void(const MoeRouting&)>;

// `comm` (not owned) spans the TP group and must outlive the backend.
// MoeMlp (CPU): router logits by Linear, RouteTokens, then per expert with
// tokens: its rows of x gathered, one LinearGroup through gate and up,
// SiluMul, one Linear through down, and the weighted rows added into y in
// expert order (transformers' index_add_ order). `observer` may be empty.
std::unique_ptr<ModelBackend> MakeCpuBackend(Communicator* comm, MoeRoutingObserver observer = {});

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CPU_BACKEND_H_
