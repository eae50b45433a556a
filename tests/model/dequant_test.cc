// Dequantization against gguf-py (fixtures from make_dequant_fixtures.py).
#include "runtime/model/dequant.h"

#include <cmath>

#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

using ::pagedserve::testing::F32Tensor;
using ::pagedserve::testing::FixturePath;

class DequantTest : public ::testing::TestWithParam<const char*> {};

// Max |a - b| / (1 + |b|): gguf-py computes in float32 with numpy's operation
// order, so tiny rounding differences are allowed, nothing more.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i;
    double e = std::abs(double(got[i]) - double(want[i])) / (1.0 + std::abs(double(want[i])));
    if (e > worst) {
      worst = e;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, 2e-6) << what << " element " << worst_i << ": got " << got[worst_i] << " want "
                         << want[worst_i];
}

TEST_P(DequantTest, MatchesGgufPy) {
  auto f = GgufFile::Open(FixturePath());
  ASSERT_TRUE(f.ok()) << f.status();
  const std::string name = std::string("synth.") + GetParam();
  const GgufTensorInfo* t = (*f)->FindTensor(name);
  ASSERT_NE(t, nullptr) << name;
  EXPECT_EQ(GgmlTypeName(t->type), GetParam());
  ASSERT_TRUE(CanDequantize(t->type));
  std::vector<float> want = F32Tensor(**f, name + ".expected");
  ASSERT_EQ(want.size(), t->num_elements);
  // Whole tensor.
  std::vector<float> got(t->num_elements);
  ASSERT_TRUE(DequantizeRows(*t, (*f)->TensorData(*t), 0, t->num_rows(), got.data()).ok());
  ExpectClose(got, want, name);
  // A single middle row reads only that row.
  const uint64_t cols = t->dims[0];
  std::vector<float> row(cols);
  ASSERT_TRUE(DequantizeRows(*t, (*f)->TensorData(*t), 2, 3, row.data()).ok());
  ExpectClose(row, std::vector<float>(want.begin() + 2 * cols, want.begin() + 3 * cols),
              name + " row 2");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, DequantTest,
                         ::testing::Values("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
                                           "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL",
                                           "IQ4_XS"),
                         [](const auto& info) { return std::string(info.param); });

TEST(DequantSmolTest, FirstRowsMatchGgufPy) {
  const std::string path = ::pagedserve::testing::ModelPath();
  if (path.empty()) GTEST_SKIP() << "PAGEDSERVE_MODEL is not set";
  auto fix = GgufFile::Open(FixturePath());
  ASSERT_TRUE(fix.ok()) << fix.status();
  auto model = GgufFile::Open(path);
  ASSERT_TRUE(model.ok()) << model.status();
  for (const char* name : {"token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight",
                           "blk.29.ffn_up.weight", "blk.0.attn_norm.weight"}) {
    std::vector<float> want = F32Tensor(**fix, std::string("smol.") + name + ".rows");
    const GgufTensorInfo* t = (*model)->FindTensor(name);
    ASSERT_NE(t, nullptr) << name;
    const uint64_t rows = want.size() / t->dims[0];
    ASSERT_EQ(rows * t->dims[0], want.size());
    std::vector<float> got(want.size());
    ASSERT_TRUE(DequantizeRows(*t, (*model)->TensorData(*t), 0, rows, got.data()).ok());
    ExpectClose(got, want, name);
  }
}

TEST(DequantErrorTest, SizeAndTypeErrors) {
  std::vector<uint8_t> block(20);
  std::vector<float> out(64);
  // Q4_1 needs 20 bytes per 32 elements.
  EXPECT_TRUE(DequantizeRow(GgmlType::kQ4_1, block, out.data(), 32).ok());
  auto s = DequantizeRow(GgmlType::kQ4_1, block, out.data(), 64);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("Q4_1"), std::string::npos) << s;
  EXPECT_FALSE(DequantizeRow(GgmlType::kQ4_1, block, out.data(), 31).ok());
  EXPECT_EQ(DequantizeRow(GgmlType::kQ8_K, block, out.data(), 32).code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_FALSE(CanDequantize(GgmlType::kQ8_1));
}

TEST(DequantErrorTest, RowRangeChecked) {
  auto f = GgufFile::Open(FixturePath());
  ASSERT_TRUE(f.ok());
  const GgufTensorInfo* t = (*f)->FindTensor("synth.Q6_K");
  ASSERT_NE(t, nullptr);
  std::vector<float> out(t->num_elements);
  auto s = DequantizeRows(*t, (*f)->TensorData(*t), 3, 5, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("synth.Q6_K"), std::string::npos);
  EXPECT_FALSE(DequantizeRows(*t, (*f)->TensorData(*t), 2, 1, out.data()).ok());
}

TEST(DequantScalarTest, HalfAndBfloat) {
  EXPECT_EQ(Fp16ToFp32(0x3c00), 1.0f);
  EXPECT_EQ(Fp16ToFp32(0xc000), -2.0f);
  EXPECT_EQ(Fp16ToFp32(0x7bff), 65504.0f);
  EXPECT_EQ(Fp16ToFp32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_TRUE(std::isinf(Fp16ToFp32(0x7c00)));
  EXPECT_TRUE(std::isnan(Fp16ToFp32(0x7e00)));
  EXPECT_EQ(Bf16ToFp32(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFp32(0xc0a0), -5.0f);
}

}  // namespace
}  // namespace pagedserve
