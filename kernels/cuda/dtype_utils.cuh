// Internal device helpers shared by the CUDA kernels: element <-> fp32
// conversion, 16-byte vector unpacking and warp/block reductions.
#ifndef PAGEDSERVE_KERNELS_CUDA_DTYPE_UTILS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_DTYPE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstring>

// Dynamic shared memory as `type* name` (16-byte aligned). A macro so that the
// CPU emulation of the kernels (tests/kernels/simt_emulator.h) can supply it.
#ifndef PAGEDSERVE_DYNAMIC_SHARED
#define PAGEDSERVE_DYNAMIC_SHARED(type, name)                              \
  extern __shared__ __align__(16) unsigned char pagedserve_dynamic_smem[]; \
  type* name = reinterpret_cast<type*>(pagedserve_dynamic_smem)
#endif

namespace pagedserve::kernels::cuda {

constexpr int kWarpSize = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToFloat(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T FromFloat(float v);
template <>
__device__ __forceinline__ float FromFloat<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// Elements of T in one 16-byte vector: the `x` of the key layout and the
// V_VEC_SIZE of the value reads.
template <typename T>
inline constexpr int kVec16 = static_cast<int>(16 / sizeof(T));

// Unpacks one 16-byte vector of T into kVec16<T> floats.
__device__ __forceinline__ void Unpack16(const uint4& r, const float*, float* f) {
  f[0] = __uint_as_float(r.x);
  f[1] = __uint_as_float(r.y);
  f[2] = __uint_as_float(r.z);
  f[3] = __uint_as_float(r.w);
}
// Bit casts of one 32-bit word. memcpy keeps host compilers' strict-aliasing
// rules intact (the CPU emulation test runs this code); nvcc emits a move.
__device__ __forceinline__ __half2 WordToHalf2(uint32_t w) {
  __half2 h;
  memcpy(&h, &w, sizeof(h));
  return h;
}
__device__ __forceinline__ __nv_bfloat162 WordToBFloat162(uint32_t w) {
  __nv_bfloat162 h;
  memcpy(&h, &w, sizeof(h));
  return h;
}

__device__ __forceinline__ void Unpack16(const uint4& r, const __half*, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __half22float2(WordToHalf2(w[i]));
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}
__device__ __forceinline__ void Unpack16(const uint4& r, const __nv_bfloat16*, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(WordToBFloat162(w[i]));
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

// One 16-byte load; p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 Load16(const T* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint4*>(p);
#else
  uint4 r;  // host (CPU emulation): no type punning through uint4 lvalues
  memcpy(&r, p, sizeof(r));
  return r;
#endif
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int m = kWarpSize / 2; m >= 1; m /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return v;
}
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int m = kWarpSize / 2; m >= 1; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return v;
}

// Block-wide max / sum over NUM_WARPS warps through red_smem[NUM_WARPS]; every
// thread gets the result. Contains __syncthreads(): call from all threads.
template <int NUM_WARPS>
__device__ __forceinline__ float BlockMax(float* red_smem, float v) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  v = WarpMax(v);
  if (lane == 0) red_smem[warp] = v;
  __syncthreads();
  v = lane < NUM_WARPS ? red_smem[lane] : -INFINITY;
#pragma unroll
  for (int m = NUM_WARPS / 2; m >= 1; m /= 2) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, m));
  return __shfl_sync(kFullMask, v, 0);
}
template <int NUM_WARPS>
__device__ __forceinline__ float BlockSum(float* red_smem, float v) {
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  v = WarpSum(v);
  if (lane == 0) red_smem[warp] = v;
  __syncthreads();
  v = lane < NUM_WARPS ? red_smem[lane] : 0.0f;
#pragma unroll
  for (int m = NUM_WARPS / 2; m >= 1; m /= 2) v += __shfl_xor_sync(kFullMask, v, m);
  return __shfl_sync(kFullMask, v, 0);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_DTYPE_UTILS_CUH_
