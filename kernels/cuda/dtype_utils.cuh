// Internal device helpers shared by the CUDA kernels: element <-> fp32
// conversion, 16-byte vector unpacking, packed (vector) loads and stores,
// and warp/block reductions.
//
// KV-cache element types (template parameter CACHE_T of the kernels): float,
// __half, __nv_bfloat16, and the fp8 types __nv_fp8_e4m3 / __nv_fp8_e5m2 of
// cuda_fp8.h used as tags (their storage is one byte; kernels read them as
// raw bytes). CacheElem<CACHE_T> gives the vector widths; Unpack16 / UnpackVec
// convert one loaded vector to fp32 in registers (fp8: cuda_fp8.h's
// __nv_cvt_fp8x2_to_halfraw2, exact, hardware cvt on sm_89+, emulated in the
// header on sm_80); CacheFromFloat<CACHE_T> encodes (fp8: __nv_cvt_float_to_fp8
// with __NV_SATFINITE, round to nearest even). The fp8 scales are NOT applied
// here: callers fold k_scale into the softmax scale and v_scale into the
// output normalization (kernels/paged_attention.h).
#ifndef PAGEDSERVE_KERNELS_CUDA_DTYPE_UTILS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_DTYPE_UTILS_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// Dynamic shared memory as `type* name` (128-byte aligned: the tensor-core
// kernels need 32-byte aligned tiles). A macro so that the
// CPU emulation of the kernels (tests/kernels/simt_emulator.h) can supply it.
#ifndef PAGEDSERVE_DYNAMIC_SHARED
#define PAGEDSERVE_DYNAMIC_SHARED(type, name)                               \
  extern __shared__ __align__(128) unsigned char pagedserve_dynamic_smem[]; \
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
__device__ __forceinline__ float FromFloat<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float v) {
  return __float2half_rn(v);
}
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
// rules intact (the CPU emulation test runs this code); nvcc emits a move. The
// copy goes through the trivially copyable *_raw structs (GCC's -Wclass-memaccess:
// __half2 and __nv_bfloat162 have user-provided assignment).
__device__ __forceinline__ __half2 WordToHalf2(uint32_t w) {
  __half2_raw h;
  memcpy(&h, &w, sizeof(h));
  return __half2(h);
}
__device__ __forceinline__ __nv_bfloat162 WordToBFloat162(uint32_t w) {
  __nv_bfloat162_raw h;
  memcpy(&h, &w, sizeof(h));
  return __nv_bfloat162(h);
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

// Memory-access profiling marks, read by the SIMT emulator's profiler
// (tests/kernels/simt_emulator.h: sectors per warp global load, shared-memory
// bank conflicts): PAGEDSERVE_GLOBAL_READ(p, bytes) marks one thread's read
// of `bytes` at p in global memory, PAGEDSERVE_SHARED(p) one thread's access
// of *p in shared memory; each is an expression yielding p. Kernels mark the
// paged-KV loads and their hot shared-memory accesses at the very instruction
// (the emulator groups the threads of a warp by mark and occurrence). Here,
// on the device and in every build without the emulator, they are p itself.
#ifndef PAGEDSERVE_GLOBAL_READ
#define PAGEDSERVE_GLOBAL_READ(p, bytes) (p)
#endif
#ifndef PAGEDSERVE_SHARED
#define PAGEDSERVE_SHARED(p) (p)
#endif

// N consecutive elements of T as one register group, aligned to its size:
// the unit of the vectorized (packed) loads and stores of the elementwise
// kernels (N * sizeof(T) bytes: 16 for 4 floats, 8 for 4 bf16 / fp16, 4 for
// 4 fp8 codes; one vector instruction each on the device).
template <typename T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

#ifndef __CUDA_ARCH__
// Host (CPU emulation): a packed or vector access (LoadPacked, StorePacked,
// Load16, Load8) at p must be aligned to `bytes`; the device would fault
// ("misaligned address"), the emulator aborts with a message instead.
inline void CheckPackedAlignment(const void* p, size_t bytes) {
  if (reinterpret_cast<uintptr_t>(p) % bytes != 0) {
    fprintf(stderr, "packed access of %zu bytes at misaligned address %p\n", bytes, p);
    abort();
  }
}
#endif

// Loads / stores the N consecutive elements at p; p must be aligned to
// N * sizeof(T) (the launchers check before choosing N > 1).
template <int N, typename T>
__device__ __forceinline__ Packed<T, N> LoadPacked(const T* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const Packed<T, N>*>(p);
#else
  CheckPackedAlignment(p, sizeof(Packed<T, N>));
  Packed<T, N> r;
  memcpy(static_cast<void*>(&r), p, sizeof(r));
  return r;
#endif
}
template <int N, typename T>
__device__ __forceinline__ void StorePacked(T* p, const Packed<T, N>& v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<Packed<T, N>*>(p) = v;
#else
  CheckPackedAlignment(p, sizeof(Packed<T, N>));
  memcpy(static_cast<void*>(p), &v, sizeof(v));
#endif
}

// One 16-byte load; p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ uint4 Load16(const T* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint4*>(p);
#else
  CheckPackedAlignment(p, sizeof(uint4));
  uint4 r;  // host (CPU emulation): no type punning through uint4 lvalues
  memcpy(&r, p, sizeof(r));
  return r;
#endif
}

