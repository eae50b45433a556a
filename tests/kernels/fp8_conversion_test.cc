// The fp8 conversions of kernels/cpu/fp8.h against CUDA's own host-callable
// conversions in cuda_fp8.h (__nv_cvt_fp8_to_halfraw, __nv_cvt_float_to_fp8
// with __NV_SATFINITE: the functions the CUDA kernels use, and the reference
// vLLM's fp8 KV cache follows). Needs the CUDA headers, not a device.
//   - every one of the 256 codes of both formats decodes to the same float
//     (NaN codes to NaN);
//   - encoding agrees on: every decoded value, every midpoint between two
//     neighbouring values (the round-to-nearest-even ties) and the floats one
//     ulp either side of it, values past the largest finite one (saturation),
//     infinities, NaNs, fp32 subnormals, and 2M random bit patterns;
//   - negative controls: a round-toward-zero encoder and an encoder with
//     ties away from zero both disagree with CUDA on this sweep, and a
//     decoder that treats e4m3 like e5m2 disagrees on the codes.
#include <cuda_fp8.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"

namespace pagedserve::kernels {
namespace {

float CudaDecode(uint8_t code, __nv_fp8_interpretation_t interp) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(code, interp);
  return HalfBitsToFloat(h.x);
}

uint8_t CudaEncode(float f, __nv_fp8_interpretation_t interp) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, interp));
}

bool SameFloat(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  // The same bit pattern (distinguishes -0 from +0), not float ==.
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

// The sweep of test inputs for one format, built from its decoded values.
std::vector<float> Sweep(const float* table) {
  std::vector<float> finite;
  for (int c = 0; c < 128; ++c)
    if (std::isfinite(table[c])) finite.push_back(table[c]);  // ascending 0 .. max
  std::vector<float> xs;
  auto add = [&](float v) {
    for (float s : {v, -v}) {
      xs.push_back(s);
      xs.push_back(std::nextafter(s, INFINITY));
      xs.push_back(std::nextafter(s, -INFINITY));
    }
  };
  for (size_t i = 0; i < finite.size(); ++i) {
    add(finite[i]);
    if (i + 1 < finite.size()) add(0.5f * (finite[i] + finite[i + 1]));  // ties (exact)
  }
  const float mx = finite.back();
  const float ulp_top = mx - finite[finite.size() - 2];
  for (float k : {0.25f, 0.5f, 0.75f, 1.0f, 1.5f, 2.0f, 100.0f}) add(mx + k * ulp_top);
  for (float v : {1e6f, 1e30f, std::numeric_limits<float>::max(), INFINITY,
                  std::numeric_limits<float>::denorm_min(), 1e-40f, 0.0f})
    add(v);
  xs.push_back(std::numeric_limits<float>::quiet_NaN());
  xs.push_back(-std::numeric_limits<float>::quiet_NaN());
  std::mt19937 rng(5);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = rng();
    float f;
    std::memcpy(&f, &u, 4);
    xs.push_back(f);
  }
  // Random values in the format's range, where most roundings happen.
  std::uniform_real_distribution<float> in_range(-1.1f * mx, 1.1f * mx);
  for (int i = 0; i < 500000; ++i) xs.push_back(in_range(rng));
  std::uniform_real_distribution<float> small(-finite[8], finite[8]);  // subnormal range
  for (int i = 0; i < 100000; ++i) xs.push_back(small(rng));
  return xs;
}

// Broken encoders for the negative controls, on the same bit-level algorithm:
// truncation (round toward zero) and ties away from zero, by nudging the
// input one fp8 half-ulp-ish via the decoded neighbours.
uint8_t TruncatingEncode(float f, const float* table, uint8_t (*enc)(float)) {
  const uint8_t c = enc(f);
  if (std::isnan(f) || std::isnan(table[c])) return c;
  // If rounding went away from zero, step one code back toward zero.
  if (std::abs(table[c]) > std::abs(f) && (c & 0x7f) != 0) return static_cast<uint8_t>(c - 1);
  return c;
}

uint8_t TiesAwayEncode(float f, const float* table, uint8_t (*enc)(float)) {
  const uint8_t c = enc(f);
  if (std::isnan(f) || std::isnan(table[c]) || (c & 0x7f) == 0x7f) return c;
  const uint8_t up = static_cast<uint8_t>(c + 1);  // next magnitude
  if (std::isfinite(table[up]) &&
      std::abs(table[up]) - std::abs(f) == std::abs(f) - std::abs(table[c]) &&
      std::abs(f) > std::abs(table[c]))
    return up;
  return c;
}

