// AVX2 path of the CPU Linear (AVX2 + FMA + F16C), selected at run time by
// kernels/cpu/linear.cc; see kernels/linear.h for why intrinsics, not Highway.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/linear_cpu.h"

// The ISA applies to the functions below only (see linear_avx512.cc).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif
#define PS_LINEAR_VNNI 0
#include "kernels/cpu/linear_panel_x86_inl.h"
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

// fp dot products of one weight row with N tokens: each weight vector is
// converted once and used for N tokens; two accumulators per token.
template <typename L, int N>
void FDotN(const uint8_t* w, const float* x, int64_t xs, int64_t n, float* out) {
  __m256 a[N], b[N];
  for (int j = 0; j < N; ++j) a[j] = _mm256_setzero_ps(), b[j] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 w0 = L::Load8(w, i), w1 = L::Load8(w, i + 8);
    for (int j = 0; j < N; ++j) {
      a[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + j * xs + i), a[j]);
      b[j] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + j * xs + i + 8), b[j]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 w0 = L::Load8(w, i);
    for (int j = 0; j < N; ++j) a[j] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + j * xs + i), a[j]);
  }
  for (int j = 0; j < N; ++j) {
    float s = HSum(_mm256_add_ps(a[j], b[j]));
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

// ---- kRowBlock8 (linear_cpu.h): 8 weight rows in the 8 vector lanes ----
//
// Per weight block the codes of the 8 rows are unpacked to one byte per element
// and transposed so that 32-bit lane i of t[j] holds row i's elements
// [4j, 4j + 4). A token's activation codes [4j, 4j + 4) are broadcast to all
// lanes and multiplied with t[j] (pmaddubsw), so summing over j gives the 8
// rows' block dot products in the 8 lanes: no horizontal sums, and one scale
// vector (the 8 rows' d, and for Q4_1 m) per block for all kRow8Tokens tokens.
// The weight layout in memory is unchanged (the transpose is done per block in
// registers; llama.cpp instead repacks Q4_0 weights into 8-row interleaved
// blocks at load time; this is an independent, on-the-fly variant).

// In each 128-bit half, a 4x4 transpose of 32-bit lanes: on input y[k] holds
// 4 dwords of row k (low half) and of row k + 4 (high half); on output z[c]
// holds dword c of rows 0..3 (low half) and rows 4..7 (high half), i.e. lane i
// of z[c] is dword c of row i.
inline void Transpose4x4Halves(const __m256i (&y)[4], __m256i (&z)[4]) {
  const __m256i a0 = _mm256_unpacklo_epi32(y[0], y[1]);  // r0c0 r1c0 r0c1 r1c1
  const __m256i a1 = _mm256_unpackhi_epi32(y[0], y[1]);  // r0c2 r1c2 r0c3 r1c3
  const __m256i a2 = _mm256_unpacklo_epi32(y[2], y[3]);  // r2c0 r3c0 r2c1 r3c1
  const __m256i a3 = _mm256_unpackhi_epi32(y[2], y[3]);  // r2c2 r3c2 r2c3 r3c3
  z[0] = _mm256_unpacklo_epi64(a0, a2);
  z[1] = _mm256_unpackhi_epi64(a0, a2);
  z[2] = _mm256_unpacklo_epi64(a1, a3);
  z[3] = _mm256_unpackhi_epi64(a1, a3);
}

// 16 bytes at lo (low half) and at hi (high half).
inline __m256i Load2x128(const uint8_t* lo, const uint8_t* hi) {
  return _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1);
}

// The fp16 pair at the start of the block of each of the 8 rows (b + r * wb)
// as fp32: *d = the first fp16 of each row, *m = the second.
inline void Scales8(const uint8_t* b, size_t wb, __m256* d, __m256* m) {
  const __m256i v = _mm256_setr_epi32(
      static_cast<int>(LoadU32(b)), static_cast<int>(LoadU32(b + wb)),
      static_cast<int>(LoadU32(b + 2 * wb)), static_cast<int>(LoadU32(b + 3 * wb)),
      static_cast<int>(LoadU32(b + 4 * wb)), static_cast<int>(LoadU32(b + 5 * wb)),
      static_cast<int>(LoadU32(b + 6 * wb)), static_cast<int>(LoadU32(b + 7 * wb)));
  // Per 128-bit half: the 4 first halves, then the 4 second halves; then the
  // 64-bit quarters in the order d(0-3) d(4-7) m(0-3) m(4-7).
  const __m256i split = _mm256_shuffle_epi8(
      v, _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9,
                          12, 13, 2, 3, 6, 7, 10, 11, 14, 15));
  const __m256i ordered = _mm256_permute4x64_epi64(split, 0xd8);  // quarters 0, 2, 1, 3
  *d = _mm256_cvtph_ps(_mm256_castsi256_si128(ordered));
  *m = _mm256_cvtph_ps(_mm256_extracti128_si256(ordered, 1));
}

