// AMX path of the CPU Linear (kernels/cpu/linear_cpu.h, "AMX"): weight panels
// dequantized to bf16 on the fly, activations in bf16, Intel AMX tiles
// (TDPBF16PS) with fp32 accumulation. Selected at run time (AmxBf16Usable); the
// ISA applies to the functions of this file only, as in linear_avx512.cc.
#include <strings.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kernels/cpu/linear_cpu.h"

#if defined(PAGEDSERVE_LINEAR_X86_PATHS)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace pagedserve::kernels::cpu {

namespace {

#if defined(PAGEDSERVE_LINEAR_X86_PATHS)

// Linux's arch_prctl request for a dynamically enabled XSAVE feature
// (arch/x86/include/uapi/asm/prctl.h) and AMX's tile data feature number.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool AmxHardware() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool amx_bf16 = (edx >> 22) & 1, amx_tile = (edx >> 24) & 1;
  const bool osxsave = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && ((c >> 27) & 1) != 0;
  }();
  if (!amx_bf16 || !amx_tile || !osxsave) return false;
  unsigned a1 = 0, b1 = 0, c1 = 0, d1 = 0;
  const bool avx512_bf16 = __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1) != 0 && ((a1 >> 5) & 1);
  if (!avx512_bf16) return false;
  // XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS manages the tile state.
  uint32_t xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if (((xcr0_lo >> 17) & 3) != 3) return false;
  // Linux (5.16+) hands the tile data state to a process only on request; the
  // permission covers every thread of the process, present and future.
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}
#endif

bool AmxEnabledByEnv() {
  const char* e = std::getenv("PAGEDSERVE_CPU_AMX");
  if (e == nullptr) return true;
  for (const char* off : {"0", "false", "off", "no"})
    if (strcasecmp(e, off) == 0) return false;
  return true;
}

}  // namespace

bool AmxBf16Supported() {
  static const bool has = [] {
#if defined(PAGEDSERVE_LINEAR_X86_PATHS)
    return AmxHardware();
#else
    return false;
#endif
  }();
  return has;
}

namespace {
std::atomic<bool>& AmxSwitch() {
  static std::atomic<bool> on{AmxEnabledByEnv()};
  return on;
}
}  // namespace

bool AmxBf16Usable() { return AmxSwitch().load(std::memory_order_relaxed) && AmxBf16Supported(); }

void SetAmxBf16Enabled(bool on) { AmxSwitch().store(on, std::memory_order_relaxed); }

}  // namespace pagedserve::kernels::cpu

#if defined(PAGEDSERVE_LINEAR_X86_PATHS)

