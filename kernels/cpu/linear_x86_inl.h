// Quantized dot products of the x86 paths of the CPU Linear, shared by
// linear_avx2.cc (pmaddubsw + pmaddwd) and linear_avx512.cc (AVX512-VNNI
// vpdpbusd on 256-bit vectors). Each of those files includes this header after
// `#pragma GCC target(...)` with PS_LINEAR_VNNI set to 0 or 1; everything here
// has internal linkage, so no function compiled for a wider ISA can be picked by
// the linker for a caller on the portable path.
//
// Method (llama.cpp's ggml-quants.c vec_dot_*; written independently): the weight
// codes are expanded to one unsigned byte per element (0..15, 0..31 or 0..63), the
// 8-bit activations multiplied with them into int32 sums per 8 elements, and the
// sums scaled in fp32 per block. The constant offsets (-8, -16, -32) and the mins
// are applied through the activation block sums (the Q4_1/Q5_1 mins in scalar
// fp32 in the legacy row dots, their offsets in the int32 sum; in vectors in the
// tiles and the K-quant row dots, which are 1-row tiles).
#ifndef PAGEDSERVE_KERNELS_CPU_LINEAR_X86_INL_H_
#define PAGEDSERVE_KERNELS_CPU_LINEAR_X86_INL_H_

#if !defined(PS_LINEAR_VNNI)
#error "define PS_LINEAR_VNNI before including linear_x86_inl.h"
#endif

namespace {

using pagedserve::kernels::cpu::ActBlock256;
using pagedserve::kernels::cpu::ActBlock32;
using pagedserve::kernels::cpu::LoadU32;

// Sum over groups of 4 bytes of w (unsigned) * x (signed): 8 x int32.
inline __m256i DotU8I8(__m256i w, __m256i x) {
#if PS_LINEAR_VNNI
  return _mm256_dpbusd_epi32(_mm256_setzero_si256(), w, x);
#else
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1));
#endif
}

// Sum over groups of 4 of (w * x) * scale16 where scale16 is int16 per pair:
// the weighted form used by the K-quants (pmaddwd applies the sub-block scale).
inline __m256i DotU8I8Scaled(__m256i w, __m256i x, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), scale16);
}

inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256i Load256(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of nibbles -> 32 bytes: low nibbles (elements 0..15), then high (16..31).
// The 16 bytes go to both 128-bit lanes (one broadcast load); the upper lane's
// 64-bit halves shift right by 4, which brings each byte's high nibble down
// (the bits that cross from the next byte are masked off).
inline __m256i Nibbles32(const uint8_t* q) {
  const __m256i b =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)),
                          _mm256_set1_epi8(0x0f));
}

// Bit i of qh -> 0x10 in byte i (i < 32), 0 otherwise.
inline __m256i HighBits32(uint32_t qh) {
  const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101,
                                         0x0000000000000000);
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ull));
  __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
  v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
  return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

// fp16 scalar by F16C (the portable LoadF16 is a software conversion).
inline float F16(const uint8_t* p) { return _cvtsh_ss(pagedserve::kernels::cpu::LoadU16(p)); }

// Distance of the software prefetch of the legacy formats' one-token row dots
// (DotLegacyN<1>), the Q8_0 / IQ4_NL / IQ4_XS row dots (at every token count)
// and the decode tiles (TileLegacy<kR, 1>), which
// stream weight rows from DRAM once per step. Measured on random-weight
// Llama-3.1-8B-shaped files, batch-1 decode (bench_model, two interleaved
// rounds, AMD EPYC Zen 4, 2 threads; issue 34, 2026-12-07): Q4_0 with its 4x1
// tiles 4.90, 4.68 tokens/s at 2048 bytes, 5.82, 5.88 at 6144; Q8_0 row dots
// 5.35, 4.51 at 2048, 5.65, 4.58 at 6144 (the machine's bandwidth moved
// between the rounds); the default SmolLM2 Q4_1 file level (153-155 vs
// 155-158); IQ4_NL / IQ4_XS not measured at either distance. 2048 had been chosen on SmolLM2 at one
// thread (58 tokens/s without, 61 at 1024, 66 at 2048). Same reason as kPrefetchKBytes below.
constexpr int kPrefetchLegacyBytes = 6144;

// The kernels below compute one weight row against N = 1..4 tokens at once, so
// that a weight block is loaded and unpacked once for N tokens; token j's
// activation blocks start at x + j * xb bytes. kMaxTokens in linear_cpu.h.

// Legacy 32-blocks. kQs: offset of the nibbles; kQh: offset of the 5th bits
// (-1: none); kMin: offset of the fp16 min (-1: none); kOffset: subtracted code.
// Even and odd blocks go to two accumulator chains per token: with one, the
// FMA's latency (4 cycles per 18-24 byte block) bounded a one-token row at
// ~16 GB/s per core. The offset (Q4_0 8, Q5_0 16) is subtracted from the
// integer sum (exact in int32); the min term (Q4_1, Q5_1) is a scalar per block.
template <int N, int kBytes, int kQs, int kQh, int kMin, int kOffset>
inline void LegacyBlock(const uint8_t* b, const uint8_t* x, size_t xb, int64_t i, __m256* acc,
                        float* extra) {
  // one token: the row is streamed from DRAM (a prefetch per block: 18-24
  // byte blocks, so a few per cache line; cheaper than a branch)
  if constexpr (N == 1)
    _mm_prefetch(reinterpret_cast<const char*>(b) + kPrefetchLegacyBytes, _MM_HINT_T0);
  __m256i q = Nibbles32(b + kQs);
  if constexpr (kQh >= 0) q = _mm256_or_si256(q, HighBits32(LoadU32(b + kQh)));
  const float dw = F16(b);
  for (int j = 0; j < N; ++j) {
    const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + j * xb)[i];
    __m256i s = DotU8I8(q, Load256(a.qs));
    if constexpr (kMin >= 0) {
      extra[j] += F16(b + kMin) * a.d * static_cast<float>(a.sum);
    } else {
      s = _mm256_sub_epi32(s, _mm256_setr_epi32(kOffset * a.sum, 0, 0, 0, 0, 0, 0, 0));
    }
    acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * a.d), acc[j]);
  }
}

