// Malformed and truncated GGUF files: every one gives a clear error naming the
// file, the field and the offset, and nothing crashes (run under ASan/UBSan).
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/dequant.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

// Little-endian GGUF byte builder.
class Builder {
 public:
  Builder& U32(uint32_t v) { return Raw(&v, 4); }
  Builder& U64(uint64_t v) { return Raw(&v, 8); }
  Builder& Str(const std::string& s) {
    U64(s.size());
    return Raw(s.data(), s.size());
  }
  Builder& Raw(const void* p, size_t n) {
    const uint8_t* b = static_cast<const uint8_t*>(p);
    bytes.insert(bytes.end(), b, b + n);
    return *this;
  }
  Builder& PadTo(size_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
    return *this;
  }
  size_t size() const { return bytes.size(); }
  std::vector<uint8_t> bytes;
};

// Offsets of interesting fields inside the valid file built by Valid().
struct Layout {
  size_t tensor_count, kv_count, str_len, arr_count, alignment_value, tensor_ndims, tensor_dim0,
      tensor_type, tensor_offset;
};

// A valid v3 file: 3 metadata entries (string, array of uint32, alignment) and
// two tensors (F32 [8], Q8_0 [32, 2]).
std::vector<uint8_t> Valid(Layout* l = nullptr, uint32_t alignment = 32) {
  Builder b;
  Layout lay;
  b.Raw("GGUF", 4).U32(3);
  lay.tensor_count = b.size();
  b.U64(2);
  lay.kv_count = b.size();
  b.U64(3);
  b.Str("general.name").U32(8);
  lay.str_len = b.size();
  b.Str("tiny");
  b.Str("ids").U32(9).U32(4);
  lay.arr_count = b.size();
  b.U64(3).U32(7).U32(8).U32(9);
  b.Str("general.alignment").U32(4);
  lay.alignment_value = b.size();
  b.U32(alignment);
  b.Str("a").U32(1);
  lay.tensor_ndims = b.size() - 4;
  lay.tensor_dim0 = b.size();
  b.U64(8).U32(0);
  lay.tensor_type = b.size() - 4;
  lay.tensor_offset = b.size();
  b.U64(0);
  b.Str("b").U32(2).U64(32).U64(2).U32(8).U64(alignment);  // after 32 bytes of "a"
  b.PadTo(alignment);
  for (int i = 0; i < 8; ++i) {
    float f = static_cast<float>(i);
    b.Raw(&f, 4);
  }
  b.PadTo(alignment);
  for (int i = 0; i < 2 * 34; ++i) b.bytes.push_back(static_cast<uint8_t>(i));
  if (l) *l = lay;
  return b.bytes;
}

template <typename T>
void Put(std::vector<uint8_t>& bytes, size_t at, T v) {
  std::memcpy(bytes.data() + at, &v, sizeof(T));
}

absl::Status Parse(std::vector<uint8_t> bytes) {
  auto f = GgufFile::FromBytes("bad.gguf", std::move(bytes));
  return f.status();
}

void ExpectError(const absl::Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  std::string m(s.message());
  EXPECT_EQ(m.rfind("bad.gguf: ", 0), 0u) << m;
  EXPECT_NE(m.find(needle), std::string::npos) << "'" << needle << "' not in: " << m;
}

TEST(GgufMalformedTest, ValidBaseline) {
  auto f = GgufFile::FromBytes("ok.gguf", Valid());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->tensors().size(), 2u);
  EXPECT_EQ(*(*f)->GetString("general.name"), "tiny");
  EXPECT_EQ(*(*f)->GetIntArray("ids"), (std::vector<int32_t>{7, 8, 9}));
  const GgufTensorInfo* a = (*f)->FindTensor("a");
  ASSERT_NE(a, nullptr);
  float x;
  std::memcpy(&x, (*f)->TensorData(*a).data() + 12, 4);
  EXPECT_EQ(x, 3.0f);
  // 64-byte alignment moves the data section.
  auto g = GgufFile::FromBytes("ok64.gguf", Valid(nullptr, 64));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->alignment(), 64u);
  EXPECT_EQ((*g)->data_offset() % 64, 0u);
}

TEST(GgufMalformedTest, TruncatedAtEveryOffset) {
  std::vector<uint8_t> full = Valid();
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + n);
    absl::Status s = Parse(cut);
    ASSERT_FALSE(s.ok()) << "truncated at " << n;
    std::string m(s.message());
    EXPECT_EQ(m.rfind("bad.gguf: ", 0), 0u) << m;
    EXPECT_NE(m.find("offset"), std::string::npos) << m;
  }
}

