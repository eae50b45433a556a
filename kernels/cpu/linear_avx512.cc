// AVX-512 path of the CPU Linear (AVX512F/BW/VL + AVX512-VNNI, with AVX2/FMA/F16C), selected at run
// time by kernels/cpu/linear.cc; see kernels/linear.h for why intrinsics, not Highway.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_cpu.h"

// The ISA applies to the functions below only (never to the standard library
// code included above, whose inline functions other files share): GCC's
// target pragma, or clang's attribute region (the sanitizer builds use clang).
#if defined(__clang__)
#pragma clang attribute push(                                                      \
    __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"))), \
    apply_to = function)
#else
#pragma GCC push_options
// GCC 12's avx512fintrin.h trips -Wuninitialized on its own _mm512_undefined_*
// (GCC bug 105593); the intrinsics are correct.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#endif
#define PS_LINEAR_VNNI 1
#include "kernels/cpu/linear_panel_x86_inl.h"
#include "kernels/cpu/linear_x86_inl.h"

namespace {

using pagedserve::kernels::cpu::LoadU16;

// Element loaders: Load16(w, i) -> __m512 of elements i..i+15, Load1(w, i) -> float.
struct F32Loader {
  static __m512 Load16(const uint8_t* w, int64_t i) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(w) + i);
  }
  static float Load1(const uint8_t* w, int64_t i) {
    float v;
    std::memcpy(&v, w + 4 * i, 4);
    return v;
  }
};
struct F16Loader {  // vcvtph2ps on 16 elements
  static __m512 Load16(const uint8_t* w, int64_t i) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * i)));
  }
  static float Load1(const uint8_t* w, int64_t i) { return _cvtsh_ss(LoadU16(w + 2 * i)); }
};
// bf16 is the upper half of an fp32: widen and shift (exact). AVX512-BF16's
// vdpbf16ps would also round the activations to bf16; at the bandwidth-bound
// shapes of decode the exact conversion costs no time.
struct BF16Loader {
  static __m512 Load16(const uint8_t* w, int64_t i) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 2 * i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static float Load1(const uint8_t* w, int64_t i) {
    const uint32_t u = static_cast<uint32_t>(LoadU16(w + 2 * i)) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// fp dot products of one weight row with N tokens: each weight vector is
// converted once and used for N tokens; two accumulators per token.
template <typename L, int N>
void FDotN(const uint8_t* w, const float* x, int64_t xs, int64_t n, float* out) {
  __m512 a[N], b[N];
  for (int j = 0; j < N; ++j) a[j] = _mm512_setzero_ps(), b[j] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m512 w0 = L::Load16(w, i), w1 = L::Load16(w, i + 16);
    for (int j = 0; j < N; ++j) {
      a[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + j * xs + i), a[j]);
      b[j] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + j * xs + i + 16), b[j]);
    }
  }
  for (; i + 16 <= n; i += 16) {
    const __m512 w0 = L::Load16(w, i);
    for (int j = 0; j < N; ++j) a[j] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + j * xs + i), a[j]);
  }
  for (int j = 0; j < N; ++j) {
    float s = _mm512_reduce_add_ps(_mm512_add_ps(a[j], b[j]));
    for (int64_t t = i; t < n; ++t) s += L::Load1(w, t) * x[j * xs + t];
    out[j] = s;
  }
}

template <typename L>
void FDot(const uint8_t* w, const float* x, int64_t xs, int64_t n, int ntok, float* out) {
  switch (ntok) {
    case 1: FDotN<L, 1>(w, x, xs, n, out); return;
    case 2: FDotN<L, 2>(w, x, xs, n, out); return;
    case 3: FDotN<L, 3>(w, x, xs, n, out); return;
    default: FDotN<L, 4>(w, x, xs, n, out); return;
  }
}

}  // namespace

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

namespace pagedserve::kernels::cpu {

const IsaKernels& Avx512Kernels() {
  static const IsaKernels k = {
      MultiToken<KQ4_0>, MultiToken<KQ4_1>, MultiToken<KQ5_0>, MultiToken<KQ5_1>, MultiToken<KQ8_0>,
      MultiToken<KQ4_K>, MultiToken<KQ5_K>, MultiToken<KQ6_K>, FDot<F32Loader>, FDot<F16Loader>,
      FDot<BF16Loader>, PS_X86_TILES,
      // kRowBlock8: the AVX2 kernels (not measured with VNNI;
      // ChooseMethod uses the method on the AVX2 path only)
      Avx2Kernels().t8r4_0, Avx2Kernels().t8r4_1, Avx2Kernels().t8r5_0, Avx2Kernels().t8r5_1,
      Avx2Kernels().t8r8_0, PS_X86_PANELS,
      // Q2_K, Q3_K, IQ4_NL, IQ4_XS: the row dots and tiles use
      // pmaddubsw + pmaddwd (the scale multiply), as on AVX2
      PS_X86_NEW_DOTS_AND_TILES, PS_X86_PANELS_Q23, PS_X86_PANELS_32, PS_X86_PANEL_Q4_1,
      DotQ4x8<false>, Q4x8Gemm<false>, DotQ4x8<true>, Q4x8Gemm<true>};
  return k;
}

}  // namespace pagedserve::kernels::cpu
