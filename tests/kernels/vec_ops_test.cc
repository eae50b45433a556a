// The CPU forward pass's elementwise loops (kernels/cpu/vec_ops.h) and the
// AVX2 exp they share with the attention kernels (kernels/cpu/vec_math_avx2.h),
// each variant the CPU runs (portable always; AVX2+FMA+F16C where present),
// against references nobody here wrote or that are exact:
// - Exp8 against double std::exp on every 97th fp32 bit pattern of
//   [-87.3, 88.3] (relative error <= 1.3e-7, the Cephes bound 1.2e-7 plus the
//   rounding of the comparison), 0 below -87.3, +inf above 88.3, NaN stays NaN.
// - SiluAndMul against g / (1 + exp(-g)) * u in double (relative 4e-7 of the
//   result plus 1e-37 absolute), odd lengths for the tails.
// - FloatsTo16 bit-identical to the scalar converters of kernels/cpu/half.h on a
//   sweep of fp32 bit patterns plus every rounding edge; Floats16ToFloat on all
//   65536 patterns (NaN only required to stay NaN).
// Negative control: a SiLU with the sign of the exponent flipped fails the check.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/vec_math_avx2.h"
#include "kernels/cpu/vec_ops.h"

namespace pagedserve::kernels::cpu {
namespace {

#ifdef PAGEDSERVE_KERNEL_TESTS_LIGHT
constexpr uint32_t kStride = 4099;
#else
constexpr uint32_t kStride = 97;
#endif

std::vector<bool> Variants() {
  std::vector<bool> v = {false};
  if (Avx2VecOpsAvailable()) v.push_back(true);
  return v;
}
std::string Name(bool avx2) { return avx2 ? "avx2" : "portable"; }

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t ToBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2,fma,f16c"))) void Exp8Array(const float* x, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 8) _mm256_storeu_ps(y + i, Exp8(_mm256_loadu_ps(x + i)));
}

// Run by SiluAndMulMatchesDouble for its AVX2 variant (the exp under it).
void CheckExp8() {
  std::vector<float> x;
  // Negative floats have the sign bit set: walk both halves of the bit space.
  for (uint32_t u = 0; u < 0x7f800000u; u += kStride) {
    const float f = FromBits(u);
    if (f <= 88.3f) x.push_back(f);
    if (-f >= -87.3f) {
      x.push_back(-f);
    }
  }
  while (x.size() % 8 != 0) x.push_back(0.0f);
  std::vector<float> y(x.size());
  Exp8Array(x.data(), static_cast<int64_t>(x.size()), y.data());
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(static_cast<double>(x[i]));
    const double rel = std::fabs(y[i] - want) / want;
    if (rel > worst) worst = rel;
    ASSERT_LE(rel, 1.3e-7) << "exp(" << x[i] << ") = " << y[i] << ", want " << want;
  }
  EXPECT_GT(worst, 0.0);  // the polynomial is not exact: the comparison saw it
  float special[8] = {-87.31f,
                      -1000.0f,
                      -std::numeric_limits<float>::infinity(),
                      std::numeric_limits<float>::quiet_NaN(),
                      88.4f,
                      std::numeric_limits<float>::infinity(),
                      0.0f,
                      -0.0f};
  float out[8];
  Exp8Array(special, 8, out);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], 0.0f);
  EXPECT_EQ(out[2], 0.0f);
  EXPECT_TRUE(std::isnan(out[3]));
  EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[5], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[6], 1.0f);
  EXPECT_EQ(out[7], 1.0f);
}
#endif

// Counts elements of gate (after the call) off the double reference.
int SiluMismatches(const std::vector<float>& got, const std::vector<float>& g0,
                   const std::vector<float>& up, double sign) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = g0[i];
    const double want = g / (1.0 + std::exp(sign * -g)) * up[i];
    if (std::fabs(got[i] - want) > 4e-7 * std::fabs(want) + 1e-37) ++bad;
  }
  return bad;
}

TEST(VecOpsTest, SiluAndMulMatchesDouble) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> wide(-30.0f, 30.0f), unit(-2.0f, 2.0f);
  for (bool avx2 : Variants()) {
#if defined(__x86_64__) || defined(__i386__)
    if (avx2) CheckExp8();
#endif
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9}, int64_t{37}, int64_t{1541}}) {
      SCOPED_TRACE(absl::StrCat(Name(avx2), " n=", n));
      std::vector<float> g0(n), up(n);
      for (int64_t i = 0; i < n; ++i) g0[i] = wide(rng), up[i] = unit(rng);
      if (n >= 8) {  // edges: zeros, beyond the exp clamps, tiny
        g0[0] = 0.0f, g0[1] = -0.0f, g0[2] = 100.0f, g0[3] = -100.0f, g0[4] = 1e-30f;
        g0[5] = -87.5f, g0[6] = 88.5f;
      }
      // In place, and into a separate output (gate left alone).
      std::vector<float> got = g0;
      SiluAndMulVariant(got.data(), up.data(), n, got.data(), avx2);
      EXPECT_EQ(SiluMismatches(got, g0, up, 1.0), 0);
      std::vector<float> gate = g0, out(n, 9.0f);
      SiluAndMulVariant(gate.data(), up.data(), n, out.data(), avx2);
      EXPECT_EQ(out, got);
      EXPECT_EQ(gate, g0) << "the gate was written";
      if (n >= 37) {
        EXPECT_GT(SiluMismatches(got, g0, up, -1.0), 0) << "negative control passed";
      }
    }
  }
}