template <int N, int kBytes, int kQs, int kQh, int kMin, int kOffset>
void DotLegacyN(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc0[N], acc1[N];
  float extra0[N], extra1[N];
  for (int j = 0; j < N; ++j) {
    acc0[j] = acc1[j] = _mm256_setzero_ps();
    extra0[j] = extra1[j] = 0.0f;
  }
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    LegacyBlock<N, kBytes, kQs, kQh, kMin, kOffset>(w + i * kBytes, x, xb, i, acc0, extra0);
    LegacyBlock<N, kBytes, kQs, kQh, kMin, kOffset>(w + (i + 1) * kBytes, x, xb, i + 1, acc1,
                                                    extra1);
  }
  if (i < nb)
    LegacyBlock<N, kBytes, kQs, kQh, kMin, kOffset>(w + i * kBytes, x, xb, i, acc0, extra0);
  for (int j = 0; j < N; ++j)
    out[j] = HSum(_mm256_add_ps(acc0[j], acc1[j])) + (extra0[j] + extra1[j]);
}

template <int N>
void DotQ8_0N(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, w += 34) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchLegacyBytes, _MM_HINT_T0);
    const __m256i q = Load256(w + 2);
    // |w| (unsigned, <= 128) times x with w's sign: one side must be unsigned.
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = F16(w);
    for (int j = 0; j < N; ++j) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + j * xb)[i];
      const __m256i s = DotU8I8(aq, _mm256_sign_epi8(Load256(a.qs), q));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * a.d), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = HSum(acc[j]);
}

// A QDotFn (linear_cpu.h) over a kernel template K<N>: n tokens in groups of 1..4.
template <template <int> class K>
void MultiToken(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, int n, float* out) {
  switch (n) {
    case 1: K<1>::Run(w, x, xb, nb, out); return;
    case 2: K<2>::Run(w, x, xb, nb, out); return;
    case 3: K<3>::Run(w, x, xb, nb, out); return;
    default: K<4>::Run(w, x, xb, nb, out); return;
  }
}

template <int N>
struct KQ4_0 {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotLegacyN<N, 18, 2, -1, -1, 8>(w, x, xb, nb, o);
  }
};
template <int N>
struct KQ4_1 {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotLegacyN<N, 20, 4, -1, 2, 0>(w, x, xb, nb, o);
  }
};
template <int N>
struct KQ5_0 {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotLegacyN<N, 22, 6, 2, -1, 16>(w, x, xb, nb, o);
  }
};
template <int N>
struct KQ5_1 {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotLegacyN<N, 24, 8, 4, 2, 0>(w, x, xb, nb, o);
  }
};
template <int N>
struct KQ8_0 {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotQ8_0N<N>(w, x, xb, nb, o);
  }
};
// IQ4_NL / IQ4_XS: the 4-bit indices become the codebook's signed values by one
// pshufb from the 16-entry table (kIq4nlValues) in both 128-bit lanes; signed
// codes, so |w| (<= 127) times x with w's sign (as Q8_0), each pmaddubsw lane
// <= 2 * 127 * 127 < 2^15.
inline __m256i Iq4Values(const uint8_t* nibbles16) {
  const __m256i table = _mm256_broadcastsi128_si256(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(pagedserve::kernels::cpu::kIq4nlValues)));
  return _mm256_shuffle_epi8(table, Nibbles32(nibbles16));
}

template <int N>
void DotIq4NlN(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, w += 18) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchLegacyBytes, _MM_HINT_T0);
    const __m256i q = Iq4Values(w + 2);
    const __m256i aq = _mm256_sign_epi8(q, q);
    const float dw = F16(w);
    for (int j = 0; j < N; ++j) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + j * xb)[i];
      const __m256i s = DotU8I8(aq, _mm256_sign_epi8(Load256(a.qs), q));
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(dw * a.d), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = HSum(acc[j]);
}

// IQ4_XS: per 32-element sub-block the int16 pair sums times the sub-block's
// scale (pmaddwd), exact int32 per super-block, one fp32 FMA per super-block.
template <int N>
void DotIq4XsN(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc[N];
  for (int j = 0; j < N; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, w += 136) {
    for (int l = 0; l < 136; l += 64)
      _mm_prefetch(reinterpret_cast<const char*>(w) + kPrefetchLegacyBytes + l, _MM_HINT_T0);
    __m256i sumi[N];
    for (int j = 0; j < N; ++j) sumi[j] = _mm256_setzero_si256();
    for (int sb = 0; sb < 8; ++sb) {
      const __m256i q = Iq4Values(w + 8 + 16 * sb);
      const __m256i aq = _mm256_sign_epi8(q, q);
      const __m256i scale =
          _mm256_set1_epi16(static_cast<int16_t>(pagedserve::kernels::cpu::ScaleIq4Xs(w, sb)));
      for (int j = 0; j < N; ++j) {
        const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + j * xb)[i];
        const __m256i xs = _mm256_sign_epi8(Load256(a.qs + 32 * sb), q);
        sumi[j] = _mm256_add_epi32(sumi[j], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, xs), scale));
      }
    }
    const float dw = F16(w);
    for (int j = 0; j < N; ++j) {
      const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + j * xb)[i];
      acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[j]), _mm256_set1_ps(dw * a.d), acc[j]);
    }
  }
  for (int j = 0; j < N; ++j) out[j] = HSum(acc[j]);
}

