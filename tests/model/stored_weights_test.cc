// SmolLM2-135M-Instruct (Q4_1 GGUF) loaded in its stored formats (WeightDType::kAuto)
// and converted to fp16: every row of every matrix, read back through
// Matrix::RowToFloat, must equal the float32 load (the path checked against
// gguf-py / transformers in smollm2_weights_test.cc) — bit for bit for kAuto,
// as fp16 rounding of it for kFloat16 — at TP=1 and for each rank at TP=3
// (permuted Q/K rows moved as quantized blocks, column slices of o/down
// copied block-wise). Matrices used as stored are memory-mapped, not copied.
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "runtime/model/weights.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

// Every row of `got` (any representation) equals `want` (fp32) after `round`.
template <typename Round>
void ExpectRowsEqual(const Matrix& got, const Matrix& want, Round round, const std::string& what) {
  ASSERT_EQ(got.rows, want.rows) << what;
  ASSERT_EQ(got.cols, want.cols) << what;
  ASSERT_TRUE(want.is_fp32()) << what;
  std::vector<float> row(got.cols);
  for (int64_t r = 0; r < got.rows; ++r) {
    ASSERT_TRUE(got.RowToFloat(r, row.data()).ok()) << what;
    for (int64_t c = 0; c < got.cols; ++c) {
      const float w = round(want.row(r)[c]);
      // Bit for bit (-0 vs +0 and NaN payloads differ), not float ==.
      ASSERT_EQ(std::bit_cast<uint32_t>(row[c]), std::bit_cast<uint32_t>(w))
          << what << " row " << r << " col " << c << ": " << row[c] << " vs " << w;
    }
  }
}

float Same(float v) { return v; }
float ViaHalf(float v) { return kernels::HalfBitsToFloat(kernels::FloatToHalfBits(v)); }

template <typename Round>
void ExpectSameModel(const LlamaWeights& got, const LlamaWeights& want, Round round) {
  ExpectRowsEqual(got.embed_tokens, want.embed_tokens, round, "embed_tokens");
  EXPECT_EQ(got.final_norm, want.final_norm);
  for (size_t l = 0; l < want.layers.size(); ++l) {
    const LayerWeights& g = got.layers[l];
    const LayerWeights& w = want.layers[l];
    const std::string p = "layer " + std::to_string(l) + " ";
    ExpectRowsEqual(g.q_proj, w.q_proj, round, p + "q_proj");
    ExpectRowsEqual(g.k_proj, w.k_proj, round, p + "k_proj");
    ExpectRowsEqual(g.v_proj, w.v_proj, round, p + "v_proj");
    ExpectRowsEqual(g.o_proj, w.o_proj, round, p + "o_proj");
    ExpectRowsEqual(g.gate_proj, w.gate_proj, round, p + "gate_proj");
    ExpectRowsEqual(g.up_proj, w.up_proj, round, p + "up_proj");
    ExpectRowsEqual(g.down_proj, w.down_proj, round, p + "down_proj");
    EXPECT_EQ(g.input_layernorm, w.input_layernorm);
    EXPECT_EQ(g.post_attention_layernorm, w.post_attention_layernorm);
  }
}

uint64_t MatrixBytes(const LlamaWeights& w) {
  uint64_t n = w.embed_tokens.size_bytes() + w.lm_head.size_bytes();
  for (const LayerWeights& L : w.layers) {
    for (const Matrix* m :
         {&L.q_proj, &L.k_proj, &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj})
      n += m->size_bytes();
  }
  return n;
}

class StoredWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::pagedserve::testing::ModelPath();
    if (path_.empty()) GTEST_SKIP() << "PAGEDSERVE_MODEL is not set";
  }
  std::string path_;
};

TEST_F(StoredWeightsTest, AutoKeepsStoredRowsMappedAndEqualToFloat32) {
  auto f32 = LoadLlamaWeights(path_, 0, 1, WeightDType::kFloat32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(f32->mapping, nullptr);  // nothing points into the file
  auto st = LoadLlamaWeights(path_, 0, 1, WeightDType::kAuto);
  ASSERT_TRUE(st.ok()) << st.status();
  ASSERT_NE(st->mapping, nullptr);
  ExpectSameModel(*st, *f32, Same);

  const LayerWeights& L = st->layers[3];
  EXPECT_EQ(L.v_proj.type, GgmlType::kQ4_1);
  EXPECT_FALSE(L.v_proj.is_fp32());
  // At TP=1 unpermuted matrices are the file's bytes; Q/K are row-permuted copies.
  for (const Matrix* m : std::initializer_list<const Matrix*>{
           &L.v_proj, &L.o_proj, &L.gate_proj, &L.up_proj, &L.down_proj, &st->embed_tokens}) {
    EXPECT_NE(m->mapped, nullptr);
    EXPECT_TRUE(m->owned.empty());
  }
  EXPECT_TRUE(L.q_proj.mapped == nullptr && !L.q_proj.owned.empty());
  // The matrices take the file's bytes (under its size), not 4-8x.
  auto file_size = [&] {
    FILE* f = std::fopen(path_.c_str(), "rb");
    std::fseek(f, 0, SEEK_END);
    const long n = std::ftell(f);
    std::fclose(f);
    return static_cast<uint64_t>(n);
  }();
  EXPECT_LT(MatrixBytes(*st), file_size);
  EXPECT_GT(MatrixBytes(*f32), 4 * file_size);
}

TEST_F(StoredWeightsTest, TensorParallelShardsOfStoredRowsEqualFloat32) {
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r) + " of 3");
    auto f32 = LoadLlamaWeights(path_, r, 3, WeightDType::kFloat32);
    ASSERT_TRUE(f32.ok()) << f32.status();
    auto st = LoadLlamaWeights(path_, r, 3, WeightDType::kAuto);
    ASSERT_TRUE(st.ok()) << st.status();
    ExpectSameModel(*st, *f32, Same);
    const LayerWeights& L = st->layers[0];
    // Column slices (192 of 576, 512 of 1536 columns) fall on Q4_1 blocks.
    EXPECT_EQ(L.o_proj.type, GgmlType::kQ4_1);
    EXPECT_FALSE(L.o_proj.owned.empty());
    EXPECT_EQ(L.down_proj.row_bytes, 512 / 32 * 20u);
    EXPECT_NE(L.gate_proj.mapped, nullptr);  // a row slice is used in place
  }
}