// One 16-byte store; p must be 16-byte aligned.
template <typename T>
__device__ __forceinline__ void Store16(T* p, const uint4& v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint4*>(p) = v;
#else
  CheckPackedAlignment(p, sizeof(uint4));
  memcpy(static_cast<void*>(p), &v, sizeof(v));  // host (CPU emulation): no type punning
#endif
}

// One 8-byte load; p must be 8-byte aligned.
template <typename T>
__device__ __forceinline__ uint2 Load8(const T* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint2*>(p);
#else
  CheckPackedAlignment(p, sizeof(uint2));
  uint2 r;
  memcpy(&r, p, sizeof(r));
  return r;
#endif
}

// ---- fp8 KV-cache elements.

template <typename C>
struct Fp8Interp;  // the cuda_fp8.h interpretation of an fp8 tag type
template <>
struct Fp8Interp<__nv_fp8_e4m3> {
  static constexpr __nv_fp8_interpretation_t value = __NV_E4M3;
};
template <>
struct Fp8Interp<__nv_fp8_e5m2> {
  static constexpr __nv_fp8_interpretation_t value = __NV_E5M2;
};

template <typename C>
inline constexpr bool kIsFp8 = false;
template <>
inline constexpr bool kIsFp8<__nv_fp8_e4m3> = true;
template <>
inline constexpr bool kIsFp8<__nv_fp8_e5m2> = true;

// Vector widths of a cache element type. kKeyVec is the x of the key layout
// (one 16-byte load). kValueVec is the number of consecutive tokens of one
// head dimension read per value load: 16 bytes for fp32/fp16/bf16 (4 or 8
// tokens); 8 bytes (8 tokens) for fp8, so that a load never straddles a block
// of 8 tokens. ValueVec is the loaded register type.
template <typename C>
struct CacheElem {
  static constexpr int kKeyVec = static_cast<int>(16 / sizeof(C));
  static constexpr int kValueVec = kKeyVec;
  using ValueVec = uint4;
};
template <>
struct CacheElem<__nv_fp8_e4m3> {
  static constexpr int kKeyVec = 16;
  static constexpr int kValueVec = 8;
  using ValueVec = uint2;
};
template <>
struct CacheElem<__nv_fp8_e5m2> : CacheElem<__nv_fp8_e4m3> {};

// Two fp8 codes (low byte first) to two floats, exact.
template <typename C>
__device__ __forceinline__ float2 Fp8x2ToFloat2(uint16_t codes) {
  const __half2_raw hr =
      __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), Fp8Interp<C>::value);
  return __half22float2(__half2(hr));
}

// One fp8 code to float, exact.
template <typename C>
__device__ __forceinline__ float Fp8ToFloat(uint8_t code) {
  return Fp8x2ToFloat2<C>(code).x;
}

// fp32 -> fp8 code: round to nearest even, saturate to the largest finite
// value, NaN -> 0x7F (cuda_fp8.h, __NV_SATFINITE).
template <typename C>
__device__ __forceinline__ uint8_t FloatToFp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, Fp8Interp<C>::value));
}

// Unpacks the 4 words of 4 fp8 codes each into 16 floats (element i = byte i).
template <typename C>
__device__ __forceinline__ void UnpackFp8Words(const uint32_t* w, int nwords, float* f) {
  for (int i = 0; i < nwords; ++i) {
    const float2 lo = Fp8x2ToFloat2<C>(static_cast<uint16_t>(w[i] & 0xffffu));
    const float2 hi = Fp8x2ToFloat2<C>(static_cast<uint16_t>(w[i] >> 16));
    f[4 * i] = lo.x;
    f[4 * i + 1] = lo.y;
    f[4 * i + 2] = hi.x;
    f[4 * i + 3] = hi.y;
  }
}
__device__ __forceinline__ void Unpack16(const uint4& r, const __nv_fp8_e4m3*, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  UnpackFp8Words<__nv_fp8_e4m3>(w, 4, f);
}
__device__ __forceinline__ void Unpack16(const uint4& r, const __nv_fp8_e5m2*, float* f) {
  const uint32_t w[4] = {r.x, r.y, r.z, r.w};
  UnpackFp8Words<__nv_fp8_e5m2>(w, 4, f);
}

// Loads / unpacks one value vector (CacheElem<C>::kValueVec elements).
template <typename C>
__device__ __forceinline__ typename CacheElem<C>::ValueVec LoadValueVec(const C* p) {
  if constexpr (kIsFp8<C>) {
    return Load8(p);
  } else {
    return Load16(p);
  }
}
template <typename C>
__device__ __forceinline__ void UnpackValueVec(const typename CacheElem<C>::ValueVec& r, float* f) {
  if constexpr (kIsFp8<C>) {
    const uint32_t w[2] = {r.x, r.y};
    UnpackFp8Words<C>(w, 2, f);
  } else {
    Unpack16(r, static_cast<const C*>(nullptr), f);
  }
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
