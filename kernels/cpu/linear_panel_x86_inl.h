// kPanel16, the many-token GEMM of the K-quants (Q2_K .. Q6_K) on the x86
// paths of the CPU Linear (layout and contract: PanelBlock and IsaKernels::PanelFn
// in kernels/cpu/linear_cpu.h). Included by linear_avx2.cc (PS_LINEAR_VNNI 0)
// and linear_avx512.cc (PS_LINEAR_VNNI 1) after linear_x86_inl.h, under their
// `#pragma GCC target`; everything here has internal linkage.
//
// Repack: the code bytes of 8 rows' super-blocks are transposed 4 bytes at a
// time (8 x 8 dword transposes, so that each lane holds one row) and unpacked
// to one unsigned byte per code in the transposed domain (the bit layouts of
// quant_blocks.h); the 6-bit (or int8) scales and mins go to int16 pairs per
// row and are transposed the same way. Kernel: per super-block and token,
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
//    (2 * 127 * code max per chunk: Q4_K 8 chunks, Q5_K 4, Q6_K 2, Q2_K/Q3_K
//    4, a whole 16-element group), then
//    pmaddwd with the scale pair; kPanelTokensY tokens per pass.
#ifndef PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_
#define PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_

#if !defined(PS_LINEAR_VNNI)
#error "define PS_LINEAR_VNNI before including linear_panel_x86_inl.h"
#endif

// F16, Load256, LoadU32, PS_UNROLL and ActBlock256 (include-guarded).
#include "kernels/cpu/linear_x86_inl.h"

namespace {

using pagedserve::kernels::cpu::kPanelRows;
using pagedserve::kernels::cpu::PanelBlock;
using pagedserve::kernels::cpu::ScaleMinK4;

// The formats of kPanel16.
enum class PanelFmt { kQ2K, kQ3K, kQ4K, kQ5K, kQ6K };

constexpr int PanelBlockBytes(PanelFmt f) {
  return f == PanelFmt::kQ2K   ? 84
         : f == PanelFmt::kQ3K ? 110
         : f == PanelFmt::kQ4K ? 144
         : f == PanelFmt::kQ5K ? 176
                               : 210;
}
// Elements per scale group: the kernels multiply by the scale once per group.
constexpr int PanelGroup(PanelFmt f) {
  return f == PanelFmt::kQ4K || f == PanelFmt::kQ5K ? 32 : 16;
}

inline uint32_t Pair16(int lo, int hi) {
  return static_cast<uint32_t>(static_cast<uint16_t>(lo)) |
         (static_cast<uint32_t>(static_cast<uint16_t>(hi)) << 16);
}

// The rows' scales before the transposition into the panel: scale pairs per
// 16 elements and min pairs per 32 (PanelBlock's contract).
struct PanelRowTmp {
  alignas(32) uint32_t scales[kPanelRows][16];
  alignas(32) uint32_t mins[kPanelRows][8];
};

// The scales and mins of super-block b of row i into tmp, d and dmin into pb.
template <PanelFmt kF>
inline void UnpackRowScales(const uint8_t* b, int i, PanelRowTmp* tmp, PanelBlock* pb) {
  if constexpr (PanelGroup(kF) == 16) {
    __m128i lo, hi, mlo, mhi;
    if constexpr (kF == PanelFmt::kQ2K) {
      // low nibbles: the scales; high nibbles: the mins (as they lie)
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b));
      const __m128i m4 = _mm_set1_epi8(0x0f);
      const __m128i sc = _mm_and_si128(raw, m4), mn = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
      lo = _mm_cvtepu8_epi16(sc);
      hi = _mm_cvtepu8_epi16(_mm_srli_si128(sc, 8));
      mlo = _mm_cvtepu8_epi16(mn);
      mhi = _mm_cvtepu8_epi16(_mm_srli_si128(mn, 8));
      pb->d[i] = F16(b + 80);
      pb->dmin[i] = F16(b + 82);
    } else {
      alignas(16) int8_t q3[16];
      if constexpr (kF == PanelFmt::kQ3K) pagedserve::kernels::cpu::ScalesQ3K(b + 96, q3);
      const __m128i sc = kF == PanelFmt::kQ3K
                             ? _mm_load_si128(reinterpret_cast<const __m128i*>(q3))
                             : _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192));
      lo = _mm_cvtepi8_epi16(sc);
      hi = _mm_cvtepi8_epi16(_mm_srli_si128(sc, 8));
      // (32 s_2k, 32 s_2k+1) / (4 s_2k, 4 s_2k+1): the int16 scales as they lie, times
      // the offset
      constexpr int kShift = kF == PanelFmt::kQ3K ? 2 : 5;
      mlo = _mm_slli_epi16(lo, kShift);
      mhi = _mm_slli_epi16(hi, kShift);
      pb->d[i] = pb->dmin[i] = F16(b + (kF == PanelFmt::kQ3K ? 108 : 208));
    }
    auto* out = reinterpret_cast<__m128i*>(tmp->scales[i]);
    _mm_store_si128(out + 0, _mm_unpacklo_epi16(lo, lo));  // (s, s) for groups 0..3
    _mm_store_si128(out + 1, _mm_unpackhi_epi16(lo, lo));
    _mm_store_si128(out + 2, _mm_unpacklo_epi16(hi, hi));
    _mm_store_si128(out + 3, _mm_unpackhi_epi16(hi, hi));
    auto* mins = reinterpret_cast<__m128i*>(tmp->mins[i]);
    _mm_store_si128(mins + 0, mlo);
    _mm_store_si128(mins + 1, mhi);
  } else {
    // the eight 6-bit scales and mins (ScaleMinK4) as scale bytes 0..7, then
    // min bytes 0..7, as in TileQ45K
    const __m128i bytes = ScaleMinBytesK4(b + 4);
    const __m128i sc = _mm_cvtepu8_epi16(bytes), mn = _mm_cvtepu8_epi16(_mm_srli_si128(bytes, 8));
    const __m128i p0 = _mm_unpacklo_epi16(sc, sc), p1 = _mm_unpackhi_epi16(sc, sc);
    auto* out = reinterpret_cast<__m128i*>(tmp->scales[i]);  // sub-block j -> groups 2j, 2j+1
    _mm_store_si128(out + 0, _mm_unpacklo_epi32(p0, p0));
    _mm_store_si128(out + 1, _mm_unpackhi_epi32(p0, p0));
    _mm_store_si128(out + 2, _mm_unpacklo_epi32(p1, p1));
    _mm_store_si128(out + 3, _mm_unpackhi_epi32(p1, p1));
    auto* mins = reinterpret_cast<__m128i*>(tmp->mins[i]);
    _mm_store_si128(mins + 0, _mm_unpacklo_epi16(mn, mn));
    _mm_store_si128(mins + 1, _mm_unpackhi_epi16(mn, mn));
    pb->d[i] = F16(b);
    pb->dmin[i] = F16(b + 2);
  }
}