#if defined(__clang__)
#pragma clang attribute push(                                                             \
    __attribute__((                                                                       \
        target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16"))), \
    apply_to = function)
#else
#pragma GCC push_options
// GCC 12's avx512fintrin.h trips -Wuninitialized on its own _mm512_undefined_*
// (GCC bug 105593); the intrinsics are correct.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")
#endif

namespace pagedserve::kernels::cpu {

namespace {

// The tile configuration of every kernel here (LDTILECFG's 64-byte format,
// palette 1): tiles 0-3 the fp32 accumulators (16 tokens x 16 rows), 4-5 the
// activation tiles (16 tokens x 32 bf16), 6-7 the weight tiles (16 pairs of
// elements x 16 rows, VNNI order); all 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  uint8_t palette;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
// Constant-initialized (read-only data): GCC 12 does not treat LDTILECFG as a
// read of its operand and dropped the stores of a configuration built on the
// stack.
alignas(64) constexpr TileConfig kTileConfig = {
    1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};

void ConfigureTiles() { _tile_loadconfig(&kTileConfig); }

// Lane i = 16 i: the dword offsets of the 16 rows of a 64-byte-row tile, for
// gathers and scatters down one of its columns.
inline __m512i TileRowOffsets() {
  return _mm512_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240);
}

// Lanes 2i and 2i + 1 of the result: lane i (rows 0..7) or 8 + i (rows 8..15).
alignas(64) constexpr int32_t kPairLo[16] = {0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7};
alignas(64) constexpr int32_t kPairHi[16] = {8,  8,  9,  9,  10, 10, 11, 11,
                                             12, 12, 13, 13, 14, 14, 15, 15};
// The values of the 4-bit codes 0..15: Q4_0 q - 8, Q4_1 q (times d, plus m).
alignas(64) constexpr float kQ4_0Values[16] = {-8, -7, -6, -5, -4, -3, -2, -1,
                                               0,  1,  2,  3,  4,  5,  6,  7};
alignas(64) constexpr float kQ4_1Values[16] = {0, 1, 2,  3,  4,  5,  6,  7,
                                               8, 9, 10, 11, 12, 13, 14, 15};

// One weight tile (16 rows, 32 elements of block b) of Q4_0x8 / Q4_1x8 from
// two 8-row groups' block starts (g1 null: rows 8..15 are zero): row kk of the
// tile holds the bf16 pairs of elements (2kk, 2kk + 1) of rows 0..15. Per
// tile row: the codes of rows 0..7 (then 8..15) with each row's dword in two
// lanes, shifted per lane (element 2kk in the even lane, 2kk + 1 in the odd
// one), looked up as floats by vpermps (its index is the low 4 bits), scaled,
// and the two halves rounded to bf16 by one vcvtne2ps2bf16, already in pair
// order.
template <bool kMin>
inline void InterleavedBlockToTile(const uint8_t* g0, const uint8_t* g1, uint16_t* tile) {
  constexpr int kCodes = kMin ? 32 : 16;
  const __m128i zero = _mm_setzero_si128();
  const __m512i pair_lo = _mm512_load_si512(kPairLo), pair_hi = _mm512_load_si512(kPairHi);
  const __m512 d = _mm512_cvtph_ps(
      _mm256_set_m128i(g1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(g1)) : zero,
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(g0))));
  const __m512 d_lo = _mm512_permutexvar_ps(pair_lo, d), d_hi = _mm512_permutexvar_ps(pair_hi, d);
  __m512 m_lo = _mm512_setzero_ps(), m_hi = _mm512_setzero_ps();
  if constexpr (kMin) {
    const __m512 m = _mm512_cvtph_ps(
        _mm256_set_m128i(g1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(g1 + 16)) : zero,
                         _mm_loadu_si128(reinterpret_cast<const __m128i*>(g0 + 16))));
    m_lo = _mm512_permutexvar_ps(pair_lo, m);
    m_hi = _mm512_permutexvar_ps(pair_hi, m);
  }
  const __m512 values = _mm512_load_ps(kMin ? kQ4_1Values : kQ4_0Values);
  const __m256i zero256 = _mm256_setzero_si256();
  for (int c = 0; c < 4; ++c) {
    const __m256i q0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g0 + kCodes + 32 * c));
    const __m256i q1 =
        g1 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g1 + kCodes + 32 * c)) : zero256;
    // Dword n of q: bytes 4c..4c+3 of row n; byte j holds element 4c + j (low
    // nibble) and 4c + j + 16 (high nibble).
    const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(q0), q1, 1);
    const __m512i q_lo = _mm512_permutexvar_epi32(pair_lo, q);
    const __m512i q_hi = _mm512_permutexvar_epi32(pair_hi, q);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 4; j += 2) {
        const int kk = 2 * c + j / 2 + 8 * h;  // elements 4c + j + 16h and the next
        const int s0 = 8 * j + 4 * h, s1 = s0 + 8;
        const __m512i shift =
            _mm512_setr_epi32(s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1, s0, s1);
        __m512 lo = _mm512_permutexvar_ps(_mm512_srlv_epi32(q_lo, shift), values);
        __m512 hi = _mm512_permutexvar_ps(_mm512_srlv_epi32(q_hi, shift), values);
        if constexpr (kMin) {
          lo = _mm512_fmadd_ps(lo, d_lo, m_lo);
          hi = _mm512_fmadd_ps(hi, d_hi, m_hi);
        } else {
          lo = _mm512_mul_ps(lo, d_lo);
          hi = _mm512_mul_ps(hi, d_hi);
        }
        _mm512_storeu_si512(tile + 32 * kk, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
      }
    }
  }
}

