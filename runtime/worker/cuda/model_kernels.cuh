// Internal: the bodies of the small kernels of the CUDA backend
// (runtime/worker/cuda/cuda_backend.h), as device functions so that
// model_kernels.cu wraps them in __global__ kernels and
// tests/worker/cuda_model_emulation_test.cc runs the same source on the CPU
// through tests/kernels/simt_emulator.h, against the CPU backend's operations
// (runtime/worker/cpu_backend.h, cpu_ops). Each body mirrors one cpu_ops
// function with the same arithmetic where it matters (double sums in RMSNorm,
// fp32 elsewhere). Activations are fp32, except the GEMM inputs the norm and
// SiLU-and-mul (GeGLU) write, which may be fp16 or bf16 (rounded once, from the fp32
// result); weights (the embedding table) and the attention operands may be
// fp16 or bf16, converted with the
// round-to-nearest-even conversions of cuda_fp16.h / cuda_bf16.h (the CPU's
// kernels/cpu/half.h converters give the same bits). Every pointer is device
// memory; row-major layouts.
//
// Packed (vectorized) access: the elementwise bodies take a template
// parameter VEC (1 or kPack) and move VEC consecutive elements per load and
// store (kernels/cuda/dtype_utils.cuh Packed: 16 bytes of fp32, 8 of bf16 /
// fp16). VEC > 1 needs the extents named at each body to be multiples of VEC
// and its pointers aligned to VEC elements; the launchers (model_kernels.cu)
// check with PackWidth and fall back to VEC = 1 otherwise. Each element's
// arithmetic is the same for every VEC (bit-identical results), except the
// RMSNorm sum of squares, whose per-thread order changes (a few float ulps,
// as against the CPU).
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_CUH_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_CUH_

#include <cstdint>
#include <initializer_list>

#include "kernels/cuda/cache_kernels.cuh"
#include "kernels/cuda/dtype_utils.cuh"

namespace pagedserve::cuda_model {

// Threads per block of every launcher (model_kernels.cu).
constexpr int kThreads = 256;

// Elements per packed access when the launchers vectorize (16 bytes of fp32).
constexpr int kPack = 4;

// One pointer a kernel reads or writes in packs: its address and the size of
// its elements in bytes.
struct PackedOperand {
  const void* p;
  size_t elem_bytes;
};
template <typename T>
PackedOperand Packable(const T* p) {
  return {p, sizeof(T)};
}

// Host: the VEC a launcher uses: kPack when every extent (the row lengths,
// strides and counts the body splits into packs) is a multiple of kPack and
// every non-null operand is aligned to kPack of its elements; else 1 (the
// scalar variant, valid for any shape and alignment).
inline int PackWidth(std::initializer_list<int64_t> extents,
                     std::initializer_list<PackedOperand> operands) {
  for (int64_t e : extents)
    if (e % kPack != 0) return 1;
  for (const PackedOperand& o : operands)
    if (o.p != nullptr && reinterpret_cast<uintptr_t>(o.p) % (kPack * o.elem_bytes) != 0) return 1;
  return kPack;
}

// Grid (n): out[t, :] = (float)table[ids[t], :], table [vocab, hidden] of
// T in {float, __half, __nv_bfloat16}. ids are checked on the host
// beforehand (0 <= id < vocab). Packs: hidden.
template <typename T, int VEC = 1>
__device__ __forceinline__ void EmbeddingGatherBody(const T* __restrict__ table,
                                                    const int32_t* __restrict__ ids, int hidden,
                                                    float* __restrict__ out) {
  namespace kc = ::pagedserve::kernels::cuda;
  const int t = blockIdx.x;
  const T* src = table + static_cast<int64_t>(ids[t]) * hidden;
  float* dst = out + static_cast<int64_t>(t) * hidden;
  for (int i = threadIdx.x * VEC; i < hidden; i += blockDim.x * VEC) {
    const kc::Packed<T, VEC> s = kc::LoadPacked<VEC>(src + i);
    kc::Packed<float, VEC> d;
#pragma unroll
    for (int j = 0; j < VEC; ++j) d.v[j] = kc::ToFloat(s.v[j]);
    kc::StorePacked<VEC>(dst + i, d);
  }
}

// Grid-stride: out[k] = To(in[k]) for k < count, From/To in {float, __half,
// __nv_bfloat16}: fp32 -> 16-bit rounds to nearest even (NaN stays NaN, out
// of range becomes inf), 16-bit -> fp32 is exact. Packs: count (the grid
// strides over count / VEC packs).
template <typename From, typename To, int VEC = 1>
__device__ __forceinline__ void ConvertBody(const From* __restrict__ in, int64_t count,
                                            To* __restrict__ out) {
  namespace kc = ::pagedserve::kernels::cuda;
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
    const kc::Packed<From, VEC> a = kc::LoadPacked<VEC>(in + k);
    kc::Packed<To, VEC> b;
#pragma unroll
    for (int j = 0; j < VEC; ++j) b.v[j] = kc::FromFloat<To>(kc::ToFloat(a.v[j]));
    kc::StorePacked<VEC>(out + k, b);
  }
}

