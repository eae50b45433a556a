// Linear over weights in their stored GGUF formats (kernels/linear.h), against
// dequantize + a double-precision dot product: runtime/model's DequantizeRow
// (kernels::DequantizeRowToFloat, checked against gguf-py's dequantize by
// tests/model/dequant_test.cc). The row-dot kernels under test never dequantize;
// the tile method does, through the same gguf-py-checked function.
//
// Error bound asserted for output y[t, r] (W = dequantized weight row r, x = token t):
//  - quantized formats, row-dot method: each activation is replaced by d q with
//    |x - d q| <= d / 2 (d = block max|x| / 127), so the activation term is
//      A = sum_blocks (d_b / 2) * sum_{c in b} |W[c]|,
//    plus fp32 rounding of the kernel's block sums: at most (nb + 8) * 2^-23 of
//    3 * sum_c |x_c| * max_{c' in block(c)} |W[c']| (each per-block term is a
//    product of three rounded factors, summed over nb blocks; a block's integer
//    sum times its scale, and its min term, are each bounded by 3 max|W| there);
//  - F32/F16/BF16, and every format with the tile-sgemm method (fp32 activations):
//    the recursive-summation bound (cols + 8) * 2^-24 * sum_c |W[c] x_c|.
// The bound is worst case; tests below show that dropping one block or zeroing
// one block's scale breaks it.
#include "kernels/linear.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/weight_format.h"
#include "runtime/model/dequant.h"

namespace pagedserve::kernels {
namespace {

using cpu::LinearMethod;

// Under sanitizers (Debug, ~20x slower) one column count per format instead of two.
#ifdef PAGEDSERVE_KERNEL_TESTS_LIGHT
constexpr bool kLight = true;
#else
constexpr bool kLight = false;
#endif

constexpr WeightType kAllTypes[] = {WeightType::kF32,  WeightType::kF16,    WeightType::kBF16,
                                    WeightType::kQ4_0, WeightType::kQ4_1,   WeightType::kQ5_0,
                                    WeightType::kQ5_1, WeightType::kQ8_0,   WeightType::kQ2_K,
                                    WeightType::kQ3_K, WeightType::kQ4_K,   WeightType::kQ5_K,
                                    WeightType::kQ6_K, WeightType::kIQ4_NL, WeightType::kIQ4_XS};
// The K-quants (kPanel16 formats) and IQ4_XS: the ActBlock256 formats.
constexpr WeightType kSuperBlockTypes[] = {WeightType::kQ2_K, WeightType::kQ3_K,
                                           WeightType::kQ4_K, WeightType::kQ5_K,
                                           WeightType::kQ6_K, WeightType::kIQ4_XS};
constexpr CpuIsa kAllIsas[] = {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512};

void PutHalf(uint8_t* p, float v) {
  uint16_t h = FloatToHalfBits(v);
  std::memcpy(p, &h, 2);
}

// A random weight [rows, cols] of `type` with `pad` extra bytes per row: random
// codes, fp16 scales in [0.002, 0.03) with random sign, mins in [-0.1, 0.1).
struct Weight {
  WeightType type;
  int64_t rows, cols;
  size_t stride;
  std::vector<uint8_t> bytes;
  WeightView view() const { return {type, rows, cols, bytes.data(), stride}; }
};

Weight RandomWeight(std::mt19937& rng, WeightType type, int64_t rows, int64_t cols, size_t pad) {
  const size_t row_bytes = *RowBytes(type, cols);
  Weight w{type, rows, cols, row_bytes + pad, {}};
  w.bytes.resize(w.stride * rows);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.002f, 0.03f), sign(-1.0f, 1.0f), val(-1.0f, 1.0f);
  auto d = [&] { return scale(rng) * (sign(rng) < 0 ? -1.0f : 1.0f); };
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + r * w.stride;
    if (type == WeightType::kF32) {
      for (int64_t c = 0; c < cols; ++c) {
        float v = val(rng);
        std::memcpy(row + 4 * c, &v, 4);
      }
      continue;
    }
    if (type == WeightType::kF16 || type == WeightType::kBF16) {
      for (int64_t c = 0; c < cols; ++c) {
        float v = val(rng);
        uint16_t h = type == WeightType::kF16 ? FloatToHalfBits(v) : FloatToBFloat16Bits(v);
        std::memcpy(row + 2 * c, &h, 2);
      }
      continue;
    }
    for (size_t i = 0; i < row_bytes; ++i) row[i] = static_cast<uint8_t>(byte(rng));
    const size_t bb = BlockBytes(type);
    for (uint8_t* b = row; b < row + row_bytes; b += bb) {
      switch (type) {
        case WeightType::kQ4_1:
        case WeightType::kQ5_1:
          PutHalf(b, d());
          PutHalf(b + 2, 0.1f * sign(rng));
          break;
        case WeightType::kQ4_K:
        case WeightType::kQ5_K:
          PutHalf(b, 0.1f * d());
          PutHalf(b + 2, 0.1f * d());
          break;
        case WeightType::kQ6_K: PutHalf(b + 208, 0.1f * d()); break;
        case WeightType::kQ2_K:
          PutHalf(b + 80, 0.1f * d());
          PutHalf(b + 82, 0.1f * d());
          break;
        case WeightType::kQ3_K: PutHalf(b + 108, 0.1f * d()); break;
        case WeightType::kIQ4_NL: PutHalf(b, 0.1f * d()); break;
        case WeightType::kIQ4_XS: PutHalf(b, 0.01f * d()); break;
        default: PutHalf(b, d()); break;
      }
    }
  }
  return w;
}

std::vector<float> RandomActs(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = g(rng);
  return v;
}

// Dequantized weight via runtime/model (the gguf-py-checked dequantizer).
std::vector<float> Dequantized(const Weight& w) {
  std::vector<float> out(w.rows * w.cols);
  const size_t row_bytes = *RowBytes(w.type, w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::span<const uint8_t> row(w.bytes.data() + r * w.stride, row_bytes);
    absl::Status s = DequantizeRow(static_cast<GgmlType>(w.type), row, &out[r * w.cols], w.cols);
    EXPECT_TRUE(s.ok()) << s;
  }
  return out;
}

struct Reference {
  std::vector<double> y, bound;
};

// Double-precision y and the bound stated at the top of this file.
Reference Compute(const Weight& w, const std::vector<float>& wf, const std::vector<float>& x,
                  int64_t tokens, int64_t x_stride, const float* bias, bool quant_acts) {
  Reference ref{std::vector<double>(tokens * w.rows), std::vector<double>(tokens * w.rows)};
  const int64_t be = cpu::IsQuantized(w.type) ? BlockElems(w.type) : 1;
  const int64_t nb = w.cols / be;
  for (int64_t t = 0; t < tokens; ++t) {
    const float* xt = &x[t * x_stride];
    for (int64_t r = 0; r < w.rows; ++r) {
      const float* wr = &wf[r * w.cols];
      double y = bias ? bias[r] : 0.0, abs_wx = 0.0, act = 0.0, scaled = 0.0;
      for (int64_t b = 0; b < nb; ++b) {
        double amax_x = 0.0, amax_w = 0.0, sum_w = 0.0, sum_x = 0.0;
        for (int64_t c = b * be; c < (b + 1) * be; ++c) {
          y += static_cast<double>(wr[c]) * xt[c];
          abs_wx += std::fabs(static_cast<double>(wr[c]) * xt[c]);
          amax_x = std::fmax(amax_x, std::fabs(xt[c]));
          amax_w = std::fmax(amax_w, std::fabs(wr[c]));
          sum_w += std::fabs(wr[c]);
          sum_x += std::fabs(xt[c]);
        }
        act += amax_x / 127.0 / 2.0 * sum_w;
        scaled += 3.0 * sum_x * amax_w;
      }
      double bound;
      if (quant_acts) {
        bound = act * (1 + 1e-6) + (nb + 8) * std::ldexp(1.0, -23) * scaled;
      } else {
        bound = (w.cols + 8) * std::ldexp(1.0, -24) * abs_wx;
      }
      ref.y[t * w.rows + r] = y;
      ref.bound[t * w.rows + r] = bound + 1e-30;
    }
  }
  return ref;
}