// The 8 x 8 dwords of rows r[0..8) at byte offset off, transposed: t[q] holds
// dword q (bytes off + 4q .. off + 4q + 4) of the 8 rows in its 8 lanes.
inline void Transpose8x8(const uint8_t* const (&r)[8], size_t off, __m256i (&t)[8]) {
  __m256 a[8], c[8];
  PS_UNROLL
  for (int i = 0; i < 8; ++i) a[i] = _mm256_castsi256_ps(Load256(r[i] + off));
  PS_UNROLL
  for (int i = 0; i < 8; i += 2) {
    c[i] = _mm256_unpacklo_ps(a[i], a[i + 1]);
    c[i + 1] = _mm256_unpackhi_ps(a[i], a[i + 1]);
  }
  PS_UNROLL
  for (int i = 0; i < 8; i += 4) {
    a[i] = _mm256_shuffle_ps(c[i], c[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
    a[i + 1] = _mm256_shuffle_ps(c[i], c[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
    a[i + 2] = _mm256_shuffle_ps(c[i + 1], c[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
    a[i + 3] = _mm256_shuffle_ps(c[i + 1], c[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
  }
  PS_UNROLL
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm256_castps_si256(_mm256_permute2f128_ps(a[i], a[i + 4], 0x20));
    t[i + 4] = _mm256_castps_si256(_mm256_permute2f128_ps(a[i], a[i + 4], 0x31));
  }
}

// Dwords [0, n) of 8 rows of `dwords`-dword arrays at src, transposed into dst
// (dst row q at dst + q * 64 bytes, 8 lanes = 32 bytes).
inline void TransposeDwords(const uint32_t* src, int dwords, int n, uint32_t* dst) {
  const uint8_t* r[8];
  PS_UNROLL
  for (int i = 0; i < 8; ++i) r[i] = reinterpret_cast<const uint8_t*>(src + i * dwords);
  PS_UNROLL
  for (int q0 = 0; q0 < n; q0 += 8) {
    __m256i t[8];
    Transpose8x8(r, 4 * q0, t);
    PS_UNROLL
    for (int q = 0; q < 8; ++q)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (q0 + q) * kPanelRows), t[q]);
  }
}

inline void StoreCodes(PanelBlock* p, int c, int rb, __m256i v) {
  _mm256_store_si256(reinterpret_cast<__m256i*>(p->codes[c][8 * rb]), v);
}

// The codes of 8 rows' super-blocks (r[i]: row 8 rb + i) into p, one byte
// each: the raw code bytes are transposed 4 bytes at a time (so that each lane
// holds one row) and unpacked in the transposed domain.
template <PanelFmt kF>
inline void RepackCodes8(const uint8_t* const (&r)[8], int rb, PanelBlock* p) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  __m256i t[8];
  if constexpr (kF == PanelFmt::kQ6K) {
    // element 128h + 32k + l: low 4 bits in ql[64h + 32(k & 1) + l] (high
    // nibble for k >= 2), high 2 bits in bits 2k of qh[32h + l]
    const __m256i m2 = _mm256_set1_epi8(0x03);
    PS_UNROLL
    for (int h = 0; h < 2; ++h) {
      __m256i th[8];
      Transpose8x8(r, 128 + 32 * h, th);
      PS_UNROLL
      for (int kk = 0; kk < 2; ++kk) {
        Transpose8x8(r, 64 * h + 32 * kk, t);
        PS_UNROLL
        for (int q = 0; q < 8; ++q) {
          PS_UNROLL
          for (int k = kk; k < 4; k += 2) {
            const __m256i low = k < 2 ? _mm256_and_si256(t[q], m4)
                                      : _mm256_and_si256(_mm256_srli_epi16(t[q], 4), m4);
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(th[q], 2 * k), m2);
            StoreCodes(p, 32 * h + 8 * k + q, rb, _mm256_or_si256(low, _mm256_slli_epi16(high, 4)));
          }
        }
      }
    }
  } else if constexpr (kF == PanelFmt::kQ2K || kF == PanelFmt::kQ3K) {
    // element 128h + 32k + l: bits 2k of qs[32h + l] (Q3_K: | bit 4h + k of
    // hmask[l] << 2)
    constexpr int kQs = kF == PanelFmt::kQ3K ? 32 : 16;
    const __m256i m2 = _mm256_set1_epi8(0x03), one = _mm256_set1_epi8(1);
    __m256i thm[8];
    if constexpr (kF == PanelFmt::kQ3K) Transpose8x8(r, 0, thm);
    PS_UNROLL
    for (int h = 0; h < 2; ++h) {
      Transpose8x8(r, kQs + 32 * h, t);
      PS_UNROLL
      for (int q = 0; q < 8; ++q) {
        PS_UNROLL
        for (int k = 0; k < 4; ++k) {
          __m256i v = _mm256_and_si256(_mm256_srli_epi16(t[q], 2 * k), m2);
          if constexpr (kF == PanelFmt::kQ3K) {
            v = _mm256_or_si256(
                v,
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(thm[q], 4 * h + k), one), 2));
          }
          StoreCodes(p, 32 * h + 8 * k + q, rb, v);
        }
      }
    }
  } else {
    // sub-block 2k: low nibbles of qs[32k..32k+32), 2k+1: high nibbles; Q5_K:
    // bit j of qh[l] is bit 4 of element l of sub-block j
    constexpr int kQs = kF == PanelFmt::kQ5K ? 48 : 16;
    const __m256i one = _mm256_set1_epi8(1);
    __m256i th[8];
    if constexpr (kF == PanelFmt::kQ5K) Transpose8x8(r, 16, th);
    PS_UNROLL
    for (int k = 0; k < 4; ++k) {
      Transpose8x8(r, kQs + 32 * k, t);
      PS_UNROLL
      for (int q = 0; q < 8; ++q) {
        __m256i lo = _mm256_and_si256(t[q], m4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(t[q], 4), m4);
        if constexpr (kF == PanelFmt::kQ5K) {
          lo = _mm256_or_si256(
              lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(th[q], 2 * k), one), 4));
          hi = _mm256_or_si256(
              hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(th[q], 2 * k + 1), one), 4));
        }
        StoreCodes(p, 16 * k + q, rb, lo);
        StoreCodes(p, 16 * k + 8 + q, rb, hi);
      }
    }
  }
}