// The sum of every thread's `v` over a block of NUM_THREADS threads (a power
// of two) in a fixed tree order (the same bits on every run); `partial`:
// NUM_THREADS shared doubles, free again when it returns. Every thread of the
// block calls it.
template <int NUM_THREADS>
__device__ __forceinline__ double BlockTreeSum(double* partial, double v) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int stride = NUM_THREADS / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  return partial[0];
}

// Grid (n), block (kThreads): fused residual add + RMSNorm of one row
// (cpu_ops::AddRmsNorm): r = rows ? rows[t] : t; v = residual[r] (+ add[r],
// AddT float, __half or __nv_bfloat16: the partial-sum type, widened exactly);
// out[t] = OutT(v / sqrt(sum(v^2) / dim + eps) * weight), the sum of squares
// in double (a tree over the block), the product in fp32 rounded to OutT
// (float, __half or __nv_bfloat16: the GEMM-input type) once; residual[r] = v
// is written back only when rows is null and add is not (a gather recomputes
// v instead, the same fp32 add). Packs: dim.
template <int NUM_THREADS, typename OutT, typename AddT = float, int VEC = 1>
__device__ __forceinline__ void AddRmsNormBody(float* residual, const AddT* __restrict__ add,
                                               const int32_t* __restrict__ rows,
                                               const float* __restrict__ weight, int dim,
                                               double eps, OutT* __restrict__ out) {
  namespace kc = ::pagedserve::kernels::cuda;
  __shared__ double partial[NUM_THREADS];
  const int t = blockIdx.x;
  const int64_t r = rows != nullptr ? rows[t] : t;
  OutT* o = out + static_cast<int64_t>(t) * dim;
  float* xr = residual + r * dim;
  const AddT* ar = add != nullptr ? add + r * dim : nullptr;
  const bool write_back = rows == nullptr && ar != nullptr;
  // v = the residual's pack at i plus, when `plus_add`, the add's (widened).
  auto load_sum = [&](int i, bool plus_add) {
    kc::Packed<float, VEC> v = kc::LoadPacked<VEC>(xr + i);
    if (plus_add) {
      const kc::Packed<AddT, VEC> a = kc::LoadPacked<VEC>(ar + i);
#pragma unroll
      for (int j = 0; j < VEC; ++j) v.v[j] += kc::ToFloat(a.v[j]);
    }
    return v;
  };
  double ss = 0.0;
  for (int i = threadIdx.x * VEC; i < dim; i += blockDim.x * VEC) {
    const kc::Packed<float, VEC> v = load_sum(i, ar != nullptr);
    // Each thread reads back only the elements it wrote.
    if (write_back) kc::StorePacked<VEC>(xr + i, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += static_cast<double>(v.v[j]) * v.v[j];
  }
  const float inv =
      static_cast<float>(1.0 / sqrt(BlockTreeSum<NUM_THREADS>(partial, ss) / dim + eps));
  for (int i = threadIdx.x * VEC; i < dim; i += blockDim.x * VEC) {
    const kc::Packed<float, VEC> v = load_sum(i, !write_back && ar != nullptr);
    const kc::Packed<float, VEC> w = kc::LoadPacked<VEC>(weight + i);
    kc::Packed<OutT, VEC> y;
#pragma unroll
    for (int j = 0; j < VEC; ++j) y.v[j] = kc::FromFloat<OutT>(v.v[j] * inv * w.v[j]);
    kc::StorePacked<VEC>(o + i, y);
  }
}

// Grid (n), block (NUM_THREADS, a power of two): the residual add of a
// normed output (Gemma's sandwich norms; cpu_ops::AddPostRmsNorm) for row t:
// a = add[t] (AddT float, __half or __nv_bfloat16: the partial-sum type,
// widened exactly), residual[t] += a / sqrt(sum(a^2) / dim + eps) * weight,
// the sum of squares in double (a block tree, as AddRmsNormBody), the
// product and the sum in fp32. Packs: dim.
template <int NUM_THREADS, typename AddT = float, int VEC = 1>
__device__ __forceinline__ void AddPostRmsNormBody(float* __restrict__ residual,
                                                   const AddT* __restrict__ add,
                                                   const float* __restrict__ weight, int dim,
                                                   double eps) {
  namespace kc = ::pagedserve::kernels::cuda;
  __shared__ double partial[NUM_THREADS];
  const int64_t t = blockIdx.x;
  float* xr = residual + t * dim;
  const AddT* ar = add + t * dim;
  auto load_add = [&](int i) {
    const kc::Packed<AddT, VEC> a = kc::LoadPacked<VEC>(ar + i);
    kc::Packed<float, VEC> v;
#pragma unroll
    for (int j = 0; j < VEC; ++j) v.v[j] = kc::ToFloat(a.v[j]);
    return v;
  };
  double ss = 0.0;
  for (int i = threadIdx.x * VEC; i < dim; i += blockDim.x * VEC) {
    const kc::Packed<float, VEC> v = load_add(i);
#pragma unroll
    for (int j = 0; j < VEC; ++j) ss += static_cast<double>(v.v[j]) * v.v[j];
  }
  const float inv =
      static_cast<float>(1.0 / sqrt(BlockTreeSum<NUM_THREADS>(partial, ss) / dim + eps));
  for (int i = threadIdx.x * VEC; i < dim; i += blockDim.x * VEC) {
    const kc::Packed<float, VEC> a = load_add(i);
    const kc::Packed<float, VEC> w = kc::LoadPacked<VEC>(weight + i);
    kc::Packed<float, VEC> x = kc::LoadPacked<VEC>(xr + i);
#pragma unroll
    for (int j = 0; j < VEC; ++j) x.v[j] += a.v[j] * inv * w.v[j];
    kc::StorePacked<VEC>(xr + i, x);
  }
}

// Grid-stride: x[k] *= factor in fp32 for k < count (Gemma's embedding
// scale). Packs: count.
template <int VEC = 1>
__device__ __forceinline__ void ScaleBody(float* __restrict__ x, int64_t count, float factor) {
  namespace kc = ::pagedserve::kernels::cuda;
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
    kc::Packed<float, VEC> v = kc::LoadPacked<VEC>(x + k);
#pragma unroll
    for (int j = 0; j < VEC; ++j) v.v[j] *= factor;
    kc::StorePacked<VEC>(x + k, v);
  }
}

