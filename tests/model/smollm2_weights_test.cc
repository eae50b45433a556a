// SmolLM2-135M-Instruct from GGUF: config, dequantized weights in Hugging Face
// orientation (Q/K un-permuted, checked against transformers' GGUF reader via
// the fixture), and the TP=3 split concatenating back to the TP=1 weights.
#include <cmath>

#include "gtest/gtest.h"
#include "runtime/model/weights.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

using ::pagedserve::testing::F32Tensor;
using ::pagedserve::testing::FixturePath;

// Columns [0, ncols) of rows [r0, r1) of m.
std::vector<float> Block(const Matrix& m, int64_t r0, int64_t r1, int64_t ncols) {
  std::vector<float> out;
  for (int64_t r = r0; r < r1; ++r) out.insert(out.end(), m.row(r), m.row(r) + ncols);
  return out;
}

void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-6 * (1 + std::abs(want[i]))) << what << " element " << i;
  }
}

class SmolLM2WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::pagedserve::testing::ModelPath();
    if (path_.empty()) GTEST_SKIP() << "PAGEDSERVE_MODEL is not set";
  }
  std::string path_;
};

TEST_F(SmolLM2WeightsTest, MatchesReferenceAndShardsConcatenate) {
  auto fix = GgufFile::Open(FixturePath());
  ASSERT_TRUE(fix.ok()) << fix.status();
  auto full = LoadLlamaWeights(path_);
  ASSERT_TRUE(full.ok()) << full.status();
  const ModelConfig& c = full->config;
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_TRUE(full->lm_head.empty());
  EXPECT_EQ(full->embed_tokens.rows, 49152);
  EXPECT_EQ(full->embed_tokens.cols, 576);
  ASSERT_EQ(full->layers.size(), 30u);
  const LayerWeights& L0 = full->layers[0];
  EXPECT_EQ(L0.q_proj.rows, 576);
  EXPECT_EQ(L0.k_proj.rows, 192);
  EXPECT_EQ(L0.o_proj.cols, 576);
  EXPECT_EQ(L0.down_proj.rows, 576);
  EXPECT_EQ(L0.down_proj.cols, 1536);

  // gguf-py's dequantization of rows that need no permutation.
  ExpectNear(Block(full->embed_tokens, 0, 3, 576), F32Tensor(**fix, "smol.token_embd.weight.rows"),
             "embed");
  ExpectNear(Block(L0.down_proj, 0, 2, 1536), F32Tensor(**fix, "smol.blk.0.ffn_down.weight.rows"),
             "down");
  ExpectNear(Block(full->layers[29].up_proj, 0, 2, 576),
             F32Tensor(**fix, "smol.blk.29.ffn_up.weight.rows"), "up 29");
  ExpectNear(L0.input_layernorm, F32Tensor(**fix, "smol.blk.0.attn_norm.weight.rows"), "norm");
  // Q and K in Hugging Face order (transformers' reverse permutation).
  ExpectNear(Block(L0.q_proj, 0, 128, 32), F32Tensor(**fix, "smol.q.hf"), "q hf order");
  ExpectNear(Block(L0.k_proj, 64, 128, 32), F32Tensor(**fix, "smol.k.hf"), "k hf order");
  // And not in the stored order: the first rows differ from the raw GGUF rows.
  std::vector<float> raw = F32Tensor(**fix, "smol.blk.0.attn_q.weight.rows");
  EXPECT_NE(Block(L0.q_proj, 1, 2, 576), std::vector<float>(raw.begin() + 576, raw.end()));

  // TP = 3: one KV head per rank; concatenations give the full weights.
  std::vector<LlamaWeights> ranks;
  for (int r = 0; r < 3; ++r) {
    auto w = LoadLlamaWeights(path_, r, 3);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(w->shard.num_heads, 3);
    EXPECT_EQ(w->shard.num_kv_heads, 1);
    EXPECT_EQ(w->shard.first_kv_head, r);
    EXPECT_EQ(w->shard.intermediate_size, 512);
    ranks.push_back(std::move(*w));
  }
  for (int l : {0, 17, 29}) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const LayerWeights& F = full->layers[l];
    std::vector<float> q, k, v, gate, up;
    for (const auto& w : ranks) {
      const LayerWeights& R = w.layers[l];
      q.insert(q.end(), R.q_proj.data.begin(), R.q_proj.data.end());
      k.insert(k.end(), R.k_proj.data.begin(), R.k_proj.data.end());
      v.insert(v.end(), R.v_proj.data.begin(), R.v_proj.data.end());
      gate.insert(gate.end(), R.gate_proj.data.begin(), R.gate_proj.data.end());
      up.insert(up.end(), R.up_proj.data.begin(), R.up_proj.data.end());
      EXPECT_EQ(R.post_attention_layernorm, F.post_attention_layernorm);
    }
    EXPECT_EQ(q, F.q_proj.data);
    EXPECT_EQ(k, F.k_proj.data);
    EXPECT_EQ(v, F.v_proj.data);
    EXPECT_EQ(gate, F.gate_proj.data);
    EXPECT_EQ(up, F.up_proj.data);
    for (int64_t row = 0; row < 576; row += 97) {
      std::vector<float> o, down;
      for (const auto& w : ranks) {
        const LayerWeights& R = w.layers[l];
        o.insert(o.end(), R.o_proj.row(row), R.o_proj.row(row) + R.o_proj.cols);
        down.insert(down.end(), R.down_proj.row(row), R.down_proj.row(row) + R.down_proj.cols);
      }
      EXPECT_EQ(o, std::vector<float>(F.o_proj.row(row), F.o_proj.row(row) + 576));
      EXPECT_EQ(down, std::vector<float>(F.down_proj.row(row), F.down_proj.row(row) + 1536));
    }
  }
  EXPECT_EQ(ranks[2].embed_tokens.data, full->embed_tokens.data);
  EXPECT_EQ(ranks[1].final_norm, full->final_norm);
  EXPECT_FALSE(LoadLlamaWeights(path_, 0, 2).ok());  // 9 heads do not split in 2
}

}  // namespace
}  // namespace pagedserve