TEST(GgufMalformedTest, FixtureTruncatedAtManyOffsets) {
  std::ifstream in(::pagedserve::testing::FixturePath(), std::ios::binary);
  std::vector<uint8_t> full((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(full.size(), 4096u);
  auto ok = GgufFile::FromBytes("bad.gguf", full);
  ASSERT_TRUE(ok.ok()) << ok.status();
  const size_t header_end = (*ok)->data_offset();
  for (size_t n = 0; n < full.size(); n += (n < header_end ? 1 : 997)) {
    absl::Status s = Parse(std::vector<uint8_t>(full.begin(), full.begin() + n));
    ASSERT_FALSE(s.ok()) << "truncated at " << n;
    EXPECT_NE(std::string(s.message()).find("offset"), std::string::npos) << s;
  }
}

TEST(GgufMalformedTest, BadMagicAndVersion) {
  auto v = Valid();
  v[0] = 'X';
  ExpectError(Parse(v), "bad magic");
  for (uint32_t version : {0u, 1u, 4u, 0xffffffffu}) {
    auto w = Valid();
    Put<uint32_t>(w, 4, version);
    ExpectError(Parse(w), "unsupported GGUF version");
  }
  auto v2 = Valid();
  Put<uint32_t>(v2, 4, 2);
  EXPECT_TRUE(Parse(v2).ok());
}

TEST(GgufMalformedTest, HugeCounts) {
  Layout l;
  auto base = Valid(&l);
  for (uint64_t big : {uint64_t{1} << 63, ~uint64_t{0}, uint64_t{1} << 32, uint64_t{100000}}) {
    auto t = base;
    Put<uint64_t>(t, l.tensor_count, big);
    ExpectError(Parse(t), "tensor_count");
    auto k = base;
    Put<uint64_t>(k, l.kv_count, big);
    ExpectError(Parse(k), "metadata");
    auto a = base;
    Put<uint64_t>(a, l.arr_count, big);
    ExpectError(Parse(a), "array count");
    auto s = base;
    Put<uint64_t>(s, l.str_len, big);
    ExpectError(Parse(s), "past end of file");
  }
}

TEST(GgufMalformedTest, BadAlignment) {
  for (uint32_t al : {0u, 3u, 48u, 0x80000000u}) {
    Layout l;
    auto v = Valid(&l);
    Put<uint32_t>(v, l.alignment_value, al);
    ExpectError(Parse(v), "general.alignment");
  }
  // Alignment of the wrong type (string).
  Layout l;
  auto v = Valid(&l);
  Put<uint32_t>(v, l.alignment_value - 4, 8);
  EXPECT_FALSE(Parse(v).ok());
}

TEST(GgufMalformedTest, BadTensorInfos) {
  Layout l;
  auto base = Valid(&l);
  {
    auto v = base;
    Put<uint64_t>(v, l.tensor_offset, 1u << 20);
    absl::Status s = Parse(v);
    ExpectError(s, "tensor 'a' offset");
    ExpectError(s, "extends past end of file");
  }
  {
    auto v = base;
    Put<uint64_t>(v, l.tensor_offset, 4);  // not aligned
    ExpectError(Parse(v), "alignment");
  }
  {
    auto v = base;
    Put<uint64_t>(v, l.tensor_offset, ~uint64_t{0} - 31);  // aligned, overflows
    ExpectError(Parse(v), "past end of file");
  }
  {
    auto v = base;
    Put<uint64_t>(v, l.tensor_dim0, uint64_t{1} << 40);
    ExpectError(Parse(v), "past end of file");
  }
  {
    auto v = base;
    Put<uint64_t>(v, l.tensor_dim0, 0);
    ExpectError(Parse(v), "dim 0");
  }
  {
    auto v = base;
    Put<uint32_t>(v, l.tensor_ndims, 5);
    ExpectError(Parse(v), "n_dims");
  }
  {
    auto v = base;
    Put<uint32_t>(v, l.tensor_type, 99);
    ExpectError(Parse(v), "unknown ggml type 99");
  }
  {
    auto v = base;
    Put<uint32_t>(v, l.tensor_type, 8);  // Q8_0 needs rows of 32
    ExpectError(Parse(v), "block size");
  }
  {
    auto v = base;
    v[l.tensor_offset + 8 + 8] = 'a';  // rename "b" to "a"
    ExpectError(Parse(v), "duplicate tensor name");
  }
}

TEST(GgufMalformedTest, UnknownValueTypeAndDeepNesting) {
  Layout l;
  auto v = Valid(&l);
  Put<uint32_t>(v, l.str_len - 4, 13);
  ExpectError(Parse(v), "unknown value type 13");

  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(0).U64(1).Str("deep").U32(9);
  for (int i = 0; i < 20; ++i) b.U32(9).U64(1);
  b.U32(4).U64(0);
  ExpectError(Parse(b.bytes), "nested deeper");
}

TEST(GgufMalformedTest, RandomCorruptionNeverCrashes) {
  auto base = Valid();
  std::mt19937 rng(42);
  int ok = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    auto v = base;
    int flips = 1 + rng() % 4;
    for (int i = 0; i < flips; ++i) v[rng() % v.size()] = static_cast<uint8_t>(rng());
    auto f = GgufFile::FromBytes("bad.gguf", v);
    if (f.ok()) {
      ++ok;
      // Everything reachable from a successfully parsed file is in bounds.
      for (const auto& t : (*f)->tensors()) {
        auto d = (*f)->TensorData(t);
        volatile uint8_t sink = 0;
        for (uint8_t x : d) sink = sink ^ x;
        (void)sink;
      }
      for (const auto& [k, val] : (*f)->metadata()) (void)val.AsStringArray();
    } else {
      EXPECT_EQ(std::string(f.status().message()).rfind("bad.gguf: ", 0), 0u) << f.status();
    }
  }
  EXPECT_GT(ok, 0);  // some flips hit tensor data and stay valid
}

// Found by fuzz_gguf: an empty numeric array used to memcpy zero bytes to the
// null storage of an empty vector (UBSan: null pointer passed as argument 1).
// The sanitized build of this test catches a regression.
TEST(GgufMalformedTest, EmptyNumericArray) {
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(0).U64(2);
  b.Str("empty.u32").U32(9).U32(4).U64(0);
  b.Str("empty.f32").U32(9).U32(6).U64(0);
  auto f = GgufFile::FromBytes("ok.gguf", b.bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("empty.u32")->array_size(), 0u);
  auto ints = (*f)->GetIntArray("empty.u32");
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_TRUE(ints->empty());
  auto floats = (*f)->GetFloatArray("empty.f32");
  ASSERT_TRUE(floats.ok()) << floats.status();
  EXPECT_TRUE(floats->empty());
}

// Token ids in the model config must fit int32: 2^32 + 1 used to be cast to 1
// silently. The error names the file and the key.
TEST(GgufMalformedTest, ModelConfigTokenIdOutOfRange) {
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"}) {
    Builder b;
    b.Raw("GGUF", 4).U32(3).U64(0).U64(8);
    b.Str("general.architecture").U32(8).Str("llama");
    b.Str("llama.block_count").U32(4).U32(1);
    b.Str("llama.embedding_length").U32(4).U32(8);
    b.Str("llama.feed_forward_length").U32(4).U32(16);
    b.Str("llama.attention.head_count").U32(4).U32(2);
    b.Str("llama.attention.layer_norm_rms_epsilon").U32(6);
    float eps = 1e-5f;
    b.Raw(&eps, 4);
    b.Str("llama.vocab_size").U32(4).U32(10);
    b.Str(key).U32(10).U64((uint64_t{1} << 32) + 1);
    auto f = GgufFile::FromBytes("bad.gguf", b.bytes);
    ASSERT_TRUE(f.ok()) << f.status();
    auto c = ModelConfigFromGguf(**f);
    ExpectError(c.status(), std::string(key) + "': value 4294967297 out of range");
  }
}