// The fp32 bit patterns the converters are checked on: a sweep of the whole
// space, and the rounding edges of fp16 (halfway points in the normal and the
// subnormal ranges, the overflow threshold) and bf16.
std::vector<float> ConversionInputs() {
  std::vector<uint32_t> bits;
  for (uint64_t u = 0; u <= 0xffffffffu; u += kStride) bits.push_back(static_cast<uint32_t>(u));
  for (uint32_t e :
       {0x33000000u, 0x33800000u, 0x38800000u, 0x387fc000u, 0x477fe000u, 0x477ff000u, 0x47800000u,
        0x3f801000u, 0x3f803000u, 0x3f808000u, 0x3f818000u, 0x7f800000u, 0x7f800001u, 0x7fc00000u,
        0x7fffffffu, 0x00000001u, 0x007fffffu, 0x7f7fffffu, 0x7f7f8000u})
    for (uint32_t d : {0u, 1u, 0xffffffffu}) {
      bits.push_back(e + d);
      bits.push_back((e + d) | 0x80000000u);
    }
  std::vector<float> f(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) f[i] = FromBits(bits[i]);
  return f;
}

TEST(VecOpsTest, FloatsTo16BitIdenticalToScalar) {
  const std::vector<float> x = ConversionInputs();
  for (bool avx2 : Variants()) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(Name(avx2), " ", DTypeName(t)));
      std::vector<uint16_t> got(x.size() + 1, 0xabcd);
      FloatsTo16Variant(x.data(), static_cast<int64_t>(x.size()), t, got.data(), avx2);
      int bad = 0;
      for (size_t i = 0; i < x.size() && bad < 5; ++i) {
        const uint16_t want =
            t == DType::kFloat16 ? FloatToHalfBits(x[i]) : FloatToBFloat16Bits(x[i]);
        if (got[i] != want) {
          ++bad;
          ADD_FAILURE() << std::hex << "0x" << ToBits(x[i]) << " -> 0x" << got[i] << ", want 0x"
                        << want;
        }
      }
      EXPECT_EQ(got.back(), 0xabcd) << "wrote past n";
    }
  }
}

TEST(VecOpsTest, Floats16ToFloatExact) {
  std::vector<uint16_t> all(65536 + 3);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (bool avx2 : Variants()) {
    for (DType t : {DType::kFloat16, DType::kBFloat16}) {
      SCOPED_TRACE(absl::StrCat(Name(avx2), " ", DTypeName(t)));
      std::vector<float> got(all.size() + 1, 7.0f);
      Floats16ToFloatVariant(all.data(), static_cast<int64_t>(all.size()), t, got.data(), avx2);
      for (size_t i = 0; i < all.size(); ++i) {
        const float want =
            t == DType::kFloat16 ? HalfBitsToFloat(all[i]) : BFloat16BitsToFloat(all[i]);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got[i])) << i;
        } else {
          ASSERT_EQ(ToBits(got[i]), ToBits(want)) << i;
        }
      }
      EXPECT_EQ(got.back(), 7.0f) << "wrote past n";
    }
  }
}

TEST(VecOpsTest, EveryTailLength) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  for (bool avx2 : Variants()) {
    for (int64_t n = 0; n <= 17; ++n) {
      SCOPED_TRACE(absl::StrCat(Name(avx2), " n=", n));
      std::vector<float> x(n);
      for (float& v : x) v = d(rng);
      std::vector<uint16_t> h(n + 1, 0x5555);
      FloatsTo16Variant(x.data(), n, DType::kFloat16, h.data(), avx2);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(h[i], FloatToHalfBits(x[i]));
      EXPECT_EQ(h[n], 0x5555);
      std::vector<float> back(n + 1, 3.0f);
      Floats16ToFloatVariant(h.data(), n, DType::kFloat16, back.data(), avx2);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(back[i], HalfBitsToFloat(h[i]));
      EXPECT_EQ(back[n], 3.0f);
      std::vector<float> g(n + 1, 5.0f), up(n + 1, 1.0f);
      SiluAndMulVariant(g.data(), up.data(), n, g.data(), avx2);
      EXPECT_EQ(g[n], 5.0f) << "wrote past n";
    }
  }
}

}  // namespace
}  // namespace pagedserve::kernels::cpu
