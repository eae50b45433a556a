// Unit tests of the grammar engine: automaton, regex and JSON Schema compilers,
// token masks. Regex verdicts were checked against Python re.fullmatch / re.search
// by hand (the cases are small enough to read).
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/structured_output.h"
#include "runtime/grammar/compile.h"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_mask.h"

namespace pagedserve::grammar {
namespace {

std::shared_ptr<const Grammar> Regex(const std::string& re) {
  auto g = CompileConstraint({StructuredOutput::Kind::kRegex, re});
  EXPECT_TRUE(g.ok()) << re << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

std::shared_ptr<const Grammar> Schema(const std::string& s) {
  auto g = CompileJsonSchema(s);
  EXPECT_TRUE(g.ok()) << s << ": " << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(Regex, FullMatchVerdicts) {
  struct Case {
    std::string re;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd"}},
      {"a|bc", {"a", "bc"}, {"ab", "abc", ""}},
      {"a*b+", {"b", "aab", "abbb"}, {"", "a", "ba"}},
      {"(ab)?c", {"c", "abc"}, {"ac", "ababc"}},
      {"[a-c]{2,3}", {"ab", "cca"}, {"a", "abca", "ad"}},
      {"x{3}", {"xxx"}, {"xx", "xxxx"}},
      {"x{2,}", {"xx", "xxxxx"}, {"x"}},
      {"[^0-9]+", {"ab", "é"}, {"a1", ""}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"5551234", "55-1234"}},
      {"\\w+@\\w+\\.com", {"a_b@x1.com"}, {"a@b.org", "@b.com"}},
      {"(?:yes|no)\\.", {"yes.", "no."}, {"yes", "maybe."}},
      {"a.c", {"abc", "a€c"}, {"a\nc", "ac"}},
      {"[\\-+]?\\d+", {"-1", "+22", "3"}, {"--1", ""}},
      {"^ab$", {"ab"}, {"abab"}},
      {"é+", {"é", "éé"}, {"e"}},
      {"(a*)*b", {"b", "aab"}, {"a"}},
      {"a{", {"a{"}, {"a"}},
  };
  for (const auto& c : cases) {
    auto g = Regex(c.re);
    ASSERT_NE(g, nullptr);
    for (const auto& s : c.yes) EXPECT_TRUE(g->Matches(s)) << c.re << " should match '" << s << "'";
    for (const auto& s : c.no)
      EXPECT_FALSE(g->Matches(s)) << c.re << " should not match '" << s << "'";
  }
}

TEST(Regex, UnsupportedConstructsAreErrors) {
  for (std::string re : {"(a)\\1", "(?=a)b", "a\\bb", "a++", "(?i)a", "[[:alpha:]]", "a^b", "(a",
                         "a)", "*a", "[z-a]", "\\"}) {
    auto g = CompileConstraint({StructuredOutput::Kind::kRegex, re});
    EXPECT_FALSE(g.ok()) << re;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << re;
  }
}

TEST(Grammar, SizeBoundIsAnError) {
  auto g = CompileConstraint(
      {StructuredOutput::Kind::kRegex, "x{0,100000}y{0,100000}z{0,100000}w{0,100000}"});
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("too large"), std::string::npos) << g.status();
  auto s = CompileJsonSchema(R"({"type":"string","maxLength":100000000})");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("too large"), std::string::npos) << s.status();
}

TEST(JsonSchema, ObjectWithRequiredAndOptional) {
  auto g = Schema(R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"},
                      "c":{"type":"boolean"}},"required":["b"],"additionalProperties":false})");
  ASSERT_NE(g, nullptr);
  for (std::string s : {R"({"b":"x"})", R"({"a":1,"b":""})", R"({"a":-20,"b":"\n","c":true})",
                        R"({"b":"\u00e9\"","c":false})"}) {
    EXPECT_TRUE(g->Matches(s)) << s;
  }
  for (std::string s : {R"({})", R"({"a":1})", R"({"b":"x",})", R"({"b":1})", R"({"a":01,"b":"x"})",
                        R"({"c":true,"b":"x"})", R"({"b": "x"})", R"({"b":"x","d":1})"}) {
    EXPECT_FALSE(g->Matches(s)) << s;
  }
}