// Rotates the VEC pairs (a[j], b[j]) by the angles whose cosines and sines
// are c[0..VEC) and s[0..VEC): a' = a c - b s, b' = b c + a s in fp32 (HF's
// rotate_half arithmetic, as cpu_ops::ApplyRope). Optionally adds the bias
// packs first (ba, bb; null: none), an fp32 add.
template <int VEC>
__device__ __forceinline__ void RotatePairs(::pagedserve::kernels::cuda::Packed<float, VEC>* a,
                                            ::pagedserve::kernels::cuda::Packed<float, VEC>* b,
                                            const float* ba, const float* bb, const float* c,
                                            const float* s) {
  namespace kc = ::pagedserve::kernels::cuda;
  if (ba != nullptr) {
    const kc::Packed<float, VEC> x = kc::LoadPacked<VEC>(ba), y = kc::LoadPacked<VEC>(bb);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      a->v[j] += x.v[j];
      b->v[j] += y.v[j];
    }
  }
  const kc::Packed<float, VEC> cv = kc::LoadPacked<VEC>(c), sv = kc::LoadPacked<VEC>(s);
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const float x = a->v[j], y = b->v[j];
    a->v[j] = x * cv.v[j] - y * sv.v[j];
    b->v[j] = y * cv.v[j] + x * sv.v[j];
  }
}

