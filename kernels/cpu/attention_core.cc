#include "kernels/cpu/attention_core.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/vec_math_avx2.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAGEDSERVE_HAVE_AVX2_VARIANT 1
#endif

namespace pagedserve::kernels::cpu {
namespace {

#define PS_ALWAYS_INLINE inline __attribute__((always_inline))

template <typename T>
PS_ALWAYS_INLINE float Load(const T* p, int64_t i) {
  if constexpr (std::is_same_v<T, float>) {
    return p[i];
  } else if constexpr (std::is_same_v<T, Fp8E4M3>) {
    return fp8_detail::kE4M3Table[p[i].bits];  // exact decode (kernels/cpu/fp8.h)
  } else if constexpr (std::is_same_v<T, Fp8E5M2>) {
    return fp8_detail::kE5M2Table[p[i].bits];
  } else if constexpr (std::is_same_v<T, BFloat16>) {
    uint32_t u = static_cast<uint32_t>(p[i].bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  } else {
    // binary16 -> binary32 (see kernels/cpu/half.h), spelled out here so that
    // it is inlined into, and vectorized with, the caller's instruction set.
    const uint32_t h = p[i].bits;
    const uint32_t sign = (h & 0x8000u) << 16;
    const uint32_t em = h & 0x7fffu;
    const uint32_t shifted = em << 13;
    float f;
    std::memcpy(&f, &shifted, 4);
    f *= 0x1p112f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u = (em >= 0x7c00u ? (shifted | 0x7f800000u) : u) | sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
}

// n contiguous elements of a cache block to fp32.
template <typename T>
PS_ALWAYS_INLINE void ToFloat(const T* src, int n, float* dst) {
  for (int i = 0; i < n; ++i) dst[i] = Load(src, i);
}

// See attention_core.h for the contract.
template <typename T, int BS>
PS_ALWAYS_INLINE void AttendImpl(const AttendArgs& a) {
  constexpr int X = static_cast<int>(16 / sizeof(T));
  constexpr int KW = BS * X;  // floats of one key chunk row group: [BS, X]
  const int hs = a.head_size;
  const int chunks = hs / X;
  const int M = a.num_queries;
  const int L = a.t_end - a.t_begin;
  const int nblk = (L + BS - 1) / BS;
  const float ninf = -std::numeric_limits<float>::infinity();

  for (int m = 0; m < M; ++m) a.out_max[m] = ninf;

  // Pass 1: logits and their max.
  for (int b = 0; b < nblk; ++b) {
    const int b0 = a.t_begin + b * BS;
    const float* K;
    if constexpr (std::is_same_v<T, float>) {
      K = static_cast<const float*>(a.k_blocks[b]);
    } else {
      ToFloat<T>(static_cast<const T*>(a.k_blocks[b]), BS * hs, a.kbuf);
      K = a.kbuf;
    }
    for (int m = 0; m < M; ++m) {
      int e = a.limit[m] < a.t_end ? a.limit[m] : a.t_end;
      if (e <= b0) continue;
      const int n = e - b0 < BS ? e - b0 : BS;
      float acc[KW];
      for (int i = 0; i < KW; ++i) acc[i] = 0.0f;
      const float* qr = a.qrep + static_cast<int64_t>(m) * chunks * kQrepWidth;
      for (int c = 0; c < chunks; ++c) {
        const float* kc = K + c * KW;
        const float* qc = qr + c * kQrepWidth;
        for (int i0 = 0; i0 < KW; i0 += kQrepWidth)
          for (int i = 0; i < kQrepWidth; ++i) acc[i0 + i] += qc[i] * kc[i0 + i];
      }
      float* lg = a.logits + static_cast<int64_t>(m) * L + (b0 - a.t_begin);
      float mx = a.out_max[m];
      for (int t = 0; t < n; ++t) {
        float s = 0.0f;
        for (int j = 0; j < X; ++j) s += acc[t * X + j];
        s *= a.scale;
        if (a.slopes != nullptr) s += a.slopes[m] * static_cast<float>(b0 + t - a.qpos[m]);
        if (a.softcap > 0) s = a.softcap * std::tanh(s / a.softcap);
        if (a.first != nullptr && b0 + t < a.first[m]) s = ninf;  // before the window
        lg[t] = s;
        mx = s > mx ? s : mx;
      }
      a.out_max[m] = mx;
    }
  }

  // Softmax numerators and exp-sums.
  for (int m = 0; m < M; ++m) {
    const int e = a.limit[m] < a.t_end ? a.limit[m] : a.t_end;
    const int n = e - a.t_begin;
    float* lg = a.logits + static_cast<int64_t>(m) * L;
    const float mx = a.out_max[m];
    float sum = 0.0f;
    if (mx == ninf) {
      // Every visible token lies before the window: no weight at all.
      for (int t = 0; t < n; ++t) lg[t] = 0.0f;
    } else {
      for (int t = 0; t < n; ++t) {
        const float p = std::exp(lg[t] - mx);
        lg[t] = p;
        sum += p;
      }
    }
    a.out_sum[m] = n > 0 ? sum : 0.0f;
    float* acc = a.out_acc + static_cast<int64_t>(m) * hs;
    for (int d = 0; d < hs; ++d) acc[d] = 0.0f;
  }

  // Pass 2: acc += p * v. The value block [hs, BS] is transposed to [BS, hs]
  // once and reused by all M queries; only the first n rows are read, so
  // whatever the unused slots of a block hold never reaches the output.
  for (int b = 0; b < nblk; ++b) {
    const int b0 = a.t_begin + b * BS;
    const T* src = static_cast<const T*>(a.v_blocks[b]);
    float* vt = a.vbuf;
    if constexpr (std::is_same_v<T, float>) {
      for (int t = 0; t < BS; ++t)
        for (int d = 0; d < hs; ++d) vt[t * hs + d] = src[static_cast<int64_t>(d) * BS + t];
    } else {
      // Convert the block contiguously (kbuf is free after pass 1), then transpose.
      ToFloat<T>(src, BS * hs, a.kbuf);
      for (int t = 0; t < BS; ++t)
        for (int d = 0; d < hs; ++d) vt[t * hs + d] = a.kbuf[d * BS + t];
    }
    for (int m = 0; m < M; ++m) {
      const int e = a.limit[m] < a.t_end ? a.limit[m] : a.t_end;
      if (e <= b0) continue;
      const int n = e - b0 < BS ? e - b0 : BS;
      const float* p = a.logits + static_cast<int64_t>(m) * L + (b0 - a.t_begin);
      float* acc = a.out_acc + static_cast<int64_t>(m) * hs;
      int t = 0;
      for (; t + 1 < n; t += 2) {
        const float p0 = p[t], p1 = p[t + 1];
        const float* v0 = vt + t * hs;
        const float* v1 = v0 + hs;
        for (int d = 0; d < hs; ++d) acc[d] += p0 * v0[d] + p1 * v1[d];
      }
      if (t < n) {
        const float p0 = p[t];
        const float* v0 = vt + t * hs;
        for (int d = 0; d < hs; ++d) acc[d] += p0 * v0[d];
      }
    }
  }
}

#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
// Explicit AVX2+FMA+F16C path for 16-bit caches (fp16, bf16: X = 8 elements
// per key chunk). See attention_core.h for the contract and the scheme.

// 8 consecutive elements to fp32 (all exact).
PS_AVX2_INLINE __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
PS_AVX2_INLINE __m256 Load8(const Half* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
PS_AVX2_INLINE __m256 Load8(const BFloat16* p) {
  // bf16 is the upper half of a binary32: zero-extend and shift left by 16.
  const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

// Lane j of the result = horizontal sum of the 8 lanes of v[j].
PS_AVX2_INLINE __m256 Sum8x8(const __m256 (&v)[8]) {
  // hadd(a, b) = [a0+a1, a2+a3, b0+b1, b2+b3 | a4+a5, a6+a7, b4+b5, b6+b7].
  const __m256 s01 = _mm256_hadd_ps(v[0], v[1]);
  const __m256 s23 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 s45 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 s67 = _mm256_hadd_ps(v[6], v[7]);
  // t0 = [v0 lo, v1 lo, v2 lo, v3 lo | v0 hi, v1 hi, v2 hi, v3 hi] (lo/hi:
  // sums of lanes 0-3 / 4-7); t1 the same for v4..v7.
  const __m256 t0 = _mm256_hadd_ps(s01, s23);
  const __m256 t1 = _mm256_hadd_ps(s45, s67);
  const __m256 lo = _mm256_permute2f128_ps(t0, t1, 0x20);  // [t0 low half | t1 low half]
  const __m256 hi = _mm256_permute2f128_ps(t0, t1, 0x31);  // [t0 high half | t1 high half]
  return _mm256_add_ps(lo, hi);
}

// Lanes i < n all ones, the others zero (0 <= n <= 8).
PS_AVX2_INLINE __m256i LaneMask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Logits of one query for the first n tokens of one block: lg[t] = scale *
// q.k_t (+ slope * (t + pos0) with ALiBi; pos0 = block start - query
// position). K: the block in cache layout [chunks, BS, 8] (S = the cache
// type, or float after ConvertBlock). Groups of 8 tokens: 8 accumulators
// (one per token, lanes = the 8 elements of a key chunk), one q-chunk vector
// per chunk, then Sum8x8 gives the 8 logits in one vector.
template <typename S, int BS>
PS_AVX2_INLINE void BlockLogits(const S* K, const float* qr, int chunks, int n, float scale,
                                const float* slope, int pos0, float* lg) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int g = 0; g * 8 < n; ++g) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (auto& v : acc) v = _mm256_setzero_ps();
    const S* kg = K + g * 64;
    for (int c = 0; c < chunks; ++c) {
      const __m256 q = _mm256_loadu_ps(qr + c * kQrepWidth);
      const S* kc = kg + c * (BS * 8);
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(q, Load8(kc + j * 8), acc[j]);
    }
    __m256 s = _mm256_mul_ps(Sum8x8(acc), vscale);
    if (slope != nullptr) {
      const __m256i pos = _mm256_add_epi32(_mm256_set1_epi32(pos0 + g * 8),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
      s = _mm256_fmadd_ps(_mm256_set1_ps(*slope), _mm256_cvtepi32_ps(pos), s);
    }
    const int ng = n - g * 8;
    if (ng >= 8) {
      _mm256_storeu_ps(lg + g * 8, s);
    } else {
      _mm256_maskstore_ps(lg + g * 8, LaneMask(ng), s);  // lanes >= ng: other queries' logits
    }
  }
}

// acc[d] += sum_{t < n} p[t] * V[d][t] for one query and one block, V in
// cache layout [hs, BS] (no transpose: a row of V is a dot product with p).
// 8 rows at a time, BS / 8 FMAs per row into one accumulator per row, then
// Sum8x8 and one add into acc[d0 .. d0 + 8). kPartial (n < BS): p and V are
// masked beyond n, so that whatever the unused slots hold (NaN, inf) never
// reaches the output.
template <typename S, int BS, bool kPartial>
PS_AVX2_INLINE void BlockPV(const S* V, const float* p, int n, int hs, float* acc) {
  constexpr int U = BS / 8;
  __m256 pv[U];
  __m256 vmask[U];
#pragma GCC unroll 4
  for (int u = 0; u < U; ++u) {
    if constexpr (kPartial) {
      const int nu = n - u * 8 < 0 ? 0 : (n - u * 8 > 8 ? 8 : n - u * 8);
      vmask[u] = _mm256_castsi256_ps(LaneMask(nu));
      pv[u] = _mm256_maskload_ps(p + u * 8, LaneMask(nu));
    } else {
      pv[u] = _mm256_loadu_ps(p + u * 8);
    }
  }
  for (int d0 = 0; d0 < hs; d0 += 8) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {
      const S* row = V + static_cast<int64_t>(d0 + j) * BS;
      __m256 v = Load8(row);
      if constexpr (kPartial) v = _mm256_and_ps(v, vmask[0]);
      r[j] = _mm256_mul_ps(pv[0], v);
#pragma GCC unroll 4
      for (int u = 1; u < U; ++u) {
        v = Load8(row + u * 8);
        if constexpr (kPartial) v = _mm256_and_ps(v, vmask[u]);
        r[j] = _mm256_fmadd_ps(pv[u], v, r[j]);
      }
    }
    _mm256_storeu_ps(acc + d0, _mm256_add_ps(_mm256_loadu_ps(acc + d0), Sum8x8(r)));
  }
}

// A whole block [BS * hs] of the cache type to fp32, same layout.
template <typename T>
PS_AVX2_INLINE void ConvertBlock(const T* src, int n, float* dst) {
  for (int i = 0; i < n; i += 8) _mm256_storeu_ps(dst + i, Load8(src + i));
}

// Software prefetch of the next block (block tables scatter blocks over the
// pool, so the hardware prefetcher cannot guess the next address).
PS_AVX2_INLINE void Prefetch(const void* p, int bytes) {
  const char* c = static_cast<const char*>(p);
  for (int i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T0);
}

// Queries per call from which a block is converted to fp32 once (kbuf / vbuf)
// and then read by every query, instead of each query converting in registers.
// Measured on SmolLM2-135M's shape (docs/benchmarks-history.md): decode with M = 3 is
// 20-40% faster converting in registers; prefill tiles (M = 63) 5-10% faster
// with the converted block.
constexpr int kConvertMinQueries = 16;

template <typename T, int BS>
__attribute__((target("avx2,fma,f16c"))) void Attend16Avx2(const AttendArgs& a) {
  static_assert(sizeof(T) == 2 && BS % 8 == 0);
  const int hs = a.head_size;
  const int chunks = hs / 8;
  const int M = a.num_queries;
  const int L = a.t_end - a.t_begin;
  const int nblk = (L + BS - 1) / BS;
  const bool convert = M >= kConvertMinQueries;
  const float ninf = -std::numeric_limits<float>::infinity();
  auto visible = [&](int m, int b0) {  // tokens of the block starting at b0 query m sees
    const int e = a.limit[m] < a.t_end ? a.limit[m] : a.t_end;
    return e <= b0 ? 0 : (e - b0 < BS ? e - b0 : BS);
  };

  // Pass 1: logits.
  for (int b = 0; b < nblk; ++b) {
    const int b0 = a.t_begin + b * BS;
    const T* K = static_cast<const T*>(a.k_blocks[b]);
    if (b + 1 < nblk) Prefetch(a.k_blocks[b + 1], BS * hs * 2);
    if (convert) ConvertBlock(K, BS * hs, a.kbuf);
    for (int m = 0; m < M; ++m) {
      const int n = visible(m, b0);
      if (n == 0) continue;
      const float* qr = a.qrep + static_cast<int64_t>(m) * chunks * kQrepWidth;
      float* lg = a.logits + static_cast<int64_t>(m) * L + (b0 - a.t_begin);
      const float* slope = a.slopes != nullptr ? a.slopes + m : nullptr;
      const int pos0 = a.slopes != nullptr ? b0 - a.qpos[m] : 0;
      if (convert) {
        BlockLogits<float, BS>(a.kbuf, qr, chunks, n, a.scale, slope, pos0, lg);
      } else {
        BlockLogits<T, BS>(K, qr, chunks, n, a.scale, slope, pos0, lg);
      }
      if (a.softcap > 0)  // Gemma 2's soft cap, in scalar code (tanh)
        for (int t = 0; t < n; ++t) lg[t] = a.softcap * std::tanh(lg[t] / a.softcap);
      if (a.first != nullptr)  // tokens before the window weigh nothing
        for (int t = 0; t < n && b0 + t < a.first[m]; ++t) lg[t] = ninf;
    }
  }

  // Max, softmax numerators and exp-sums.
  for (int m = 0; m < M; ++m) {
    const int e = a.limit[m] < a.t_end ? a.limit[m] : a.t_end;
    const int n = e - a.t_begin > 0 ? e - a.t_begin : 0;
    float* lg = a.logits + static_cast<int64_t>(m) * L;
    __m256 vmx = _mm256_set1_ps(ninf);
    int t = 0;
    for (; t + 8 <= n; t += 8) vmx = _mm256_max_ps(vmx, _mm256_loadu_ps(lg + t));
    float mx = ninf;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmx);
    for (float v : lanes) mx = v > mx ? v : mx;
    for (; t < n; ++t) mx = lg[t] > mx ? lg[t] : mx;
    a.out_max[m] = mx;
    if (mx == ninf) {
      // Every visible token lies before the window: no weight at all.
      for (t = 0; t < n; ++t) lg[t] = 0.0f;
      a.out_sum[m] = 0.0f;
      float* acc = a.out_acc + static_cast<int64_t>(m) * hs;
      for (int d = 0; d < hs; ++d) acc[d] = 0.0f;
      continue;
    }
    const __m256 vm = _mm256_set1_ps(mx);
    __m256 vsum = _mm256_setzero_ps();
    for (t = 0; t + 8 <= n; t += 8) {
      const __m256 p = Exp8(_mm256_sub_ps(_mm256_loadu_ps(lg + t), vm));
      _mm256_storeu_ps(lg + t, p);
      vsum = _mm256_add_ps(vsum, p);
    }
    if (t < n) {
      const __m256i mask = LaneMask(n - t);
      const __m256 x = _mm256_maskload_ps(lg + t, mask);
      const __m256 p = _mm256_and_ps(Exp8(_mm256_sub_ps(x, vm)), _mm256_castsi256_ps(mask));
      _mm256_maskstore_ps(lg + t, mask, p);
      vsum = _mm256_add_ps(vsum, p);
    }
    _mm256_store_ps(lanes, vsum);
    float sum = 0.0f;
    for (float v : lanes) sum += v;
    a.out_sum[m] = sum;
    float* acc = a.out_acc + static_cast<int64_t>(m) * hs;
    for (int d = 0; d < hs; ++d) acc[d] = 0.0f;
  }

  // Pass 2: acc += p * v.
  for (int b = 0; b < nblk; ++b) {
    const int b0 = a.t_begin + b * BS;
    const T* V = static_cast<const T*>(a.v_blocks[b]);
    if (b + 1 < nblk) Prefetch(a.v_blocks[b + 1], BS * hs * 2);
    if (convert) ConvertBlock(V, BS * hs, a.vbuf);
    for (int m = 0; m < M; ++m) {
      const int n = visible(m, b0);
      if (n == 0) continue;
      const float* p = a.logits + static_cast<int64_t>(m) * L + (b0 - a.t_begin);
      float* acc = a.out_acc + static_cast<int64_t>(m) * hs;
      if (convert) {
        if (n == BS) {
          BlockPV<float, BS, false>(a.vbuf, p, n, hs, acc);
        } else {
          BlockPV<float, BS, true>(a.vbuf, p, n, hs, acc);
        }
      } else if (n == BS) {
        BlockPV<T, BS, false>(V, p, n, hs, acc);
      } else {
        BlockPV<T, BS, true>(V, p, n, hs, acc);
      }
    }
  }
}
#endif  // PAGEDSERVE_HAVE_AVX2_VARIANT

template <typename T, int BS>
void AttendBaseline(const AttendArgs& a) {
  AttendImpl<T, BS>(a);
}

#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
template <typename T, int BS>
__attribute__((target("avx2,fma,f16c"))) void AttendAvx2(const AttendArgs& a) {
  if constexpr (sizeof(T) == 2) {
    Attend16Avx2<T, BS>(a);  // fp16, bf16: the explicit intrinsics path
  } else {
    AttendImpl<T, BS>(a);
  }
}

bool CpuHasAvx2() {
  static const bool has = CpuHasAvx2FmaF16c();
  return has;
}
#endif

template <typename T>
AttendFn SelectForType(int block_size, bool avx2) {
  if (avx2) {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
    if (!CpuHasAvx2()) return nullptr;
    switch (block_size) {
      case 8: return &AttendAvx2<T, 8>;
      case 16: return &AttendAvx2<T, 16>;
      case 32: return &AttendAvx2<T, 32>;
    }
#endif
    return nullptr;
  }
  switch (block_size) {
    case 8: return &AttendBaseline<T, 8>;
    case 16: return &AttendBaseline<T, 16>;
    case 32: return &AttendBaseline<T, 32>;
  }
  return nullptr;
}

}  // namespace

AttendFn SelectAttendVariant(DType dtype, int block_size, bool avx2) {
  switch (dtype) {
    case DType::kFloat32: return SelectForType<float>(block_size, avx2);
    case DType::kFloat16: return SelectForType<Half>(block_size, avx2);
    case DType::kBFloat16: return SelectForType<BFloat16>(block_size, avx2);
    case DType::kFloat8E4M3: return SelectForType<Fp8E4M3>(block_size, avx2);
    case DType::kFloat8E5M2: return SelectForType<Fp8E5M2>(block_size, avx2);
  }
  return nullptr;
}

AttendFn SelectAttend(DType dtype, int block_size) {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
  if (CpuHasAvx2()) return SelectAttendVariant(dtype, block_size, true);
#endif
  return SelectAttendVariant(dtype, block_size, false);
}

const char* AttendIsaName() {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
  if (CpuHasAvx2()) return "avx2+fma+f16c";
#endif
  return "baseline";
}

void BuildQrep(const float* q, int head_size, int x, float* qrep) {
  // Copies of each x-element chunk side by side (no `i % x` in the inner loop).
  const int chunks = head_size / x;
  for (int c = 0; c < chunks; ++c)
    for (int r = 0; r < kQrepWidth; r += x)
      std::memcpy(qrep + c * kQrepWidth + r, q + c * x, sizeof(float) * x);
}

}  // namespace pagedserve::kernels::cpu
