// --speculative-config parsing and the n-gram (prompt lookup) proposer.
#include "runtime/coordinator/speculative.h"

#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

TEST(SpeculativeConfigTest, ParsesVllmJson) {
  auto c = ParseSpeculativeConfig(
      R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
          "prompt_lookup_min": 2})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->enabled());
  EXPECT_EQ(c->num_speculative_tokens, 4);
  EXPECT_EQ(c->prompt_lookup_max, 4);
  EXPECT_EQ(c->prompt_lookup_min, 2);
  EXPECT_EQ(c->disable_by_batch_size, 0);
  auto empty = ParseSpeculativeConfig("");
  ASSERT_TRUE(empty.ok());
  EXPECT_FALSE(empty->enabled());
  auto defaults = ParseSpeculativeConfig(R"({"method": "ngram", "num_speculative_tokens": 3})");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  EXPECT_EQ(defaults->prompt_lookup_min, 1);
  EXPECT_EQ(defaults->prompt_lookup_max, 4);
}

// vLLM's draft-model form: "model" implies "method": "draft_model"; the
// proposer leaves placeholders for the workers' draft model.
TEST(SpeculativeConfigTest, ParsesDraftModel) {
  auto c =
      ParseSpeculativeConfig(R"({"model": "/models/draft.gguf", "num_speculative_tokens": 5})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->enabled());
  EXPECT_EQ(c->method, "draft_model");
  EXPECT_EQ(c->model, "/models/draft.gguf");
  EXPECT_EQ(c->num_speculative_tokens, 5);
  auto explicit_method = ParseSpeculativeConfig(
      R"({"method": "draft_model", "model": "/d", "num_speculative_tokens": 1})");
  ASSERT_TRUE(explicit_method.ok()) << explicit_method.status();
  std::unique_ptr<Proposer> p = MakeProposer(*c);
  ASSERT_NE(p, nullptr);
  std::vector<int32_t> draft = {9};
  p->Propose(std::vector<int32_t>{1, 2, 3}, 3, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{kNoToken, kNoToken, kNoToken}));
}

TEST(SpeculativeConfigTest, BadInputNamesTheKey) {
  struct Case {
    const char* json;
    const char* names;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "JSON object"},
           {"[1]", "JSON object"},
           {R"({"num_speculative_tokens": 4})", "\"method\""},
           {R"({"method": "eagle", "num_speculative_tokens": 4})", "\"method\""},
           {R"({"method": "ngram"})", "\"num_speculative_tokens\""},
           {R"({"method": "ngram", "num_speculative_tokens": 0})", "\"num_speculative_tokens\""},
           {R"({"method": "ngram", "num_speculative_tokens": 99})",
            "\"num_speculative_tokens\" must be in [1, 16], got 99"},
           {R"({"method": "ngram", "num_speculative_tokens": -1})",
            "\"num_speculative_tokens\" must be in [1, 16], got -1"},
           {R"({"method": "ngram", "num_speculative_tokens": 99999999999})",
            "\"num_speculative_tokens\" is out of range"},
           {R"({"method": "ngram", "num_speculative_tokens": "4"})", "\"num_speculative_tokens\""},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5,
               "prompt_lookup_max": 3})",
            "\"prompt_lookup_min\""},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "typo": 1})", "\"typo\""},
           {R"({"model": "", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"model": 3, "num_speculative_tokens": 2})", "\"model\""},
           {R"({"method": "ngram", "model": "/m", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"method": "draft_model", "num_speculative_tokens": 2})", "\"model\""},
           {R"({"model": "/m", "num_speculative_tokens": 2, "prompt_lookup_max": 2})",
            "\"prompt_lookup_max\""},
           {R"({"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": -1})",
            "\"disable_by_batch_size\""},
       }) {
    auto got = ParseSpeculativeConfig(c.json);
    ASSERT_FALSE(got.ok()) << c.json;
    EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_NE(got.status().message().find(c.names), std::string::npos)
        << c.json << " -> " << got.status();
    EXPECT_NE(got.status().message().find("--speculative-config"), std::string::npos);
  }
}

TEST(NgramProposerTest, LongestNgramFirstOccurrence) {
  NgramProposer p(1, 3);
  std::vector<int32_t> draft;
  // Tail [7 8 9] occurs at 1: propose what followed (4 5 6 ...).
  p.Propose(std::vector<int32_t>{1, 7, 8, 9, 4, 5, 6, 2, 7, 8, 9}, 3, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{4, 5, 6}));
  // Only the 1-gram [9] matches (3-gram and 2-gram do not): its first occurrence.
  p.Propose(std::vector<int32_t>{9, 1, 2, 9, 3, 5, 9}, 2, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{1, 2}));
  // Fewer tokens near the end.
  p.Propose(std::vector<int32_t>{4, 4}, 5, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{4}));
  // No match, and min_n excludes short matches.
  p.Propose(std::vector<int32_t>{1, 2, 3}, 4, &draft);
  EXPECT_TRUE(draft.empty());
  NgramProposer two(2, 2);
  two.Propose(std::vector<int32_t>{9, 1, 2, 9}, 4, &draft);
  EXPECT_TRUE(draft.empty());
  two.Propose(std::vector<int32_t>{9, 1, 2, 9, 1}, 4, &draft);
  EXPECT_EQ(draft, (std::vector<int32_t>{2, 9, 1}));
}

TEST(AcceptanceTest, LongestMatchingPrefix) {
  EXPECT_EQ(AcceptedDraftLength(std::vector<int32_t>{1, 2, 3}, std::vector<int32_t>{1, 2, 4, 5}),
            2);
  EXPECT_EQ(AcceptedDraftLength(std::vector<int32_t>{1, 2}, std::vector<int32_t>{1, 2, 7}), 2);
  EXPECT_EQ(AcceptedDraftLength(std::vector<int32_t>{3}, std::vector<int32_t>{1, 3}), 0);
}

}  // namespace
}  // namespace pagedserve
