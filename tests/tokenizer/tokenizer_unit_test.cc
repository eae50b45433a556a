// Incremental detokenizer properties, UTF-8 sanitising, hand-built specs and
// error paths (malformed tokenizer.json, unknown chat template, bad ids).
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/detokenizer.h"
#include "runtime/tokenizer/loaders.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/tokenizer/fixture_util.h"

namespace pagedserve {
namespace {

using testing::ReadFile;
using testing::SourceDir;

std::string ByteToken(int b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
  return buf;
}

bool IsValidUtf8(const std::string& s) { return SanitizeUtf8(s, true) == s; }

std::unique_ptr<Tokenizer> Load(const std::string& name) {
  auto tok = LoadHfTokenizer(SourceDir() + "/tests/fixtures/" + name);
  EXPECT_TRUE(tok.ok()) << tok.status();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// Random sequences mixing ids of emoji / CJK / byte tokens with random ids: the
// deltas are valid UTF-8 and concatenate to the one-shot decode.
void CheckIncremental(const Tokenizer& tok, const std::vector<int32_t>& interesting,
                      uint32_t seed) {
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<int32_t> ids;
    int n = 1 + rng() % 40;
    ids.reserve(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) {
      ids.push_back(rng() % 3 != 0 ? interesting[rng() % interesting.size()]
                                   : static_cast<int32_t>(rng() % tok.vocab_size()));
    }
    for (bool skip : {true, false}) {
      DecodeOptions options{.skip_special_tokens = skip};
      IncrementalDetokenizer detok(tok, options);
      std::string joined;
      for (int32_t id : ids) {
        auto delta = detok.Add(id);
        ASSERT_TRUE(delta.ok()) << delta.status();
        EXPECT_TRUE(IsValidUtf8(*delta));
        joined += *delta;
      }
      joined += detok.Finish();
      EXPECT_EQ(detok.pending_bytes(), 0u);
      auto once = tok.Decode(ids, options);
      ASSERT_TRUE(once.ok());
      EXPECT_EQ(joined, *once) << "trial " << trial;
      EXPECT_EQ(detok.text(), *once);
    }
  }
}

TEST(IncrementalDetokenizer, ByteLevelDeltasConcatenateToDecode) {
  auto tok = Load("smollm2-tokenizer");
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> interesting = tok->Encode(
      "😀👍🏽🇫🇷❤️ 👨‍👩‍👧‍👦 日本語のテキスト 한국어 e\u0301 Ωμέγα <|im_end|>");
  for (int b = 0; b < 256;
       b += 7) {  // single-byte tokens, including lone UTF-8 lead/continuation bytes
    std::string s(1, static_cast<char>(b));
    auto ids = tok->Encode(s, {.parse_special = false});
    interesting.insert(interesting.end(), ids.begin(), ids.end());
  }
  CheckIncremental(*tok, interesting, 7);
}

TEST(IncrementalDetokenizer, EmojiWaitsUntilComplete) {
  auto tok = Load("smollm2-tokenizer");
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> ids = tok->Encode("a😀b");
  ASSERT_GT(ids.size(), 3u);  // the emoji takes more than one token
  IncrementalDetokenizer detok(*tok);
  std::vector<std::string> deltas;
  deltas.reserve(ids.size());
  for (int32_t id : ids) deltas.push_back(*detok.Add(id));
  EXPECT_EQ(deltas.front(), "a");
  EXPECT_EQ(deltas.back(), "b");
  std::string middle;
  for (size_t i = 1; i + 1 < deltas.size(); ++i) {
    EXPECT_TRUE(deltas[i].empty() || deltas[i] == "😀") << i;
    middle += deltas[i];
  }
  EXPECT_EQ(middle, "😀");
  EXPECT_EQ(detok.Finish(), "");
}

TEST(IncrementalDetokenizer, SentencePieceByteFallbackAndLeadingSpace) {
  auto tok = Load("spm-tiny-tokenizer");
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> interesting = tok->Encode("Hello 😀 日本語 ΩΨ the sea");
  for (int b = 0; b < 256; b += 5) {
    int32_t id = tok->TokenId(ByteToken(b));
    if (id >= 0) interesting.push_back(id);
  }
  CheckIncremental(*tok, interesting, 11);
  // Leading dummy-prefix space is dropped once, as HF's Strip decoder does.
  auto text = tok->Decode(tok->Encode("the sea"));
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "the sea");
}

TEST(IncrementalDetokenizer, RejectsOutOfRangeIds) {
  auto tok = Load("smollm2-tokenizer");
  ASSERT_NE(tok, nullptr);
  IncrementalDetokenizer detok(*tok);
  EXPECT_FALSE(detok.Add(-1).ok());
  EXPECT_FALSE(detok.Add(tok->vocab_size()).ok());
  std::vector<int32_t> bad = {5, 1 << 20};
  auto decoded = tok->Decode(bad);
  ASSERT_FALSE(decoded.ok());
  EXPECT_NE(std::string(decoded.status().message()).find("ids[1]"), std::string::npos);
}

TEST(SanitizeUtf8, ChunkedEqualsWhole) {
  std::mt19937 rng(3);
  const std::string pieces[] = {"a",    "\xC3", "\xA9",         "\xF0\x9F", "\x98\x80", "\xE2\x82",
                                "\xAC", "\xFF", "\xED\xA0\x80", "\xC0\xAF", "\xF4\x90"};
  for (int trial = 0; trial < 500; ++trial) {
    std::string all;
    for (int i = rng() % 12; i >= 0; --i) all += pieces[rng() % std::size(pieces)];
    std::string whole = SanitizeUtf8(all, true);
    EXPECT_TRUE(IsValidUtf8(whole));
    std::string pending, chunked;
    for (char c : all) {
      pending.push_back(c);
      size_t consumed = 0;
      chunked += SanitizeUtf8(pending, false, &consumed);
      pending.erase(0, consumed);
    }
    chunked += SanitizeUtf8(pending, true);
    EXPECT_EQ(chunked, whole);
  }
  // Maximal subparts: each becomes one U+FFFD (Unicode 15 §3.9, Table 3-8).
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98", true), "\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("\xC0\xAF", true), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(SanitizeUtf8("a\xED\xA0\x80z", true), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBDz");
}

TEST(Tokenizer, HandBuiltByteLevelSpecMergesByRank) {
  TokenizerSpec spec;
  spec.model = TokenizerModel::kByteLevelBpe;
  // The GPT-2 byte alphabet: printable bytes as themselves, others shifted.
  int next = 256;
  std::vector<std::string> alphabet(256);
  for (int b = 0; b < 256; ++b) {
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    uint32_t cp = printable ? b : next++;
    std::string s;
    if (cp < 0x80) {
      s.push_back(static_cast<char>(cp));
    } else {
      s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    alphabet[b] = s;
  }
  spec.tokens = alphabet;
  spec.tokens.push_back("ab");   // 256
  spec.tokens.push_back("bc");   // 257
  spec.tokens.push_back("abc");  // 258
  spec.tokens.push_back("<eos>");
  // "b c" ranks before "a b": "abc" -> a + bc (no merge "a bc") -> [a, bc].
  spec.merges = {{"b", "c"}, {"a", "b"}, {"ab", "c"}};
  spec.pre_tokenizer_regexes = *PreTokenizerRegexes("gpt2");
  spec.eos_id = 259;
  spec.add_eos = true;
  spec.added_tokens = {{259, "<eos>", true, false, false}};
  auto tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->Encode("abc"), (std::vector<int32_t>{'a', 257, 259}));
  EXPECT_EQ((*tok)->Encode("abd", {.add_special_tokens = false}), (std::vector<int32_t>{256, 'd'}));
  EXPECT_EQ((*tok)->Encode("x<eos>", {.add_special_tokens = false}),
            (std::vector<int32_t>{'x', 259}));

  TokenizerSpec bad = spec;
  bad.merges.push_back({"c", "q"});
  auto err = Tokenizer::Create(bad);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(std::string(err.status().message()).find("merges[3]"), std::string::npos)
      << err.status();
  bad = spec;
  bad.pre_tokenizer_regexes = {"(unclosed"};
  err = Tokenizer::Create(bad);
  ASSERT_FALSE(err.ok());
  EXPECT_NE(std::string(err.status().message()).find("pre_tokenizer_regexes[0]"),
            std::string::npos);
  bad = spec;
  bad.bos_id = 100000;
  EXPECT_FALSE(Tokenizer::Create(bad).ok());
  EXPECT_FALSE(PreTokenizerRegexes("no-such-pre").ok());
}

TEST(HfLoader, MalformedTokenizerJsonNamesTheField) {
  std::string good = ReadFile(SourceDir() + "/tests/fixtures/spm-tiny-tokenizer/tokenizer.json");
  ASSERT_FALSE(good.empty());
  ASSERT_TRUE(TokenizerSpecFromHfJson(good, "").ok());
  struct Case {
    std::string json;
    std::string field;
  } cases[] = {
      {"{not json", "not valid JSON"},
      {"{}", "model"},
      {R"({"model": {"type": "Unigram", "vocab": {}}})", "model.type"},
      {R"({"model": {"type": "BPE", "vocab": {"a": "x"}}})", "model.vocab[\"a\"]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 2}}, "pre_tokenizer": {"type": "ByteLevel"}})",
       "no token has id 1"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [3]}, "pre_tokenizer": {"type": "ByteLevel"}})",
       "model.merges[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "added_tokens": [{"id": "x"}]})",
       "added_tokens[0]"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "normalizer": {"type": "NFKC"}})",
       "normalizer.type"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]}})",
       "pre_tokenizer.pretokenizers[0].type"},
  };
  for (const auto& c : cases) {
    auto spec = TokenizerSpecFromHfJson(c.json, "");
    ASSERT_FALSE(spec.ok()) << c.json;
    EXPECT_NE(std::string(spec.status().message()).find(c.field), std::string::npos)
        << spec.status() << " should name " << c.field;
  }
  // Ids are range-checked before any narrowing (an added token's id 4294967297
  // used to wrap to 1 and be accepted), and an id past the number of entries is
  // reported as the hole it implies without sizing the vocabulary by it (id
  // 16777216 used to allocate 2^24 strings first).
  struct IdCase {
    const char* text;
    const char* error;
  } id_cases[] = {
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}}, "pre_tokenizer": {"type": "ByteLevel"}, "added_tokens": [{"id": 4294967297, "content": "b"}]})",
       "added_tokens[0].id: id 4294967297 out of range"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 18446744073709551615}}, "pre_tokenizer": {"type": "ByteLevel"}})",
       "model.vocab[\"b\"]: id 18446744073709551615 out of range"},
      {R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 16777216}}, "pre_tokenizer": {"type": "ByteLevel"}})",
       "no token has id 1"},
  };
  for (const IdCase& c : id_cases) {
    auto spec = TokenizerSpecFromHfJson(c.text, "");
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_NE(std::string(spec.status().message()).find(c.error), std::string::npos)
        << spec.status() << " should contain " << c.error;
  }
  // Pre-tokenizer Sequences nest at most 8 deep (the parser recurses).
  std::string deep = R"({"type": "ByteLevel"})";
  for (int i = 0; i < 12; ++i) {
    deep.insert(0, R"({"type": "Sequence", "pretokenizers": [)");
    deep += "]}";
  }
  auto nested = TokenizerSpecFromHfJson(
      R"({"model": {"type": "BPE", "vocab": {"a": 0}}, "pre_tokenizer": )" + deep + "}", "");
  ASSERT_FALSE(nested.ok());
  EXPECT_NE(std::string(nested.status().message()).find("nested deeper than 8"), std::string::npos)
      << nested.status();
  auto bad_config = TokenizerSpecFromHfJson(good, R"({"bos_token": 7})");
  ASSERT_FALSE(bad_config.ok());
  EXPECT_NE(std::string(bad_config.status().message()).find("tokenizer_config.json: bos_token"),
            std::string::npos);
  auto missing = LoadHfTokenizer("/nonexistent-dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("/nonexistent-dir/tokenizer.json"),
            std::string::npos);
}