template <int N>
struct KIQ4_NL {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotIq4NlN<N>(w, x, xb, nb, o);
  }
};
template <int N>
struct KIQ4_XS {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    DotIq4XsN<N>(w, x, xb, nb, o);
  }
};

// The K-quant row dots are the register-blocked tiles below with one row
// (TileQ45K<1, N>, TileK16<1, N, bits>): scales and mins unpacked in vectors, the
// mins / -32 offsets by one pmaddwd with the activation sub-block sums, one
// int32 -> fp32 conversion per super-block and token.
template <int kR, int kT, bool kFive>
void TileQ45K(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out);
template <int kR, int kT, int kBits>
void TileK16(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out);
template <int N>
struct KQ4_K {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    TileQ45K<1, N, false>(w, 0, x, xb, nb, o);
  }
};
template <int N>
struct KQ5_K {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    TileQ45K<1, N, true>(w, 0, x, xb, nb, o);
  }
};
template <int N>
struct KQ6_K {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    TileK16<1, N, 6>(w, 0, x, xb, nb, o);
  }
};
template <int N>
struct KQ2_K {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    TileK16<1, N, 2>(w, 0, x, xb, nb, o);
  }
};
template <int N>
struct KQ3_K {
  static void Run(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* o) {
    TileK16<1, N, 3>(w, 0, x, xb, nb, o);
  }
};

// ---- activation quantization (QuantizeActs32 / QuantizeActs256, vectorized) ----
//
// Bit-identical to the portable quantizer for finite input: the block maximum of
// |x| is exact in any order, d and 1/d are the same scalar fp32 expressions, the
// products x * id are the same fp32 multiplies, and vcvtps2dq rounds them in the
// MXCSR mode (round to nearest, ties to even, by default), which is what lrintf
// does in the default rounding mode. |x * id| <= 127 * (1 + 2^-23) for finite x,
// so the int16/int8 saturating packs never clip a finite code; the clamp to -127
// matches the portable clamp (it only acts on non-finite input).

inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline __m256 AbsPs(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }

// The 32 codes of x[0..32) * id, in element order.
inline __m256i QuantCodes32(const float* x, __m256 id) {
  const __m256i i0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x), id));
  const __m256i i1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8), id));
  const __m256i i2 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 16), id));
  const __m256i i3 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 24), id));
  // packs work per 128-bit lane: the dwords of 4 codes come out as elements
  // 0-3, 8-11, 16-19, 24-27, 4-7, 12-15, 20-23, 28-31; the permute restores order.
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i0, i1), _mm256_packs_epi32(i2, i3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  return _mm256_max_epi8(ordered, _mm256_set1_epi8(-127));
}

// Sums of codes 0..15 and 16..31 of a 32-byte vector.
inline void HalfSums(__m256i q, int32_t* s0, int32_t* s1) {
  const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q),
                                      _mm256_set1_epi16(1));  // 4 codes per int32
  __m128i h = _mm_hadd_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  h = _mm_hadd_epi32(h, h);
  *s0 = _mm_cvtsi128_si32(h);
  *s1 = _mm_extract_epi32(h, 1);
}

void QuantActs32X86(const float* x, int64_t n, ActBlock32* out) {
  for (int64_t blk = 0; blk < n / 32; ++blk) {
    const float* p = x + 32 * blk;
    const __m256 m = _mm256_max_ps(
        _mm256_max_ps(AbsPs(_mm256_loadu_ps(p)), AbsPs(_mm256_loadu_ps(p + 8))),
        _mm256_max_ps(AbsPs(_mm256_loadu_ps(p + 16)), AbsPs(_mm256_loadu_ps(p + 24))));
    const float amax = HMax(m);
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    ActBlock32& o = out[blk];
    o.d = amax / 127.0f;
    const __m256i q = QuantCodes32(p, _mm256_set1_ps(id));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs), q);
    int32_t s0, s1;
    HalfSums(q, &s0, &s1);
    o.sum = s0 + s1;
  }
}

void QuantActs256X86(const float* x, int64_t n, ActBlock256* out) {
  for (int64_t blk = 0; blk < n / 256; ++blk) {
    const float* p = x + 256 * blk;
    __m256 m0 = _mm256_setzero_ps(), m1 = _mm256_setzero_ps();
    for (int i = 0; i < 256; i += 16) {
      m0 = _mm256_max_ps(m0, AbsPs(_mm256_loadu_ps(p + i)));
      m1 = _mm256_max_ps(m1, AbsPs(_mm256_loadu_ps(p + i + 8)));
    }
    const float amax = HMax(_mm256_max_ps(m0, m1));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    ActBlock256& o = out[blk];
    o.d = amax / 127.0f;
    const __m256 idv = _mm256_set1_ps(id);
    for (int c = 0; c < 8; ++c) {
      const __m256i q = QuantCodes32(p + 32 * c, idv);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs + 32 * c), q);
      int32_t s0, s1;
      HalfSums(q, &s0, &s1);
      o.bsums[2 * c] = static_cast<int16_t>(s0);
      o.bsums[2 * c + 1] = static_cast<int16_t>(s1);
    }
  }
}

