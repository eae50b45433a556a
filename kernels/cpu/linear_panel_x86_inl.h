// kPanel16, the many-token GEMM of the K-quants (Q4_K, Q5_K, Q6_K) on the x86
// paths of the CPU Linear (layout and contract: PanelBlock and IsaKernels::PanelFn
// in kernels/cpu/linear_cpu.h). Included by linear_avx2.cc (PS_LINEAR_VNNI 0)
// and linear_avx512.cc (PS_LINEAR_VNNI 1) after linear_x86_inl.h, under their
// `#pragma GCC target`; everything here has internal linkage.
//
// Repack: each weight row's super-block is unpacked to one unsigned byte per
// code with 256-bit vector ops (the bit layouts of quant_blocks.h), and its
// 4-byte groups are written to their row's lane of the panel; the 6-bit (or
// int8) scales and mins go to int16 pairs. Kernel: per super-block and token,
// the integer sums of each scale group are formed for the 16 rows at once
// (rows in the lanes), multiplied by the group's scales and summed exactly in
// int32; the mins / -32 offsets are one int16 pair multiply-add per 32
// elements with the token's activation sums; one int32 -> fp32 conversion and
// FMA per super-block and token.
//  - AVX-512 (AVX512-VNNI): 16 rows in one zmm; vpdpbusd of the 16 rows' 4
//    codes with a broadcast of the token's 4 codes (one instruction per 64
//    multiply-adds), the group's int32 sums times the scales by vpmulld, the
//    mins by vpdpwssd; kPanelTokensZ tokens per pass over the panel.
//  - AVX2: 8 rows per ymm (the panel's two halves one after the other);
//    pmaddubsw into int16 over as many 4-code chunks as cannot overflow
//    (2 * 127 * code max per chunk: Q4_K 8 chunks, Q5_K 4, Q6_K 2), then
//    pmaddwd with the scale pair; kPanelTokensY tokens per pass.
#ifndef PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_
#define PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_

#if !defined(PS_LINEAR_VNNI)
#error "define PS_LINEAR_VNNI before including linear_panel_x86_inl.h"
#endif

namespace {

using pagedserve::kernels::cpu::kPanelRows;
using pagedserve::kernels::cpu::PanelBlock;
using pagedserve::kernels::cpu::ScaleMinK4;

// The formats of kPanel16.
enum class PanelFmt { kQ4K, kQ5K, kQ6K };

constexpr int PanelBlockBytes(PanelFmt f) {
  return f == PanelFmt::kQ4K ? 144 : f == PanelFmt::kQ5K ? 176 : 210;
}
// Elements per scale group: the kernels multiply by the scale once per group.
constexpr int PanelGroup(PanelFmt f) { return f == PanelFmt::kQ6K ? 16 : 32; }

inline uint32_t Pair16(int lo, int hi) {
  return static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
         (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16);
}

// The 256 codes of one super-block in element order, one byte each.
template <PanelFmt kF>
inline void UnpackCodes(const uint8_t* b, uint8_t* codes) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  if constexpr (kF == PanelFmt::kQ6K) {
    const __m256i m2 = _mm256_set1_epi8(0x03);
    for (int h = 0; h < 2; ++h) {
      const __m256i qh = Load256(b + 128 + 32 * h);
      for (int k = 0; k < 4; ++k) {
        const __m256i ql = Load256(b + 64 * h + 32 * (k & 1));
        const __m256i low =
            k < 2 ? _mm256_and_si256(ql, m4) : _mm256_and_si256(_mm256_srli_epi16(ql, 4), m4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), m2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 128 * h + 32 * k),
                            _mm256_or_si256(low, _mm256_slli_epi16(high, 4)));
      }
    }
  } else {
    constexpr int kQs = kF == PanelFmt::kQ5K ? 48 : 16;
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i hb = kF == PanelFmt::kQ5K ? Load256(b + 16) : _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256i v = Load256(b + kQs + 32 * k);
      __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
      if constexpr (kF == PanelFmt::kQ5K) {
        // bit j of qh[l] is bit 4 of element l of sub-block j
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * k + 1), one), 4));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * k), lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(codes + 64 * k + 32), hi);
    }
  }
}