// The legacy 4- and 5-bit formats (kernels/cpu/quant_blocks.h): kBytes per
// block, the nibbles at kQs, the 5th bits (u32) at kQh (-1: none), kMin: an
// fp16 min at offset 2 (d * q + m), else d * (q - kOffset).
// Bound of the int16 sums: each pmaddubsw lane is q0 x0 + q1 x1 with |x| <= 127;
// 4-bit codes (<= 15): |lane| <= 3810, and the sum of all 8 j's <= 30480;
// 5-bit codes (<= 31): |lane| <= 7874, so 4 j's at a time (<= 31496) are
// summed in int16 before each pmaddwd. Both < 2^15.
template <int kBytes, int kQs, int kQh, bool kMin, int kOffset>
void Row8Legacy(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  constexpr int kT = pagedserve::kernels::cpu::kRow8Tokens;
  constexpr int kGroup = kQh >= 0 ? 4 : 8;
  const __m256i m4 = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  __m256 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = w + i * kBytes;
    __m256i y[4], z[4], t[8];
    PS_UNROLL
    for (int k = 0; k < 4; ++k) y[k] = Load2x128(b + k * wb + kQs, b + (k + 4) * wb + kQs);
    Transpose4x4Halves(y, z);
    // Byte c of the 16 packed bytes holds element c (low nibble) and c + 16.
    PS_UNROLL
    for (int c = 0; c < 4; ++c) {
      t[c] = _mm256_and_si256(z[c], m4);
      t[c + 4] = _mm256_and_si256(_mm256_srli_epi16(z[c], 4), m4);
    }
    if constexpr (kQh >= 0) {
      // Lane i of qh: row i's 32 fifth bits (bit e is element e's). Elements
      // [4j, 4j + 4) are bits 4 (j % 2) .. + 3 of byte j / 2: that byte goes to
      // the 4 bytes of the lane (pshufb), byte k keeps bit 4 (j % 2) + k, and a
      // set bit becomes 0x10.
      const __m256i qh = _mm256_setr_epi32(
          static_cast<int>(LoadU32(b + kQh)), static_cast<int>(LoadU32(b + wb + kQh)),
          static_cast<int>(LoadU32(b + 2 * wb + kQh)), static_cast<int>(LoadU32(b + 3 * wb + kQh)),
          static_cast<int>(LoadU32(b + 4 * wb + kQh)), static_cast<int>(LoadU32(b + 5 * wb + kQh)),
          static_cast<int>(LoadU32(b + 6 * wb + kQh)), static_cast<int>(LoadU32(b + 7 * wb + kQh)));
      const __m256i lane_base = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0c0c0c0c, 0,
                                                  0x04040404, 0x08080808, 0x0c0c0c0c);
      PS_UNROLL
      for (int j = 0; j < 8; ++j) {
        const __m256i bytes = _mm256_shuffle_epi8(
            qh, _mm256_add_epi8(lane_base, _mm256_set1_epi8(static_cast<char>(j / 2))));
        const __m256i bit = _mm256_set1_epi32((j % 2) ? static_cast<int>(0x80402010u) : 0x08040201);
        const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
        t[j] = _mm256_or_si256(t[j], _mm256_and_si256(set, _mm256_set1_epi8(0x10)));
      }
    }
    __m256 d8, m8;
    Scales8(b, wb, &d8, &m8);
    PS_UNROLL
    for (int tok = 0; tok < kT; ++tok) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + tok * xb)[i];
      const uint8_t* xq = reinterpret_cast<const uint8_t*>(a.qs);
      __m256i s = _mm256_setzero_si256();
      PS_UNROLL
      for (int g = 0; g < 8; g += kGroup) {
        __m256i s16 =
            _mm256_maddubs_epi16(t[g], _mm256_set1_epi32(static_cast<int>(LoadU32(xq + 4 * g))));
        PS_UNROLL
        for (int j = g + 1; j < g + kGroup; ++j) {
          const __m256i xj = _mm256_set1_epi32(static_cast<int>(LoadU32(xq + 4 * j)));
          s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(t[j], xj));
        }
        s = _mm256_add_epi32(s, _mm256_madd_epi16(s16, ones));
      }
      const __m256 dx = _mm256_set1_ps(a.d);
      if constexpr (kMin) {
        acc[tok] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, dx), acc[tok]);
        acc[tok] = _mm256_fmadd_ps(m8, _mm256_set1_ps(a.d * static_cast<float>(a.sum)), acc[tok]);
      } else {
        // (q - kOffset) . x = q . x - kOffset * sum(x codes), exact in int32.
        s = _mm256_sub_epi32(s, _mm256_set1_epi32(kOffset * a.sum));
        acc[tok] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, dx), acc[tok]);
      }
    }
  }
  PS_UNROLL
  for (int tok = 0; tok < kT; ++tok) _mm256_storeu_ps(out + 8 * tok, acc[tok]);
}