// ---- register-blocked tiles (QTileFn, linear_cpu.h) ----
//
// kR weight rows x kT tokens: one fp32 accumulator vector per (row, token) for
// the whole row. Per block, each row's codes are unpacked once for kT tokens and
// each token's per-block terms (scale broadcast, offset/min sums) are formed
// once for kR rows. The per-(row, token) terms (offset, min, sub-block mins)
// are done in vectors: the Q4_0/Q5_0
// offset is subtracted from the integer sum, the Q4_1/Q5_1 min term is an FMA
// into lane 0 of the accumulator, and the K-quant mins / Q6_K offsets are a
// pmaddwd of the 16 activation sub-block sums with the 16 weight sub-block
// mins / scales.

// Every loop over the tile's rows and tokens is unrolled, so that the
// accumulator arrays live in registers (GCC keeps them in memory otherwise).
// clang unrolls these constant-trip loops by itself at -O2; told to, at the
// sanitizer builds' -O1 it spends minutes per file and then gives up
// (-Wpass-failed), so it is not told.
#if defined(__clang__)
#define PS_UNROLL
#else
#define PS_UNROLL _Pragma("GCC unroll 16")
#endif

// Two shapes are instantiated: kBlockRows x kBlockTokens (many tokens) and
// kDecodeRows x 1 (one token at a time: decode).
template <int kR, int kT>
inline void StoreTile(const __m256 (&acc)[kR][kT], float* out) {
  PS_UNROLL
  for (int r = 0; r < kR; ++r) PS_UNROLL
  for (int t = 0; t < kT; ++t) out[r * kT + t] = HSum(acc[r][t]);
}

template <int kR, int kT, int kBytes, int kQs, int kQh, int kMin, int kOffset>
void TileLegacy(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc[kR][kT];
  PS_UNROLL
  for (auto& row : acc) PS_UNROLL
  for (auto& a : row) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i q[kR];
    __m256 dw[kR], mw[kR];
    PS_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint8_t* b = w + r * wb + i * kBytes;
      if constexpr (kT == 1)
        _mm_prefetch(reinterpret_cast<const char*>(b) + kPrefetchLegacyBytes, _MM_HINT_T0);
      q[r] = Nibbles32(b + kQs);
      if constexpr (kQh >= 0) q[r] = _mm256_or_si256(q[r], HighBits32(LoadU32(b + kQh)));
      if constexpr (kMin == 2) {
        // d and min are adjacent fp16 fields: one F16C conversion for both
        // (the same values as two scalar conversions).
        const __m128 dm = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(b))));
        dw[r] = _mm256_broadcastss_ps(dm);
        mw[r] = _mm256_broadcastss_ps(_mm_movehdup_ps(dm));
      } else {
        dw[r] = _mm256_set1_ps(F16(b));
        if constexpr (kMin >= 0) mw[r] = _mm256_set1_ps(F16(b + kMin));
      }
    }
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + t * xb)[i];
      const __m256i xq = Load256(a.qs);
      const __m256 dx = _mm256_set1_ps(a.d);
      if constexpr (kMin >= 0) {
        // min * sum_c x_c = m * d_x * sum(codes), added to lane 0.
        const __m256 ms = _mm256_setr_ps(a.d * static_cast<float>(a.sum), 0, 0, 0, 0, 0, 0, 0);
        PS_UNROLL
        for (int r = 0; r < kR; ++r) {
          const __m256i s = DotU8I8(q[r], xq);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), acc[r][t]);
          acc[r][t] = _mm256_fmadd_ps(mw[r], ms, acc[r][t]);
        }
      } else {
        // (q - kOffset) . x = q . x - kOffset * sum(x codes): exact in int32, lane 0.
        const __m256i off = _mm256_setr_epi32(kOffset * a.sum, 0, 0, 0, 0, 0, 0, 0);
        PS_UNROLL
        for (int r = 0; r < kR; ++r) {
          const __m256i s = _mm256_sub_epi32(DotU8I8(q[r], xq), off);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), acc[r][t]);
        }
      }
    }
  }
  StoreTile(acc, out);
}

template <int kR, int kT>
void TileQ8_0(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  __m256 acc[kR][kT];
  PS_UNROLL
  for (auto& row : acc) PS_UNROLL
  for (auto& a : row) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i q[kR], aq[kR];
    __m256 dw[kR];
    PS_UNROLL
    for (int r = 0; r < kR; ++r) {
      const uint8_t* b = w + r * wb + i * 34;
      q[r] = Load256(b + 2);
      aq[r] = _mm256_sign_epi8(q[r], q[r]);  // |w| unsigned; x takes w's sign
      dw[r] = _mm256_set1_ps(F16(b));
    }
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + t * xb)[i];
      const __m256i xq = Load256(a.qs);
      const __m256 dx = _mm256_set1_ps(a.d);
      PS_UNROLL
      for (int r = 0; r < kR; ++r) {
        const __m256i s = DotU8I8(aq[r], _mm256_sign_epi8(xq, q[r]));
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw[r], dx), acc[r][t]);
      }
    }
  }
  StoreTile(acc, out);
}

// Distance of the software prefetch of the K-quant row dots (kR == 1), which
// stream weight rows from DRAM once per step. Measured with
// the weight read from memory, AMD EPYC Zen 4 VM, 2 threads, idle (issue 34,
// 2026-12-07): whole-model decode at batch 1 on Llama-3.2-1B / 3.1-8B shapes in
// Q4_K_M (bench_model, interleaved rounds) 45.7-48.3 / 8.1-8.3 tokens/s at
// 4096 bytes, 47.7-48.7 / 7.8-8.7 at 6144, 45.5 / 8.1 at 8192, 7.4 (8B) at
// 12288; at the earlier 1024 bytes (tuned in cache) 43.7-44.3 (1B). 4096 and
// 6144 are level within the noise on the 1B file; 6144 was ahead on the 8B. One thread alone
// streams 15.5 GB/s at 1024 and 19.1-19.4 at 6144 (BM_LinearMethodCold Q4_K 8192x2048): a core's
// own misses in flight bound it, and the far prefetch adds more.
constexpr int kPrefetchKBytes = 6144;