// One 16 x 16 fp32 C tile at c to y with bias, for the panel's rows r0 ..
// r0 + 15 (those < nrows) and tokens t0 .. t0 + 15 (those < T); nothing else
// of y is written. kColumns (kTokenColumns): tile row i is panel row r0 + i and
// column j token t0 + j (a column is gathered per token); otherwise (kTokenRows)
// tile row j is token t0 + j and column i panel row r0 + i.
template <bool kColumns>
inline void StoreTile(const float* c, int64_t t0, int64_t T, int r0, int nrows, float* y,
                      int64_t y_stride, const float* bias) {
  const int n = std::min(16, nrows - r0);
  if (n <= 0) return;
  const __mmask16 m = static_cast<__mmask16>((1u << n) - 1);
  const __m512 b = bias ? _mm512_maskz_loadu_ps(m, bias + r0) : _mm512_setzero_ps();
  const __m512i rows = TileRowOffsets();
  const int64_t tn = std::min<int64_t>(16, T - t0);
  for (int64_t t = 0; t < tn; ++t) {
    const __m512 v = kColumns ? _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, rows, c + t, 4)
                              : _mm512_loadu_ps(c + 16 * t);
    _mm512_mask_storeu_ps(y + (t0 + t) * y_stride + r0, m, _mm512_add_ps(v, b));
  }
}

// One pass over the 32-element steps of a k-chunk, C (up to 32 x 32) += A B:
// A tiles (16 rows x 32 bf16 each; step s at a0 + 512 s, the second 16 rows
// at a0 + a_tile_stride + 512 s) times B tiles (16 pairs x 16 columns, VNNI
// order; step s at b + 1024 s, the second 16 columns 512 further). C tiles
// 0-3 hold (A rows 0-15 | 16-31) x (B columns 0-15 | 16-31) in the order
// A0B0, A0B1, A1B0, A1B1, loaded from c[0..1024) (zero on the first chunk) and
// stored back. kTwoA / kTwoB: the second A rows / B columns take part. The
// tile registers are not renamed, so a load waits for the products that read
// the register before; each load is placed right before its first use.
template <bool kTwoA, bool kTwoB>
void GemmPass(const uint16_t* panel, int64_t nks, const uint16_t* a0, int64_t a_tile_stride,
              bool first, float* c) {
  if (first) {
    _tile_zero(0);
    if constexpr (kTwoB) _tile_zero(1);
    if constexpr (kTwoA) _tile_zero(2);
    if constexpr (kTwoA && kTwoB) _tile_zero(3);
  } else {
    _tile_loadd(0, c, 64);
    if constexpr (kTwoB) _tile_loadd(1, c + 256, 64);
    if constexpr (kTwoA) _tile_loadd(2, c + 512, 64);
    if constexpr (kTwoA && kTwoB) _tile_loadd(3, c + 768, 64);
  }
  const uint16_t* a1 = a0 + a_tile_stride;
  for (int64_t s = 0; s < nks; ++s) {
    const uint16_t* b = panel + s * 1024;
    _tile_loadd(4, a0 + 512 * s, 64);
    _tile_loadd(6, b, 64);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (kTwoB) {
      _tile_loadd(7, b + 512, 64);
      _tile_dpbf16ps(1, 4, 7);
    }
    if constexpr (kTwoA) {
      _tile_loadd(5, a1 + 512 * s, 64);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (kTwoB) _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, c, 64);
  if constexpr (kTwoB) _tile_stored(1, c + 256, 64);
  if constexpr (kTwoA) _tile_stored(2, c + 512, 64);
  if constexpr (kTwoA && kTwoB) _tile_stored(3, c + 768, 64);
}

void RunPass(bool two_a, bool two_b, const uint16_t* panel, int64_t nks, const uint16_t* a0,
             int64_t a_tile_stride, bool first, float* c) {
  if (two_a && two_b) {
    GemmPass<true, true>(panel, nks, a0, a_tile_stride, first, c);
  } else if (two_a) {
    GemmPass<true, false>(panel, nks, a0, a_tile_stride, first, c);
  } else if (two_b) {
    GemmPass<false, true>(panel, nks, a0, a_tile_stride, first, c);
  } else {
    GemmPass<false, false>(panel, nks, a0, a_tile_stride, first, c);
  }
}

// Blocks [b0, b0 + nbk) of rows [0, nrows) (nrows <= 32, a multiple of 8) to
// weight tiles at panel + 1024 (b - b0): rows 0..15, then 16..31 (zero past
// nrows).
void DequantPanel(WeightType type, const uint8_t* w, size_t w_row_bytes, int nrows, int64_t b0,
                  int64_t nbk, uint16_t* panel) {
  const bool q4_1 = type == WeightType::kQ4_1x8;
  const size_t group_block = q4_1 ? 160 : 144;
  const uint8_t* g[4];
  for (int i = 0; i < 4; ++i) g[i] = 8 * i < nrows ? w + 8 * i * w_row_bytes : nullptr;
  for (int64_t b = 0; b < nbk; ++b) {
    const size_t off = (b0 + b) * group_block;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* lo = g[2 * half];
      const uint8_t* hi = g[2 * half + 1];
      uint16_t* t = panel + b * 1024 + 512 * half;
      if (lo == nullptr) {
        std::memset(t, 0, 1024);
      } else if (q4_1) {
        InterleavedBlockToTile<true>(lo + off, hi ? hi + off : nullptr, t);
      } else {
        InterleavedBlockToTile<false>(lo + off, hi ? hi + off : nullptr, t);
      }
    }
  }
}

