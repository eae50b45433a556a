#pragma once
// AVX2+FMA math shared by the CPU kernels' x86 paths (kernels/cpu/attention_core.cc,
// kernels/cpu/vec_ops.cc). Include only from x86 builds; every function carries
// target("avx2,fma,f16c") and is inlined into callers compiled for that target,
// which select it at run time (CpuHasAvx2FmaF16c), never by -march.

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>

#define PS_AVX2_INLINE inline __attribute__((always_inline, target("avx2,fma,f16c")))

namespace pagedserve::kernels::cpu {

// exp(x), 8 lanes: Cephes expf (range reduction by ln 2 split in two
// constants, degree-5 polynomial; relative error at most 1.2e-7 against double
// exp over [-87.3, 88.3], checked in tests/kernels/attention_core_test.cc and
// vec_ops_test.cc). x < -87.3 (including -inf) gives exactly 0; x > 88.3
// (including +inf) gives +inf (exact above ln(FLT_MAX) = 88.72; in between the
// true value is within 1.4x of FLT_MAX), so that g / (1 + exp(-g)) is -0 for
// very negative g; NaN stays NaN.
PS_AVX2_INLINE __m256 Exp8(__m256 x) {
  const __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3f), _CMP_LT_OQ);
  const __m256 huge = _mm256_cmp_ps(x, _mm256_set1_ps(88.3f), _CMP_GT_OQ);
  // max/min return the second operand when either is NaN: NaN stays NaN.
  x = _mm256_max_ps(_mm256_set1_ps(-87.3f), x);
  x = _mm256_min_ps(_mm256_set1_ps(88.3f), x);
  __m256 fx = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f));
  fx = _mm256_floor_ps(fx);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 x2 = _mm256_mul_ps(x, x);
  y = _mm256_fmadd_ps(y, x2, _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  // y * 2^fx, fx in [-126, 127].
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), huge);
  return _mm256_andnot_ps(tiny, y);
}

}  // namespace pagedserve::kernels::cpu

#endif  // x86
