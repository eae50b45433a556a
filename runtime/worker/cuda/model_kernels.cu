// The small fp32 kernels of the CUDA forward pass; contracts in model_kernels.h.
// No templates: one instantiation per kernel keeps nvcc time small.
#include "runtime/worker/cuda/model_kernels.h"

namespace pagedserve::cuda_model {
namespace {

constexpr int kThreads = 256;

// Grid-stride element count -> number of blocks, capped so that the grid
// fits the 1-D limit comfortably; kernels loop over the remainder.
unsigned int BlocksFor(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  return static_cast<unsigned int>(blocks);
}

__global__ void EmbeddingGatherKernel(const float* __restrict__ table,
                                      const int32_t* __restrict__ ids, int hidden,
                                      float* __restrict__ out) {
  const int t = blockIdx.x;
  const float* src = table + static_cast<int64_t>(ids[t]) * hidden;
  float* dst = out + static_cast<int64_t>(t) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = src[i];
}

// One block per output row; kThreads threads reduce the double sum of squares.
__global__ void RmsNormKernel(const float* __restrict__ x, const int32_t* __restrict__ rows,
                              const float* __restrict__ weight, int dim, double eps,
                              float* __restrict__ out) {
  __shared__ double partial[kThreads];
  const int t = blockIdx.x;
  const int r = rows != nullptr ? rows[t] : t;
  const float* xr = x + static_cast<int64_t>(r) * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    const double v = xr[i];
    ss += v * v;
  }
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / dim + eps));
  float* o = out + static_cast<int64_t>(t) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * weight[i];
}

__global__ void RopeTablesKernel(const int32_t* __restrict__ positions,
                                 const double* __restrict__ inv_freq, int64_t total, int half,
                                 float* __restrict__ cos_t, float* __restrict__ sin_t) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = k / half;
    const int i = static_cast<int>(k % half);
    const double angle = static_cast<double>(positions[t]) * inv_freq[i];
    cos_t[k] = static_cast<float>(cos(angle));
    sin_t[k] = static_cast<float>(sin(angle));
  }
}

// One block per token; threads cover (head, i) pairs of that token.
__global__ void ApplyRopeKernel(float* __restrict__ x, int heads, int head_size,
                                int64_t token_stride, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t) {
  const int t = blockIdx.x;
  const int half = head_size / 2;
  const float* c = cos_t + static_cast<int64_t>(t) * half;
  const float* s = sin_t + static_cast<int64_t>(t) * half;
  float* row = x + static_cast<int64_t>(t) * token_stride;
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int h = k / half;
    const int i = k % half;
    float* v = row + static_cast<int64_t>(h) * head_size;
    const float a = v[i], b = v[i + half];
    v[i] = a * c[i] - b * s[i];
    v[i + half] = b * c[i] + a * s[i];
  }
}

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int64_t total,
                              int cols) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[k] += bias[k % cols];
}

__global__ void SiluMulKernel(float* __restrict__ gate, const float* __restrict__ up,
                              int64_t count) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[k];
    gate[k] = g / (1.0f + expf(-g)) * up[k];
  }
}

__global__ void AddKernel(float* __restrict__ x, const float* __restrict__ o, int64_t count) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[k] += o[k];
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const float* table, const int32_t* ids, int n, int hidden,
                                  float* out, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return cudaSuccess;
  EmbeddingGatherKernel<<<n, kThreads, 0, stream>>>(table, ids, hidden, out);
  return cudaGetLastError();
}

cudaError_t LaunchRmsNorm(const float* x, const int32_t* rows, const float* weight, int n, int dim,
                          double eps, float* out, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return cudaSuccess;
  RmsNormKernel<<<n, kThreads, 0, stream>>>(x, rows, weight, dim, eps, out);
  return cudaGetLastError();
}

cudaError_t LaunchRopeTables(const int32_t* positions, const double* inv_freq, int n, int half,
                             float* cos_t, float* sin_t, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * half;
  if (total <= 0) return cudaSuccess;
  RopeTablesKernel<<<BlocksFor(total), kThreads, 0, stream>>>(positions, inv_freq, total, half,
                                                              cos_t, sin_t);
  return cudaGetLastError();
}

cudaError_t LaunchApplyRope(float* x, int n, int heads, int head_size, int64_t token_stride,
                            const float* cos_t, const float* sin_t, cudaStream_t stream) {
  if (n <= 0 || heads <= 0 || head_size < 2) return cudaSuccess;
  ApplyRopeKernel<<<n, kThreads, 0, stream>>>(x, heads, head_size, token_stride, cos_t, sin_t);
  return cudaGetLastError();
}

cudaError_t LaunchAddBias(float* y, const float* bias, int n, int cols, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * cols;
  if (total <= 0) return cudaSuccess;
  AddBiasKernel<<<BlocksFor(total), kThreads, 0, stream>>>(y, bias, total, cols);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(float* gate, const float* up, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  SiluMulKernel<<<BlocksFor(count), kThreads, 0, stream>>>(gate, up, count);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* x, const float* o, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  AddKernel<<<BlocksFor(count), kThreads, 0, stream>>>(x, o, count);
  return cudaGetLastError();
}

}  // namespace pagedserve::cuda_model