// Dimensions far above any checkpoint are refused before any work scales with
// them: a fuzzed head size of tens of millions made Validate() compute that many
// rotary frequencies (a 12 s stall under ASan, found by fuzz_gguf in CI), and a
// block count of 2^31 - 1 would fill as many sliding-window flags.
TEST(GgufMalformedTest, ModelConfigDimensionsAboveTheBounds) {
  auto config = [](const char* key, uint32_t v) {
    Builder b;
    b.Raw("GGUF", 4).U32(3).U64(0).U64(8);
    b.Str("general.architecture").U32(8).Str("gemma2");
    const bool layers = std::string(key) == "gemma2.block_count";
    b.Str("gemma2.block_count").U32(4).U32(layers ? v : 2);
    b.Str("gemma2.embedding_length").U32(4).U32(8);
    b.Str("gemma2.feed_forward_length").U32(4).U32(16);
    b.Str("gemma2.attention.head_count").U32(4).U32(2);
    b.Str("gemma2.attention.key_length").U32(4).U32(layers ? 4 : v);
    b.Str("gemma2.attention.layer_norm_rms_epsilon").U32(6);
    float eps = 1e-5f;
    b.Raw(&eps, 4);
    b.Str("gemma2.attention.sliding_window").U32(4).U32(512);
    auto f = GgufFile::FromBytes("bad.gguf", b.bytes);
    EXPECT_TRUE(f.ok()) << f.status();
    return ModelConfigFromGguf(**f);
  };
  ExpectError(config("gemma2.attention.key_length", 50'000'000).status(),
              "head_size 50000000 is above the bound 4096");
  ExpectError(config("gemma2.block_count", 0x7fffffff).status(),
              "num_layers 2147483647 is above the bound 4096");
}