// ---- Row-major formats to A tiles: one weight row's 32-element step s is row
// (row % 16) of the step's tile, its elements in order, each the value the
// format's reference dequantizer gives (DequantizeWeightRow; up to one fp32
// rounding where an FMA replaces its multiply and add) rounded to bf16.

inline __m512i U8x16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void StoreBf16Row(__m512 lo, __m512 hi, uint16_t* dst) {
  _mm512_store_si512(dst, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

inline float F16At(const uint8_t* p) { return _cvtsh_ss(LoadU16(p)); }

// Steps [s0, s0 + n) of a Q8_0 row to dst + 512 (s - s0).
void Q8_0ToTileRows(const uint8_t* row, int64_t s0, int64_t n, uint16_t* dst) {
  for (int64_t s = 0; s < n; ++s) {
    const uint8_t* b = row + 34 * (s0 + s);
    const __m512 d = _mm512_set1_ps(F16At(b));
    const __m512 lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2))));
    const __m512 hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 18))));
    StoreBf16Row(_mm512_mul_ps(lo, d), _mm512_mul_ps(hi, d), dst + 512 * s);
  }
}

// The IQ4_NL / IQ4_XS codebook as floats (kIq4nlValues).
alignas(64) constexpr float kIq4nlFloats[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                                1,    13,   25,  38,  53,  69,  89,  113};

// A 16-byte block of 4-bit codes (element j the low nibble of byte j, element
// j + 16 its high nibble) looked up in a 16-float table: vpermps reads only
// the index's low 4 bits.
inline void NibbleLookup(const uint8_t* qs, __m512 table, __m512* lo, __m512* hi) {
  const __m512i raw = U8x16(qs);
  *lo = _mm512_permutexvar_ps(raw, table);
  *hi = _mm512_permutexvar_ps(_mm512_srli_epi32(raw, 4), table);
}