// Grid (n): rotary embedding in the rotate_half layout (HF
// LlamaRotaryEmbedding) of token t: for head h < heads and i < half =
// rot_half the pair (i, i + half) of x[t * token_stride + h * head_size +
// ...] rotates by (cos_t, sin_t)[t, i]; tables [n, rot_half]. rot_half is
// head_size / 2, or less for partial rotary (the dimensions from 2 *
// rot_half on are left as they are). Packs: rot_half, token_stride.
template <int VEC = 1>
__device__ __forceinline__ void ApplyRopeBody(float* __restrict__ x, int heads, int head_size,
                                              int rot_half, int64_t token_stride,
                                              const float* __restrict__ cos_t,
                                              const float* __restrict__ sin_t) {
  namespace kc = ::pagedserve::kernels::cuda;
  const int t = blockIdx.x;
  const int half = rot_half;
  const int packs = half / VEC;  // per head and half
  const float* c = cos_t + static_cast<int64_t>(t) * half;
  const float* s = sin_t + static_cast<int64_t>(t) * half;
  float* row = x + static_cast<int64_t>(t) * token_stride;
  for (int k = threadIdx.x; k < heads * packs; k += blockDim.x) {
    const int h = k / packs;
    const int i = (k % packs) * VEC;
    float* v = row + static_cast<int64_t>(h) * head_size;
    kc::Packed<float, VEC> a = kc::LoadPacked<VEC>(v + i), b = kc::LoadPacked<VEC>(v + i + half);
    RotatePairs<VEC>(&a, &b, nullptr, nullptr, c + i, s + i);
    kc::StorePacked<VEC>(v + i, a);
    kc::StorePacked<VEC>(v + i + half, b);
  }
}

// Grid-stride: y[k] += bias[k % cols], k < total.
__device__ __forceinline__ void AddBiasBody(float* __restrict__ y, const float* __restrict__ bias,
                                            int64_t total, int cols) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[k] += bias[k % cols];
}

// One pack of SiLU-and-mul: OutT(g / (1 + exp(-g)) * u) per element, in
// fp32 rounded once to OutT.
template <typename OutT, int VEC>
__device__ __forceinline__ void SiluMulPack(const float* gate, const float* up, OutT* out) {
  namespace kc = ::pagedserve::kernels::cuda;
  const kc::Packed<float, VEC> g = kc::LoadPacked<VEC>(gate), u = kc::LoadPacked<VEC>(up);
  kc::Packed<OutT, VEC> y;
#pragma unroll
  for (int j = 0; j < VEC; ++j)
    y.v[j] = kc::FromFloat<OutT>(g.v[j] / (1.0f + expf(-g.v[j])) * u.v[j]);
  kc::StorePacked<VEC>(out, y);
}