// Rows [0, nrows) of the weight (row i at w + i * wb), nb super-blocks, into
// pb[0, nb); rows nrows..kPanelRows-1 are zero.
// Distance of the software prefetch of the repack (about 3-5 super-blocks).
constexpr int kPrefetchPanelBytes = 640;

template <PanelFmt kF>
void RepackPanel(const uint8_t* w, size_t wb, int nrows, int64_t nb, PanelBlock* pb) {
  alignas(32) static const uint8_t kZeroBlock[PanelBlockBytes(kF)] = {};
  PanelRowTmp tmp;
  if (nrows < kPanelRows) std::memset(static_cast<void*>(&tmp), 0, sizeof(tmp));
  for (int64_t b = 0; b < nb; ++b) {
    PanelBlock* p = pb + b;
    for (int i = nrows; i < kPanelRows; ++i) p->d[i] = p->dmin[i] = 0.0f;
    for (int rb = 0; rb < 2; ++rb) {
      const uint8_t* r[8];
      for (int i = 0; i < 8; ++i) {
        const int row = 8 * rb + i;
        r[i] = row < nrows ? w + row * wb + b * PanelBlockBytes(kF) : kZeroBlock;
        if (row >= nrows) continue;
        // 16 rows are read side by side, too many short streams for the
        // hardware prefetcher: fetch each row kPrefetchPanelBytes ahead
        for (int l = 0; l < PanelBlockBytes(kF); l += 64)
          _mm_prefetch(reinterpret_cast<const char*>(r[i]) + kPrefetchPanelBytes + l, _MM_HINT_T0);
        UnpackRowScales<kF>(r[i], row, &tmp, p);
      }
      RepackCodes8<kF>(r, rb, p);
      TransposeDwords(tmp.scales[8 * rb], 16, 16, &p->scales[0][8 * rb]);
      TransposeDwords(tmp.mins[8 * rb], 8, 8, &p->mins[0][8 * rb]);
    }
  }
}