// Steps [s0, s0 + n) of a row of a 32-element format (Q4_0, Q4_1, Q5_0, Q5_1,
// IQ4_NL; block layouts in quant_blocks.h): step s is block s.
template <WeightType kType>
void Block32ToTileRows(const uint8_t* row, int64_t s0, int64_t n, uint16_t* dst) {
  constexpr bool kMin = kType == WeightType::kQ4_1 || kType == WeightType::kQ5_1;
  constexpr bool kFive = kType == WeightType::kQ5_0 || kType == WeightType::kQ5_1;
  constexpr size_t kBytes = kType == WeightType::kQ4_1   ? 20
                            : kType == WeightType::kQ5_0 ? 22
                            : kType == WeightType::kQ5_1 ? 24
                                                         : 18;  // Q4_0, IQ4_NL
  // The values of the low 4 bits (Q5: 0..15, the fifth bit adds 16).
  const __m512 table = _mm512_load_ps(kType == WeightType::kIQ4_NL ? kIq4nlFloats
                                      : kType == WeightType::kQ4_0 ? kQ4_0Values
                                                                   : kQ4_1Values);
  const __m512 sixteen = _mm512_set1_ps(16.0f);
  for (int64_t s = 0; s < n; ++s) {
    const uint8_t* b = row + kBytes * (s0 + s);
    const __m512 d = _mm512_set1_ps(F16At(b));
    __m512 lo, hi;
    NibbleLookup(b + kBytes - 16, table, &lo, &hi);
    if constexpr (kFive) {
      const uint32_t qh = LoadU32(b + (kMin ? 4 : 2));
      lo = _mm512_mask_add_ps(lo, static_cast<__mmask16>(qh), lo, sixteen);
      hi = _mm512_mask_add_ps(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
      if constexpr (!kMin) {  // Q5_0: value d (q - 16)
        lo = _mm512_sub_ps(lo, sixteen);
        hi = _mm512_sub_ps(hi, sixteen);
      }
    }
    if constexpr (kMin) {
      const __m512 m = _mm512_set1_ps(F16At(b + 2));
      StoreBf16Row(_mm512_fmadd_ps(d, lo, m), _mm512_fmadd_ps(d, hi, m), dst + 512 * s);
    } else {
      StoreBf16Row(_mm512_mul_ps(d, lo), _mm512_mul_ps(d, hi), dst + 512 * s);
    }
  }
}

// One IQ4_XS super-block to its 8 steps: step j is sub-block j, nibbles as
// Q4_0, value d (ls_j - 32) kIq4nlValues[code].
void Iq4XsSuperBlockToTileRows(const uint8_t* b, uint16_t* dst) {
  const float d = F16At(b);
  const __m512 table = _mm512_load_ps(kIq4nlFloats);
  for (int j = 0; j < 8; ++j) {
    const __m512 dl = _mm512_set1_ps(d * static_cast<float>(ScaleIq4Xs(b, j)));
    __m512 lo, hi;
    NibbleLookup(b + 8 + 16 * j, table, &lo, &hi);
    StoreBf16Row(_mm512_mul_ps(dl, lo), _mm512_mul_ps(dl, hi), dst + 512 * j);
  }
}

// The eight 6-bit scales and mins of a Q4_K / Q5_K super-block times d and dmin:
// dl[j] = d * scale_j, ml[j] = dmin * min_j (ScaleMinK4's unpacking done on the
// 12 bytes at once: bytes 0..7 of the result are the scales, 8..15 the mins).
inline void KScalesMins(const uint8_t* b, float* dl, float* ml) {
  uint32_t u[4];
  std::memcpy(u, b + 4, 12);
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kLow2 = 0x03030303;
  u[3] = ((u[2] >> 4) & kLow4) | (((u[1] >> 6) & kLow2) << 4);
  const uint32_t mins_lo = u[1] & kLow6;
  u[1] = (u[2] & kLow4) | (((u[0] >> 6) & kLow2) << 4);
  u[2] = mins_lo;
  u[0] &= kLow6;
  const __m512 v = _mm512_cvtepi32_ps(
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(u))));
  const __m512 dd =
      _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(F16At(b)), _mm512_set1_ps(F16At(b + 2)));
  alignas(64) float out[16];
  _mm512_store_ps(out, _mm512_mul_ps(v, dd));
  std::memcpy(dl, out, 32);
  std::memcpy(ml, out + 8, 32);
}

// One Q4_K / Q5_K (kFive) super-block to its 8 steps at dst + 512 j: step j is
// sub-block j, value dl_j q - ml_j.
template <bool kFive>
void Q45KSuperBlockToTileRows(const uint8_t* b, uint16_t* dst) {
  float dl[8], ml[8];
  KScalesMins(b, dl, ml);
  const __m512i low4 = _mm512_set1_epi32(15), sixteen = _mm512_set1_epi32(16);
  const uint8_t* qs = b + (kFive ? 48 : 16);
  __m512i qh[2];
  if constexpr (kFive) qh[0] = U8x16(b + 16), qh[1] = U8x16(b + 32);
  for (int p = 0; p < 4; ++p) {
    const __m512i raw[2] = {U8x16(qs + 32 * p), U8x16(qs + 32 * p + 16)};
    for (int odd = 0; odd < 2; ++odd) {
      const int j = 2 * p + odd;
      const __m512 d = _mm512_set1_ps(dl[j]), m = _mm512_set1_ps(ml[j]);
      __m512 v[2];
      for (int h = 0; h < 2; ++h) {
        __m512i q = odd ? _mm512_srli_epi32(raw[h], 4) : _mm512_and_si512(raw[h], low4);
        if constexpr (kFive) {
          const __mmask16 bit = _mm512_test_epi32_mask(qh[h], _mm512_set1_epi32(1 << j));
          q = _mm512_mask_or_epi32(q, bit, q, sixteen);
        }
        v[h] = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(q), m);
      }
      StoreBf16Row(v[0], v[1], dst + 512 * j);
    }
  }
}