// Grid-stride: out[k] = OutT(gate[k] / (1 + exp(-gate[k])) * up[k]) for
// k < count, in fp32 rounded once to OutT (float, __half or __nv_bfloat16).
// out may be gate when OutT is float (in place). Packs: count.
template <typename OutT, int VEC = 1>
__device__ __forceinline__ void SiluMulBody(const float* gate, const float* __restrict__ up,
                                            int64_t count, OutT* out) {
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC)
    SiluMulPack<OutT, VEC>(gate + k, up + k, out + k);
}

// Mixture of experts (CudaBackend::MoeMlp; runtime/worker/moe_routing.h).
// Grid (pairs): out[i, :] = x[tokens[i], :], T the GEMM-input type (float,
// __half or __nv_bfloat16): each expert's tokens become one contiguous GEMM
// input. tokens are checked on the host (0 <= token < n). Packs: hidden.
template <typename T, int VEC = 1>
__device__ __forceinline__ void MoeGatherRowsBody(const T* __restrict__ x,
                                                  const int32_t* __restrict__ tokens, int hidden,
                                                  T* __restrict__ out) {
  namespace kc = ::pagedserve::kernels::cuda;
  const T* src = x + static_cast<int64_t>(tokens[blockIdx.x]) * hidden;
  T* dst = out + static_cast<int64_t>(blockIdx.x) * hidden;
  for (int c = threadIdx.x * VEC; c < hidden; c += blockDim.x * VEC)
    kc::StorePacked<VEC>(dst + c, kc::LoadPacked<VEC>(src + c));
}

// Grid (n): token t's MoE output, the CPU backend's sums (SumExperts, then
// AddSharedExpert) in the same order and precision:
//   acc = 0; for j < top_k: i = token_pairs[t * top_k + j] (t's grouped
//   positions in ascending expert order), acc += pair_weights[i] *
//   pair_out[i, c]; then, when shared_out is not null,
//   acc += 1 / (1 + exp(-shared_logit[t])) * shared_out[t, c];
//   y[t, c] = OutT(acc) (rounded once: the partial sums' type).
// pair_out [pairs, hidden] and shared_out [n, hidden] fp32. Packs: hidden.
template <typename OutT, int VEC = 1>
__device__ __forceinline__ void MoeCombineBody(const float* __restrict__ pair_out,
                                               const int32_t* __restrict__ token_pairs,
                                               const float* __restrict__ pair_weights, int top_k,
                                               int hidden, const float* __restrict__ shared_out,
                                               const float* __restrict__ shared_logit,
                                               OutT* __restrict__ y) {
  namespace kc = ::pagedserve::kernels::cuda;
  const int64_t t = blockIdx.x;
  const float g = shared_out != nullptr ? 1.0f / (1.0f + expf(-shared_logit[t])) : 0.0f;
  for (int c = threadIdx.x * VEC; c < hidden; c += blockDim.x * VEC) {
    kc::Packed<float, VEC> acc;
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc.v[v] = 0.0f;
    for (int j = 0; j < top_k; ++j) {
      const int64_t i = token_pairs[t * top_k + j];
      const float w = pair_weights[i];
      const kc::Packed<float, VEC> r = kc::LoadPacked<VEC>(pair_out + i * hidden + c);
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc.v[v] += w * r.v[v];
    }
    if (shared_out != nullptr) {
      const kc::Packed<float, VEC> r = kc::LoadPacked<VEC>(shared_out + t * hidden + c);
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc.v[v] += g * r.v[v];
    }
    kc::Packed<OutT, VEC> out;
#pragma unroll
    for (int v = 0; v < VEC; ++v) out.v[v] = kc::FromFloat<OutT>(acc.v[v]);
    kc::StorePacked<VEC>(y + t * hidden + c, out);
  }
}

// Grid-stride: the final logit soft cap (Gemma 2; SoftcapLogit in
// runtime/worker/model_backend.h): x[k] = float(cap * tanh(double(x[k]) /
// cap)) for k < count, cap > 0, the division and tanh in double as on the
// host (a NaN stays NaN, +-inf becomes +-cap).
__device__ __forceinline__ void SoftcapBody(float* __restrict__ x, int64_t count, double cap) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    x[k] = static_cast<float>(cap * tanh(static_cast<double>(x[k]) / cap));
}