// The eight 6-bit scales and eight 6-bit mins of a Q4_K / Q5_K super-block
// (the 12 bytes at p, ScaleMinK4 in quant_blocks.h) as bytes: scales 0..7, then
// mins 0..7. Decoded in vector registers: the scalar decode's general-register
// round trip put ~20 cycles of latency before the first pmaddwd of each
// super-block (measured: the Q4_K row dot in L2 ran 1.25x faster with the scales
// taken as constants; with this decode, one iteration ahead, and vpdpwssd it
// runs 1.17x faster than before on AVX-512, 1.04x on AVX2). Reads 16 bytes at p (the 4 past the
// fields are inside the block's code array and ignored).
inline __m128i ScaleMinBytesK4(const uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  // a: low 6 bits of scales 0-3 | nibbles of 4-7 | low 6 bits of mins 0-3 | nibbles of 4-7
  const __m128i a =
      _mm_shuffle_epi8(v, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
  // t: the bytes whose top 2 bits are the high bits of scales 4-7 / mins 4-7
  const __m128i t =
      _mm_shuffle_epi8(v, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
  const __m128i lo =
      _mm_and_si128(a, _mm_setr_epi8(63, 63, 63, 63, 15, 15, 15, 15, 63, 63, 63, 63, 0, 0, 0, 0));
  const __m128i nib_hi = _mm_and_si128(
      _mm_srli_epi16(a, 4), _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 15, 15, 15));
  const __m128i top = _mm_and_si128(_mm_srli_epi16(t, 2), _mm_set1_epi8(0x30));
  return _mm_or_si128(_mm_or_si128(lo, nib_hi), top);
}

// Q4_K (kFive = false) and Q5_K.
template <int kR, int kT, bool kFive>
void TileQ45K(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  constexpr int kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
  const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi8(1);
  __m256 acc[kR][kT];
  PS_UNROLL
  for (auto& row : acc) PS_UNROLL
  for (auto& a : row) a = _mm256_setzero_ps();
  // Each super-block's scales and mins are decoded one iteration ahead, so that
  // its pmaddwd never wait for them (the clamp re-reads the last block).
  __m128i next_bytes[kR];
  PS_UNROLL
  for (int r = 0; r < kR; ++r) next_bytes[r] = ScaleMinBytesK4(w + r * wb + 4);
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b[kR];
    __m256i sc256[kR], mins16[kR], hbits[kR];
    __m256 dm[kR];  // d, d, -dmin, -dmin in each 128-bit lane
    const int64_t ahead = std::min<int64_t>(i + 1, nb - 1) * kBytes;
    PS_UNROLL
    for (int r = 0; r < kR; ++r) {
      b[r] = w + r * wb + i * kBytes;
      if constexpr (kR == 1) {
        // the row dots stream one row: prefetch kPrefetchKBytes ahead (every
        // cache line the block spans)
        for (int l = 0; l < kBytes; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(b[r]) + kPrefetchKBytes + l, _MM_HINT_T0);
      }
      const __m128i bytes = next_bytes[r];
      next_bytes[r] = ScaleMinBytesK4(w + r * wb + ahead + 4);
      // scales as int16 in both 128-bit lanes (for a per-sub-block pshufb broadcast)
      sc256[r] = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(bytes));
      // mins as int16, each twice: the activation sums are per 16 elements
      const __m128i mins = _mm_srli_si128(bytes, 8);
      mins16[r] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
      hbits[r] = kFive ? Load256(b[r] + 16) : _mm256_setzero_si256();
      // d and dmin are adjacent fp16 fields: one F16C conversion for both
      const __m128 dd = _mm_cvtph_ps(_mm_cvtsi32_si128(static_cast<int>(LoadU32(b[r]))));
      const __m128 dm4 = _mm_xor_ps(_mm_shuffle_ps(dd, dd, _MM_SHUFFLE(1, 1, 0, 0)),
                                    _mm_setr_ps(0.0f, 0.0f, -0.0f, -0.0f));
      dm[r] = _mm256_set_m128(dm4, dm4);
    }
    __m256i sumi[kR][kT];
    PS_UNROLL
    for (auto& row : sumi) PS_UNROLL
    for (auto& s : row) s = _mm256_setzero_si256();
#if PS_LINEAR_VNNI
    __m256i sumo[kR][kT];
    PS_UNROLL
    for (auto& row : sumo) PS_UNROLL
    for (auto& s : row) s = _mm256_setzero_si256();
#endif
    // Sub-block 2k (low nibbles) and 2k + 1 (high nibbles) one after the other,
    // so that only kR unpacked vectors and kR scales are live next to the
    // kR x kT integer sums (16 vector registers on AVX2).
    PS_UNROLL
    for (int sub = 0; sub < 8; ++sub) {
      const int k = sub / 2;
      __m256i q[kR], sc16[kR];
      PS_UNROLL
      for (int r = 0; r < kR; ++r) {
        const __m256i v = Load256(b[r] + kQs + 32 * k);
        q[r] = (sub & 1) ? _mm256_and_si256(_mm256_srli_epi16(v, 4), m4) : _mm256_and_si256(v, m4);
        if constexpr (kFive) {
          // bit `sub` of each qh byte is bit 4 of the element
          q[r] = _mm256_or_si256(
              q[r], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits[r], sub), one), 4));
        }
        sc16[r] = _mm256_shuffle_epi8(
            sc256[r], _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * sub)));
      }
      PS_UNROLL
      for (int t = 0; t < kT; ++t) {
        const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + t * xb)[i];
        const __m256i xv = Load256(a.qs + 32 * sub);
        PS_UNROLL
        for (int r = 0; r < kR; ++r) {
#if PS_LINEAR_VNNI
          // vpdpwssd: the scale multiply and the accumulation in one
          // instruction; even and odd sub-blocks in two chains
          __m256i& acc_i = (sub & 1) ? sumo[r][t] : sumi[r][t];
          acc_i = _mm256_dpwssd_epi32(acc_i, _mm256_maddubs_epi16(q[r], xv), sc16[r]);
#else
          sumi[r][t] = _mm256_add_epi32(sumi[r][t], DotU8I8Scaled(q[r], xv, sc16[r]));
#endif
        }
      }
    }
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + t * xb)[i];
      const __m256i bs = Load256(a.bsums);
