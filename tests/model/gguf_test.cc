// GGUF parsing: metadata of every value type (a file written by gguf-py's
// GGUFWriter, tests/model/make_dequant_fixtures.py) and the SmolLM2 model.
#include "runtime/model/gguf.h"

#include "gtest/gtest.h"
#include "runtime/model/model_config.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

using ::pagedserve::testing::FixturePath;
using ::pagedserve::testing::ModelPath;

TEST(GgufTest, FixtureMetadataOfEveryType) {
  auto f = GgufFile::Open(FixturePath());
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(*g.GetString("general.architecture"), "fixture");
  EXPECT_EQ(g.Find("fixture.u8")->type(), GgufValueType::kUint8);
  EXPECT_EQ(*g.GetUint("fixture.u8"), 200u);
  EXPECT_EQ(g.Find("fixture.i8")->type(), GgufValueType::kInt8);
  EXPECT_EQ(*g.GetInt("fixture.i8"), -100);
  EXPECT_EQ(*g.GetUint("fixture.u16"), 60000u);
  EXPECT_EQ(*g.GetInt("fixture.i16"), -30000);
  EXPECT_EQ(*g.GetUint("fixture.u32"), 4000000000u);
  EXPECT_EQ(*g.GetInt("fixture.i32"), -2000000000);
  EXPECT_EQ(*g.GetUint("fixture.u64"), 18000000000000000000ull);
  EXPECT_EQ(g.GetInt("fixture.u64").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*g.GetInt("fixture.i64"), -9000000000000000000ll);
  EXPECT_EQ(g.GetUint("fixture.i64").status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(*g.GetFloat("fixture.f32"), 1.5);
  EXPECT_EQ(*g.GetFloat("fixture.f64"), -2.25e100);
  EXPECT_EQ(*g.GetBool("fixture.bool"), true);
  EXPECT_EQ(*g.GetString("fixture.str"), "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");
  EXPECT_EQ(*g.GetStringArray("fixture.arr_str"), (std::vector<std::string>{"a", "", "\xc3\xbc"}));
  EXPECT_EQ(*g.GetIntArray("fixture.arr_i32"), (std::vector<int32_t>{1, -2, 3}));
  EXPECT_EQ(*g.GetFloatArray("fixture.arr_f32"), (std::vector<float>{0.5f, -1.25f}));
  const GgufValue* nested = g.Find("fixture.arr_nested");
  ASSERT_NE(nested, nullptr);
  ASSERT_TRUE(nested->is_array());
  EXPECT_EQ(nested->array_type(), GgufValueType::kArray);
  ASSERT_EQ(nested->array_size(), 2u);
  auto first = nested->At(0);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(*first->AsInt64Array(), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(*nested->At(1)->AsInt64Array(), (std::vector<int64_t>{3}));
  EXPECT_FALSE(nested->At(2).ok());

  // Errors name the file and key.
  auto missing = g.GetString("no.such.key");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("no.such.key"), std::string::npos);
  EXPECT_NE(missing.status().message().find("dequant_fixtures.gguf"), std::string::npos);
  auto wrong = g.GetString("fixture.u8");
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("fixture.u8"), std::string::npos) << wrong.status();
  EXPECT_NE(wrong.status().message().find("uint8"), std::string::npos) << wrong.status();
  EXPECT_FALSE(g.GetIntArray("fixture.arr_str").ok());
  EXPECT_FALSE(g.GetBool("fixture.u8").ok());
  EXPECT_EQ(GgufValueTypeName(GgufValueType::kFloat64), "float64");

  // Tensor infos: the synthetic Q4_1 tensor is 4 x 512.
  const GgufTensorInfo* t = g.FindTensor("synth.Q4_1");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->type, GgmlType::kQ4_1);
  EXPECT_EQ(t->dims, (std::vector<uint64_t>{512, 4}));
  EXPECT_EQ(t->num_rows(), 4u);
  EXPECT_EQ(t->row_bytes, 512u / 32 * 20);
  EXPECT_EQ(t->size_bytes, 4u * 512 / 32 * 20);
  EXPECT_EQ(t->file_offset % 32, 0u);
  EXPECT_EQ(g.TensorData(*t).size(), t->size_bytes);
  EXPECT_EQ(g.FindTensor("nope"), nullptr);
}

TEST(GgufTest, OpenMissingFileNamesIt) {
  auto f = GgufFile::Open("/nonexistent/dir/model.gguf");
  EXPECT_EQ(f.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(f.status().message().find("/nonexistent/dir/model.gguf"), std::string::npos);
}

TEST(GgufTest, SmolLM2MetadataAndTensors) {
  const std::string path = ModelPath();
  if (path.empty()) GTEST_SKIP() << "PAGEDSERVE_MODEL is not set";
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const GgufFile& g = **f;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(*g.GetString("general.architecture"), "llama");
  EXPECT_EQ(*g.GetUint("llama.block_count"), 30u);
  EXPECT_EQ(*g.GetUint("llama.embedding_length"), 576u);
  EXPECT_EQ(*g.GetUint("llama.attention.head_count"), 9u);
  EXPECT_EQ(*g.GetUint("llama.attention.head_count_kv"), 3u);
  EXPECT_FLOAT_EQ(*g.GetFloat("llama.rope.freq_base"), 100000.0f);
  EXPECT_EQ(*g.GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*g.GetString("tokenizer.ggml.pre"), "smollm");
  EXPECT_EQ(*g.GetBool("tokenizer.ggml.add_bos_token"), false);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.bos_token_id"), 1u);
  EXPECT_EQ(*g.GetUint("tokenizer.ggml.eos_token_id"), 2u);
  auto tokens = g.GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 49152u);
  EXPECT_EQ((*tokens)[1], "<|im_start|>");
  EXPECT_EQ((*tokens)[2], "<|im_end|>");
  EXPECT_EQ(g.GetIntArray("tokenizer.ggml.token_type")->size(), 49152u);
  EXPECT_EQ(g.GetStringArray("tokenizer.ggml.merges")->size(), 48900u);
  EXPECT_NE(g.GetString("tokenizer.chat_template")->find("<|im_start|>"), std::string::npos);

  EXPECT_EQ(g.tensors().size(), 272u);
  const GgufTensorInfo* embd = g.FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->type, GgmlType::kQ8_0);
  EXPECT_EQ(embd->dims, (std::vector<uint64_t>{576, 49152}));
  const GgufTensorInfo* k = g.FindTensor("blk.0.attn_k.weight");
  ASSERT_NE(k, nullptr);
  EXPECT_EQ(k->type, GgmlType::kQ4_1);
  EXPECT_EQ(k->dims, (std::vector<uint64_t>{576, 192}));
  EXPECT_EQ(g.FindTensor("output.weight"), nullptr);  // tied embeddings

  auto c = ModelConfigFromGguf(g);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kLlama);
  EXPECT_EQ(c->num_layers, 30);
  EXPECT_EQ(c->hidden_size, 576);
  EXPECT_EQ(c->intermediate_size, 1536);
  EXPECT_EQ(c->num_heads, 9);
  EXPECT_EQ(c->num_kv_heads, 3);
  EXPECT_EQ(c->head_size, 64);
  EXPECT_EQ(c->vocab_size, 49152);
  EXPECT_FLOAT_EQ(static_cast<float>(c->rms_norm_eps), 1e-5f);
  EXPECT_DOUBLE_EQ(c->rope_theta, 100000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace pagedserve