// Any template runs (runtime/chat), not only the four families once recognised
// by their markers; a template jinja2 would refuse, or a missing one, fails clearly.
TEST(ChatTemplate, AnyTemplateRendersAndBrokenOrMissingOnesFailClearly) {
  auto other = ChatTemplate::Create("{% for m in messages %}{{ m.content }}{% endfor %}", "", "");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->family(), ChatTemplateFamily::kOther);
  std::vector<ChatMessage> messages = {{"user", "hi"}, {"assistant", "yo"}};
  EXPECT_EQ(*other->Render(messages, true), "hiyo");
  auto broken = ChatTemplate::Create("{% for m in messages %}{{ m.content }}", "", "");
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(broken.status().message())
                .find("chat template: line 1: unexpected end of template"),
            std::string::npos)
      << broken.status();
  auto refused = ChatTemplate::Create(
      "{{ raise_exception('only one message') if messages|length > 1 }}", "", "");
  ASSERT_TRUE(refused.ok());
  auto text = refused->Render(messages, true);
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(text.status().message(), "chat template: line 1: only one message");
  auto empty = ChatTemplate::Create("", "", "");
  ASSERT_FALSE(empty.ok());
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition);
}

// The template runs as written: this one has no generation prompt, so none is
// added (as transformers; the family-based renderer once added ChatML's).
TEST(ChatTemplate, ChatMlWithoutDefaultSystemPrompt) {
  const std::string source =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
  auto tmpl = ChatTemplate::Create(source, "", "");
  ASSERT_TRUE(tmpl.ok());
  EXPECT_EQ(tmpl->family(), ChatTemplateFamily::kChatMl);
  EXPECT_EQ(tmpl->default_system_prompt(), "");
  std::vector<ChatMessage> messages = {{"user", "hi"}};
  EXPECT_EQ(*tmpl->Render(messages, true), "<|im_start|>user\nhi<|im_end|>\n");
  auto with_prompt = ChatTemplate::Create(
      source + "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}", "", "");
  ASSERT_TRUE(with_prompt.ok());
  EXPECT_EQ(*with_prompt->Render(messages, true),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(*with_prompt->Render(messages, false), "<|im_start|>user\nhi<|im_end|>\n");
}

}  // namespace
}  // namespace pagedserve