// A llama config (hidden 8, 2 heads of 4: two rotary pairs) with one tensor
// "rope_freqs.weight" of `type` (0 F32, 1 F16) and `count` elements `f`.
std::vector<uint8_t> WithRopeFreqs(uint32_t type, std::vector<float> f) {
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(1).U64(7);
  b.Str("general.architecture").U32(8).Str("llama");
  b.Str("llama.block_count").U32(4).U32(1);
  b.Str("llama.embedding_length").U32(4).U32(8);
  b.Str("llama.feed_forward_length").U32(4).U32(16);
  b.Str("llama.attention.head_count").U32(4).U32(2);
  b.Str("llama.attention.layer_norm_rms_epsilon").U32(6);
  float eps = 1e-5f;
  b.Raw(&eps, 4);
  b.Str("llama.vocab_size").U32(4).U32(10);
  b.Str("rope_freqs.weight").U32(1).U64(f.size()).U32(type).U64(0);
  b.PadTo(32);
  if (type == 0) {
    b.Raw(f.data(), f.size() * sizeof(float));
  } else {
    const uint16_t one = 0x3c00;  // fp16 1.0
    for (size_t i = 0; i < f.size(); ++i) b.Raw(&one, 2);
  }
  return b.bytes;
}

// llama.cpp's per-frequency RoPE factors (Llama 3.x GGUF files): read into
// rope_scaling.freq_factors and dividing the rotary frequencies; a tensor of
// the wrong type or size, or a factor that is zero, negative or NaN, is an
// error naming the tensor.
TEST(GgufMalformedTest, ModelConfigRopeFreqFactors) {
  auto f = GgufFile::FromBytes("ok.gguf", WithRopeFreqs(0, {1.0f, 8.0f}));
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfigFromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(c->rope_scaling.freq_factors, (std::vector<float>{1.0f, 8.0f}));
  const std::vector<double> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 1.0 / 100.0 / 8.0);  // 10000^(-2/4) / 8
  const float nan = std::nanf("");
  for (auto [type, factors, needle] :
       {std::tuple<uint32_t, std::vector<float>, std::string>{0, {1.0f, 2.0f, 4.0f}, "must be F32"},
        {1, {1.0f, 2.0f}, "must be F32"},
        {0, {1.0f, 0.0f}, "factor 1 is 0"},
        {0, {-1.0f, 2.0f}, "factor 0 is -1"},
        {0, {nan, 2.0f}, "factor 0 is nan"}}) {
    auto g = GgufFile::FromBytes("bad.gguf", WithRopeFreqs(type, factors));
    ASSERT_TRUE(g.ok()) << g.status();
    auto bad = ModelConfigFromGguf(**g);
    ExpectError(bad.status(), "tensor 'rope_freqs.weight'");
    ExpectError(bad.status(), needle);
  }
}