// Row i of the panel, super-block at b, into pb (PanelBlock's field contract).
template <PanelFmt kF>
inline void RepackRow(const uint8_t* b, int i, PanelBlock* pb) {
  alignas(32) uint8_t codes[256];
  UnpackCodes<kF>(b, codes);
  for (int c = 0; c < 64; ++c) std::memcpy(pb->codes[c][i], codes + 4 * c, 4);
  if constexpr (kF == PanelFmt::kQ6K) {
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int g = 0; g < 16; ++g) pb->scales[g][i] = Pair16(sc[g], sc[g]);
    for (int k = 0; k < 8; ++k) pb->mins[k][i] = Pair16(32 * sc[2 * k], 32 * sc[2 * k + 1]);
    pb->d[i] = pb->dmin[i] = F16(b + 208);
  } else {
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      ScaleMinK4(j, b + 4, &sc, &mn);
      pb->scales[2 * j][i] = pb->scales[2 * j + 1][i] = Pair16(sc, sc);
      pb->mins[j][i] = Pair16(mn, mn);
    }
    pb->d[i] = F16(b);
    pb->dmin[i] = F16(b + 2);
  }
}

// Rows [0, nrows) of the weight (row i at w + i * wb), nb super-blocks, into
// pb[0, nb); rows nrows..kPanelRows-1 are zero.
template <PanelFmt kF>
void RepackPanel(const uint8_t* w, size_t wb, int nrows, int64_t nb, PanelBlock* pb) {
  if (nrows < kPanelRows) std::memset(static_cast<void*>(pb), 0, sizeof(PanelBlock) * nb);
  for (int i = 0; i < nrows; ++i) {
    const uint8_t* row = w + i * wb;
    for (int64_t b = 0; b < nb; ++b) RepackRow<kF>(row + b * PanelBlockBytes(kF), i, pb + b);
  }
}

// out[16 * j + i] (token j, row i) -> y[j * ys + i] (+ bias[i]) for i < nrows.
inline void StorePanelOut(const float* out, int ntok, int nrows, float* y, int64_t ys,
                          const float* bias) {
  for (int j = 0; j < ntok; ++j)
    for (int i = 0; i < nrows; ++i) y[j * ys + i] = out[16 * j + i] + (bias ? bias[i] : 0.0f);
}

#if PS_LINEAR_VNNI

// Tokens per pass over the panel: 3 zmm accumulators per token (group sums,
// super-block sums, fp32 results) of AVX-512's 32 vector registers.
constexpr int kPanelTokensZ = 8;