// Grid-stride: the GeGLU activation with GELU's tanh approximation
// (cpu_ops::GeluTanhMul): out[k] = OutT(0.5 g (1 + tanh(sqrt(2/pi) (g +
// 0.044715 g^3))) u), g = gate[k], u = up[k], for k < count, in fp32 (tanhf)
// rounded once to OutT (float, __half or __nv_bfloat16). out may be gate when
// OutT is float (in place). Packs: count.
template <typename OutT, int VEC = 1>
__device__ __forceinline__ void GeluTanhMulBody(const float* gate, const float* __restrict__ up,
                                                int64_t count, OutT* out) {
  namespace kc = ::pagedserve::kernels::cuda;
  const float k0 = 0.7978845608028654f;  // sqrt(2 / pi)
  const float k1 = 0.044715f;
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
    const kc::Packed<float, VEC> g = kc::LoadPacked<VEC>(gate + k), u = kc::LoadPacked<VEC>(up + k);
    kc::Packed<OutT, VEC> y;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float x = g.v[j];
      y.v[j] = kc::FromFloat<OutT>(0.5f * x * (1.0f + tanhf(k0 * (x + k1 * x * x * x))) * u.v[j]);
    }
    kc::StorePacked<VEC>(out + k, y);
  }
}

// Grid-stride: SiluMulBody over the output of one GEMM over the stacked
// gate/up rows, y [n, 2 * inter] (row t: gate columns [0, inter), up columns
// [inter, 2 * inter)): out[t * inter + i] = OutT(silu(g) * u) with g = y[t,
// i], u = y[t, inter + i], k = t * inter + i < n * inter; the same fp32
// arithmetic as SiluMulBody after a split. Packs: inter.
template <typename OutT, int VEC = 1>
__device__ __forceinline__ void SiluMulStackedBody(const float* __restrict__ y, int64_t n,
                                                   int inter, OutT* __restrict__ out) {
  const int64_t count = n * inter;
  for (int64_t k = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) * VEC; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x * VEC) {
    const int64_t t = k / inter;
    const float* row = y + t * 2 * inter;
    const int64_t i = k - t * inter;
    SiluMulPack<OutT, VEC>(row + i, row + inter + i, out + k);
  }
}

// An fp32 value in the element type of a KV cache: RNE for 16-bit caches,
// fp8(v / scale) saturating for fp8 ones (reshape_and_cache's rule).
template <typename C>
__device__ __forceinline__ C ToCacheElem(float v, float) {
  return ::pagedserve::kernels::cuda::FromFloat<C>(v);
}
template <>
__device__ __forceinline__ __nv_fp8_e4m3 ToCacheElem<__nv_fp8_e4m3>(float v, float scale) {
  __nv_fp8_e4m3 r;
  r.__x = ::pagedserve::kernels::cuda::FloatToFp8<__nv_fp8_e4m3>(v / scale);
  return r;
}
template <>
__device__ __forceinline__ __nv_fp8_e5m2 ToCacheElem<__nv_fp8_e5m2>(float v, float scale) {
  __nv_fp8_e5m2 r;
  r.__x = ::pagedserve::kernels::cuda::FloatToFp8<__nv_fp8_e5m2>(v / scale);
  return r;
}