// A phi3 config (hidden 8, 2 heads of 4: two rotary pairs, context 64) with
// LongRoPE's tensors rope_factors_long / _short.weight (F32 [2]) holding
// `long_f` / `short_f` (an empty one is left out), rope_freqs.weight too when
// `freqs`, and rope.scaling.original_context_length 16 / attn_factor 1.25
// when `keys`.
std::vector<uint8_t> WithLongRope(const std::vector<float>& long_f,
                                  const std::vector<float>& short_f, bool freqs, bool keys,
                                  bool linear = false) {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  if (!long_f.empty()) tensors.push_back({"rope_factors_long.weight", long_f});
  if (!short_f.empty()) tensors.push_back({"rope_factors_short.weight", short_f});
  if (freqs) tensors.push_back({"rope_freqs.weight", {1.0f, 2.0f}});
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(tensors.size()).U64((keys ? 10 : 8) + (linear ? 2 : 0));
  b.Str("general.architecture").U32(8).Str("phi3");
  b.Str("phi3.block_count").U32(4).U32(1);
  b.Str("phi3.embedding_length").U32(4).U32(8);
  b.Str("phi3.feed_forward_length").U32(4).U32(16);
  b.Str("phi3.attention.head_count").U32(4).U32(2);
  b.Str("phi3.attention.layer_norm_rms_epsilon").U32(6);
  float eps = 1e-5f;
  b.Raw(&eps, 4);
  b.Str("phi3.context_length").U32(4).U32(64);
  b.Str("phi3.vocab_size").U32(4).U32(10);
  if (linear) {
    float factor = 4.0f;
    b.Str("phi3.rope.scaling.type").U32(8).Str("linear");
    b.Str("phi3.rope.scaling.factor").U32(6).Raw(&factor, 4);
  }
  if (keys) {
    b.Str("phi3.rope.scaling.original_context_length").U32(4).U32(16);
    float attn = 1.25f;
    b.Str("phi3.rope.scaling.attn_factor").U32(6).Raw(&attn, 4);
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    b.Str(tensors[i].first).U32(1).U64(tensors[i].second.size()).U32(0).U64(32 * i);
  b.PadTo(32);
  for (const auto& t : tensors) b.Raw(t.second.data(), t.second.size() * sizeof(float)).PadTo(32);
  return b.bytes;
}

// phi3's LongRoPE from llama.cpp's converter: both factor sets (the long one
// for a context past the original), the attention factor, the original
// context defaulting to context_length (as llama.cpp); one set alone,
// rope_freqs.weight beside them, or a factor that is not positive: errors.
TEST(GgufMalformedTest, ModelConfigLongRope) {
  auto f = GgufFile::FromBytes("ok.gguf", WithLongRope({2.0f, 8.0f}, {1.0f, 1.5f}, false, true));
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfigFromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLongRope);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 16);
  EXPECT_EQ(c->rope_scaling.attention_factor, 1.25);
  EXPECT_TRUE(c->rope_scaling.use_long_factor);  // 64 > 16
  std::vector<double> inv = RopeInverseFrequencies(*c);
  ASSERT_EQ(inv.size(), 2u);
  EXPECT_DOUBLE_EQ(inv[1], 1.0 / 100.0 / 8.0);
  SelectLongRopeFactors(16, &*c);
  EXPECT_DOUBLE_EQ(RopeInverseFrequencies(*c)[1], 1.0 / 100.0 / 1.5);

  auto d = GgufFile::FromBytes("ok.gguf", WithLongRope({2.0f, 8.0f}, {1.0f, 1.5f}, false, false));
  ASSERT_TRUE(d.ok()) << d.status();
  auto dc = ModelConfigFromGguf(**d);
  ASSERT_TRUE(dc.ok()) << dc.status();
  EXPECT_EQ(dc->rope_scaling.original_max_position_embeddings, 64);
  EXPECT_FALSE(dc->rope_scaling.use_long_factor);
  EXPECT_EQ(dc->rope_scaling.attention_factor, 1.0);

  for (auto [bytes, needle] :
       {std::pair{WithLongRope({2.0f, 8.0f}, {}, false, true), "needs both"},
        std::pair{WithLongRope({2.0f, 8.0f}, {1.0f, 1.5f}, true, true), "rope_freqs.weight"},
        std::pair{WithLongRope({2.0f, 0.0f}, {1.0f, 1.5f}, false, true),
                  "tensor 'rope_factors_long.weight': factor 1 is 0"},
        // llama.cpp would apply both; refused rather than dropping one.
        std::pair{WithLongRope({2.0f, 8.0f}, {1.0f, 1.5f}, false, true, true),
                  "rope.scaling.type together with LongRoPE"},
        // attn_factor without the factor tensors: nothing here would apply it.
        std::pair{WithLongRope({}, {}, false, true), "rope.scaling.attn_factor"}}) {
    auto g = GgufFile::FromBytes("bad.gguf", bytes);
    ASSERT_TRUE(g.ok()) << g.status();
    auto bad = ModelConfigFromGguf(**g);
    ExpectError(bad.status(), needle);
  }
}

// A two-layer llama config with {arch}.attention.sliding_window = `window`
// and, unless `pattern` is 0, a sliding_window_pattern: 1 = the bool array
// {false, true}, 2 = llama.cpp's integer form (2), 3 = a bool array of 3.
std::vector<uint8_t> WithSlidingWindow(uint32_t window, int pattern) {
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(0).U64(pattern == 0 ? 8 : 9);
  b.Str("general.architecture").U32(8).Str("llama");
  b.Str("llama.block_count").U32(4).U32(2);
  b.Str("llama.embedding_length").U32(4).U32(8);
  b.Str("llama.feed_forward_length").U32(4).U32(16);
  b.Str("llama.attention.head_count").U32(4).U32(2);
  b.Str("llama.attention.layer_norm_rms_epsilon").U32(6);
  float eps = 1e-5f;
  b.Raw(&eps, 4);
  b.Str("llama.vocab_size").U32(4).U32(10);
  b.Str("llama.attention.sliding_window").U32(4).U32(window);
  if (pattern == 1 || pattern == 3) {
    b.Str("llama.attention.sliding_window_pattern").U32(9).U32(7).U64(pattern == 1 ? 2 : 3);
    const uint8_t flags[3] = {0, 1, 1};
    b.Raw(flags, pattern == 1 ? 2 : 3);
  } else if (pattern == 2) {
    b.Str("llama.attention.sliding_window_pattern").U32(4).U32(2);
  }
  b.PadTo(32);
  return b.bytes;
}

