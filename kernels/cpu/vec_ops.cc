// Elementwise loops of the CPU forward pass (contract in vec_ops.h).
#include "kernels/cpu/vec_ops.h"

#include <cmath>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/vec_math_avx2.h"

namespace pagedserve::kernels::cpu {
namespace {

void SiluAndMulPortable(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void FloatsTo16Portable(const float* src, int64_t n, DType t, uint16_t* dst) {
  if (t == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToBFloat16Bits(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = FloatToHalfBits(src[i]);
  }
}

void Floats16ToFloatPortable(const uint16_t* src, int64_t n, DType t, float* dst) {
  if (t == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(src[i]);
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(src[i]);
  }
}

#if defined(__x86_64__) || defined(__i386__)
#define PAGEDSERVE_HAVE_AVX2_VEC_OPS 1

__attribute__((target("avx2,fma,f16c"))) void SiluAndMulAvx2(const float* gate, const float* up,
                                                             int64_t n, float* out) {
  const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = Exp8(_mm256_xor_ps(g, neg));  // exp(-g)
    const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    // The tail through a full vector, so that every element is computed the same way.
    float g[8] = {}, u[8] = {};
    for (int64_t j = i; j < n; ++j) g[j - i] = gate[j], u[j - i] = up[j];
    SiluAndMulAvx2(g, u, 8, g);
    for (int64_t j = i; j < n; ++j) out[j] = g[j - i];
  }
}

// 8 floats -> 8 halves (round to nearest even by F16C); NaN lanes become the
// portable converter's quiet NaN (sign | 0x7e00) instead of F16C's truncated payload.
__attribute__((target("avx2,fma,f16c"))) inline __m128i HalfOf8(__m256 v) {
  const __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  if (_mm256_movemask_ps(nan) == 0) return h;
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                        _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
  const __m128i quiet = _mm_or_si128(_mm_and_si128(h, _mm_set1_epi16(static_cast<int16_t>(0x8000))),
                                     _mm_set1_epi16(0x7e00));
  return _mm_blendv_epi8(h, quiet, nan16);
}

// 8 floats -> 8 bf16, round to nearest even; NaN -> (bits >> 16) | 0x40.
__attribute__((target("avx2,fma,f16c"))) inline __m128i BFloat16Of8(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);  // 16-bit values in 32-bit lanes
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

__attribute__((target("avx2,fma,f16c"))) void FloatsTo16Avx2(const float* src, int64_t n, DType t,
                                                             uint16_t* dst) {
  const bool bf = t == DType::kBFloat16;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(src + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), bf ? BFloat16Of8(v) : HalfOf8(v));
  }
  FloatsTo16Portable(src + i, n - i, t, dst + i);
}

__attribute__((target("avx2,fma,f16c"))) void Floats16ToFloatAvx2(const uint16_t* src, int64_t n,
                                                                  DType t, float* dst) {
  const bool bf = t == DType::kBFloat16;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m256 v = bf ? _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                        : _mm256_cvtph_ps(h);
    _mm256_storeu_ps(dst + i, v);
  }
  Floats16ToFloatPortable(src + i, n - i, t, dst + i);
}
#else
// No AVX2 variant on this architecture: Avx2VecOpsAvailable() is false and the
// "AVX2" entry points are the portable loops.
void SiluAndMulAvx2(const float* gate, const float* up, int64_t n, float* out) {
  SiluAndMulPortable(gate, up, n, out);
}
void FloatsTo16Avx2(const float* src, int64_t n, DType t, uint16_t* dst) {
  FloatsTo16Portable(src, n, t, dst);
}
void Floats16ToFloatAvx2(const uint16_t* src, int64_t n, DType t, float* dst) {
  Floats16ToFloatPortable(src, n, t, dst);
}
#endif

}  // namespace

bool Avx2VecOpsAvailable() {
#ifdef PAGEDSERVE_HAVE_AVX2_VEC_OPS
  static const bool has = CpuHasAvx2FmaF16c();
  return has;
#else
  return false;
#endif
}

void SiluAndMulVariant(const float* gate, const float* up, int64_t n, float* out, bool avx2) {
  avx2 ? SiluAndMulAvx2(gate, up, n, out) : SiluAndMulPortable(gate, up, n, out);
}
void FloatsTo16Variant(const float* src, int64_t n, DType t, uint16_t* dst, bool avx2) {
  avx2 ? FloatsTo16Avx2(src, n, t, dst) : FloatsTo16Portable(src, n, t, dst);
}
void Floats16ToFloatVariant(const uint16_t* src, int64_t n, DType t, float* dst, bool avx2) {
  avx2 ? Floats16ToFloatAvx2(src, n, t, dst) : Floats16ToFloatPortable(src, n, t, dst);
}

void SiluAndMul(const float* gate, const float* up, int64_t n, float* out) {
  SiluAndMulVariant(gate, up, n, out, Avx2VecOpsAvailable());
}
void FloatsTo16(const float* src, int64_t n, DType t, uint16_t* dst) {
  FloatsTo16Variant(src, n, t, dst, Avx2VecOpsAvailable());
}
void Floats16ToFloat(const uint16_t* src, int64_t n, DType t, float* dst) {
  Floats16ToFloatVariant(src, n, t, dst, Avx2VecOpsAvailable());
}

}  // namespace pagedserve::kernels::cpu