// Largest |y - ref| / bound over all outputs (<= 1 passes).
double WorstRatio(const std::vector<float>& y, int64_t y_stride, const Reference& ref,
                  int64_t tokens, int64_t rows) {
  double worst = 0.0;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double e = std::fabs(y[t * y_stride + r] - ref.y[t * rows + r]) / ref.bound[t * rows + r];
      if (!(e <= worst)) worst = e;  // NaN propagates as a failure
    }
  return worst;
}

// A Q4_0 / Q4_1 weight with its rows interleaved as at load (InterleaveRows8).
Weight Interleaved(const Weight& w) {
  Weight x{InterleavedRows8Of(w.type), w.rows, w.cols, *RowBytes(w.type, w.cols), {}};
  x.bytes.resize(x.stride * w.rows);
  EXPECT_TRUE(InterleaveRows8(w.view(), x.bytes.data()).ok());
  return x;
}

// The negative controls of an interleaved weight: group 0's odd rows with
// their scales zeroed, and group 0's rows 2i and 2i + 1 with their codes
// exchanged (each must break the bound of its source).
std::vector<std::pair<Weight, const char*>> BrokenInterleaved(const Weight& x8) {
  const WeightType src = x8.type == WeightType::kQ4_1x8 ? WeightType::kQ4_1 : WeightType::kQ4_0;
  const size_t group_block = 8 * BlockBytes(src), codes = src == WeightType::kQ4_1 ? 32 : 16;
  const int64_t nb = x8.cols / 32;
  Weight zeroed = x8, swapped = x8;
  for (int64_t b = 0; b < nb; ++b) {
    for (int i = 1; i < 8; i += 2) PutHalf(&zeroed.bytes[group_block * b + 2 * i], 0.0f);
    for (int c = 0; c < 4; ++c)
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 4; ++k)
          std::swap(swapped.bytes[group_block * b + codes + 32 * c + 8 * i + k],
                    swapped.bytes[group_block * b + codes + 32 * c + 8 * i + 4 + k]);
  }
  return {{std::move(zeroed), "zeroed scales"}, {std::move(swapped), "swapped rows"}};
}

// Negative controls for a row-major weight (at least 3 rows): rows 0 and 1
// swapped; row 1's block scales d zeroed; and, where the format has them, the
// mins (Q4_1, Q5_1 m; Q4_K dmin), high bits (Q5_0, Q5_1, Q5_K, Q6_K qh) or high
// scale bits (IQ4_XS) of rows 2.. dropped (one row's mins over one super-block
// can stay inside the bound).
std::vector<std::pair<Weight, const char*>> BrokenRows(const Weight& w) {
  std::vector<std::pair<Weight, const char*>> out;
  Weight swapped = w, zeroed = w;
  std::swap_ranges(swapped.bytes.begin(), swapped.bytes.begin() + w.stride,
                   swapped.bytes.begin() + w.stride);
  out.emplace_back(std::move(swapped), "swapped rows");
  const size_t bb = BlockBytes(w.type);
  const size_t d_at = w.type == WeightType::kQ6_K ? 208 : 0;
  for (int64_t b = 0; b < w.cols / BlockElems(w.type); ++b)
    PutHalf(&zeroed.bytes[w.stride + bb * b + d_at], 0.0f);
  out.emplace_back(std::move(zeroed), "zeroed scales");
  // The field whose loss the third control shows: offset and bytes in a block.
  struct Field {
    size_t at, bytes;
    const char* what;
  };
  Field f{0, 0, nullptr};
  switch (w.type) {
    case WeightType::kQ4_1:
    case WeightType::kQ5_1:
    case WeightType::kQ4_K: f = {2, 2, "mins dropped"}; break;
    case WeightType::kQ5_0: f = {2, 4, "high bits dropped"}; break;
    case WeightType::kQ5_K: f = {16, 32, "high bits dropped"}; break;
    case WeightType::kQ6_K: f = {128, 64, "high bits dropped"}; break;
    case WeightType::kIQ4_XS: f = {2, 2, "high scale bits dropped"}; break;
    default: break;
  }
  if (f.what != nullptr) {
    Weight dropped = w, high = w;
    for (int64_t r = 2; r < w.rows; ++r)
      for (int64_t b = 0; b < w.cols / BlockElems(w.type); ++b) {
        std::memset(&dropped.bytes[r * w.stride + bb * b + f.at], 0, f.bytes);
        if (w.type == WeightType::kQ5_1) std::memset(&high.bytes[r * w.stride + bb * b + 4], 0, 4);
      }
    out.emplace_back(std::move(dropped), f.what);
    if (w.type == WeightType::kQ5_1) out.emplace_back(std::move(high), "high bits dropped");
  }
  return out;
}

// Every `step`-th token of p (already computed into p.y) gives, as a
// one-token call, the same outputs bit for bit: a token's outputs do not
// depend on the tokens beside it (speculative verification of k + 1 tokens
// equals k + 1 one-token steps).
void ExpectTokensIndependent(const LinearParams& p, CpuIsa isa, LinearMethod method, int64_t step) {
  for (int64_t t = 0; t < p.num_tokens; t += step) {
    std::vector<float> one(p.y_stride, 7.5f);
    LinearParams p1 = p;
    p1.x = p.x + t * p.x_stride;
    p1.num_tokens = 1;
    p1.y = one.data();
    ASSERT_TRUE(cpu::LinearWith(p1, isa, method).ok());
    for (int64_t r = 0; r < p.w.rows; ++r)
      ASSERT_EQ(one[r], p.y[t * p.y_stride + r]) << "token " << t << " row " << r;
  }
}

std::string Describe(WeightType type, CpuIsa isa, LinearMethod m, int64_t rows, int64_t cols,
                     int64_t tokens) {
  return absl::StrCat(WeightTypeName(type), " ", CpuIsaName(isa), " ", cpu::LinearMethodName(m),
                      " rows=", rows, " cols=", cols, " tokens=", tokens);
}

// Runs one case and checks the bound and that the padding of y is untouched.
void CheckCase(std::mt19937& rng, WeightType type, CpuIsa isa, LinearMethod method, int64_t rows,
               int64_t cols, int64_t tokens, bool with_bias) {
  SCOPED_TRACE(Describe(type, isa, method, rows, cols, tokens));
  Weight w = RandomWeight(rng, type, rows, cols, /*pad=*/type == WeightType::kF32 ? 8 : 5);
  const int64_t x_stride = cols + 3, y_stride = rows + 2;
  std::vector<float> x = RandomActs(rng, tokens * x_stride);
  std::vector<float> bias = RandomActs(rng, rows);
  std::vector<float> y(tokens * y_stride, 7.5f);
  LinearParams p{x.data(), tokens,  x_stride, w.view(), with_bias ? bias.data() : nullptr,
                 y.data(), y_stride};
  ASSERT_TRUE(cpu::LinearWith(p, isa, method).ok());
  const bool quant = method != LinearMethod::kTileSgemm && cpu::IsQuantized(type);
  Reference ref = Compute(w, Dequantized(w), x, tokens, x_stride, p.bias, quant);
  EXPECT_LE(WorstRatio(y, y_stride, ref, tokens, rows), 1.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t r = rows; r < y_stride; ++r) ASSERT_EQ(y[t * y_stride + r], 7.5f);
}