// out[16 * j + i] (token j, row i) -> y[j * ys + i] (+ bias[i]) for i < nrows.
inline void StorePanelOut(const float* out, int ntok, int nrows, float* y, int64_t ys,
                          const float* bias) {
  if (nrows == kPanelRows) {
    const __m256 b0 = bias ? _mm256_loadu_ps(bias) : _mm256_setzero_ps();
    const __m256 b1 = bias ? _mm256_loadu_ps(bias + 8) : _mm256_setzero_ps();
    for (int j = 0; j < ntok; ++j) {
      _mm256_storeu_ps(y + j * ys, _mm256_add_ps(_mm256_loadu_ps(out + 16 * j), b0));
      _mm256_storeu_ps(y + j * ys + 8, _mm256_add_ps(_mm256_loadu_ps(out + 16 * j + 8), b1));
    }
    return;
  }
  for (int j = 0; j < ntok; ++j)
    for (int i = 0; i < nrows; ++i) y[j * ys + i] = out[16 * j + i] + (bias ? bias[i] : 0.0f);
}

// ---- Q4_0, Q4_1 and Q8_0 panels (PanelBlock32, issues 34 and 33) ----
//
// Repack: per 32-element block, each 4-byte chunk of the 8 rows of a half
// panel is one masked dword gather (rows past the weight's end read nothing
// and stay zero, with d = m = 0); Q4_0's and Q4_1's nibbles are split in the
// transposed domain (low nibbles: elements 0..15, high: 16..31), Q8_0's bytes
// are used as they are (AVX2) or offset by 128 (AVX-512, vpdpbusd's unsigned
// operand).

using pagedserve::kernels::cpu::PanelBlock32;

enum class Panel32Fmt { kQ4_0, kQ4_1, kQ8_0 };
constexpr int Panel32BlockBytes(Panel32Fmt f) {
  return f == Panel32Fmt::kQ4_0 ? 18 : f == Panel32Fmt::kQ4_1 ? 20 : 34;
}
// Byte offset of the codes in a block (after d, and Q4_1's m).
constexpr int Panel32CodesOffset(Panel32Fmt f) { return f == Panel32Fmt::kQ4_1 ? 4 : 2; }