struct Format {
  const char* name;
  __nv_fp8_interpretation_t interp;
  const float* table;
  uint8_t (*encode)(float);
  float max;
};

const Format kFormats[] = {
    {"e4m3", __NV_E4M3, Fp8E4M3Table(), &FloatToFp8E4M3Bits, kFp8E4M3Max},
    {"e5m2", __NV_E5M2, Fp8E5M2Table(), &FloatToFp8E5M2Bits, kFp8E5M2Max},
};

TEST(Fp8ConversionTest, AllCodesDecodeLikeCuda) {
  for (const Format& f : kFormats) {
    int nans = 0;
    for (int c = 0; c < 256; ++c) {
      const float cuda = CudaDecode(static_cast<uint8_t>(c), f.interp);
      EXPECT_TRUE(SameFloat(f.table[c], cuda))
          << f.name << " code 0x" << std::hex << c << ": ours " << f.table[c] << ", CUDA " << cuda;
      nans += std::isnan(cuda);
    }
    // e4m3fn: only S.1111.111 is NaN; e5m2: S.11111.{01,10,11}.
    EXPECT_EQ(nans, f.interp == __NV_E4M3 ? 2 : 6) << f.name;
    EXPECT_EQ(f.table[f.encode(INFINITY)], f.max) << f.name;  // 0x7E = 448, 0x7B = 57344
    EXPECT_EQ(f.max, f.interp == __NV_E4M3 ? 448.0f : std::ldexp(1.75f, 15)) << f.name;
  }
  // Negative control: decoding e4m3 codes as e5m2 is caught.
  int differ = 0;
  for (int c = 0; c < 256; ++c)
    differ += !SameFloat(Fp8E5M2Table()[c], CudaDecode(static_cast<uint8_t>(c), __NV_E4M3));
  EXPECT_GT(differ, 200);
}

TEST(Fp8ConversionTest, EncodeMatchesCudaIncludingTiesAndSaturation) {
  for (const Format& f : kFormats) {
    const std::vector<float> xs = Sweep(f.table);
    int64_t mismatches = 0, ties_checked = 0, saturated = 0;
    int64_t trunc_differs = 0, away_differs = 0;
    for (float x : xs) {
      const uint8_t ours = f.encode(x);
      const uint8_t cuda = CudaEncode(x, f.interp);
      if (ours != cuda && ++mismatches <= 10)
        ADD_FAILURE() << f.name << " encode(" << x << ") = 0x" << std::hex << int{ours}
                      << ", CUDA 0x" << int{cuda};
      if (std::isfinite(x) && std::abs(x) > f.max)
        saturated += (cuda & 0x7f) == (f.encode(f.max) & 0x7f);
      const uint8_t c = cuda & 0x7f;
      if (c < 0x7e && std::isfinite(x) && !std::isnan(f.table[c + 1]) &&
          std::abs(x) == 0.5f * (f.table[c] + f.table[c + 1]))
        ++ties_checked;
      trunc_differs += TruncatingEncode(x, f.table, f.encode) != cuda;
      away_differs += TiesAwayEncode(x, f.table, f.encode) != cuda;
    }
    EXPECT_EQ(mismatches, 0) << f.name << " over " << xs.size() << " inputs";
    EXPECT_GT(ties_checked, 100) << f.name << ": the sweep must contain rounding ties";
    EXPECT_GT(saturated, 100) << f.name << ": the sweep must contain saturating inputs";
    // The check can fail: wrong rounding modes disagree with CUDA.
    EXPECT_GT(trunc_differs, 1000) << f.name;
    EXPECT_GT(away_differs, 50) << f.name;
  }
  // Spot values (OFP8 spec examples; SATFINITE semantics).
  EXPECT_EQ(FloatToFp8E4M3Bits(448.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3Bits(1e9f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3Bits(-INFINITY), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3Bits(std::nanf("")), 0x7f);
  EXPECT_EQ(FloatToFp8E5M2Bits(INFINITY), 0x7b);
  EXPECT_EQ(FloatToFp8E4M3Bits(0x1p-9f), 0x01);    // smallest subnormal
  EXPECT_EQ(FloatToFp8E4M3Bits(0x1p-10f), 0x00);   // tie to even -> 0
  EXPECT_EQ(FloatToFp8E4M3Bits(0x1.8p-9f), 0x02);  // tie to even -> 2
  EXPECT_EQ(FloatToFp8E4M3Bits(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E5M2Bits(1.0f), 0x3c);
}

}  // namespace
}  // namespace pagedserve::kernels
