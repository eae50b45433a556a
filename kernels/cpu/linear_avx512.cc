// AVX-512 path of the CPU Linear (AVX512F/BW/VL + AVX512-VNNI, with AVX2/FMA/F16C), selected at run time by
// kernels/cpu/linear.cc; see kernels/linear.h for why intrinsics, not Highway.
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_cpu.h"

#pragma GCC push_options
// GCC 12's avx512fintrin.h trips -Wuninitialized on its own _mm512_undefined_*
// (GCC bug 105593); the intrinsics are correct.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")
#define PS_LINEAR_VNNI 1
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

// fp dot product over 16-float vectors with 4 accumulators.
template <typename L>
float FDot(const uint8_t* w, const float* x, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(L::Load16(w, i), _mm512_loadu_ps(x + i), a0);
    a1 = _mm512_fmadd_ps(L::Load16(w, i + 16), _mm512_loadu_ps(x + i + 16), a1);
    a2 = _mm512_fmadd_ps(L::Load16(w, i + 32), _mm512_loadu_ps(x + i + 32), a2);
    a3 = _mm512_fmadd_ps(L::Load16(w, i + 48), _mm512_loadu_ps(x + i + 48), a3);
  }
  for (; i + 16 <= n; i += 16) a0 = _mm512_fmadd_ps(L::Load16(w, i), _mm512_loadu_ps(x + i), a0);
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; ++i) s += L::Load1(w, i) * x[i];
  return s;
}

}  // namespace

#pragma GCC diagnostic pop
#pragma GCC pop_options

namespace pagedserve::kernels::cpu {

const IsaKernels& Avx512Kernels() {
  static const IsaKernels k = {DotLegacy<18, 2, -1, -1, 8>,  DotLegacy<20, 4, -1, 2, 0>,
                               DotLegacy<22, 6, 2, -1, 16>,  DotLegacy<24, 8, 4, 2, 0>,
                               DotQ8_0,                      DotQ45K<false>,
                               DotQ45K<true>,                DotQ6K,
                               FDot<F32Loader>,              FDot<F16Loader>,
                               FDot<BF16Loader>};
  return k;
}

}  // namespace pagedserve::kernels::cpu