// One Q6_K super-block to its 8 steps at dst + 512 (4 h + k): elements 128 h +
// 32 k .. of the layout in quant_blocks.h, halves scaled by scales 8 h + 2 k
// and 8 h + 2 k + 1; value (d s) q - 32 (d s).
void Q6KSuperBlockToTileRows(const uint8_t* b, uint16_t* dst) {
  alignas(64) float ds[16], ds32[16];
  const __m512 dsv = _mm512_mul_ps(_mm512_set1_ps(F16At(b + 208)),
                                   _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                                       reinterpret_cast<const __m128i*>(b + 192)))));
  _mm512_store_ps(ds, dsv);
  _mm512_store_ps(ds32, _mm512_mul_ps(dsv, _mm512_set1_ps(32.0f)));
  // The 6-bit codes are assembled as bytes (32 per step), then widened.
  const __m256i low4 = _mm256_set1_epi8(15), bits45 = _mm256_set1_epi8(0x30);
  for (int h = 0; h < 2; ++h) {
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
    // Bits 2k, 2k + 1 of qh moved to bits 4, 5 (k = 0..3).
    const __m256i hi[4] = {_mm256_and_si256(_mm256_slli_epi16(qh, 4), bits45),
                           _mm256_and_si256(_mm256_slli_epi16(qh, 2), bits45),
                           _mm256_and_si256(qh, bits45),
                           _mm256_and_si256(_mm256_srli_epi16(qh, 2), bits45)};
    for (int k = 0; k < 4; ++k) {
      const __m256i ql =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * h + 32 * (k & 1)));
      const __m256i lo = _mm256_and_si256(k < 2 ? ql : _mm256_srli_epi16(ql, 4), low4);
      const __m256i q = _mm256_or_si256(lo, hi[k]);
      __m512 v[2];
      for (int half = 0; half < 2; ++half) {
        const __m128i q16 = half ? _mm256_extracti128_si256(q, 1) : _mm256_castsi256_si128(q);
        const int g = 8 * h + 2 * k + half;
        v[half] =
            _mm512_fmsub_ps(_mm512_set1_ps(ds[g]), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(q16)),
                            _mm512_set1_ps(ds32[g]));
      }
      StoreBf16Row(v[0], v[1], dst + 512 * (4 * h + k));
    }
  }
}

// Steps [s0, s0 + n) of a row of a 256-element format (s0 and n multiples of 8:
// whole super-blocks).
template <void (*kSuperBlock)(const uint8_t*, uint16_t*), size_t kBytes>
void KQuantToTileRows(const uint8_t* row, int64_t s0, int64_t n, uint16_t* dst) {
  for (int64_t s = 0; s < n; s += 8) kSuperBlock(row + kBytes * ((s0 + s) / 8), dst + 512 * s);
}

// Steps [k0, k0 + nks) of rows [0, nrows) (nrows <= 32; the 256-element formats:
// k0 and nks multiples of 8) of a row-major format to A tiles at panel: row r's step k0 + s at
// panel + (r / 16) * kc * 512 + s * 512 + (r % 16) * 32; rows past nrows are zero.
void DequantRowsPanel(WeightType type, const uint8_t* w, size_t w_row_bytes, int nrows, int64_t k0,
                      int64_t nks, int64_t kc, uint16_t* panel) {
  // Each row's chunk is its own stream through memory (the weights are read
  // once per call): the chunk kAhead rows on is asked for ahead of its use.
  constexpr int kAhead = 2;
  const size_t begin = static_cast<size_t>(k0 * 32 / BlockElems(type)) * BlockBytes(type);
  const size_t end = static_cast<size_t>((k0 + nks) * 32 / BlockElems(type)) * BlockBytes(type);
  for (int r = 0; r < kAmxPanelRows; ++r) {
    uint16_t* dst = panel + (r / 16) * kc * 512 + (r % 16) * 32;
    const uint8_t* row = w + r * w_row_bytes;
    if (r >= nrows) {
      for (int64_t s = 0; s < nks; ++s) _mm512_store_si512(dst + 512 * s, _mm512_setzero_si512());
      continue;
    }
    if (r + kAhead < nrows) {
      const uint8_t* next = row + kAhead * w_row_bytes;
      for (size_t off = begin; off < end; off += 64) _mm_prefetch(next + off, _MM_HINT_T0);
    }
    switch (type) {
      case WeightType::kQ8_0: Q8_0ToTileRows(row, k0, nks, dst); break;
      case WeightType::kQ4_K:
        KQuantToTileRows<Q45KSuperBlockToTileRows<false>, 144>(row, k0, nks, dst);
        break;
      case WeightType::kQ5_K:
        KQuantToTileRows<Q45KSuperBlockToTileRows<true>, 176>(row, k0, nks, dst);
        break;
      case WeightType::kQ6_K:
        KQuantToTileRows<Q6KSuperBlockToTileRows, 210>(row, k0, nks, dst);
        break;
      case WeightType::kIQ4_XS:
        KQuantToTileRows<Iq4XsSuperBlockToTileRows, 136>(row, k0, nks, dst);
        break;
      case WeightType::kQ4_0: Block32ToTileRows<WeightType::kQ4_0>(row, k0, nks, dst); break;
      case WeightType::kQ4_1: Block32ToTileRows<WeightType::kQ4_1>(row, k0, nks, dst); break;
      case WeightType::kQ5_0: Block32ToTileRows<WeightType::kQ5_0>(row, k0, nks, dst); break;
      case WeightType::kQ5_1: Block32ToTileRows<WeightType::kQ5_1>(row, k0, nks, dst); break;
      case WeightType::kIQ4_NL: Block32ToTileRows<WeightType::kIQ4_NL>(row, k0, nks, dst); break;
      default: break;
    }
  }
}

}  // namespace