template <PanelFmt kF, int kT>
void PanelTileZ(const PanelBlock* pb, int64_t nb, const uint8_t* x, size_t xb, float* out) {
  constexpr int kGroup = PanelGroup(kF), kChunks = kGroup / 4;
  __m512 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& p = pb[b];
    const ActBlock256* a[kT];
    PS_UNROLL
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const ActBlock256*>(x + t * xb) + b;
    __m512i s[kT];
    PS_UNROLL
    for (auto& v : s) v = _mm512_setzero_si512();
    for (int g = 0; g < 256 / kGroup; ++g) {
      __m512i sum[kT];
      PS_UNROLL
      for (auto& v : sum) v = _mm512_setzero_si512();
      PS_UNROLL
      for (int c = g * kChunks; c < (g + 1) * kChunks; ++c) {
        const __m512i wv = _mm512_load_si512(p.codes[c]);
        PS_UNROLL
        for (int t = 0; t < kT; ++t)
          sum[t] = _mm512_dpbusd_epi32(sum[t], wv,
                                       _mm512_set1_epi32(static_cast<int>(LoadU32(
                                           reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c))));
      }
      // (s, s) int16 pairs -> s as int32 (arithmetic shift)
      const __m512i sc = _mm512_srai_epi32(_mm512_load_si512(p.scales[g * kGroup / 16]), 16);
      PS_UNROLL
      for (int t = 0; t < kT; ++t) s[t] = _mm512_add_epi32(s[t], _mm512_mullo_epi32(sum[t], sc));
    }
    const __m512 d = _mm512_load_ps(p.d), dmin = _mm512_load_ps(p.dmin);
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      __m512i m = _mm512_setzero_si512();
      PS_UNROLL
      for (int k = 0; k < 8; ++k)
        m = _mm512_dpwssd_epi32(m, _mm512_load_si512(p.mins[k]),
                                _mm512_set1_epi32(static_cast<int>(LoadU32(
                                    reinterpret_cast<const uint8_t*>(a[t]->bsums + 2 * k)))));
      const __m512 v =
          _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(s[t]), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m)));
      acc[t] = _mm512_fmadd_ps(v, _mm512_set1_ps(a[t]->d), acc[t]);
    }
  }
  PS_UNROLL
  for (int t = 0; t < kT; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

template <PanelFmt kF>
void PanelRunZ(const PanelBlock* pb, int64_t nb, const uint8_t* x, size_t xb, int n, float* out) {
  switch (n) {
    case 1: PanelTileZ<kF, 1>(pb, nb, x, xb, out); return;
    case 2: PanelTileZ<kF, 2>(pb, nb, x, xb, out); return;
    case 3: PanelTileZ<kF, 3>(pb, nb, x, xb, out); return;
    case 4: PanelTileZ<kF, 4>(pb, nb, x, xb, out); return;
    case 5: PanelTileZ<kF, 5>(pb, nb, x, xb, out); return;
    case 6: PanelTileZ<kF, 6>(pb, nb, x, xb, out); return;
    case 7: PanelTileZ<kF, 7>(pb, nb, x, xb, out); return;
    default: PanelTileZ<kF, 8>(pb, nb, x, xb, out); return;
  }
}

template <PanelFmt kF>
void PanelGemm(const uint8_t* w, size_t wb, int nrows, int64_t nb, const uint8_t* x, size_t xb,
               int64_t ntok, PanelBlock* pb, float* y, int64_t ys, const float* bias) {
  RepackPanel<kF>(w, wb, nrows, nb, pb);
  alignas(64) float out[16 * kPanelTokensZ];
  for (int64_t t = 0; t < ntok; t += kPanelTokensZ) {
    const int n = static_cast<int>(std::min<int64_t>(kPanelTokensZ, ntok - t));
    PanelRunZ<kF>(pb, nb, x + t * xb, xb, n, out);
    StorePanelOut(out, n, nrows, y + t * ys, ys, bias);
  }
}

#else  // AVX2

// Tokens per pass over a half panel (8 rows): 3 ymm per token of AVX2's 16.
constexpr int kPanelTokensY = 4;

// 4-code chunks summed in int16 before pmaddwd: each pmaddubsw lane is at most
// 2 * 127 * (largest code), and the sum must stay below 2^15.
constexpr int PanelChunksInt16(PanelFmt f) {
  return f == PanelFmt::kQ4K ? 8 : f == PanelFmt::kQ5K ? 4 : 2;
}

// Rows 8h..8h+7 of the panel times kT tokens: out[16 * t + 8h + i].
template <PanelFmt kF, int kT>
void PanelHalfY(const PanelBlock* pb, int64_t nb, int h, const uint8_t* x, size_t xb,
                float* out) {
  constexpr int kGroup = PanelGroup(kF), kChunks = kGroup / 4, kRun = PanelChunksInt16(kF);
  __m256 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock& p = pb[b];
    const ActBlock256* a[kT];
    PS_UNROLL
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const ActBlock256*>(x + t * xb) + b;
    __m256i s[kT];
    PS_UNROLL
    for (auto& v : s) v = _mm256_setzero_si256();
    for (int g = 0; g < 256 / kGroup; ++g) {
      const __m256i sc = Load256(&p.scales[g * kGroup / 16][8 * h]);
      PS_UNROLL
      for (int c0 = g * kChunks; c0 < (g + 1) * kChunks; c0 += kRun) {
        __m256i sum16[kT];
        PS_UNROLL
        for (int c = c0; c < c0 + kRun; ++c) {
          const __m256i wv = Load256(p.codes[c][8 * h]);
          PS_UNROLL
          for (int t = 0; t < kT; ++t) {
            const __m256i xv = _mm256_set1_epi32(static_cast<int>(
                LoadU32(reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c)));
            const __m256i prod = _mm256_maddubs_epi16(wv, xv);
            sum16[t] = c == c0 ? prod : _mm256_add_epi16(sum16[t], prod);
          }
        }
        PS_UNROLL
        for (int t = 0; t < kT; ++t) s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(sum16[t], sc));
      }
    }
    const __m256 d = _mm256_loadu_ps(p.d + 8 * h), dmin = _mm256_loadu_ps(p.dmin + 8 * h);
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      __m256i m = _mm256_setzero_si256();
      PS_UNROLL
      for (int k = 0; k < 8; ++k)
        m = _mm256_add_epi32(
            m, _mm256_madd_epi16(Load256(&p.mins[k][8 * h]),
                                 _mm256_set1_epi32(static_cast<int>(LoadU32(
                                     reinterpret_cast<const uint8_t*>(a[t]->bsums + 2 * k))))));
      const __m256 v =
          _mm256_fmsub_ps(d, _mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(m)));
      acc[t] = _mm256_fmadd_ps(v, _mm256_set1_ps(a[t]->d), acc[t]);
    }
  }
  PS_UNROLL
  for (int t = 0; t < kT; ++t) _mm256_storeu_ps(out + 16 * t + 8 * h, acc[t]);
}