// Grid (n): the query side of RoPE fused with the conversion to the
// attention's operand type T: out[t, h * D + i] for the pair (i, i + r) of
// head h < heads, r = rot_half, is x[t * token_stride + ...] (+ bias[h * D +
// ...] when bias is not null, an fp32 add first, as the split of a fused
// GEMM adds it) rotated by (cos_t, sin_t)[t, i] (ApplyRopeBody's arithmetic)
// and converted to T; the dimensions from 2r on (partial rotary) are
// converted unrotated. out [n, heads * D]; may be x itself when T is float.
// Packs: rot_half, token_stride.
template <typename T, int VEC = 1>
__device__ __forceinline__ void RopeConvertBody(const float* x, int heads, int head_size,
                                                int rot_half, int64_t token_stride,
                                                const float* __restrict__ bias,
                                                const float* __restrict__ cos_t,
                                                const float* __restrict__ sin_t, T* out) {
  namespace kc = ::pagedserve::kernels::cuda;
  const int t = blockIdx.x;
  const int half = rot_half;
  const int packs = half / VEC;
  const float* c = cos_t + static_cast<int64_t>(t) * half;
  const float* s = sin_t + static_cast<int64_t>(t) * half;
  const float* row = x + static_cast<int64_t>(t) * token_stride;
  T* dst = out + static_cast<int64_t>(t) * heads * head_size;
  for (int k = threadIdx.x; k < heads * packs; k += blockDim.x) {
    const int h = k / packs;
    const int i = (k % packs) * VEC;
    const int64_t e = static_cast<int64_t>(h) * head_size + i;
    kc::Packed<float, VEC> a = kc::LoadPacked<VEC>(row + e),
                           b = kc::LoadPacked<VEC>(row + e + half);
    RotatePairs<VEC>(&a, &b, bias != nullptr ? bias + e : nullptr,
                     bias != nullptr ? bias + e + half : nullptr, c + i, s + i);
    kc::Packed<T, VEC> ra, rb;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      ra.v[j] = kc::FromFloat<T>(a.v[j]);
      rb.v[j] = kc::FromFloat<T>(b.v[j]);
    }
    kc::StorePacked<VEC>(dst + e, ra);
    kc::StorePacked<VEC>(dst + e + half, rb);
  }
  const int pass = head_size - 2 * half;  // partial rotary: the unrotated tail
  for (int k = threadIdx.x; k < heads * pass; k += blockDim.x) {
    const int64_t e = static_cast<int64_t>(k / pass) * head_size + 2 * half + k % pass;
    dst[e] = kc::FromFloat<T>(bias != nullptr ? row[e] + bias[e] : row[e]);
  }
}