// Instantiated for every path (portable, avx2, avx512) on every host, so that
// the test names never vanish. A path this CPU cannot run (e.g. avx512 on an
// AVX2-only EPYC) cannot be tested here, and a skip would fail the run
// (tests/common/test_main.cc: only "no usable CUDA device" skips are allowed):
// instead SetUp checks what does hold there (selecting the path is refused,
// Linear itself runs on the best path this CPU has) and says in the output
// that this path's kernels were NOT tested; the body then returns.
// PAGEDSERVE_REQUIRE_CPU_ISAS="avx2,avx512" makes a missing path a failure
// (for a CI host known to have it). LinearTest.IsaPathsOfThisHost prints the
// summary.
CpuIsa BestIsaOfThisCpu() {
  if (CpuSupportsIsa(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (CpuSupportsIsa(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

bool RequiredIsa(CpuIsa isa) {
  const char* env = std::getenv("PAGEDSERVE_REQUIRE_CPU_ISAS");
  if (env == nullptr) return false;
  const std::string list = absl::StrCat(",", env, ",");
  return list.find(absl::StrCat(",", CpuIsaName(isa), ",")) != std::string::npos;
}

// Linear dispatches to the best path unless PAGEDSERVE_CPU_ISA chose another.
void ExpectDispatchToBestPath() {
  if (std::getenv("PAGEDSERVE_CPU_ISA") != nullptr) return;
  EXPECT_EQ(std::string(CpuIsaName(ActiveLinearIsa())), CpuIsaName(BestIsaOfThisCpu()))
      << "Linear's default path is not the best one this CPU has";
}

class LinearIsaTest : public ::testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    const CpuIsa isa = GetParam();
    if (CpuSupportsIsa(isa)) return;
    absent_ = true;
    std::printf(
        "[ NOT TESTED ] the %s path of Linear: this CPU lacks it; checked instead that "
        "selecting it is refused and that Linear runs the %s path\n",
        CpuIsaName(isa), CpuIsaName(ActiveLinearIsa()));
    RecordProperty("not_tested", absl::StrCat(CpuIsaName(isa), ": not on this CPU"));
    EXPECT_FALSE(RequiredIsa(isa)) << "PAGEDSERVE_REQUIRE_CPU_ISAS names " << CpuIsaName(isa)
                                   << ", which this CPU lacks: its kernels are not tested";
    EXPECT_EQ(SetLinearIsa(isa).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(ActiveLinearIsa(), isa);
    ExpectDispatchToBestPath();
    float x[32] = {}, y[1] = {};
    std::vector<float> w(32, 1.0f);
    const LinearParams p{
        x, 1, 32, WeightView{WeightType::kF32, 1, 32, w.data(), 32 * sizeof(float)}, nullptr, y, 1};
    EXPECT_EQ(cpu::LinearWith(p, isa, LinearMethod::kTileSgemm).code(),
              absl::StatusCode::kFailedPrecondition);
  }
  // True when this CPU cannot run the path: the body does not run.
  bool absent() const { return absent_; }

 private:
  bool absent_ = false;
};

TEST_P(LinearIsaTest, EveryFormatWithinBoundOnOddShapes) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(11);
  for (WeightType type : kAllTypes) {
    const int64_t be = BlockElems(type) == 1 ? 13 : BlockElems(type);
    for (int64_t cols : kLight ? std::vector<int64_t>{3 * be} : std::vector<int64_t>{be, 3 * be}) {
      for (int64_t rows : {1, 7, 45}) {
        for (int64_t tokens : {1, 3, 37}) {
          for (LinearMethod m :
               {LinearMethod::kRowDot, LinearMethod::kRowBlock, LinearMethod::kTileSgemm}) {
            CheckCase(rng, type, GetParam(), m, rows, cols, tokens, rows == 7);
          }
        }
      }
    }
  }
}

// The K-quant kernels (issue 10: the row dots are 1-row tiles; AVX2 uses them
// at every token count) on every token count from 1 to 9 and 37 (each group
// size 1..4 of the row dots, whole and partial 2x4 tiles) and row counts that
// are not multiples of the 2- and 4-row tiles.
TEST_P(LinearIsaTest, KQuantsEveryTokenCount) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(15);
  for (WeightType type : kSuperBlockTypes)
    for (int64_t rows : {1, 5, 7})
      for (int64_t tokens : {1, 2, 3, 4, 5, 6, 7, 8, 9, 37})
        for (LinearMethod m : {LinearMethod::kRowDot, LinearMethod::kRowBlock})
          CheckCase(rng, type, GetParam(), m, rows, 512, tokens, rows == 5);
}

// kRowBlock8 (8 rows x kRow8Tokens tokens, rows in the vector lanes) on its
// formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): whole tiles, left-over rows (not a multiple of 8) and
// tokens (not a multiple of kRow8Tokens), several blocks per row; also the formats without the tile
// and fewer tokens than a tile (both fall back to kRowBlock).
TEST_P(LinearIsaTest, RowBlock8WithinBoundOnOddShapes) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(14);
  for (WeightType type : {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                          WeightType::kQ5_1, WeightType::kQ8_0}) {
    for (int64_t cols : {32, 96, 576}) {
      for (int64_t rows : {8, 13, 45}) {
        for (int64_t tokens : {4, 8, 12, 15, 37}) {
          if (kLight && cols == 576 && rows != 45) continue;
          CheckCase(rng, type, GetParam(), LinearMethod::kRowBlock8, rows, cols, tokens,
                    rows == 13);
        }
      }
    }
  }
  for (WeightType type : {WeightType::kQ4_K, WeightType::kQ6_K, WeightType::kF16})
    CheckCase(rng, type, GetParam(), LinearMethod::kRowBlock8, 24, 256, 9, true);
  CheckCase(rng, WeightType::kQ4_1, GetParam(), LinearMethod::kRowBlock8, 24, 64, 3, true);
}

// Q4_0x8 / Q4_1x8 (Q4_0 / Q4_1 rows interleaved at load by InterleaveRows8,
// issue 34): within the bound of the weight they came from, at every token
// count the kernels split differently (8-row groups x 1..8 tokens; on AVX-512
// 16-row pairs of groups from 3 tokens, 16 tokens per pass, and an 8-row group
// left over: rows 40), with padded source rows and a bias; the portable path
// refuses the layouts; each token's outputs equal those of a one-token call bit
// for bit. Negative controls: four rows' scales zeroed and four pairs of rows'
// codes swapped in the interleaved bytes exceed the bound.
TEST_P(LinearIsaTest, InterleavedRowsWithinBoundOfTheirSource) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(17);
  for (WeightType src : {WeightType::kQ4_0, WeightType::kQ4_1}) {
    const WeightType type = InterleavedRows8Of(src);
    for (int64_t cols : {32, 96, 576}) {
      for (int64_t rows : {8, 24, 40}) {
        for (int64_t tokens : {1, 2, 3, 5, 8, 9, 16, 17, 37}) {
          if (kLight && cols == 576 && tokens > 9) continue;
          SCOPED_TRACE(Describe(type, GetParam(), LinearMethod::kInterleaved8, rows, cols, tokens));
          const Weight w = RandomWeight(rng, src, rows, cols, /*pad=*/5);
          const Weight x8 = Interleaved(w);
          const int64_t x_stride = cols + 3, y_stride = rows + 2;
          std::vector<float> x = RandomActs(rng, tokens * x_stride);
          std::vector<float> bias = RandomActs(rng, rows);
          std::vector<float> y(tokens * y_stride, 7.5f);
          LinearParams p{x.data(), tokens,  x_stride, x8.view(), rows == 24 ? bias.data() : nullptr,
                         y.data(), y_stride};
          const absl::Status s = cpu::LinearWith(p, GetParam(), LinearMethod::kRowDot);
          if (GetParam() == CpuIsa::kPortable) {
            EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
            EXPECT_EQ(y[0], 7.5f);
            continue;
          }
          ASSERT_TRUE(s.ok()) << s;
          const Reference ref = Compute(w, Dequantized(w), x, tokens, x_stride, p.bias, true);
          EXPECT_LE(WorstRatio(y, y_stride, ref, tokens, rows), 1.0);
          ExpectTokensIndependent(p, GetParam(), LinearMethod::kRowDot, 4);
          for (int64_t t = 0; t < tokens; ++t)
            for (int64_t r = rows; r < y_stride; ++r) ASSERT_EQ(y[t * y_stride + r], 7.5f);
          if (tokens != 3 && tokens != 17) continue;
          // Negative controls on the interleaved bytes.
          for (const auto& [broken, what] : BrokenInterleaved(x8)) {
            p.w = broken.view();
            ASSERT_TRUE(cpu::LinearWith(p, GetParam(), LinearMethod::kRowDot).ok());
            EXPECT_GT(WorstRatio(y, y_stride, ref, tokens, rows), 1.0) << what << " passed";
          }
        }
      }
    }
  }
}