// Q8_0: signed codes, so |w| (unsigned, <= 128) times x with w's sign; each
// pmaddubsw lane is then <= 2 * 128 * 127 = 32512, and two of them could
// overflow int16, so every j is widened to int32 (pmaddwd) before the sum.
void Row8Q8_0(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  constexpr int kT = pagedserve::kernels::cpu::kRow8Tokens;
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b = w + i * 34;
    __m256i y[4], t[8], at[8];
    PS_UNROLL
    for (int h = 0; h < 2; ++h) {  // elements 16h .. 16h + 15
      PS_UNROLL
      for (int k = 0; k < 4; ++k)
        y[k] = Load2x128(b + k * wb + 2 + 16 * h, b + (k + 4) * wb + 2 + 16 * h);
      __m256i z[4];
      Transpose4x4Halves(y, z);
      PS_UNROLL
      for (int c = 0; c < 4; ++c) t[4 * h + c] = z[c];
    }
    PS_UNROLL
    for (int j = 0; j < 8; ++j) at[j] = _mm256_sign_epi8(t[j], t[j]);
    __m256 d8, unused;
    Scales8(b, wb, &d8, &unused);
    PS_UNROLL
    for (int tok = 0; tok < kT; ++tok) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + tok * xb)[i];
      __m256i s = _mm256_setzero_si256();
      PS_UNROLL
      for (int j = 0; j < 8; ++j) {
        const __m256i xj = _mm256_set1_epi32(
            static_cast<int>(LoadU32(reinterpret_cast<const uint8_t*>(a.qs) + 4 * j)));
        s = _mm256_add_epi32(
            s, _mm256_madd_epi16(_mm256_maddubs_epi16(at[j], _mm256_sign_epi8(xj, t[j])), ones));
      }
      acc[tok] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, _mm256_set1_ps(a.d)), acc[tok]);
    }
  }
  PS_UNROLL
  for (int tok = 0; tok < kT; ++tok) _mm256_storeu_ps(out + 8 * tok, acc[tok]);
}

}  // namespace

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace pagedserve::kernels::cpu {

const IsaKernels& Avx2Kernels() {
  static const IsaKernels k = {MultiToken<KQ4_0>,
                               MultiToken<KQ4_1>,
                               MultiToken<KQ5_0>,
                               MultiToken<KQ5_1>,
                               MultiToken<KQ8_0>,
                               MultiToken<KQ4_K>,
                               MultiToken<KQ5_K>,
                               MultiToken<KQ6_K>,
                               FDot<F32Loader>,
                               FDot<F16Loader>,
                               FDot<BF16Loader>,
                               PS_X86_TILES,
                               Row8Legacy<18, 2, -1, false, 8>,
                               Row8Legacy<20, 4, -1, true, 0>,
                               Row8Legacy<22, 6, 2, false, 16>,
                               Row8Legacy<24, 8, 4, true, 0>,
                               Row8Q8_0,
                               PS_X86_PANELS,
                               PS_X86_NEW_DOTS_AND_TILES,
                               PS_X86_PANELS_Q23,
                               PS_X86_PANELS_32,
                               PS_X86_PANEL_Q4_1,
                               DotQ4x8<false>,
                               nullptr,
                               DotQ4x8<true>,
                               nullptr};
  return k;
}

}  // namespace pagedserve::kernels::cpu