#if PS_LINEAR_VNNI
      PS_UNROLL
      for (int r = 0; r < kR; ++r) sumi[r][t] = _mm256_add_epi32(sumi[r][t], sumo[r][t]);
#endif
      PS_UNROLL
      for (int r = 0; r < kR; ++r) {
        const __m256i mins = _mm256_madd_epi16(bs, mins16[r]);  // sum_j min_j * bsum_j
        // Pairwise sums (exact in int32) of the scaled code sums (lanes 0, 1
        // of each 128-bit half) and of the min sums (lanes 2, 3): one
        // conversion and one FMA with d * dx, d * dx, -dmin * dx, -dmin * dx.
        const __m256i both = _mm256_hadd_epi32(sumi[r][t], mins);
        acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(both),
                                    _mm256_mul_ps(dm[r], _mm256_set1_ps(a.d)), acc[r][t]);
      }
    }
  }
  StoreTile(acc, out);
}

// The K-quants with a scale per 16 elements: Q6_K (kBits 6), Q3_K (3), Q2_K
// (2); layouts in quant_blocks.h. Element 128h + 32k + l of all three takes its
// low bits from byte 32h + l (+ 32 (k & 1) for Q6_K's nibbles) of its code
// array and its scale from group 8h + 2k + l / 16, so one 32-byte vector of
// codes per (h, k) is one scale pair, as in the Q6_K loop this was first.
// Codes are unsigned (Q6_K 0..63, Q3_K 0..7, Q2_K 0..3); the offsets (Q6_K -32,
// Q3_K -4) and Q2_K's mins go through the activation group sums in int32.
template <int kBits>
struct K16Fmt {
  static constexpr int kBytes = kBits == 6 ? 210 : (kBits == 3 ? 110 : 84);
  static constexpr int kD = kBits == 6 ? 208 : (kBits == 3 ? 108 : 80);
  static constexpr int kQs = kBits == 3 ? 32 : 16;   // Q2_K/Q3_K low 2 bits
  static constexpr int kShift = kBits == 6 ? 5 : 2;  // offset 32 or 4 (Q2_K: mins)
};

// The 16 scales of a super-block as int16 (Q2_K also its 16 mins in *mins).
template <int kBits>
inline __m256i K16Scales(const uint8_t* b, __m256i* mins) {
  if constexpr (kBits == 6) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
  } else if constexpr (kBits == 3) {
    alignas(16) int8_t sc[16];
    pagedserve::kernels::cpu::ScalesQ3K(b + 96, sc);
    return _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sc)));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
    const __m128i m4 = _mm_set1_epi8(0x0f);
    *mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
    return _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4));
  }
}

// The 32 codes of elements 128h + 32k .. + 32 of super-block b, one byte each.
template <int kBits>
inline __m256i K16Codes(const uint8_t* b, int h, int k) {
  const __m256i m2 = _mm256_set1_epi8(0x03);
  if constexpr (kBits == 6) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    const __m256i ql = Load256(b + 64 * h + 32 * (k & 1));
    const __m256i qh = Load256(b + 128 + 32 * h);
    const __m256i low =
        k < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
    // bits 2k, 2k + 1 of each qh byte moved to bits 4, 5 in one shift (the
    // 16-bit shifts carry bits across bytes only outside the 0x30 mask)
    const __m256i qh_at4 = k < 2    ? _mm256_slli_epi16(qh, 4 - 2 * k)
                           : k == 2 ? qh
                                    : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(low, _mm256_and_si256(qh_at4, _mm256_set1_epi8(0x30)));
  } else {
    const __m256i low =
        _mm256_and_si256(_mm256_srli_epi16(Load256(b + K16Fmt<kBits>::kQs + 32 * h), 2 * k), m2);
    if constexpr (kBits == 2) return low;
    const __m256i hm =
        _mm256_and_si256(_mm256_srli_epi16(Load256(b), 4 * h + k), _mm256_set1_epi8(1));
    return _mm256_or_si256(low, _mm256_slli_epi16(hm, 2));
  }
}