void AmxActsToBf16(AmxActs layout, const float* x, int64_t x_stride, int64_t T, int64_t tile,
                   int64_t cols, uint16_t* xa) {
  const int64_t nk = cols / 32;
  if (layout == AmxActs::kTokenRows) {
    for (int64_t t = 16 * tile; t < 16 * tile + 16; ++t) {
      const float* src = x + t * x_stride;
      uint16_t* dst = xa + tile * nk * 512 + (t % 16) * 32;
      for (int64_t s = 0; s < nk; ++s, dst += 512) {
        __m512i v = _mm512_setzero_si512();
        if (t < T)
          v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 32 * s + 16),
                                           _mm512_loadu_ps(src + 32 * s));
        _mm512_storeu_si512(dst, v);
      }
    }
    return;
  }
  // kTokenColumns: dword (pair) kk of token n goes to dword 16 kk + n of the tile.
  const __m512i pairs = TileRowOffsets();
  uint16_t* base = xa + (tile / 2) * nk * 1024 + (tile % 2) * 512;
  for (int n = 0; n < 16; ++n) {
    const int64_t t = 16 * tile + n;
    const float* src = x + t * x_stride;
    for (int64_t s = 0; s < nk; ++s) {
      __m512i v = _mm512_setzero_si512();
      if (t < T)
        v = (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + 32 * s + 16),
                                         _mm512_loadu_ps(src + 32 * s));
      _mm512_i32scatter_epi32(base + s * 1024 + 2 * n, pairs, v, 4);
    }
  }
}

bool AmxHasPanel(WeightType type) {
  switch (type) {
    case WeightType::kQ4_0x8:
    case WeightType::kQ4_1x8:
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
    case WeightType::kQ5_0:
    case WeightType::kQ5_1:
    case WeightType::kQ8_0:
    case WeightType::kIQ4_NL:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
    case WeightType::kIQ4_XS: return true;
    default: return false;
  }
}

AmxActs AmxActsOf(WeightType type) {
  return IsInterleavedRows8(type) ? AmxActs::kTokenRows : AmxActs::kTokenColumns;
}