// kPanel16 (the K-quants' many-token GEMM, 16-row panels repacked on the fly):
// whole and partial panels (rows 1..45, not multiples of 16), whole and
// partial token tiles (8 on AVX-512, 4 on AVX2), one and several super-blocks
// per row, with and without bias. On the portable path the method falls back
// to kRowBlock (checked too).
TEST_P(LinearIsaTest, KQuantPanelsWithinBoundOnOddShapes) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(16);
  for (WeightType type : {WeightType::kQ2_K, WeightType::kQ3_K, WeightType::kQ4_K,
                          WeightType::kQ5_K, WeightType::kQ6_K})
    for (int64_t cols : {256, 768})
      for (int64_t rows : {1, 9, 16, 45})
        for (int64_t tokens : {1, 3, 8, 13, 37}) {
          if (kLight && cols == 768 && rows != 45) continue;
          CheckCase(rng, type, GetParam(), LinearMethod::kPanel16, rows, cols, tokens, rows == 9);
        }
  // Q4_0, Q4_1 and Q8_0 (PanelBlock32, issues 34 and 33): one and several
  // 32-element blocks
  for (WeightType type : {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ8_0})
    for (int64_t cols : {32, 96, 576})
      for (int64_t rows : {1, 9, 16, 45})
        for (int64_t tokens : {1, 3, 8, 13, 37}) {
          if (kLight && cols == 576 && rows != 45) continue;
          CheckCase(rng, type, GetParam(), LinearMethod::kPanel16, rows, cols, tokens, rows == 9);
        }
  // formats without panels fall back to kRowBlock
  CheckCase(rng, WeightType::kQ5_0, GetParam(), LinearMethod::kPanel16, 24, 64, 9, true);
  CheckCase(rng, WeightType::kF16, GetParam(), LinearMethod::kPanel16, 24, 64, 9, true);
  CheckCase(rng, WeightType::kIQ4_XS, GetParam(), LinearMethod::kPanel16, 24, 512, 9, true);
  CheckCase(rng, WeightType::kIQ4_NL, GetParam(), LinearMethod::kPanel16, 24, 64, 9, true);
}

// Large enough to be split over the OpenMP threads (OMP_NUM_THREADS=2 in ctest).
TEST_P(LinearIsaTest, ThreadedShapes) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(12);
  for (WeightType type : kAllTypes) {
    const int64_t cols = BlockElems(type) == 256 ? 768 : 576;
    CheckCase(rng, type, GetParam(), LinearMethod::kRowDot, 130, cols, 3, true);
    CheckCase(rng, type, GetParam(), LinearMethod::kRowBlock, 130, cols, 11, true);
    CheckCase(rng, type, GetParam(), LinearMethod::kRowBlock8, 130, cols, 11, true);
    CheckCase(rng, type, GetParam(), LinearMethod::kPanel16, 130, cols, 11, true);
    CheckCase(rng, type, GetParam(), LinearMethod::kTileSgemm, 130, cols, 9, false);
  }
}

// The bound has teeth: feeding the kernel a weight with one block's scale zeroed,
// or one block fewer, while comparing against the intact weight, breaks it.
TEST_P(LinearIsaTest, BrokenWeightsExceedTheBound) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(13);
  // kRowBlock with 8 tokens: whole kBlockRows x kBlockTokens tiles; with 1
  // token: kDecodeRows x 1 tiles. kRowBlock8 with 8 tokens: whole 8-row tiles
  // for Q4_0/Q4_1/Q8_0 (kRowBlock for the others).
  for (auto [method, tokens] : {std::pair{LinearMethod::kRowDot, int64_t{3}},
                                std::pair{LinearMethod::kRowBlock, int64_t{8}},
                                std::pair{LinearMethod::kRowBlock8, int64_t{8}},
                                std::pair{LinearMethod::kPanel16, int64_t{9}},
                                std::pair{LinearMethod::kRowBlock, int64_t{1}}})
    for (WeightType type : kAllTypes) {
      if (!cpu::IsQuantized(type)) continue;
      SCOPED_TRACE(absl::StrCat(WeightTypeName(type), " ", cpu::LinearMethodName(method),
                                " tokens=", tokens));
      const int64_t rows = 16, cols = BlockElems(type) * 2;
      Weight w = RandomWeight(rng, type, rows, cols, 0);
      std::vector<float> x = RandomActs(rng, tokens * cols);
      Reference ref = Compute(w, Dequantized(w), x, tokens, cols, nullptr, true);
      std::vector<float> y(tokens * rows);
      LinearParams p{x.data(), tokens, cols, w.view(), nullptr, y.data(), rows};
      ASSERT_TRUE(cpu::LinearWith(p, GetParam(), method).ok());
      EXPECT_LE(WorstRatio(y, rows, ref, tokens, rows), 1.0);

      // Dropped block: the last block of every row is ignored.
      p.w.cols = cols - BlockElems(type);
      std::vector<float> x_short(tokens * p.w.cols);
      for (int64_t t = 0; t < tokens; ++t)
        std::copy_n(&x[t * cols], p.w.cols, &x_short[t * p.w.cols]);
      p.x = x_short.data();
      p.x_stride = p.w.cols;
      ASSERT_TRUE(cpu::LinearWith(p, GetParam(), method).ok());
      EXPECT_GT(WorstRatio(y, rows, ref, tokens, rows), 1.0) << "dropping a block went unnoticed";

      // Zeroed scale of the first block of every row.
      Weight broken = w;
      const size_t d_offset = type == WeightType::kQ6_K   ? 208
                              : type == WeightType::kQ3_K ? 108
                              : type == WeightType::kQ2_K ? 80
                                                          : 0;
      for (int64_t r = 0; r < rows; ++r) PutHalf(&broken.bytes[r * broken.stride + d_offset], 0.0f);
      p = LinearParams{x.data(), tokens, cols, broken.view(), nullptr, y.data(), rows};
      ASSERT_TRUE(cpu::LinearWith(p, GetParam(), method).ok());
      EXPECT_GT(WorstRatio(y, rows, ref, tokens, rows), 1.0) << "a zeroed scale went unnoticed";
    }
}

