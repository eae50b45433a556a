// Host conversions between fp32 and the 8-bit float element types of the KV
// cache (kernels/types.h: DType::kFloat8E4M3, kFloat8E5M2).
//
// Formats: "OCP 8-bit Floating Point Specification (OFP8)" rev 1.0 (2023);
// the same as CUDA's __nv_fp8_e4m3 / __nv_fp8_e5m2 (cuda_fp8.h) and
// ml_dtypes' float8_e4m3fn / float8_e5m2.
//   E4M3 ("fn"): bias 7, 3 mantissa bits, no infinities; S.1111.111 is NaN;
//                max finite 448 (0x7E), min subnormal 2^-9.
//   E5M2:        bias 15, 2 mantissa bits, IEEE-like inf (S.11111.00) and NaN;
//                max finite 57344 (0x7B), min subnormal 2^-16.
// fp32 -> fp8 rounds to nearest, ties to even, and saturates: a finite value
// (or an infinity) beyond the largest finite magnitude becomes +-max finite.
// NaN becomes 0x7F (the code CUDA's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, .)
// returns for either sign). fp8 -> fp32 is exact, through a 256-entry table.
// tests/kernels/fp8_test.cc checks every decode and a sweep of encodes against
// cuda_fp8.h's host-callable conversions.
//
// Header-only and dependency-free so that the CPU backend, the tests and the
// CUDA emulation test share it.
#ifndef PAGEDSERVE_KERNELS_CPU_FP8_H_
#define PAGEDSERVE_KERNELS_CPU_FP8_H_

#include <array>
#include <cstdint>
#include <cstring>
#include <limits>

namespace pagedserve::kernels {

// Storage-only wrappers: the bits of one fp8 element.
struct Fp8E4M3 {
  uint8_t bits;
};
struct Fp8E5M2 {
  uint8_t bits;
};
static_assert(sizeof(Fp8E4M3) == 1 && sizeof(Fp8E5M2) == 1);

namespace fp8_detail {

// Parameters of one format.
template <int kExpBits, int kManBits>
struct Format {
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr int kMinNormalExp = 1 - kBias;  // unbiased exponent of the smallest normal
};

constexpr float Pow2(int e) {
  float r = 1.0f;
  for (; e > 0; --e) r *= 2.0f;
  for (; e < 0; ++e) r *= 0.5f;
  return r;
}

// Exact value of code b (kE4M3Fn: E4M3 without infinities; else E5M2).
template <int kExpBits, int kManBits, bool kE4M3Fn>
constexpr float DecodeArith(uint8_t b) {
  using F = Format<kExpBits, kManBits>;
  const bool neg = (b & 0x80u) != 0;
  const int e = (b >> kManBits) & ((1 << kExpBits) - 1);
  const int m = b & ((1 << kManBits) - 1);
  const int emax_field = (1 << kExpBits) - 1;
  float v;
  if (kE4M3Fn && e == emax_field && m == (1 << kManBits) - 1) {
    return std::numeric_limits<float>::quiet_NaN();
  } else if (!kE4M3Fn && e == emax_field) {
    if (m != 0) return std::numeric_limits<float>::quiet_NaN();
    v = std::numeric_limits<float>::infinity();
  } else if (e == 0) {
    v = static_cast<float>(m) * Pow2(F::kMinNormalExp - kManBits);
  } else {
    v = (1.0f + static_cast<float>(m) / static_cast<float>(1 << kManBits)) * Pow2(e - F::kBias);
  }
  return neg ? -v : v;
}

template <int kExpBits, int kManBits, bool kE4M3Fn>
constexpr std::array<float, 256> MakeTable() {
  std::array<float, 256> t{};
  for (int i = 0; i < 256; ++i)
    t[i] = DecodeArith<kExpBits, kManBits, kE4M3Fn>(static_cast<uint8_t>(i));
  return t;
}

inline constexpr std::array<float, 256> kE4M3Table = MakeTable<4, 3, true>();
inline constexpr std::array<float, 256> kE5M2Table = MakeTable<5, 2, false>();

// fp32 -> fp8 bits, round to nearest even, saturating; kMaxCode is the code of
// the largest finite magnitude.
template <int kExpBits, int kManBits, uint32_t kMaxCode>
inline uint8_t Encode(float f) {
  using F = Format<kExpBits, kManBits>;
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 24) & 0x80u;
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7Fu;  // NaN
  if (a == 0x7f800000u) return static_cast<uint8_t>(sign | kMaxCode);
  const int fexp = static_cast<int>(a >> 23);
  const int e = fexp - 127;
  const uint32_t mant = a & 0x7fffffu;
  uint32_t code;
  if (e >= F::kMinNormalExp) {
    if (e > 2 * F::kBias + 2) return static_cast<uint8_t>(sign | kMaxCode);  // far beyond max
    constexpr int shift = 23 - kManBits;
    code = (static_cast<uint32_t>(e + F::kBias) << kManBits) | (mant >> shift);
    const uint32_t rem = mant & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) ++code;  // may carry into the exponent
  } else {
    if (fexp == 0) return static_cast<uint8_t>(sign);  // fp32 subnormal: far below 2^-17
    // Units of the smallest subnormal 2^(kMinNormalExp - kManBits).
    const int shift = 23 - kManBits + (F::kMinNormalExp - e);
    if (shift >= 25) return static_cast<uint8_t>(sign);  // below half the smallest subnormal
    const uint32_t m24 = mant | 0x800000u;
    code = m24 >> shift;
    const uint32_t rem = m24 & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (code & 1u))) ++code;  // may become the smallest normal
  }
  if (code > kMaxCode) code = kMaxCode;
  return static_cast<uint8_t>(sign | code);
}

}  // namespace fp8_detail

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

inline uint8_t FloatToFp8E4M3Bits(float f) { return fp8_detail::Encode<4, 3, 0x7Eu>(f); }
inline uint8_t FloatToFp8E5M2Bits(float f) { return fp8_detail::Encode<5, 2, 0x7Bu>(f); }
inline float Fp8E4M3BitsToFloat(uint8_t b) { return fp8_detail::kE4M3Table[b]; }
inline float Fp8E5M2BitsToFloat(uint8_t b) { return fp8_detail::kE5M2Table[b]; }
// The 256-entry decode tables (index = code).
inline const float* Fp8E4M3Table() { return fp8_detail::kE4M3Table.data(); }
inline const float* Fp8E5M2Table() { return fp8_detail::kE5M2Table.data(); }

inline float ToFloat(Fp8E4M3 v) { return Fp8E4M3BitsToFloat(v.bits); }
inline float ToFloat(Fp8E5M2 v) { return Fp8E5M2BitsToFloat(v.bits); }

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_CPU_FP8_H_