template <int kR, int kT, int kBits>
void TileK16(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  using F = K16Fmt<kBits>;
  __m256 acc[kR][kT];
  PS_UNROLL
  for (auto& row : acc) PS_UNROLL
  for (auto& a : row) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* b[kR];
    __m256i scales16[kR], mins16[kR] = {};
    float d[kR], dmin[kR];
    PS_UNROLL
    for (int r = 0; r < kR; ++r) {
      b[r] = w + r * wb + i * F::kBytes;
      if constexpr (kR == 1) {
        for (int l = 0; l < F::kBytes; l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(b[r]) + kPrefetchKBytes + l, _MM_HINT_T0);
      }
      scales16[r] = K16Scales<kBits>(b[r], &mins16[r]);
      d[r] = F16(b[r] + F::kD);
      dmin[r] = kBits == 2 ? F16(b[r] + 82) : 0.0f;
    }
    __m256i sumi[kR][kT];
    PS_UNROLL
    for (auto& row : sumi) PS_UNROLL
    for (auto& s : row) s = _mm256_setzero_si256();
#if PS_LINEAR_VNNI
    __m256i sumo[kR][kT];
    PS_UNROLL
    for (auto& row : sumo) PS_UNROLL
    for (auto& s : row) s = _mm256_setzero_si256();
#endif
    PS_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i scales_h[kR];  // int16 scales 8h..8h+7 in both 128-bit lanes
      PS_UNROLL
      for (int r = 0; r < kR; ++r)
        scales_h[r] = h == 0 ? _mm256_permute2x128_si256(scales16[r], scales16[r], 0x00)
                             : _mm256_permute2x128_si256(scales16[r], scales16[r], 0x11);
      PS_UNROLL
      for (int k = 0; k < 4; ++k) {
        // pshufb selectors of int16 scale 2k (low lane) and 2k + 1 (high lane)
        // of the 8 scales of half h (in both lanes of scales_h)
        const __m256i sel =
            _mm256_setr_m128i(_mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0404 * k)),
                              _mm_set1_epi16(static_cast<int16_t>(0x0302 + 0x0404 * k)));
        __m256i q[kR], scale[kR];
        PS_UNROLL
        for (int r = 0; r < kR; ++r) {
          q[r] = K16Codes<kBits>(b[r], h, k);
          // scale of sub-block `sub` in the low 128-bit lane, of sub + 1 in the high one
          scale[r] = _mm256_shuffle_epi8(scales_h[r], sel);
        }
        PS_UNROLL
        for (int t = 0; t < kT; ++t) {
          const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + t * xb)[i];
          const __m256i xv = Load256(a.qs + 128 * h + 32 * k);
          PS_UNROLL
          for (int r = 0; r < kR; ++r) {
#if PS_LINEAR_VNNI
            // as in TileQ45K: vpdpwssd, two chains
            __m256i& acc_i = (k & 1) ? sumo[r][t] : sumi[r][t];
            acc_i = _mm256_dpwssd_epi32(acc_i, _mm256_maddubs_epi16(q[r], xv), scale[r]);
#else
            sumi[r][t] = _mm256_add_epi32(sumi[r][t], DotU8I8Scaled(q[r], xv, scale[r]));
#endif
          }
        }
      }
    }
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      const ActBlock256& a = reinterpret_cast<const ActBlock256*>(x + t * xb)[i];
      const __m256i bs = Load256(a.bsums);
#if PS_LINEAR_VNNI
      PS_UNROLL
      for (int r = 0; r < kR; ++r) sumi[r][t] = _mm256_add_epi32(sumi[r][t], sumo[r][t]);
#endif
      PS_UNROLL
      for (int r = 0; r < kR; ++r) {
        if constexpr (kBits == 2) {
          // the mins: dmin * sum_g min_g * bsum_g, in fp32 beside d * sumi
          const __m256i m = _mm256_madd_epi16(bs, mins16[r]);
          const __m256 v =
              _mm256_fmsub_ps(_mm256_set1_ps(d[r]), _mm256_cvtepi32_ps(sumi[r][t]),
                              _mm256_mul_ps(_mm256_set1_ps(dmin[r]), _mm256_cvtepi32_ps(m)));
          acc[r][t] = _mm256_fmadd_ps(v, _mm256_set1_ps(a.d), acc[r][t]);
        } else {
          // The offset of the codes (32 or 4): offset * sum_j scale_j * bsum_j.
          const __m256i off = _mm256_slli_epi32(_mm256_madd_epi16(bs, scales16[r]), F::kShift);
          const __m256i s = _mm256_sub_epi32(sumi[r][t], off);
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d[r] * a.d), acc[r][t]);
        }
      }
    }
  }
  StoreTile(acc, out);
}

// The QTileFn of each format for an R x T tile (argument order of IsaKernels).
#define PS_X86_TILE_SET(R, T)                                                               \
  TileLegacy<R, T, 18, 2, -1, -1, 8>, TileLegacy<R, T, 20, 4, -1, 2, 0>,                    \
      TileLegacy<R, T, 22, 6, 2, -1, 16>, TileLegacy<R, T, 24, 8, 4, 2, 0>, TileQ8_0<R, T>, \
      TileQ45K<R, T, false>, TileQ45K<R, T, true>, TileK16<R, T, 6>
#define PS_X86_TILES                                                                             \
  PS_X86_TILE_SET(pagedserve::kernels::cpu::kBlockRows, pagedserve::kernels::cpu::kBlockTokens), \
      PS_X86_TILE_SET(pagedserve::kernels::cpu::kDecodeRows, 1), QuantActs32X86, QuantActs256X86