// The ISA's activation quantizer (IsaKernels::quant32 / quant256) writes blocks
// bit-identical to the portable QuantizeActs32 / QuantizeActs256, including
// exact ties (x * 127 / max|x| = k + 1/2: the block maximum is 127, so the
// scale factor is exactly 1 and x = k + 0.5 rounds to even), an all-zero block,
// tiny and huge magnitudes. A quantizer that rounds ties away from zero
// (std::round) is shown to differ, so the comparison can fail.
std::vector<float> QuantizerInput(std::mt19937& rng, int64_t n) {
  std::vector<float> x = RandomActs(rng, n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (int64_t b = 0; b < n / 32; ++b) {
    float* p = &x[32 * b];
    switch (b % 6) {
      case 0:  // ties: max 127, values k + 0.5
        for (int i = 0; i < 32; ++i) p[i] = static_cast<float>(i * 4 - 63) + 0.5f;
        p[7] = 127.0f;
        break;
      case 1: std::fill(p, p + 32, 0.0f); break;
      case 2:
        // tiny (127 / max|x| must stay finite: below ~3.7e-37 it overflows to
        // inf and both quantizers return unspecified codes, linear_cpu.h)
        for (int i = 0; i < 32; ++i) p[i] = u(rng) * 1e-30f;
        break;
      case 3:
        for (int i = 0; i < 32; ++i) p[i] = u(rng) * 3e38f;
        break;
      case 4:
        p[3] = -0.0f;
        p[9] = -40.0f;
        break;  // a negative maximum
      default: break;
    }
  }
  return x;
}

void BrokenQuantize32(const float* x, int64_t n, cpu::ActBlock32* out) {
  cpu::QuantizeActs32(x, n, out);
  for (int64_t b = 0; b < n / 32; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[32 * b + i]));
    const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) {
      out[b].qs[i] = static_cast<int8_t>(std::round(x[32 * b + i] * id));
      s += out[b].qs[i];
    }
    out[b].sum = s;
  }
}

TEST_P(LinearIsaTest, ActivationQuantizerMatchesPortableBitForBit) {
  if (absent()) return;  // said so in SetUp
  const cpu::IsaKernels& k = cpu::KernelsFor(GetParam());
  std::mt19937 rng(17);
  for (int64_t n : {256, 768, 2304}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = QuantizerInput(rng, n);
    std::vector<cpu::ActBlock32> want32(n / 32), got32(n / 32), broken(n / 32);
    cpu::QuantizeActs32(x.data(), n, want32.data());
    k.quant32(x.data(), n, got32.data());
    EXPECT_EQ(std::memcmp(want32.data(), got32.data(), want32.size() * sizeof(cpu::ActBlock32)), 0);
    BrokenQuantize32(x.data(), n, broken.data());
    EXPECT_NE(std::memcmp(want32.data(), broken.data(), want32.size() * sizeof(cpu::ActBlock32)), 0)
        << "rounding ties away from zero went unnoticed";

    std::vector<cpu::ActBlock256> want256(n / 256), got256(n / 256);
    // The struct has no padding (static_assert in quant_blocks.h), so memcmp compares fields.
    cpu::QuantizeActs256(x.data(), n, want256.data());
    k.quant256(x.data(), n, got256.data());
    EXPECT_EQ(std::memcmp(want256.data(), got256.data(), want256.size() * sizeof(cpu::ActBlock256)),
              0);
    for (size_t b = 0; b < want256.size(); ++b) {
      for (int i = 0; i < 256; ++i) ASSERT_EQ(want256[b].qs[i], got256[b].qs[i]) << b << " " << i;
    }
  }
}

// A row of NaN activations (what a NaN weight upstream of a norm gives) comes
// out NaN on every path, method and quantized format, at decode and batched
// token counts: the sampler then refuses the request (docs/worker.md) instead of
// sampling from logits the quantizer made finite. The finite row beside it
// stays finite, so the check can fail both ways.
TEST_P(LinearIsaTest, NanActivationRowGivesNanOutputs) {
  if (absent()) return;  // said so in SetUp
  std::mt19937 rng(23);
  for (WeightType type : {WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ8_0,
                          WeightType::kQ4_K, WeightType::kQ6_K, WeightType::kQ2_K}) {
    Weight w = RandomWeight(rng, type, 20, 512, 0);
    for (int64_t tokens : {1, 2, 9}) {
      for (LinearMethod m : {LinearMethod::kRowDot, LinearMethod::kRowBlock,
                             LinearMethod::kRowBlock8, LinearMethod::kPanel16}) {
        SCOPED_TRACE(testing::Message() << WeightTypeName(type) << " tokens " << tokens
                                        << " method " << cpu::LinearMethodName(m));
        std::vector<float> x = RandomActs(rng, tokens * 512), y(tokens * 20);
        std::fill(x.begin(), x.begin() + 512, std::numeric_limits<float>::quiet_NaN());
        LinearParams p{x.data(), tokens, 512, w.view(), nullptr, y.data(), 20};
        ASSERT_TRUE(cpu::LinearWith(p, GetParam(), m).ok());
        for (int64_t r = 0; r < 20; ++r) EXPECT_TRUE(std::isnan(y[r])) << "row " << r;
        for (int64_t i = 20; i < tokens * 20; ++i) ASSERT_TRUE(std::isfinite(y[i])) << i;
      }
    }
  }
}

// Every path agrees with the public entry point, whichever path that chose.
TEST_P(LinearIsaTest, SetLinearIsaSelectsThePath) {
  if (absent()) return;  // said so in SetUp
  const CpuIsa before = ActiveLinearIsa();
  ASSERT_TRUE(SetLinearIsa(GetParam()).ok());
  EXPECT_EQ(ActiveLinearIsa(), GetParam());
  std::mt19937 rng(14);
  Weight w = RandomWeight(rng, WeightType::kQ4_K, 20, 512, 0);
  std::vector<float> x = RandomActs(rng, 2 * 512), y(2 * 20), y2(2 * 20);
  LinearParams p{x.data(), 2, 512, w.view(), nullptr, y.data(), 20};
  ASSERT_TRUE(Linear(p).ok());
  p.y = y2.data();
  ASSERT_TRUE(
      cpu::LinearWith(p, GetParam(), cpu::ChooseMethod(w.type, 2, 20, 512, GetParam())).ok());
  EXPECT_EQ(y, y2);
  ASSERT_TRUE(SetLinearIsa(before).ok());
}

// LinearGroup: several weights over one input in one parallel region give
// exactly what Linear gives for each alone (same method, kernels and activation
// blocks), and every member is within the double-precision bound. Groups mix
// block sizes (32 and 256: two activation quantizations), fp16 rows and
// tile-sgemm members, at decode and batched token counts; rows odd so that
// the threads' slices end mid-tile. A group member fed a weight with one
// byte changed is shown to differ, so the comparison can fail.
TEST_P(LinearIsaTest, GroupMatchesLinearBitForBit) {
  if (absent()) return;  // said so in SetUp
  const CpuIsa isa = GetParam();
  const CpuIsa before = ActiveLinearIsa();
  ASSERT_TRUE(SetLinearIsa(isa).ok());
  std::mt19937 rng(21);
  const std::vector<std::vector<WeightType>> groups = {
      {WeightType::kQ4_1, WeightType::kQ4_1, WeightType::kQ4_1},
      {WeightType::kQ4_K, WeightType::kQ6_K, WeightType::kQ8_0},
      {WeightType::kQ5_0, WeightType::kF16},
      // Rows interleaved at load beside row-major K-quants: with AMX, two
      // activation tile layouts in one group (kernels/cpu/linear_cpu.h).
      {WeightType::kQ4_0x8, WeightType::kQ6_K, WeightType::kQ4_K}};
  const int64_t cols = 768;  // a multiple of 256
  for (const auto& types : groups)
    for (int64_t tokens : {1, 3, 5, 130}) {
      if (types[0] == WeightType::kQ4_0x8 && isa == CpuIsa::kPortable) continue;  // no kernel
      SCOPED_TRACE(absl::StrCat("tokens=", tokens, " first=", WeightTypeName(types[0])));
      std::vector<Weight> ws, srcs;  // srcs: the row-major source of each member
      std::vector<std::vector<float>> ys, want, biases;
      std::vector<float> x = RandomActs(rng, tokens * cols);
      std::vector<LinearParams> ps;
      for (size_t i = 0; i < types.size(); ++i) {
        // Odd rows; interleaved rows come in groups of 8.
        const int64_t rows = (97 + 64 * static_cast<int64_t>(i)) /
                             (IsInterleavedRows8(types[i]) ? 8 : 1) *
                             (IsInterleavedRows8(types[i]) ? 8 : 1);
        if (IsInterleavedRows8(types[i])) {
          srcs.push_back(RandomWeight(rng, WeightType::kQ4_0, rows, cols, 0));
          ws.push_back(Interleaved(srcs.back()));
        } else {
          ws.push_back(RandomWeight(rng, types[i], rows, cols, 0));
          srcs.push_back(ws.back());
        }
        biases.push_back(RandomActs(rng, rows));
        ys.emplace_back(tokens * rows, 7.5f);
        want.emplace_back(tokens * rows);
      }
      for (size_t i = 0; i < types.size(); ++i) {
        const int64_t rows = ws[i].rows;
        LinearParams p{
            x.data(),       tokens, cols, ws[i].view(), i == 1 ? biases[i].data() : nullptr,
            want[i].data(), rows};
        ASSERT_TRUE(Linear(p).ok());
        p.y = ys[i].data();
        ps.push_back(p);
      }
      ASSERT_TRUE(LinearGroup(ps).ok());
      for (size_t i = 0; i < types.size(); ++i) {
        SCOPED_TRACE(absl::StrCat("member ", i, " ", WeightTypeName(types[i])));
        EXPECT_EQ(ys[i], want[i]);
        const bool quant =
            cpu::IsQuantized(types[i]) &&
            cpu::ChooseMethod(types[i], tokens, ws[i].rows, cols, isa) != LinearMethod::kTileSgemm;
        Reference ref = Compute(srcs[i], Dequantized(srcs[i]), x, tokens, cols, ps[i].bias, quant);
        EXPECT_LE(WorstRatio(ys[i], ws[i].rows, ref, tokens, ws[i].rows), 1.0);
      }
      // Teeth: one changed weight byte in the last member shows up.
      Weight broken = ws.back();
      broken.bytes[broken.stride * 3 + broken.stride / 2] ^= 0x11;
      ps.back().w = broken.view();
      ASSERT_TRUE(LinearGroup(ps).ok());
      EXPECT_NE(ys.back(), want.back()) << "a changed weight byte went unnoticed";
    }
  ASSERT_TRUE(SetLinearIsa(before).ok());
}