template <Panel32Fmt kF>
void RepackPanel32(const uint8_t* w, size_t wb, int nrows, int64_t nb, PanelBlock32* pb) {
  constexpr int kBytes = Panel32BlockBytes(kF), kCodes = Panel32CodesOffset(kF);
  const __m256i m4 = _mm256_set1_epi8(0x0f), lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  // The gather's int32 offsets reach 7 rows down (wb * 7 + 34 bytes).
  const bool gather_ok = wb <= static_cast<size_t>(INT32_MAX / 8);
  const int s = gather_ok ? static_cast<int>(wb) : 0;
  const __m256i vindex = _mm256_setr_epi32(0, s, 2 * s, 3 * s, 4 * s, 5 * s, 6 * s, 7 * s);
  // The 8 rows of a half panel are one contiguous run of 8 * wb bytes: while
  // repacking one, prefetch the next (the other half, then the next panel's
  // first half, which the caller repacks next) spread over the blocks, so the
  // gathers find the weights in cache (the panel streams them from DRAM once
  // per call, as the decode tiles do with kPrefetchLegacyBytes).
  const size_t half_bytes = 8 * wb;
  for (int rb = 0; rb < 2; ++rb) {
    const int valid = std::clamp(nrows - 8 * rb, 0, 8);
    const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), lanes);
    const uint8_t* base = w + static_cast<size_t>(8 * rb) * wb;
    const char* next = reinterpret_cast<const char*>(base + half_bytes);
    size_t prefetched = 0;
    for (int64_t b = 0; b < nb; ++b) {
      PanelBlock32& p = pb[b];
      const uint8_t* blk = base + b * kBytes;
      for (const size_t end = half_bytes * static_cast<size_t>(b + 1) / static_cast<size_t>(nb);
           prefetched < end; prefetched += 64)
        _mm_prefetch(next + prefetched, _MM_HINT_T0);
      auto gather = [&](int off) {
        if (valid == 0) return _mm256_setzero_si256();
        if (!gather_ok) {  // row offsets past int32: one load per row
          alignas(32) uint32_t d[8] = {};
          for (int i = 0; i < valid; ++i) d[i] = LoadU32(blk + i * wb + off);
          return _mm256_load_si256(reinterpret_cast<const __m256i*>(d));
        }
        return _mm256_mask_i32gather_epi32(
            _mm256_setzero_si256(), reinterpret_cast<const int*>(blk + off), vindex, mask, 1);
      };
      auto store = [&](int c, __m256i v) {
        _mm256_store_si256(reinterpret_cast<__m256i*>(p.codes[c][8 * rb]), v);
      };
      // d (and Q4_1's m) of the 8 rows: the dword at the block's start holds d
      // in its low half and m (or two codes) in its high half; masked rows
      // gather 0, i.e. d = m = 0.
      const __m256i dm = gather(0);
      const __m256i lo_halves =
          _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8,
                           9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
      auto halves = [](__m256i v) {  // the low qword of each lane -> 8 packed halves
        return _mm256_castsi256_si128(_mm256_permute4x64_epi64(v, 0x08));
      };
      _mm256_storeu_ps(p.d + 8 * rb, _mm256_cvtph_ps(halves(_mm256_shuffle_epi8(dm, lo_halves))));
      if constexpr (kF == Panel32Fmt::kQ4_1)
        _mm256_storeu_ps(
            p.m + 8 * rb,
            _mm256_cvtph_ps(halves(_mm256_shuffle_epi8(_mm256_srli_epi32(dm, 16), lo_halves))));
      if constexpr (kF != Panel32Fmt::kQ8_0) {
        PS_UNROLL
        for (int q = 0; q < 4; ++q) {
          const __m256i t = gather(kCodes + 4 * q);
          store(q, _mm256_and_si256(t, m4));
          store(4 + q, _mm256_and_si256(_mm256_srli_epi16(t, 4), m4));
        }
      } else {
        PS_UNROLL
        for (int c = 0; c < 8; ++c) {
          const __m256i t = gather(kCodes + 4 * c);
          store(c, PS_LINEAR_VNNI ? _mm256_xor_si256(t, _mm256_set1_epi8(static_cast<char>(0x80)))
                                  : t);
        }
      }
    }
  }
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

// Q4_0 / Q4_1 / Q8_0 panels: 8 vpdpbusd per block and token (16 rows x 32
// codes), the offset (8 or 128) through the activation block sum, one int32 ->
// fp32 conversion and FMA per block and token (Q4_1: one more FMA, m times
// the activation block's sum).
template <Panel32Fmt kF, int kT>
void Panel32TileZ(const PanelBlock32* pb, int64_t nb, const uint8_t* x, size_t xb, float* out) {
  constexpr int kOff = kF == Panel32Fmt::kQ4_0 ? 8 : kF == Panel32Fmt::kQ4_1 ? 0 : 128;
  __m512 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock32& p = pb[b];
    const ActBlock32* a[kT];
    PS_UNROLL
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const ActBlock32*>(x + t * xb) + b;
    __m512i s[kT];
    PS_UNROLL
    for (auto& v : s) v = _mm512_setzero_si512();
    PS_UNROLL
    for (int c = 0; c < 8; ++c) {
      const __m512i wv = _mm512_load_si512(p.codes[c]);
      PS_UNROLL
      for (int t = 0; t < kT; ++t)
        s[t] = _mm512_dpbusd_epi32(s[t], wv,
                                   _mm512_set1_epi32(static_cast<int>(LoadU32(
                                       reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c))));
    }
    const __m512 d = _mm512_load_ps(p.d);
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      const __m512i st =
          kOff == 0 ? s[t] : _mm512_sub_epi32(s[t], _mm512_set1_epi32(kOff * a[t]->sum));
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(d, _mm512_set1_ps(a[t]->d)),
                               acc[t]);
      if constexpr (kF == Panel32Fmt::kQ4_1)
        acc[t] = _mm512_fmadd_ps(_mm512_load_ps(p.m),
                                 _mm512_set1_ps(a[t]->d * static_cast<float>(a[t]->sum)), acc[t]);
    }
  }
  PS_UNROLL
  for (int t = 0; t < kT; ++t) _mm512_storeu_ps(out + 16 * t, acc[t]);
}

