// AVX2 path of the CPU Linear (AVX2 + FMA + F16C), selected at run time by
// kernels/cpu/linear.cc; see kernels/linear.h for why intrinsics, not Highway.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_cpu.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#define PS_LINEAR_VNNI 0
#include "kernels/cpu/linear_x86_inl.h"

namespace {

using pagedserve::kernels::cpu::LoadU16;

// Element loaders: Load8(w, i) -> __m256 of elements i..i+7, Load1(w, i) -> float.
struct F32Loader {
  static __m256 Load8(const uint8_t* w, int64_t i) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(w) + i);
  }
  static float Load1(const uint8_t* w, int64_t i) {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  }
};
struct F16Loader {  // F16C conversion
  static __m256 Load8(const uint8_t* w, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i)));
  }
  static float Load1(const uint8_t* w, int64_t i) { return _cvtsh_ss(LoadU16(w + 2 * i)); }
};
struct BF16Loader {  // bf16 is the upper half of an fp32: widen and shift (exact)
  static __m256 Load8(const uint8_t* w, int64_t i) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float Load1(const uint8_t* w, int64_t i) {
    const uint32_t u = static_cast<uint32_t>(LoadU16(w + 2 * i)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// fp dot product over 8-float vectors with 4 accumulators.
template <typename L>
float FDot(const uint8_t* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(L::Load8(w, i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(L::Load8(w, i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(L::Load8(w, i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(L::Load8(w, i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(L::Load8(w, i), _mm256_loadu_ps(x + i), a0);
  float s = HSum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += L::Load1(w, i) * x[i];
  return s;
}

}  // namespace

#pragma GCC pop_options

namespace pagedserve::kernels::cpu {

const IsaKernels& Avx2Kernels() {
  static const IsaKernels k = {DotLegacy<18, 2, -1, -1, 8>,  DotLegacy<20, 4, -1, 2, 0>,
                               DotLegacy<22, 6, 2, -1, 16>,  DotLegacy<24, 8, 4, 2, 0>,
                               DotQ8_0,                      DotQ45K<false>,
                               DotQ45K<true>,                DotQ6K,
                               FDot<F32Loader>,              FDot<F16Loader>,
                               FDot<BF16Loader>};
  return k;
}

}  // namespace pagedserve::kernels::cpu