INSTANTIATE_TEST_SUITE_P(AllPaths, LinearIsaTest, ::testing::ValuesIn(kAllIsas),
                         [](const ::testing::TestParamInfo<CpuIsa>& i) {
                           return std::string(CpuIsaName(i.param));
                         });

// Which paths this host tested, in the output of every run; Linear's default
// is the best path the CPU has (on an AVX2-only host: avx2).
TEST(LinearTest, IsaPathsOfThisHost) {
  std::string tested, missing;
  for (CpuIsa isa : kAllIsas)
    absl::StrAppend(CpuSupportsIsa(isa) ? &tested : &missing, " ", CpuIsaName(isa));
  std::printf(
      "Linear ISA paths tested on this host:%s; not tested (CPU lacks them):%s; "
      "Linear dispatches to %s\n",
      tested.c_str(), missing.empty() ? " none" : missing.c_str(), CpuIsaName(ActiveLinearIsa()));
  RecordProperty("isa_tested", tested);
  RecordProperty("isa_not_tested", missing);
  ExpectDispatchToBestPath();
  EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kPortable));
  for (CpuIsa isa : kAllIsas) {
    EXPECT_TRUE(CpuSupportsIsa(isa) || !RequiredIsa(isa))
        << "PAGEDSERVE_REQUIRE_CPU_ISAS names " << CpuIsaName(isa) << ", which this CPU lacks";
  }
}