// The QDotFn of Q2_K, Q3_K, IQ4_NL, IQ4_XS and the tiles of Q2_K and Q3_K
// (argument order of IsaKernels' second part).
#define PS_X86_NEW_DOTS_AND_TILES                                                               \
  MultiToken<KQ2_K>, MultiToken<KQ3_K>, MultiToken<KIQ4_NL>, MultiToken<KIQ4_XS>,               \
      TileK16<pagedserve::kernels::cpu::kBlockRows, pagedserve::kernels::cpu::kBlockTokens, 2>, \
      TileK16<pagedserve::kernels::cpu::kBlockRows, pagedserve::kernels::cpu::kBlockTokens, 3>, \
      TileK16<pagedserve::kernels::cpu::kDecodeRows, 1, 2>,                                     \
      TileK16<pagedserve::kernels::cpu::kDecodeRows, 1, 3>

// ---- Q4_0x8 / Q4_1x8 (kernels/weight_format.h): 8 interleaved rows x kT tokens ----
//
// The load-time layout puts each row in one 32-bit lane: chunk c of a block is
// one 256-bit load whose low nibbles are elements 4c..4c+3 and high nibbles
// 16+4c..16+4c+3 of the 8 rows, so the 8 rows' codes need two ANDs and a
// shift per chunk (no transposition, as kRowBlock8 does per call), a token's 4
// activation codes are one broadcast, the 8 rows' integer block sums come out
// in the 8 lanes, and the 8 fp16 scales (and Q4_1's minimums) are one
// vcvtph2ps each. One sequential stream per group (the 4x1 tiles and the
// on-the-fly 8-row tiles read 4 or 8 row streams and measured slower than the
// row dots from memory). The idea of llama.cpp's block_q4_0x8 repack
// (ggml-cpu/repack.cpp), written independently with its own layout. AVX2:
// pmaddubsw sums of 8 chunks stay within int16 (each lane <= 2 * 15 * 127, 8
// of them <= 30480); VNNI: vpdpbusd, Q4_0 from the block's -8 * sum(x codes)
// offset. Same integer block sums as every other Q4_0 / Q4_1 method, fp32
// scaling per block (Q4_1: plus m * d_x * sum(x codes)).
template <bool kMin>
constexpr int Q4x8GroupBlock() {
  return kMin ? 160 : 144;  // 8 rows' d (and m), then 128 code bytes
}

template <int kT, bool kMin>
void DotQ4x8T(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  constexpr int kCodes = kMin ? 32 : 16;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, w += Q4x8GroupBlock<kMin>()) {
    if constexpr (kT <= 2) {
      // one token or two: the group streams from DRAM; a prefetch per line
      // (144/160-byte blocks: three points 64 bytes apart leave no line out)
      const char* p = reinterpret_cast<const char*>(w) + kPrefetchLegacyBytes;
      _mm_prefetch(p, _MM_HINT_T0);
      _mm_prefetch(p + 64, _MM_HINT_T0);
      _mm_prefetch(p + 128, _MM_HINT_T0);
    }
    __m256i t[8];
    PS_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m256i v = Load256(w + kCodes + 32 * c);
      t[c] = _mm256_and_si256(v, m4);
      t[c + 4] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    }
    const __m256 d8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w)));
    __m256 m8 = _mm256_setzero_ps();
    if constexpr (kMin)
      m8 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16)));
    PS_UNROLL
    for (int j = 0; j < kT; ++j) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + j * xb)[i];
      const uint8_t* xq = reinterpret_cast<const uint8_t*>(a.qs);
#if PS_LINEAR_VNNI
      __m256i s = _mm256_set1_epi32(kMin ? 0 : -8 * a.sum);
      PS_UNROLL
      for (int c = 0; c < 8; ++c)
        s = _mm256_dpbusd_epi32(s, t[c], _mm256_set1_epi32(static_cast<int>(LoadU32(xq + 4 * c))));
#else
      __m256i s16 = _mm256_maddubs_epi16(t[0], _mm256_set1_epi32(static_cast<int>(LoadU32(xq))));
      PS_UNROLL
      for (int c = 1; c < 8; ++c)
        s16 = _mm256_add_epi16(
            s16,
            _mm256_maddubs_epi16(t[c], _mm256_set1_epi32(static_cast<int>(LoadU32(xq + 4 * c)))));
      __m256i s = _mm256_madd_epi16(s16, _mm256_set1_epi16(1));
      if constexpr (!kMin) s = _mm256_sub_epi32(s, _mm256_set1_epi32(8 * a.sum));
#endif
      acc[j] =
          _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d8, _mm256_set1_ps(a.d)), acc[j]);
      if constexpr (kMin)
        acc[j] = _mm256_fmadd_ps(m8, _mm256_set1_ps(a.d * static_cast<float>(a.sum)), acc[j]);
    }
  }
  PS_UNROLL
  for (int j = 0; j < kT; ++j) _mm256_storeu_ps(out + 8 * j, acc[j]);
}

// IsaKernels::i8q4_0 (kMin false) and i8q4_1: ntok (1..kRow8Tokens) tokens.
template <bool kMin>
void DotQ4x8(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, int ntok, float* out) {
  switch (ntok) {
    case 1: DotQ4x8T<1, kMin>(w, x, xb, nb, out); return;
    case 2: DotQ4x8T<2, kMin>(w, x, xb, nb, out); return;
    case 3: DotQ4x8T<3, kMin>(w, x, xb, nb, out); return;
    case 4: DotQ4x8T<4, kMin>(w, x, xb, nb, out); return;
    case 5: DotQ4x8T<5, kMin>(w, x, xb, nb, out); return;
    case 6: DotQ4x8T<6, kMin>(w, x, xb, nb, out); return;
    case 7: DotQ4x8T<7, kMin>(w, x, xb, nb, out); return;
    default: DotQ4x8T<8, kMin>(w, x, xb, nb, out); return;
  }
}

}  // namespace

#endif  // PAGEDSERVE_KERNELS_CPU_LINEAR_X86_INL_H_