TEST(JsonSchema, ArraysEnumsRefsAndBounds) {
  auto arr = Schema(R"({"type":"array","items":{"enum":["x",1,null]},"minItems":1,"maxItems":3})");
  EXPECT_TRUE(arr->Matches(R"(["x"])"));
  EXPECT_TRUE(arr->Matches(R"([1,null,"x"])"));
  EXPECT_FALSE(arr->Matches(R"([])"));
  EXPECT_FALSE(arr->Matches(R"([1,1,1,1])"));
  EXPECT_FALSE(arr->Matches(R"(["y"])"));
  auto tree = Schema(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
      "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v"]}},"$ref":"#/$defs/node"})");
  EXPECT_TRUE(tree->Matches(R"({"v":1,"kids":[{"v":2},{"v":3,"kids":[]}]})"));
  EXPECT_FALSE(tree->Matches(R"({"v":1,"kids":[{"w":2}]})"));
  auto range = Schema(R"({"type":"integer","minimum":-15,"exclusiveMaximum":120})");
  for (int i = -40; i < 200; ++i) {
    EXPECT_EQ(range->Matches(std::to_string(i)), i >= -15 && i < 120) << i;
  }
  auto len = Schema(R"({"type":"string","minLength":2,"maxLength":3})");
  EXPECT_TRUE(len->Matches(R"("ab")"));
  EXPECT_TRUE(len->Matches(R"("é\n€")"));
  EXPECT_FALSE(len->Matches(R"("a")"));
  EXPECT_FALSE(len->Matches(R"("abcd")"));
  auto date = Schema(R"({"type":"string","format":"date-time"})");
  EXPECT_TRUE(date->Matches(R"("2024-02-29T12:30:00Z")"));
  EXPECT_FALSE(date->Matches(R"("2024-13-29T12:30:00Z")"));
  auto pat = Schema(R"({"type":"string","pattern":"^[a-z]+\"?$"})");
  EXPECT_TRUE(pat->Matches(R"("abc\"")"));
  EXPECT_FALSE(pat->Matches(R"("abc"")"));
  auto any_obj = CompileJsonObject();
  ASSERT_TRUE(any_obj.ok());
  EXPECT_TRUE((*any_obj)->Matches(R"({"a":[1,2.5e-3,{"b":null}],"c":"d"})"));
  EXPECT_FALSE((*any_obj)->Matches(R"([1])"));
}

TEST(JsonSchema, UnsupportedKeywordsNameThemselves) {
  struct Case {
    std::string schema, word;
  };
  for (const auto& c : std::vector<Case>{
           {R"({"type":"object","properties":{"a":{"not":{"type":"string"}}}})", "'not'"},
           {R"({"type":"array","uniqueItems":true})", "uniqueItems"},
           {R"({"type":"number","minimum":0.5})", "minimum"},
           {R"({"type":"string","format":"hostname"})", "hostname"},
           {R"({"$ref":"http://example.com/s.json"})", "$ref"},
           {R"({"allOf":[{"type":"string"},{"maxLength":2}]})", "allOf"},
           {R"({"type":"strin"})", "strin"},
           {R"({"patternProperties":{"a":{}}})", "patternProperties"}}) {
    auto g = CompileJsonSchema(c.schema);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_NE(g.status().message().find(c.word), std::string::npos) << g.status();
  }
  EXPECT_FALSE(CompileJsonSchema("{not json").ok());
}

TEST(Choice, ExactlyOneOfTheStrings) {
  auto g = CompileConstraint({StructuredOutput::Kind::kChoice, R"(["red","green","gr"])"});
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE((*g)->Matches("gr"));
  EXPECT_TRUE((*g)->Matches("green"));
  EXPECT_FALSE((*g)->Matches("gre"));
  EXPECT_FALSE(CompileConstraint({StructuredOutput::Kind::kChoice, R"([])"}).ok());
  EXPECT_FALSE(CompileConstraint({StructuredOutput::Kind::kChoice, R"([1])"}).ok());
}

// A toy vocabulary of multi-byte tokens, masks checked against brute force:
// a token is allowed iff its bytes keep the automaton alive.
TEST(TokenMask, EqualsBruteForce) {
  std::vector<std::string> vocab = {"",   "{",  "}",    "\"",      "\"a", "a\"", "a",
                                    ":",  "1",  "12",   "{\"a\":", ",",   " ",   "true",
                                    "tr", "ue", "\xc3", "\xa9",    "</s>"};
  const int32_t eos = 18;
  vocab[eos] = "";
  auto v = TokenVocabulary::Create(vocab, {eos});
  ASSERT_TRUE(v.ok());
  auto g = Schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"required":["a"]})");
  auto c = std::make_shared<CompiledConstraint>(g, *v);
  ConstraintMatcher m(c);
  // Walk one accepted path and compare every mask on it.
  for (int32_t tok : {10, 9, 8, 2}) {
    auto mask = m.Mask();
    for (int32_t id = 0; id < static_cast<int32_t>(vocab.size()); ++id) {
      bool expect = id == eos ? g->Accepting(m.state())
                              : !vocab[id].empty() && !g->AdvanceAll(m.state(), vocab[id]).dead();
      EXPECT_EQ(MaskAllows(*mask, id), expect) << "token " << id << " after " << tok;
    }
    ASSERT_TRUE(MaskAllows(*mask, tok));
    ASSERT_TRUE(m.Accept(tok));
  }
  EXPECT_TRUE(m.accepting());
  auto final_mask = m.Mask();
  EXPECT_TRUE(MaskAllows(*final_mask, eos));
  EXPECT_FALSE(MaskAllows(*final_mask, 11));
  EXPECT_TRUE(m.Accept(eos));
  EXPECT_TRUE(m.finished());
  // Masks are memoized per state: the same path again computes none.
  const size_t computed = c->mask_computations();
  ConstraintMatcher again(c);
  for (int32_t tok : {10, 9, 8, 2}) {
    again.Mask();
    ASSERT_TRUE(again.Accept(tok));
  }
  EXPECT_EQ(c->mask_computations(), computed);
  // A refused token leaves the state unchanged.
  ConstraintMatcher r(c);
  EXPECT_FALSE(r.Accept(2));
  EXPECT_FALSE(r.Accept(eos));
  EXPECT_TRUE(r.Accept(1));
}

TEST(ConstraintCache, LruBoundAndSharing) {
  ConstraintCache<const Grammar> cache(2);
  auto make = [](const StructuredOutput& c) { return CompileConstraint(c); };
  auto a = cache.GetOrCreate({StructuredOutput::Kind::kRegex, "a"}, make);
  auto a2 = cache.GetOrCreate({StructuredOutput::Kind::kRegex, "a"}, make);
  ASSERT_TRUE(a.ok() && a2.ok());
  EXPECT_EQ(a->get(), a2->get());
  ASSERT_TRUE(cache.GetOrCreate({StructuredOutput::Kind::kRegex, "b"}, make).ok());
  ASSERT_TRUE(cache.GetOrCreate({StructuredOutput::Kind::kRegex, "c"}, make).ok());
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_FALSE(cache.GetOrCreate({StructuredOutput::Kind::kRegex, "("}, make).ok());
  EXPECT_EQ(cache.size(), 2u);
}

}  // namespace
}  // namespace pagedserve::grammar