// kAmxBf16 (AMX tiles over bf16 panels; kernels/cpu/linear_cpu.h, "AMX"): the
// bound of its contract, (2^-8 + 2^-9 + cols 2^-24) sum |x W| (+ 2^-23 |y| for
// the bias add), against the double-precision reference of the source rows,
// for Q4_0 / Q4_1 interleaved at load and every row-major format with a panel;
// whole and partial 32-row panels (claims of 16 rows give 8..24-row panels
// too; row-major: 9 and 45 rows), whole and partial token tiles, a partial
// k-chunk, with and without bias, one thread and the team; a token's outputs
// equal a one-token call's bit for bit; negative controls (zeroed scales,
// swapped rows, mins or high bits dropped) exceed the bound. On a CPU without
// AMX the method is refused (FailedPrecondition) and the output says the
// kernels were NOT tested; PAGEDSERVE_REQUIRE_CPU_ISAS naming "amx" makes that
// a failure.
TEST(LinearAmxTest, WithinBoundOfTheirSource) {
  std::mt19937 rng(29);
  if (!cpu::AmxBf16Supported()) {
    std::printf("AMX kernels NOT tested: this CPU or OS offers no AMX-BF16 tiles\n");
    const char* req = std::getenv("PAGEDSERVE_REQUIRE_CPU_ISAS");
    EXPECT_TRUE(req == nullptr || std::string(req).find("amx") == std::string::npos)
        << "PAGEDSERVE_REQUIRE_CPU_ISAS names amx, which this CPU lacks";
    Weight w = RandomWeight(rng, WeightType::kQ4_0, 16, 64, 0);
    Weight x8 = Interleaved(w);
    std::vector<float> x(32 * 64, 1.0f), y(32 * 16, 7.5f);
    LinearParams p{x.data(), 32, 64, x8.view(), nullptr, y.data(), 16};
    EXPECT_EQ(cpu::LinearWith(p, BestIsaOfThisCpu(), LinearMethod::kAmxBf16).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(y[0], 7.5f);
    EXPECT_NE(cpu::ChooseMethod(WeightType::kQ4_0x8, 128, 2048, 2048, BestIsaOfThisCpu()),
              LinearMethod::kAmxBf16);
    return;
  }
  std::printf("AMX kernels tested (AMX-TILE, AMX-BF16 present)\n");
  EXPECT_EQ(cpu::ChooseMethod(WeightType::kQ4_0x8, 128, 2048, 2048, CpuIsa::kAvx512),
            cpu::AmxBf16Usable() ? LinearMethod::kAmxBf16 : LinearMethod::kInterleaved8);
  EXPECT_EQ(cpu::ChooseMethod(WeightType::kQ4_0x8, 4, 2048, 2048, CpuIsa::kAvx512),
            LinearMethod::kInterleaved8);
  EXPECT_EQ(cpu::ChooseMethod(WeightType::kQ4_0x8, 128, 2048, 2048, CpuIsa::kAvx2),
            LinearMethod::kInterleaved8);
  EXPECT_EQ(cpu::ChooseMethod(WeightType::kQ4_K, 128, 2048, 2048, CpuIsa::kAvx512),
            cpu::AmxBf16Usable() ? LinearMethod::kAmxBf16 : LinearMethod::kPanel16);
  struct Shape {
    int64_t rows, cols;
  };
  const std::vector<Shape> legacy = {Shape{8, 32},  Shape{24, 96},  Shape{40, 576},
                                     Shape{64, 64}, Shape{72, 160}, Shape{1024, 512}};
  // K-quants: partial panels (9, 45 rows) and a partial k-chunk (1280 = 1024 + 256).
  const std::vector<Shape> kquant = {Shape{8, 256}, Shape{9, 256}, Shape{45, 512}, Shape{72, 1280},
                                     Shape{1024, 512}};
  // Q4_0 / Q4_1 interleaved at load (kTokenRows), then every row-major format
  // with a panel (kTokenColumns; Q4_0 / Q4_1 stay row-major where not
  // interleaved: PAGEDSERVE_CPU_REPACK=0).
  const std::vector<std::pair<WeightType, bool>> formats = {
      {WeightType::kQ4_0, true},  {WeightType::kQ4_1, true},    {WeightType::kQ4_0, false},
      {WeightType::kQ4_1, false}, {WeightType::kQ5_0, false},   {WeightType::kQ5_1, false},
      {WeightType::kQ8_0, false}, {WeightType::kIQ4_NL, false}, {WeightType::kQ4_K, false},
      {WeightType::kQ5_K, false}, {WeightType::kQ6_K, false},   {WeightType::kIQ4_XS, false}};
  for (const auto& [src, interleave] : formats) {
    EXPECT_TRUE(cpu::AmxHasPanel(interleave ? InterleavedRows8Of(src) : src));
    std::vector<Shape> shapes = cpu::UsesActBlock256(src) ? kquant : legacy;
    if (!interleave && !cpu::UsesActBlock256(src))
      shapes.insert(shapes.end(), {Shape{9, 96}, Shape{45, 160}});
    for (const Shape sh : shapes) {
      for (int64_t tokens : {1, 5, 16, 17, 33, 48}) {
        if (kLight && sh.rows == 1024 && tokens != 48) continue;
        SCOPED_TRACE(Describe(interleave ? InterleavedRows8Of(src) : src, CpuIsa::kAvx512,
                              LinearMethod::kAmxBf16, sh.rows, sh.cols, tokens));
        const Weight w = RandomWeight(rng, src, sh.rows, sh.cols, /*pad=*/5);
        const Weight x8 = interleave ? Interleaved(w) : w;
        const int64_t x_stride = sh.cols + 3, y_stride = sh.rows + 2;
        std::vector<float> x = RandomActs(rng, tokens * x_stride);
        std::vector<float> bias = RandomActs(rng, sh.rows);
        std::vector<float> y(tokens * y_stride, 7.5f);
        LinearParams p{
            x.data(), tokens,  x_stride, x8.view(), sh.rows % 16 == 8 ? bias.data() : nullptr,
            y.data(), y_stride};
        ASSERT_TRUE(cpu::LinearWith(p, CpuIsa::kAvx512, LinearMethod::kAmxBf16).ok());
        Reference ref = Compute(w, Dequantized(w), x, tokens, x_stride, p.bias, false);
        // The reference's fp32-summation bound is (cols + 8) 2^-24 sum|x W|:
        // rescale it to the AMX bound.
        const double scale =
            (std::ldexp(1.0, -8) + std::ldexp(1.0, -9) + sh.cols * std::ldexp(1.0, -24)) /
            ((sh.cols + 8) * std::ldexp(1.0, -24));
        for (size_t i = 0; i < ref.bound.size(); ++i)
          ref.bound[i] = ref.bound[i] * scale + std::ldexp(1.0, -23) * std::fabs(ref.y[i]);
        EXPECT_LE(WorstRatio(y, y_stride, ref, tokens, sh.rows), 1.0);
        for (int64_t t = 0; t < tokens; ++t)
          for (int64_t r = sh.rows; r < y_stride; ++r) ASSERT_EQ(y[t * y_stride + r], 7.5f);
        ExpectTokensIndependent(p, CpuIsa::kAvx512, LinearMethod::kAmxBf16, 7);
        if (tokens != 17 || sh.rows > 72) continue;
        for (const auto& [broken, what] : interleave ? BrokenInterleaved(x8) : BrokenRows(x8)) {
          p.w = broken.view();
          ASSERT_TRUE(cpu::LinearWith(p, CpuIsa::kAvx512, LinearMethod::kAmxBf16).ok());
          EXPECT_GT(WorstRatio(y, y_stride, ref, tokens, sh.rows), 1.0) << what << " passed";
        }
      }
    }
  }
  // Formats without an AMX panel and the other paths are refused.
  Weight w = RandomWeight(rng, WeightType::kQ3_K, 16, 256, 0);
  std::vector<float> x(32 * 256, 1.0f), y(32 * 16, 7.5f);
  LinearParams p{x.data(), 32, 256, w.view(), nullptr, y.data(), 16};
  EXPECT_EQ(cpu::LinearWith(p, CpuIsa::kAvx512, LinearMethod::kAmxBf16).code(),
            absl::StatusCode::kInvalidArgument);
  p.x_stride = 64;
  p.w = Interleaved(RandomWeight(rng, WeightType::kQ4_0, 16, 64, 0)).view();
  EXPECT_EQ(cpu::LinearWith(p, CpuIsa::kAvx2, LinearMethod::kAmxBf16).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(LinearTest, UnsupportedIsaIsRefused) {
  for (CpuIsa isa : kAllIsas) {
    if (CpuSupportsIsa(isa)) continue;
    EXPECT_EQ(SetLinearIsa(isa).code(), absl::StatusCode::kFailedPrecondition);
  }
  EXPECT_TRUE(CpuSupportsIsa(CpuIsa::kPortable));
}

TEST(LinearTest, GroupValidates) {
  std::mt19937 rng(22);
  Weight a = RandomWeight(rng, WeightType::kQ4_1, 40, 64, 0);
  Weight b = RandomWeight(rng, WeightType::kQ8_0, 24, 64, 0);
  Weight c = RandomWeight(rng, WeightType::kQ8_0, 24, 96, 0);
  std::vector<float> x = RandomActs(rng, 2 * 96), x2 = x, ya(2 * 40), yb(2 * 24);
  LinearParams pa{x.data(), 2, 64, a.view(), nullptr, ya.data(), 40};
  LinearParams pb{x.data(), 2, 64, b.view(), nullptr, yb.data(), 24};
  EXPECT_TRUE(LinearGroup(std::vector<LinearParams>{}).ok());
  EXPECT_TRUE(LinearGroup(std::vector<LinearParams>{pa, pb}).ok());
  LinearParams other_x = pb;
  other_x.x = x2.data();
  EXPECT_EQ(LinearGroup(std::vector<LinearParams>{pa, other_x}).code(),
            absl::StatusCode::kInvalidArgument);
  LinearParams other_cols{x.data(), 2, 96, c.view(), nullptr, yb.data(), 24};
  EXPECT_EQ(LinearGroup(std::vector<LinearParams>{pa, other_cols}).code(),
            absl::StatusCode::kInvalidArgument);
  LinearParams same_y = pb;
  same_y.y = ya.data() + 10;
  EXPECT_EQ(LinearGroup(std::vector<LinearParams>{pa, same_y}).code(),
            absl::StatusCode::kInvalidArgument);
  LinearParams bad_member = pb;
  bad_member.y_stride = 3;
  EXPECT_EQ(LinearGroup(std::vector<LinearParams>{pa, bad_member}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinearTest, DequantizeRowToFloatValidates) {
  std::vector<uint8_t> row(18);
  std::vector<float> out(32);
  EXPECT_TRUE(DequantizeRowToFloat(WeightType::kQ4_0, row.data(), 32, out.data()).ok());
  EXPECT_EQ(DequantizeRowToFloat(WeightType::kQ4_0, row.data(), 48, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRowToFloat(WeightType::kQ4_0, nullptr, 32, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DequantizeRowToFloat(static_cast<WeightType>(16), row.data(), 256, out.data()).code(),
            absl::StatusCode::kInvalidArgument);
}

// Activation quantization: |x - d q| <= d / 2, and the stored sums match the codes.
TEST(LinearTest, ActivationQuantizationBounds) {
  std::mt19937 rng(16);
  std::vector<float> x = RandomActs(rng, 512);
  x[5] = 0.0f;
  std::fill(x.begin() + 256, x.begin() + 288, 0.0f);  // an all-zero block
  std::vector<cpu::ActBlock32> b32(16);
  cpu::QuantizeActs32(x.data(), 512, b32.data());
  for (int b = 0; b < 16; ++b) {
    int sum = 0;
    for (int i = 0; i < 32; ++i) {
      const float xi = x[32 * b + i];
      EXPECT_LE(std::fabs(xi - b32[b].d * b32[b].qs[i]), b32[b].d / 2 * 1.0001f + 1e-30f);
      sum += b32[b].qs[i];
    }
    EXPECT_EQ(sum, b32[b].sum);
  }
  EXPECT_EQ(b32[8].d, 0.0f);
  std::vector<cpu::ActBlock256> b256(2);
  cpu::QuantizeActs256(x.data(), 512, b256.data());
  for (int b = 0; b < 2; ++b)
    for (int k = 0; k < 16; ++k) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) {
        const float xi = x[256 * b + 16 * k + i];
        EXPECT_LE(std::fabs(xi - b256[b].d * b256[b].qs[16 * k + i]), b256[b].d / 2 * 1.0001f);
        sum += b256[b].qs[16 * k + i];
      }
      EXPECT_EQ(sum, b256[b].bsums[k]);
    }
}

TEST(WeightFormatTest, InterleavedQ4_0ViewsAndRepackValidate) {
  std::vector<uint8_t> bytes(68 * 16), dst(bytes.size());  // room for Q8_0 rows of 64
  WeightView v{WeightType::kQ4_0x8, 16, 64, bytes.data(), 36};
  EXPECT_TRUE(ValidateWeightView(v).ok());
  EXPECT_STREQ(WeightTypeName(WeightType::kQ4_0x8), "Q4_0x8");
  EXPECT_STREQ(WeightTypeName(WeightType::kQ4_1x8), "Q4_1x8");
  EXPECT_EQ(BlockBytes(WeightType::kQ4_1x8), 20u);
  EXPECT_FALSE(IsWeightType(static_cast<uint32_t>(WeightType::kQ4_0x8)))
      << "no file may name the in-memory layout";
  EXPECT_FALSE(IsWeightType(static_cast<uint32_t>(WeightType::kQ4_1x8)));
  v.rows = 12;
  EXPECT_NE(std::string(ValidateWeightView(v).message()).find("multiple of 8"), std::string::npos);
  v.rows = 16;
  v.row_stride_bytes = 40;
  EXPECT_EQ(ValidateWeightView(v).code(), absl::StatusCode::kInvalidArgument);
  float row[64];
  EXPECT_EQ(DequantizeRowToFloat(WeightType::kQ4_0x8, bytes.data(), 64, row).code(),
            absl::StatusCode::kInvalidArgument);

  WeightView q{WeightType::kQ4_0, 16, 64, bytes.data(), 36};
  EXPECT_TRUE(InterleaveRows8(q, dst.data()).ok());
  EXPECT_EQ(InterleaveRows8(q, nullptr).code(), absl::StatusCode::kInvalidArgument);
  q.rows = 12;
  EXPECT_NE(std::string(InterleaveRows8(q, dst.data()).message()).find("multiple of 8"),
            std::string::npos);
  q.rows = 16;
  q.type = WeightType::kQ4_1;
  q.row_stride_bytes = 40;
  EXPECT_TRUE(InterleaveRows8(q, dst.data()).ok()) << "Q4_1 interleaves too";
  q.type = WeightType::kQ8_0;
  q.row_stride_bytes = 68;
  EXPECT_NE(std::string(InterleaveRows8(q, dst.data()).message()).find("takes Q4_0 or Q4_1"),
            std::string::npos);
  // PrefersInterleavedRows8: Q4_0 with rows % 8 == 0 on a path that runs it.
  q = WeightView{WeightType::kQ4_0, 16, 64, bytes.data(), 36};
  const bool x86 = cpu::KernelsFor(ActiveLinearIsa()).i8q4_0 != nullptr;
  const char* env = std::getenv("PAGEDSERVE_CPU_REPACK");
  if (env == nullptr || std::string(env) != "0") {
    EXPECT_EQ(PrefersInterleavedRows8(q), x86);
  } else {
    EXPECT_FALSE(PrefersInterleavedRows8(q));
  }
  q.rows = 12;
  EXPECT_FALSE(PrefersInterleavedRows8(q));
  q.rows = 16;
  q.type = WeightType::kQ8_0;
  q.row_stride_bytes = 68;
  EXPECT_FALSE(PrefersInterleavedRows8(q));
}

TEST(WeightFormatTest, BlockGeometryMatchesGgml) {
  for (WeightType type : kAllTypes) {
    GgmlBlockInfo info;
    ASSERT_TRUE(GetGgmlBlockInfo(static_cast<GgmlType>(type), &info)) << WeightTypeName(type);
    EXPECT_EQ(BlockElems(type), info.block_elements) << WeightTypeName(type);
    EXPECT_EQ(BlockBytes(type), info.block_bytes) << WeightTypeName(type);
    EXPECT_EQ(WeightTypeName(type), GgmlTypeName(static_cast<GgmlType>(type)));
    EXPECT_TRUE(IsWeightType(static_cast<uint32_t>(type)));
  }
  EXPECT_FALSE(IsWeightType(16));  // IQ2_XXS: not a Linear format
  EXPECT_FALSE(IsWeightType(39));  // MXFP4
  EXPECT_EQ(*RowBytes(WeightType::kQ4_K, 512), 288u);
  EXPECT_EQ(RowBytes(WeightType::kQ4_0, 48).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RowBytes(static_cast<WeightType>(16), 256).status().code(),
            absl::StatusCode::kInvalidArgument);
}

class LinearValidationTest : public ::testing::Test {
 protected:
  LinearValidationTest()
      : rng_(3),
        w_(RandomWeight(rng_, WeightType::kQ8_0, 8, 64, 0)),
        x_(RandomActs(rng_, 2 * 64)),
        y_(2 * 8, 42.0f) {
    p_ = LinearParams{x_.data(), 2, 64, w_.view(), nullptr, y_.data(), 8};
  }
  void ExpectRejected(const LinearParams& p, const std::string& field) {
    absl::Status s = Linear(p);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_NE(s.message().find(field), std::string::npos) << s << " does not name " << field;
    for (float v : y_) ASSERT_EQ(v, 42.0f);
  }
  std::mt19937 rng_;
  Weight w_;
  std::vector<float> x_, y_;
  LinearParams p_;
};

TEST_F(LinearValidationTest, RejectsBadParams) {
  ASSERT_TRUE(Linear(p_).ok());
  std::fill(y_.begin(), y_.end(), 42.0f);
  LinearParams p = p_;
  p.x = nullptr;
  ExpectRejected(p, "x");
  p = p_;
  p.y = nullptr;
  ExpectRejected(p, "y");
  p = p_;
  p.num_tokens = -1;
  ExpectRejected(p, "num_tokens");
  p = p_;
  p.x_stride = 63;
  ExpectRejected(p, "x_stride");
  p = p_;
  p.y_stride = 7;
  ExpectRejected(p, "y_stride");
  p = p_;
  p.w.cols = 48;
  ExpectRejected(p, "w.cols");
  p = p_;
  p.w.cols = 0;
  ExpectRejected(p, "w.cols");
  p = p_;
  p.w.rows = 0;
  ExpectRejected(p, "w.rows");
  p = p_;
  p.w.data = nullptr;
  ExpectRejected(p, "w.data");
  p = p_;
  p.w.row_stride_bytes = 67;
  ExpectRejected(p, "w.row_stride_bytes");
  p = p_;
  p.w.type = static_cast<WeightType>(16);
  ExpectRejected(p, "w.type");
  p = p_;
  p.y = x_.data() + 8;
  ExpectRejected(p, "overlaps x");
  p = p_;
  p.bias = y_.data() + 4;
  ExpectRejected(p, "overlaps bias");
  std::vector<float> wf(8 * 64 + 1);
  p = p_;
  p.w = WeightView{WeightType::kF32, 8, 64, wf.data(), 258};
  ExpectRejected(p, "4-byte aligned");
  p = p_;
  p.num_tokens = 0;
  p.x = nullptr;
  p.y = nullptr;
  EXPECT_TRUE(Linear(p).ok());
}

}  // namespace
}  // namespace pagedserve::kernels