template <Panel32Fmt kF>
void Panel32Gemm(const uint8_t* w, size_t wb, int nrows, int64_t nb, const uint8_t* x, size_t xb,
                 int64_t ntok, PanelBlock* scratch, float* y, int64_t ys, const float* bias) {
  auto* pb = reinterpret_cast<PanelBlock32*>(scratch);
  RepackPanel32<kF>(w, wb, nrows, nb, pb);
  alignas(64) float out[16 * kPanelTokensZ];
  for (int64_t t = 0; t < ntok; t += kPanelTokensZ) {
    const int n = static_cast<int>(std::min<int64_t>(kPanelTokensZ, ntok - t));
    switch (n) {
      case 1: Panel32TileZ<kF, 1>(pb, nb, x + t * xb, xb, out); break;
      case 2: Panel32TileZ<kF, 2>(pb, nb, x + t * xb, xb, out); break;
      case 3: Panel32TileZ<kF, 3>(pb, nb, x + t * xb, xb, out); break;
      case 4: Panel32TileZ<kF, 4>(pb, nb, x + t * xb, xb, out); break;
      case 5: Panel32TileZ<kF, 5>(pb, nb, x + t * xb, xb, out); break;
      case 6: Panel32TileZ<kF, 6>(pb, nb, x + t * xb, xb, out); break;
      case 7: Panel32TileZ<kF, 7>(pb, nb, x + t * xb, xb, out); break;
      default: Panel32TileZ<kF, 8>(pb, nb, x + t * xb, xb, out); break;
    }
    StorePanelOut(out, n, nrows, y + t * ys, ys, bias);
  }
}

// Q4_0x8 / Q4_1x8 (kernels/weight_format.h), two groups of 8 interleaved rows
// (16 rows) x kT tokens with the 16 rows in one zmm: chunk c of the two
// groups' blocks (two 256-bit loads, one per group) gives the 16 rows' 4 codes
// per lane, then as Panel32TileZ (8 vpdpbusd per block and token) with no
// repack: the layout is already the panel's. out[16 * t + i].
// 8 fp16 at lo and 8 at hi -> 16 fp32.
inline __m512 Halves16(const uint8_t* lo, const uint8_t* hi) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(lo))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(hi)), 1));
}

template <int kT, bool kMin>
void Q4x8TileZ(const uint8_t* w, size_t group_bytes, int64_t nb, const uint8_t* x, size_t xb,
               float* out) {
  constexpr int kCodes = kMin ? 32 : 16;
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm512_setzero_ps();
  const uint8_t* g0 = w;
  const uint8_t* g1 = w + group_bytes;
  for (int64_t b = 0; b < nb; ++b, g0 += Q4x8GroupBlock<kMin>(), g1 += Q4x8GroupBlock<kMin>()) {
    if constexpr (kT <= 4) {
      // few tokens: both groups stream from DRAM (as DotQ4x8T)
      PS_UNROLL
      for (int o = 0; o < 192; o += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(g0) + kPrefetchLegacyBytes + o, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(g1) + kPrefetchLegacyBytes + o, _MM_HINT_T0);
      }
    }
    __m512i t[8];
    PS_UNROLL
    for (int c = 0; c < 4; ++c) {
      const __m512i v = _mm512_inserti64x4(_mm512_castsi256_si512(Load256(g0 + kCodes + 32 * c)),
                                           Load256(g1 + kCodes + 32 * c), 1);
      t[c] = _mm512_and_si512(v, m4);
      t[c + 4] = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);
    }
    const __m512 d = Halves16(g0, g1);
    __m512 m = _mm512_setzero_ps();
    if constexpr (kMin) m = Halves16(g0 + 16, g1 + 16);
    PS_UNROLL
    for (int j = 0; j < kT; ++j) {
      const ActBlock32& a = reinterpret_cast<const ActBlock32*>(x + j * xb)[b];
      const uint8_t* xq = reinterpret_cast<const uint8_t*>(a.qs);
      __m512i st = _mm512_set1_epi32(kMin ? 0 : -8 * a.sum);
      PS_UNROLL
      for (int c = 0; c < 8; ++c)
        st =
            _mm512_dpbusd_epi32(st, t[c], _mm512_set1_epi32(static_cast<int>(LoadU32(xq + 4 * c))));
      acc[j] =
          _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(d, _mm512_set1_ps(a.d)), acc[j]);
      if constexpr (kMin)
        acc[j] = _mm512_fmadd_ps(m, _mm512_set1_ps(a.d * static_cast<float>(a.sum)), acc[j]);
    }
  }
  PS_UNROLL
  for (int j = 0; j < kT; ++j) _mm512_storeu_ps(out + 16 * j, acc[j]);
}

