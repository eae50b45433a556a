// Internal: launchers of the small fp32 CUDA kernels of the Llama forward pass
// (runtime/worker/cuda/llama_model_cuda.cc). Callable from host C++20 and from
// nvcc (C++17); free of Abseil so that nvcc parses little. Every pointer is
// device memory; every launcher enqueues on `stream` and returns the launch
// error (cudaSuccess when there is nothing to do, e.g. n == 0). Row-major
// layouts throughout. Each kernel mirrors one loop of the CPU forward pass
// (runtime/worker/llama_model.cc) with the same arithmetic order where it
// matters (double sums in RMSNorm, double angles in RoPE).
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace pagedserve::cuda_model {

// out[t, :] = table[ids[t], :] for t < n; table [vocab, hidden].
// ids are checked on the host beforehand (0 <= id < vocab).
cudaError_t LaunchEmbeddingGather(const float* table, const int32_t* ids, int n, int hidden,
                                  float* out, cudaStream_t stream);

// out[t, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight, with r = rows[t]
// when `rows` is not null (a gather of selected rows), else r = t. The sum of
// squares is accumulated in double, as on the CPU. out [n, dim].
cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows, const float* weight, int n, int dim,
                          double eps, float* out, cudaStream_t stream);

// cos_t/sin_t[t, i] = (float)cos/sin(positions[t] * inv_freq[i]) computed in
// double; inv_freq [half] (double), tables [n, half].
cudaError_t LaunchRopeTables(const int32_t* positions, const double* inv_freq, int n, int half,
                             float* cos_t, float* sin_t, cudaStream_t stream);

// Rotary embedding in the rotate_half layout (HF LlamaRotaryEmbedding): for
// every token t, head h < heads and i < head_size/2, the pair (i, i + half) of
// x[t * token_stride + h * head_size + ...] rotates by (cos_t, sin_t)[t, i].
cudaError_t LaunchApplyRope(float* x, int n, int heads, int head_size, int64_t token_stride,
                            const float* cos_t, const float* sin_t, cudaStream_t stream);

// y[t, j] += bias[j] for t < n, j < cols.
cudaError_t LaunchAddBias(float* y, const float* bias, int n, int cols, cudaStream_t stream);

// gate[i] = silu(gate[i]) * up[i] = gate[i] / (1 + exp(-gate[i])) * up[i], i < count.
cudaError_t LaunchSiluMul(float* gate, const float* up, int64_t count, cudaStream_t stream);

// x[i] += o[i], i < count (the residual connection).
cudaError_t LaunchAdd(float* x, const float* o, int64_t count, cudaStream_t stream);

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_H_
