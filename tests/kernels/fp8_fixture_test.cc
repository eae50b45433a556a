// The fp8 conversions of kernels/cpu/fp8.h against ml_dtypes (float8_e4m3fn,
// float8_e5m2), through the committed fixture tests/fixtures/fp8/fp8_reference.txt
// (generator: make_fp8_fixture.py in the same folder). Runs in every build,
// CUDA or not; builds with CUDA also compare against cuda_fp8.h, including
// saturation (fp8_conversion_test.cc). Every decode of the 256 codes and every
// encode of the fixture's inputs (all values, all rounding ties and their ulp
// neighbours, random in-range floats) must agree; negative control: a
// round-toward-zero encoder disagrees on the fixture.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "kernels/cpu/fp8.h"

namespace pagedserve::kernels {
namespace {

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(Fp8FixtureTest, ConversionsMatchMlDtypes) {
  const char* src = std::getenv("PAGEDSERVE_SOURCE_DIR");  // set by CTest
  const std::string path =
      std::string(src != nullptr ? src : ".") + "/tests/fixtures/fp8/fp8_reference.txt";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::string line;
  int decodes = 0, encodes = 0, ties = 0, truncation_differs = 0, mismatches = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream ss(line);
    std::string op, fmt;
    ss >> op >> fmt;
    const bool e4 = fmt == "e4m3";
    ASSERT_TRUE(e4 || fmt == "e5m2") << line;
    const float* table = e4 ? Fp8E4M3Table() : Fp8E5M2Table();
    if (op == "decode") {
      int code;
      std::string bits;
      ss >> code >> bits;
      ++decodes;
      const float ours = table[code];
      if (bits == "nan") {
        EXPECT_TRUE(std::isnan(ours)) << line;
      } else {
        const uint32_t u = static_cast<uint32_t>(std::stoul(bits, nullptr, 16));
        uint32_t got;
        std::memcpy(&got, &ours, 4);
        EXPECT_EQ(got, u) << line << " (ours " << ours << ")";
      }
    } else {
      ASSERT_EQ(op, "encode") << line;
      std::string bits;
      int code;
      ss >> bits >> code;
      ++encodes;
      const float x = FromBits(static_cast<uint32_t>(std::stoul(bits, nullptr, 16)));
      const uint8_t ours = e4 ? FloatToFp8E4M3Bits(x) : FloatToFp8E5M2Bits(x);
      if (ours != code && ++mismatches <= 10)
        ADD_FAILURE() << line << ": encode(" << x << ") = " << int{ours} << ", ml_dtypes " << code;
      // Ties: x exactly halfway between two neighbouring fp8 values.
      const int c = code & 0x7f;
      if (c > 0 && std::abs(x) == 0.5f * (table[c - 1] + table[c])) ++ties;
      if (c < 0x7e && std::isfinite(table[c + 1]) &&
          std::abs(x) == 0.5f * (table[c] + table[c + 1]))
        ++ties;
      // Round toward zero would pick the code whose magnitude is below |x|.
      const uint8_t trunc =
          std::abs(table[ours]) > std::abs(x) && (ours & 0x7f) != 0 ? ours - 1 : ours;
      truncation_differs += trunc != code;
    }
  }
  EXPECT_EQ(decodes, 512);
  EXPECT_GT(encodes, 5000);
  EXPECT_EQ(mismatches, 0);
  EXPECT_GT(ties, 400) << "the fixture must contain rounding ties";
  EXPECT_GT(truncation_differs, 1000) << "a round-toward-zero encoder must fail this fixture";
}

}  // namespace
}  // namespace pagedserve::kernels