// IsaKernels::i16q4_0 (kMin false) and i16q4_1: a PanelFn over Q4_0x8 /
// Q4_1x8 (nrows 16, the scratch unused), 16 tokens per pass (16 zmm
// accumulators beside the 8 code vectors), then up to 8.
template <bool kMin>
void Q4x8Gemm(const uint8_t* w, size_t wb, int nrows, int64_t nb, const uint8_t* x, size_t xb,
              int64_t ntok, PanelBlock* /*scratch*/, float* y, int64_t ys, const float* bias) {
  alignas(64) float out[16 * 16];
  const size_t group_bytes = 8 * wb;
  for (int64_t t = 0; t < ntok;) {
    const uint8_t* xt = x + t * xb;
    if (ntok - t >= 16) {
      Q4x8TileZ<16, kMin>(w, group_bytes, nb, xt, xb, out);
      StorePanelOut(out, 16, nrows, y + t * ys, ys, bias);
      t += 16;
      continue;
    }
    const int n = static_cast<int>(std::min<int64_t>(kPanelTokensZ, ntok - t));
    switch (n) {
      case 1: Q4x8TileZ<1, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 2: Q4x8TileZ<2, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 3: Q4x8TileZ<3, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 4: Q4x8TileZ<4, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 5: Q4x8TileZ<5, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 6: Q4x8TileZ<6, kMin>(w, group_bytes, nb, xt, xb, out); break;
      case 7: Q4x8TileZ<7, kMin>(w, group_bytes, nb, xt, xb, out); break;
      default: Q4x8TileZ<8, kMin>(w, group_bytes, nb, xt, xb, out); break;
    }
    StorePanelOut(out, n, nrows, y + t * ys, ys, bias);
    t += n;
  }
}

#else  // AVX2

// Tokens per pass over a half panel (8 rows): 3 ymm per token of AVX2's 16.
constexpr int kPanelTokensY = 4;

// 4-code chunks summed in int16 before pmaddwd: each pmaddubsw lane is at most
// 2 * 127 * (largest code), and the sum must stay below 2^15.
constexpr int PanelChunksInt16(PanelFmt f) {
  // Q2_K/Q3_K: every 4 chunks of a 16-element group (2 * 127 * 7 * 4 < 2^15)
  return f == PanelFmt::kQ4K ? 8 : f == PanelFmt::kQ6K ? 2 : 4;
}

