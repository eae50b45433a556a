// Host conversions between fp32 and the 16-bit element types of the KV cache.
//
// fp16 is IEEE 754 binary16 (1 sign, 5 exponent, 10 mantissa bits); bf16 is the
// upper half of an IEEE binary32 (1 sign, 8 exponent, 7 mantissa bits).
// Float -> 16-bit conversions round to nearest, ties to even; overflow gives
// infinity and NaN stays NaN. 16-bit -> float is exact. Header-only and
// dependency-free so that tests (CPU and CUDA) can share it.
#ifndef PAGEDSERVE_KERNELS_CPU_HALF_H_
#define PAGEDSERVE_KERNELS_CPU_HALF_H_

#include <cstdint>
#include <cstring>

namespace pagedserve::kernels {

// Storage-only wrappers: the bits of one fp16 / bf16 element.
struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Exact binary16 -> binary32. Branch-light so that loops over it vectorize:
// shifting the exponent/mantissa field into binary32 position and multiplying
// by 2^112 rebiases normals and turns subnormals into normals in one step.
inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t em = h & 0x7fffu;
  const uint32_t shifted = em << 13;
  float v = BitsToFloat(shifted) * 0x1p112f;
  uint32_t out = FloatBits(v);
  if (em >= 0x7c00u) out = shifted | 0x7f800000u;  // inf / NaN keep their payload
  return BitsToFloat(out | sign);
}

// binary32 -> binary16, round to nearest even.
inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t a = x & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN (quiet)
  if (a >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16: infinity
  if (a >= 0x38800000u) {                       // normal half range, >= 2^-14
    const uint32_t mant = a & 0x7fffffu;
    const uint32_t e = (a >> 23) - 127 + 15;
    uint32_t h = (e << 10) | (mant >> 13);
    const uint32_t rem = mant & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // may carry into inf: correct
    return static_cast<uint16_t>(sign | h);
  }
  if (a <= 0x33000000u) return sign;  // <= 2^-25 rounds to (signed) zero
  // Subnormal half: value / 2^-24, rounded.
  const uint32_t mant = (a & 0x7fffffu) | 0x800000u;
  const int shift = 126 - static_cast<int>(a >> 23);  // 14..24
  uint32_t h = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1);
  if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float BFloat16BitsToFloat(uint16_t b) { return BitsToFloat(static_cast<uint32_t>(b) << 16); }

// binary32 -> bfloat16, round to nearest even.
inline uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

inline float ToFloat(float v) { return v; }
inline float ToFloat(Half v) { return HalfBitsToFloat(v.bits); }
inline float ToFloat(BFloat16 v) { return BFloat16BitsToFloat(v.bits); }

template <typename T>
inline T FromFloat(float v);
template <>
inline float FromFloat<float>(float v) {
  return v;
}
template <>
inline Half FromFloat<Half>(float v) {
  return Half{FloatToHalfBits(v)};
}
template <>
inline BFloat16 FromFloat<BFloat16>(float v) {
  return BFloat16{FloatToBFloat16Bits(v)};
}

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_CPU_HALF_H_