// The sliding window of a GGUF: every layer without a pattern, the layers a
// bool array marks with one; 0 = none; the integer pattern (its layer order is
// per architecture in llama.cpp) and an array of the wrong length are errors.
TEST(GgufMalformedTest, ModelConfigSlidingWindow) {
  auto config = [](uint32_t window, int pattern) {
    auto f = GgufFile::FromBytes("bad.gguf", WithSlidingWindow(window, pattern));
    EXPECT_TRUE(f.ok()) << f.status();
    return ModelConfigFromGguf(**f);
  };
  auto all = config(4096, 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->LayerSlidingWindow(0), 4096);
  EXPECT_EQ(all->LayerSlidingWindow(1), 4096);
  auto none = config(0, 0);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->LayerSlidingWindow(0), 0);
  auto mixed = config(512, 1);
  ASSERT_TRUE(mixed.ok()) << mixed.status();
  EXPECT_EQ(mixed->LayerSlidingWindow(0), 0);
  EXPECT_EQ(mixed->LayerSlidingWindow(1), 512);
  auto integer = config(512, 2);
  EXPECT_EQ(integer.status().code(), absl::StatusCode::kUnimplemented);
  ExpectError(integer.status(), "llama.attention.sliding_window_pattern");
  auto wrong = config(512, 3);
  ExpectError(wrong.status(), "3 flags for 2 layers");
}

// Mixtral-style experts in a llama GGUF: expert_weights_norm read as a bool,
// and a value of another type named by its key.
TEST(GgufMalformedTest, ModelConfigExpertWeightsNorm) {
  auto config = [](int norm) {  // 0: absent, 1: bool false, 2: a string
    Builder b;
    b.Raw("GGUF", 4).U32(3).U64(0).U64(norm == 0 ? 9 : 10);
    b.Str("general.architecture").U32(8).Str("llama");
    b.Str("llama.block_count").U32(4).U32(1);
    b.Str("llama.embedding_length").U32(4).U32(8);
    b.Str("llama.feed_forward_length").U32(4).U32(16);
    b.Str("llama.attention.head_count").U32(4).U32(2);
    b.Str("llama.attention.layer_norm_rms_epsilon").U32(6);
    float eps = 1e-5f;
    b.Raw(&eps, 4);
    b.Str("llama.vocab_size").U32(4).U32(10);
    b.Str("llama.expert_count").U32(4).U32(4);
    b.Str("llama.expert_used_count").U32(4).U32(2);
    const uint8_t no = 0;
    if (norm == 1) b.Str("llama.expert_weights_norm").U32(7).Raw(&no, 1);
    if (norm == 2) b.Str("llama.expert_weights_norm").U32(8).Str("true");
    b.PadTo(32);
    auto f = GgufFile::FromBytes("bad.gguf", b.bytes);
    EXPECT_TRUE(f.ok()) << f.status();
    return ModelConfigFromGguf(**f);
  };
  auto absent = config(0);
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_EQ(absent->moe.num_experts, 4);
  EXPECT_TRUE(absent->moe.norm_topk_prob);  // llama.cpp's default for llama
  auto off = config(1);
  ASSERT_TRUE(off.ok()) << off.status();
  EXPECT_FALSE(off->moe.norm_topk_prob);
  ExpectError(config(2).status(), "llama.expert_weights_norm");
}

// Every end-of-generation id a GGUF declares ends generation: eos, eot
// (Llama 3's <|eot_id|>) and eom, each once.
TEST(GgufMalformedTest, ModelConfigEndOfGenerationIds) {
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(0).U64(10);
  b.Str("general.architecture").U32(8).Str("llama");
  b.Str("llama.block_count").U32(4).U32(1);
  b.Str("llama.embedding_length").U32(4).U32(8);
  b.Str("llama.feed_forward_length").U32(4).U32(16);
  b.Str("llama.attention.head_count").U32(4).U32(2);
  b.Str("llama.attention.layer_norm_rms_epsilon").U32(6);
  float eps = 1e-5f;
  b.Raw(&eps, 4);
  b.Str("llama.vocab_size").U32(4).U32(10);
  b.Str("tokenizer.ggml.eos_token_id").U32(4).U32(9);
  b.Str("tokenizer.ggml.eot_token_id").U32(4).U32(8);
  b.Str("tokenizer.ggml.eom_token_id").U32(4).U32(9);
  b.PadTo(32);
  auto f = GgufFile::FromBytes("eog.gguf", b.bytes);
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfigFromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{9, 8}));
}