TEST_F(StoredWeightsTest, Float16ConvertsEveryMatrix) {
  auto f32 = LoadLlamaWeights(path_, 1, 3, WeightDType::kFloat32);
  ASSERT_TRUE(f32.ok()) << f32.status();
  auto h = LoadLlamaWeights(path_, 1, 3, WeightDType::kFloat16);
  ASSERT_TRUE(h.ok()) << h.status();
  EXPECT_EQ(h->layers[0].q_proj.type, GgmlType::kF16);
  EXPECT_EQ(h->embed_tokens.type, GgmlType::kF16);
  ExpectSameModel(*h, *f32, ViaHalf);
}

// A copy of the default model whose tensor `tensor` can be given another
// type id in its GGUF tensor info (SetType; the type must take fewer bytes per
// row than Q4_1, the data stays in place). Written once (the disk is slow),
// patched in place, removed at the end.
class PatchedModel {
 public:
  PatchedModel(const std::string& path, const std::string& tensor)
      : path_(::pagedserve::testing::MakeTempDir() + "/patched.gguf") {
    std::ifstream in(path, std::ios::binary | std::ios::ate);
    std::string bytes(static_cast<size_t>(in.tellg()), '\0');
    in.seekg(0);
    in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    // A tensor info: u64 name length, name, u32 n_dims, u64 dims[n_dims], u32 type.
    const uint64_t len = tensor.size();
    std::string key(reinterpret_cast<const char*>(&len), 8);
    key += tensor;
    const size_t at = bytes.find(key);
    EXPECT_NE(at, std::string::npos) << tensor;
    uint32_t n_dims = 0;
    if (at != std::string::npos) std::memcpy(&n_dims, &bytes[at + key.size()], 4);
    type_at_ = at + key.size() + 4 + 8 * n_dims;
    std::ofstream(path_, std::ios::binary)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  ~PatchedModel() { std::remove(path_.c_str()); }
  const std::string& SetType(uint32_t type) {
    std::fstream f(path_, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(type_at_));
    f.write(reinterpret_cast<const char*>(&type), 4);
    return path_;
  }

 private:
  std::string path_;
  size_t type_at_ = 0;
};

// Types the kernels do not run (other IQ types, ternary, MXFP4) are refused at
// load with an error naming the tensor and its type (in --dtype float32 too):
// never expanded to fp32 silently.
TEST_F(StoredWeightsTest, UnsupportedTypesRefusedNamingTensorAndType) {
  PatchedModel patched(path_, "blk.0.ffn_down.weight");
  for (const auto& [id, name] : {std::pair{16u, "IQ2_XXS"}, std::pair{19u, "IQ1_S"},
                                 std::pair{35u, "TQ2_0"}, std::pair{39u, "MXFP4"}}) {
    for (WeightDType d : {WeightDType::kAuto, WeightDType::kFloat32}) {
      if (d == WeightDType::kFloat32 && id != 16) continue;  // (fp32 loads are slow)
      auto w = LoadLlamaWeights(patched.SetType(id), 0, 1, d);
      ASSERT_FALSE(w.ok()) << name;
      EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented) << w.status();
      EXPECT_NE(
          w.status().message().find(std::string("tensor 'blk.0.ffn_down.weight' has type ") + name),
          std::string::npos)
          << w.status();
    }
  }
  // The patch itself is harmless: the Q4_1 id written back loads.
  EXPECT_TRUE(LoadLlamaWeights(patched.SetType(3), 0, 1, WeightDType::kAuto).ok());
}

TEST(WeightDTypeTest, ParsesItsNames) {
  for (WeightDType d :
       {WeightDType::kAuto, WeightDType::kFloat32, WeightDType::kFloat16, WeightDType::kBFloat16}) {
    auto p = ParseWeightDType(WeightDTypeName(d));
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, d);
  }
  auto bad = ParseWeightDType("fp8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("fp8"), std::string::npos);
}

}  // namespace
}  // namespace pagedserve
