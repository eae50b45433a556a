#include "kernels/cpu/attention_core.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define PAGEDSERVE_HAVE_AVX2_VARIANT 1
#endif

namespace pagedserve::kernels::cpu {
namespace {

#define PS_ALWAYS_INLINE inline __attribute__((always_inline))

#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
// fp16 -> fp32 with F16C, 8 elements per instruction (exact, like HalfBitsToFloat).
__attribute__((target("avx2,f16c"))) void HalfToFloatF16c(const Half* src, int n, float* dst) {
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = HalfBitsToFloat(src[i].bits);
}
#endif

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

// n contiguous elements of a cache block to fp32; kF16c: with F16C (fp16 only).
template <typename T, bool kF16c>
PS_ALWAYS_INLINE void ToFloat(const T* src, int n, float* dst) {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
  if constexpr (kF16c && std::is_same_v<T, Half>) {
    HalfToFloatF16c(src, n, dst);
    return;
  }
#endif
  for (int i = 0; i < n; ++i) dst[i] = Load(src, i);
}

// See attention_core.h for the contract.
template <typename T, int BS, bool kF16c>
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
      ToFloat<T, kF16c>(static_cast<const T*>(a.k_blocks[b]), BS * hs, a.kbuf);
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
    for (int t = 0; t < n; ++t) {
      const float p = std::exp(lg[t] - mx);
      lg[t] = p;
      sum += p;
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
      ToFloat<T, kF16c>(src, BS * hs, a.kbuf);
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

template <typename T, int BS>
void AttendBaseline(const AttendArgs& a) {
  AttendImpl<T, BS, false>(a);
}

#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
template <typename T, int BS>
__attribute__((target("avx2,fma,f16c"))) void AttendAvx2(const AttendArgs& a) {
  AttendImpl<T, BS, true>(a);
}

bool CpuHasAvx2() {
  static const bool has = CpuHasAvx2FmaF16c();
  return has;
}
#endif

template <typename T>
AttendFn SelectForType(int block_size) {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
  if (CpuHasAvx2()) {
    switch (block_size) {
      case 8: return &AttendAvx2<T, 8>;
      case 16: return &AttendAvx2<T, 16>;
      case 32: return &AttendAvx2<T, 32>;
    }
    return nullptr;
  }
#endif
  switch (block_size) {
    case 8: return &AttendBaseline<T, 8>;
    case 16: return &AttendBaseline<T, 16>;
    case 32: return &AttendBaseline<T, 32>;
  }
  return nullptr;
}

}  // namespace

AttendFn SelectAttend(DType dtype, int block_size) {
  switch (dtype) {
    case DType::kFloat32: return SelectForType<float>(block_size);
    case DType::kFloat16: return SelectForType<Half>(block_size);
    case DType::kBFloat16: return SelectForType<BFloat16>(block_size);
    case DType::kFloat8E4M3: return SelectForType<Fp8E4M3>(block_size);
    case DType::kFloat8E5M2: return SelectForType<Fp8E5M2>(block_size);
  }
  return nullptr;
}

const char* AttendIsaName() {
#ifdef PAGEDSERVE_HAVE_AVX2_VARIANT
  if (CpuHasAvx2()) return "avx2+fma+f16c";
#endif
  return "baseline";
}

void BuildQrep(const float* q, int head_size, int x, float* qrep) {
  const int chunks = head_size / x;
  for (int c = 0; c < chunks; ++c)
    for (int i = 0; i < kQrepWidth; ++i) qrep[c * kQrepWidth + i] = q[c * x + i % x];
}

}  // namespace pagedserve::kernels::cpu