// A gemma2 / gemma3 header as llama.cpp's converter writes it: `layers`
// blocks of head size 4 on hidden 8 (2 heads), a sliding_window unless
// window < 0, an integer sliding_window_pattern unless pattern < 0, eos id 1
// and the tokens <pad>, <eos>, <end_of_turn>.
std::vector<uint8_t> GemmaHeader(const std::string& arch, uint32_t layers, int window,
                                 int pattern) {
  Builder b;
  b.Raw("GGUF", 4).U32(3).U64(0).U64(9 + (window >= 0) + (pattern >= 0));
  b.Str("general.architecture").U32(8).Str(arch);
  b.Str(arch + ".block_count").U32(4).U32(layers);
  b.Str(arch + ".embedding_length").U32(4).U32(8);
  b.Str(arch + ".feed_forward_length").U32(4).U32(16);
  b.Str(arch + ".attention.head_count").U32(4).U32(2);
  b.Str(arch + ".attention.key_length").U32(4).U32(64);
  b.Str(arch + ".attention.layer_norm_rms_epsilon").U32(6);
  float eps = 1e-6f;
  b.Raw(&eps, 4);
  if (window >= 0) b.Str(arch + ".attention.sliding_window").U32(4).U32(window);
  if (pattern >= 0) b.Str(arch + ".attention.sliding_window_pattern").U32(4).U32(pattern);
  b.Str("tokenizer.ggml.eos_token_id").U32(4).U32(1);
  b.Str("tokenizer.ggml.tokens").U32(9).U32(8).U64(3);
  b.Str("<pad>").Str("<eos>").Str("<end_of_turn>");
  b.PadTo(32);
  return b.bytes;
}

// Gemma from GGUF (model_config.h): llama.cpp's window patterns (gemma2
// even layers, window 4096 when absent; gemma3 all but every 6th, or the
// integer pattern), gemma3's local RoPE base, the Gemma operations, norms
// stored as 1 + w already, and <end_of_turn> found by its text as an end id.
TEST(GgufMalformedTest, ModelConfigGemma) {
  auto config = [](const std::string& arch, uint32_t layers, int window, int pattern) {
    auto f = GgufFile::FromBytes("gemma.gguf", GemmaHeader(arch, layers, window, pattern));
    EXPECT_TRUE(f.ok()) << f.status();
    return ModelConfigFromGguf(**f);
  };
  auto g3 = config("gemma3", 6, 16, -1);
  ASSERT_TRUE(g3.ok()) << g3.status();
  EXPECT_EQ(g3->arch, ModelArch::kGemma3);
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(g3->LayerSlidingWindow(l), l == 5 ? 0 : 16) << l;
    EXPECT_EQ(g3->LayerLocalRope(l), l != 5) << l;
  }
  EXPECT_EQ(g3->rope_local_theta, 10000.0);
  EXPECT_TRUE(g3->qk_norm && g3->post_norms && !g3->norm_weight_plus_one);
  EXPECT_EQ(g3->mlp_activation, MlpActivation::kGeluTanh);
  EXPECT_FLOAT_EQ(g3->embedding_scale, std::sqrt(8.0f));
  EXPECT_FLOAT_EQ(g3->AttentionScale(), 1.0f / 8.0f);  // key_length 64
  EXPECT_EQ(g3->eos_token_ids, (std::vector<int32_t>{2, 1}));
  auto every_other = config("gemma3", 6, 16, 2);
  ASSERT_TRUE(every_other.ok()) << every_other.status();
  for (int l = 0; l < 6; ++l) EXPECT_EQ(every_other->LayerSlidingWindow(l), l % 2 ? 0 : 16) << l;
  auto no_window = config("gemma3", 6, -1, -1);
  ASSERT_TRUE(no_window.ok()) << no_window.status();
  EXPECT_EQ(no_window->LayerSlidingWindow(0), 0);
  EXPECT_EQ(no_window->rope_local_theta, 0.0);
  auto g2 = config("gemma2", 2, -1, -1);
  ASSERT_TRUE(g2.ok()) << g2.status();
  EXPECT_EQ(g2->arch, ModelArch::kGemma2);
  EXPECT_FALSE(g2->qk_norm);
  EXPECT_EQ(g2->LayerSlidingWindow(0), 4096);
  EXPECT_EQ(g2->LayerSlidingWindow(1), 0);
  EXPECT_EQ(g2->rope_local_theta, 0.0);
}