template <PanelFmt kF>
void PanelRunY(const PanelBlock* pb, int64_t nb, int h, const uint8_t* x, size_t xb, int n,
               float* out) {
  switch (n) {
    case 1: PanelHalfY<kF, 1>(pb, nb, h, x, xb, out); return;
    case 2: PanelHalfY<kF, 2>(pb, nb, h, x, xb, out); return;
    case 3: PanelHalfY<kF, 3>(pb, nb, h, x, xb, out); return;
    default: PanelHalfY<kF, 4>(pb, nb, h, x, xb, out); return;
  }
}

template <PanelFmt kF>
void PanelGemm(const uint8_t* w, size_t wb, int nrows, int64_t nb, const uint8_t* x, size_t xb,
               int64_t ntok, PanelBlock* pb, float* y, int64_t ys, const float* bias) {
  RepackPanel<kF>(w, wb, nrows, nb, pb);
  alignas(32) float out[16 * kPanelTokensY];
  for (int64_t t = 0; t < ntok; t += kPanelTokensY) {
    const int n = static_cast<int>(std::min<int64_t>(kPanelTokensY, ntok - t));
    PanelRunY<kF>(pb, nb, 0, x + t * xb, xb, n, out);
    if (nrows > 8) PanelRunY<kF>(pb, nb, 1, x + t * xb, xb, n, out);
    StorePanelOut(out, n, nrows, y + t * ys, ys, bias);
  }
}

#endif  // PS_LINEAR_VNNI

// The PanelFn of Q4_K, Q5_K, Q6_K (argument order of IsaKernels).
#define PS_X86_PANELS \
  PanelGemm<PanelFmt::kQ4K>, PanelGemm<PanelFmt::kQ5K>, PanelGemm<PanelFmt::kQ6K>

}  // namespace

#endif  // PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_