void AmxLinearRows(WeightType type, const uint8_t* w, size_t w_row_bytes, int64_t nrows,
                   int64_t cols, const uint16_t* xa, int64_t T, float* y, int64_t y_stride,
                   const float* bias, int64_t chunk_k) {
  static thread_local std::vector<uint16_t> panel_scratch;
  static thread_local std::vector<float> c_scratch;
  const int64_t nk = cols / 32;
  // Steps per chunk; the K-quants' chunks are whole super-blocks (nk % 8 == 0).
  int64_t kc = std::min(nk, std::max<int64_t>(1, chunk_k / 32));
  if (UsesActBlock256(type)) kc = std::min(nk, (kc + 7) / 8 * 8);
  const int64_t t_pairs = (T + 31) / 32;
  uint16_t* panels = Scratch64(panel_scratch, static_cast<size_t>(kAmxGroupPanels * kc * 1024));
  float* cbuf = Scratch64(c_scratch, static_cast<size_t>(t_pairs * kAmxGroupPanels * 1024));
  const int64_t a_tile_stride = nk * 512;  // elements between 16-token tiles of xa
  const bool rows_in_a = AmxActsOf(type) == AmxActs::kTokenColumns;
  ConfigureTiles();
  for (int64_t g0 = 0; g0 < nrows; g0 += kAmxGroupPanels * kAmxPanelRows) {
    const int64_t gn = std::min<int64_t>(kAmxGroupPanels * kAmxPanelRows, nrows - g0);
    const int np = static_cast<int>((gn + kAmxPanelRows - 1) / kAmxPanelRows);
    for (int64_t k0 = 0; k0 < nk; k0 += kc) {
      const int64_t nks = std::min(kc, nk - k0);
      const bool first = k0 == 0;
      for (int p = 0; p < np; ++p) {
        const int n = static_cast<int>(std::min<int64_t>(kAmxPanelRows, gn - p * kAmxPanelRows));
        const uint8_t* pw = w + (g0 + p * kAmxPanelRows) * w_row_bytes;
        if (rows_in_a) {
          DequantRowsPanel(type, pw, w_row_bytes, n, k0, nks, kc, panels + p * kc * 1024);
        } else {
          DequantPanel(type, pw, w_row_bytes, n, k0, nks, panels + p * kc * 1024);
        }
      }
      for (int64_t tp = 0; tp < t_pairs; ++tp) {
        const bool two_tok = T - 32 * tp > 16;
        for (int p = 0; p < np; ++p) {
          const bool two_rows = gn - p * kAmxPanelRows > 16;
          const uint16_t* panel = panels + p * kc * 1024;
          float* c = cbuf + (tp * kAmxGroupPanels + p) * 1024;
          if (rows_in_a) {
            RunPass(two_rows, two_tok, xa + tp * nk * 1024 + k0 * 1024, nks, panel, kc * 512, first,
                    c);
          } else {
            RunPass(two_tok, two_rows, panel, nks, xa + 2 * tp * a_tile_stride + k0 * 512,
                    a_tile_stride, first, c);
          }
        }
      }
    }
    for (int64_t tp = 0; tp < t_pairs; ++tp)
      for (int p = 0; p < np; ++p) {
        const float* c = cbuf + (tp * kAmxGroupPanels + p) * 1024;
        const int64_t r = g0 + p * kAmxPanelRows;
        const int n = static_cast<int>(std::min<int64_t>(kAmxPanelRows, gn - p * kAmxPanelRows));
        const float* b = bias != nullptr ? bias + r : nullptr;
        for (int half = 0; half < 2; ++half) {
          if (rows_in_a) {  // C tiles rows (half) x tokens (0-15, 16-31)
            StoreTile<true>(c + 512 * half, 32 * tp, T, 16 * half, n, y + r, y_stride, b);
            StoreTile<true>(c + 512 * half + 256, 32 * tp + 16, T, 16 * half, n, y + r, y_stride,
                            b);
          } else {  // C tiles tokens (half) x rows (0-15, 16-31)
            StoreTile<false>(c + 512 * half, 32 * tp + 16 * half, T, 0, n, y + r, y_stride, b);
            StoreTile<false>(c + 512 * half + 256, 32 * tp + 16 * half, T, 16, n, y + r, y_stride,
                             b);
          }
        }
      }
  }
  _tile_release();
}

}  // namespace pagedserve::kernels::cpu

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC diagnostic pop
#pragma GCC pop_options
#endif

#else  // !PAGEDSERVE_LINEAR_X86_PATHS: no AMX; AmxBf16Usable() is false.

namespace pagedserve::kernels::cpu {
void AmxActsToBf16(AmxActs, const float*, int64_t, int64_t, int64_t, int64_t, uint16_t*) {}
bool AmxHasPanel(WeightType) { return false; }
AmxActs AmxActsOf(WeightType) { return AmxActs::kTokenRows; }
void AmxLinearRows(WeightType, const uint8_t*, size_t, int64_t, int64_t, const uint16_t*, int64_t,
                   float*, int64_t, const float*, int64_t) {}
}  // namespace pagedserve::kernels::cpu

#endif