// phi3 (llama.cpp's converter): fused projections, <|end|> found by its text
// as an end id, and rope.dimension_count below the head size (Phi-4-mini's
// partial rotary) as the rotated part of each head; for another architecture
// that is refused by name.
TEST(GgufMalformedTest, ModelConfigPhi3) {
  auto header = [](uint32_t rope_dims, const std::string& arch = "phi3") {
    Builder b;
    b.Raw("GGUF", 4).U32(3).U64(0).U64(9);
    b.Str("general.architecture").U32(8).Str(arch);
    b.Str(arch + ".block_count").U32(4).U32(2);
    b.Str(arch + ".embedding_length").U32(4).U32(128);
    b.Str(arch + ".feed_forward_length").U32(4).U32(256);
    b.Str(arch + ".attention.head_count").U32(4).U32(2);
    b.Str(arch + ".rope.dimension_count").U32(4).U32(rope_dims);
    b.Str(arch + ".attention.layer_norm_rms_epsilon").U32(6);
    float eps = 1e-5f;
    b.Raw(&eps, 4);
    b.Str("tokenizer.ggml.eos_token_id").U32(4).U32(1);
    b.Str("tokenizer.ggml.tokens").U32(9).U32(8).U64(3);
    b.Str("<unk>").Str("</s>").Str("<|end|>");
    b.PadTo(32);
    return b.bytes;
  };
  auto f = GgufFile::FromBytes("phi3.gguf", header(64));
  ASSERT_TRUE(f.ok()) << f.status();
  auto c = ModelConfigFromGguf(**f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->arch, ModelArch::kPhi3);
  EXPECT_TRUE(c->fused_projections);
  EXPECT_EQ(c->head_size, 64);
  EXPECT_EQ(c->RotaryDim(), 64);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{2, 1}));
  auto partial = GgufFile::FromBytes("partial.gguf", header(48));
  ASSERT_TRUE(partial.ok()) << partial.status();
  auto p48 = ModelConfigFromGguf(**partial);
  ASSERT_TRUE(p48.ok()) << p48.status();
  EXPECT_EQ(p48->head_size, 64);
  EXPECT_EQ(p48->RotaryDim(), 48);
  EXPECT_EQ(RopeInverseFrequencies(*p48).size(), 24u);
  auto llama = GgufFile::FromBytes("bad.gguf", header(48, "llama"));
  ASSERT_TRUE(llama.ok()) << llama.status();
  auto refused = ModelConfigFromGguf(**llama);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnimplemented);
  ExpectError(refused.status(), "partial rotary");
}

// A quantized tensor of every ggml block type: whole, it parses and (where
// supported) dequantizes; one byte short, the error names the file, the tensor
// and the field (its data offset) and says the data runs past the end; a row
// length that is not a whole number of blocks names the tensor's type field.
TEST(GgufMalformedTest, TruncatedQuantizedTensorOfEveryType) {
  const GgmlType kTypes[] = {GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1,
                             GgmlType::kQ8_0, GgmlType::kQ8_1, GgmlType::kQ2_K, GgmlType::kQ3_K,
                             GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kQ8_K};
  for (GgmlType type : kTypes) {
    GgmlBlockInfo bi;
    ASSERT_TRUE(GetGgmlBlockInfo(type, &bi));
    const std::string name = "blk.0." + GgmlTypeName(type);
    auto file = [&](uint64_t row, size_t data_bytes) {
      Builder b;
      b.Raw("GGUF", 4).U32(3).U64(1).U64(0);
      b.Str(name).U32(2).U64(row).U64(2).U32(static_cast<uint32_t>(type)).U64(0);
      b.PadTo(32);
      for (size_t i = 0; i < data_bytes; ++i) b.bytes.push_back(i % 2 ? 0x11 : 0x3c);
      return b.bytes;
    };
    const size_t whole = 2 * bi.block_bytes;  // 2 rows of one block
    auto f = GgufFile::FromBytes("ok.gguf", file(bi.block_elements, whole));
    ASSERT_TRUE(f.ok()) << GgmlTypeName(type) << ": " << f.status();
    const GgufTensorInfo& t = (*f)->tensors()[0];
    EXPECT_EQ(t.size_bytes, whole);
    if (CanDequantize(type)) {
      std::vector<float> out(2 * bi.block_elements);
      EXPECT_TRUE(DequantizeRows(t, (*f)->TensorData(t), 0, 2, out.data()).ok());
      EXPECT_FALSE(DequantizeRows(t, (*f)->TensorData(t).first(whole - 1), 0, 2, out.data()).ok());
    }
    absl::Status s = Parse(file(bi.block_elements, whole - 1));
    ExpectError(s, "tensor '" + name + "' offset ");
    ExpectError(s, "data (" + std::to_string(whole) + " bytes) extends past end of file");
    s = Parse(file(bi.block_elements + 1, whole));
    ExpectError(s, "tensor '" + name + "' type");
    ExpectError(s, "block size " + std::to_string(bi.block_elements));
  }
}

TEST(GgufMalformedTest, EmptyAndDirectory) {
  ExpectError(Parse({}), "magic");
  auto d = GgufFile::Open("/tmp");
  EXPECT_FALSE(d.ok());
}

}  // namespace
}  // namespace pagedserve