// Rows 8h..8h+7 of the panel times kT tokens: out[16 * t + 8h + i].
template <PanelFmt kF, int kT>
void PanelHalfY(const PanelBlock* pb, int64_t nb, int h, const uint8_t* x, size_t xb, float* out) {
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
            const __m256i xv = _mm256_set1_epi32(
                static_cast<int>(LoadU32(reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c)));
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

// Q4_0 / Q4_1 / Q8_0 panels, rows 8h..8h+7: Q4_0 and Q4_1 sum the 8 chunks'
// pmaddubsw in int16 (8 * 2 * 15 * 127 < 2^15) and widen once (Q4_1 adds m
// times the activation block's sum after scaling); Q8_0 takes |w| and x with
// w's sign (each lane <= 2 * 128 * 127) and widens every chunk.
template <Panel32Fmt kF, int kT>
void Panel32HalfY(const PanelBlock32* pb, int64_t nb, int h, const uint8_t* x, size_t xb,
                  float* out) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[kT];
  PS_UNROLL
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const PanelBlock32& p = pb[b];
    const ActBlock32* a[kT];
    PS_UNROLL
    for (int t = 0; t < kT; ++t) a[t] = reinterpret_cast<const ActBlock32*>(x + t * xb) + b;
    __m256i s[kT];
    if constexpr (kF != Panel32Fmt::kQ8_0) {
      __m256i s16[kT];
      PS_UNROLL
      for (int c = 0; c < 8; ++c) {
        const __m256i wv = Load256(p.codes[c][8 * h]);
        PS_UNROLL
        for (int t = 0; t < kT; ++t) {
          const __m256i prod = _mm256_maddubs_epi16(
              wv, _mm256_set1_epi32(static_cast<int>(
                      LoadU32(reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c))));
          s16[t] = c == 0 ? prod : _mm256_add_epi16(s16[t], prod);
        }
      }
      constexpr int kOff = kF == Panel32Fmt::kQ4_0 ? 8 : 0;
      PS_UNROLL
      for (int t = 0; t < kT; ++t)
        s[t] =
            _mm256_sub_epi32(_mm256_madd_epi16(s16[t], ones), _mm256_set1_epi32(kOff * a[t]->sum));
    } else {
      PS_UNROLL
      for (auto& v : s) v = _mm256_setzero_si256();
      PS_UNROLL
      for (int c = 0; c < 8; ++c) {
        const __m256i wv = Load256(p.codes[c][8 * h]);
        const __m256i aw = _mm256_sign_epi8(wv, wv);
        PS_UNROLL
        for (int t = 0; t < kT; ++t) {
          const __m256i xv = _mm256_set1_epi32(
              static_cast<int>(LoadU32(reinterpret_cast<const uint8_t*>(a[t]->qs) + 4 * c)));
          s[t] = _mm256_add_epi32(
              s[t], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(xv, wv)), ones));
        }
      }
    }
    const __m256 d = _mm256_loadu_ps(p.d + 8 * h);
    PS_UNROLL
    for (int t = 0; t < kT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), _mm256_mul_ps(d, _mm256_set1_ps(a[t]->d)),
                               acc[t]);
      if constexpr (kF == Panel32Fmt::kQ4_1)
        acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(p.m + 8 * h),
                                 _mm256_set1_ps(a[t]->d * static_cast<float>(a[t]->sum)), acc[t]);
    }
  }
  PS_UNROLL
  for (int t = 0; t < kT; ++t) _mm256_storeu_ps(out + 16 * t + 8 * h, acc[t]);
}

template <Panel32Fmt kF>
void Panel32Gemm(const uint8_t* w, size_t wb, int nrows, int64_t nb, const uint8_t* x, size_t xb,
                 int64_t ntok, PanelBlock* scratch, float* y, int64_t ys, const float* bias) {
  auto* pb = reinterpret_cast<PanelBlock32*>(scratch);
  RepackPanel32<kF>(w, wb, nrows, nb, pb);
  alignas(32) float out[16 * kPanelTokensY];
  for (int64_t t = 0; t < ntok; t += kPanelTokensY) {
    const int n = static_cast<int>(std::min<int64_t>(kPanelTokensY, ntok - t));
    for (int h = 0; h < (nrows > 8 ? 2 : 1); ++h) {
      switch (n) {
        case 1: Panel32HalfY<kF, 1>(pb, nb, h, x + t * xb, xb, out); break;
        case 2: Panel32HalfY<kF, 2>(pb, nb, h, x + t * xb, xb, out); break;
        case 3: Panel32HalfY<kF, 3>(pb, nb, h, x + t * xb, xb, out); break;
        default: Panel32HalfY<kF, 4>(pb, nb, h, x + t * xb, xb, out); break;
      }
    }
    StorePanelOut(out, n, nrows, y + t * ys, ys, bias);
  }
}

#endif  // PS_LINEAR_VNNI

// The PanelFn of Q4_K, Q5_K, Q6_K and of Q2_K, Q3_K (argument order of IsaKernels).
#define PS_X86_PANELS \
  PanelGemm<PanelFmt::kQ4K>, PanelGemm<PanelFmt::kQ5K>, PanelGemm<PanelFmt::kQ6K>
#define PS_X86_PANELS_Q23 PanelGemm<PanelFmt::kQ2K>, PanelGemm<PanelFmt::kQ3K>
#define PS_X86_PANELS_32 Panel32Gemm<Panel32Fmt::kQ4_0>, Panel32Gemm<Panel32Fmt::kQ8_0>
#define PS_X86_PANEL_Q4_1 Panel32Gemm<Panel32Fmt::kQ4_1>

}  // namespace

#endif  // PAGEDSERVE_KERNELS_CPU_LINEAR_PANEL_X86_INL_H_