// Grid (n): the key/value side, fused: token t's keys (fp32 rows
// key[t * token_stride + ...] of kv_heads * D, + k_bias when not null, RoPE
// applied here as in ApplyRopeBody over the first 2 * rot_half dimensions of
// each head) and values (value[t * token_stride +
// ...], + v_bias when not null) written into a paged cache of element type C
// (float, __half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2) at
// slot_mapping[t], in vLLM's layout (kernels/cuda/cache_kernels.cuh): what a
// fused GEMM's split (bias add), ApplyRope, the conversion to C and
// reshape_and_cache do one after the other. Slots < 0 or >= num_blocks *
// block_size are skipped (reshape_and_cache's rule). Packs: rot_half,
// token_stride (a key pack lands in one x-group of the key layout; values are
// read in packs and stored one by one, their layout strides by block_size).
template <typename C, int VEC = 1>
__device__ __forceinline__ void RopeReshapeAndCacheBody(
    const float* __restrict__ key, const float* __restrict__ value, int64_t token_stride,
    const float* __restrict__ k_bias, const float* __restrict__ v_bias, int num_kv_heads,
    int head_size, int rot_half, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
    const int64_t* __restrict__ slot_mapping, int64_t num_blocks, int block_size,
    C* __restrict__ key_cache, C* __restrict__ value_cache, float k_scale, float v_scale) {
  namespace kc = ::pagedserve::kernels::cuda;
  constexpr int X = kc::CacheElem<C>::kKeyVec;
  static_assert(X % VEC == 0, "a key pack must not straddle two x-groups");
  const int t = blockIdx.x;
  const int64_t slot = slot_mapping[t];
  if (slot < 0 || slot >= num_blocks * block_size) return;
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int half = rot_half;
  const int kv_dim = num_kv_heads * head_size;
  const float* c = cos_t + static_cast<int64_t>(t) * half;
  const float* s = sin_t + static_cast<int64_t>(t) * half;
  const float* k = key + static_cast<int64_t>(t) * token_stride;
  const float* v = value + static_cast<int64_t>(t) * token_stride;
  const int packs = half / VEC;
  for (int p = threadIdx.x; p < num_kv_heads * packs; p += blockDim.x) {
    const int h = p / packs;
    const int i = (p % packs) * VEC;
    const int e = h * head_size + i;
    kc::Packed<float, VEC> a = kc::LoadPacked<VEC>(k + e), b = kc::LoadPacked<VEC>(k + e + half);
    RotatePairs<VEC>(&a, &b, k_bias != nullptr ? k_bias + e : nullptr,
                     k_bias != nullptr ? k_bias + e + half : nullptr, c + i, s + i);
    kc::Packed<C, VEC> ca, cb;
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      ca.v[j] = ToCacheElem<C>(a.v[j], k_scale);
      cb.v[j] = ToCacheElem<C>(b.v[j], k_scale);
    }
    kc::StorePacked<VEC>(
        key_cache + kc::KeyCacheOffset(block, offset, h, i, num_kv_heads, head_size, block_size, X),
        ca);
    kc::StorePacked<VEC>(key_cache + kc::KeyCacheOffset(block, offset, h, i + half, num_kv_heads,
                                                        head_size, block_size, X),
                         cb);
  }
  const int pass = head_size - 2 * half;  // partial rotary: keys stored unrotated
  for (int p = threadIdx.x; p < num_kv_heads * pass; p += blockDim.x) {
    const int h = p / pass;
    const int d = 2 * half + p % pass;
    const int e = h * head_size + d;
    key_cache[kc::KeyCacheOffset(block, offset, h, d, num_kv_heads, head_size, block_size, X)] =
        ToCacheElem<C>(k_bias != nullptr ? k[e] + k_bias[e] : k[e], k_scale);
  }
  for (int e = threadIdx.x * VEC; e < kv_dim; e += blockDim.x * VEC) {
    const int h = e / head_size;
    const int d = e % head_size;
    kc::Packed<float, VEC> x = kc::LoadPacked<VEC>(v + e);
    if (v_bias != nullptr) {
      const kc::Packed<float, VEC> bv = kc::LoadPacked<VEC>(v_bias + e);
#pragma unroll
      for (int j = 0; j < VEC; ++j) x.v[j] += bv.v[j];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j)
      value_cache[kc::ValueCacheOffset(block, offset, h, d + j, num_kv_heads, head_size,
                                       block_size)] = ToCacheElem<C>(x.v[j], v_scale);
  }
}

// Grid (n), block (NUM_THREADS, a power of two): out[t] = the index of the
// largest of logits[t, 0..vocab), ties to the lowest index, or -1 when the
// row holds a NaN or +inf or only -inf values: the host's GreedyArgmax
// (runtime/worker/model_backend.h), i.e. the sampler's greedy rule. Each
// thread scans a strided slice in ascending order keeping its first maximum;
// a block tree then keeps the larger value, the lower index on ties.
template <int NUM_THREADS>
__device__ __forceinline__ void GreedyArgmaxBody(const float* __restrict__ logits, int64_t vocab,
                                                 int32_t* __restrict__ out) {
  __shared__ float best_v[NUM_THREADS];
  __shared__ int32_t best_i[NUM_THREADS];
  __shared__ int32_t bad[NUM_THREADS];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int32_t bi = -1, b = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = row[i];
    if (v != v || v == INFINITY) {
      b = 1;
    } else if (v > bv) {
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  bad[threadIdx.x] = b;
  __syncthreads();
  for (int stride = NUM_THREADS / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int32_t oi = best_i[threadIdx.x + stride];
      const int32_t mi = best_i[threadIdx.x];
      if (oi >= 0 &&
          (mi < 0 || ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < mi))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
      bad[threadIdx.x] |= bad[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = bad[0] != 0 ? -1 : best_i[0];
}

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_MODEL_KERNELS_CUH_
