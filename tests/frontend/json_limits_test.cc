// The limits on client JSON checked before parsing (runtime/common/json_limits.h):
// nesting, string and array sizes, each at its bound and one past it, with the
// byte offset the error names; brackets and quotes inside strings do not count.
#include "runtime/common/json_limits.h"

#include <string>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

std::string Nested(int levels) { return std::string(levels, '[') + std::string(levels, ']'); }

TEST(JsonLimitsTest, DepthAtTheLimitPassesAndOneMoreLevelFailsWhereItOpens) {
  JsonLimits l;
  l.max_depth = 4;
  EXPECT_TRUE(CheckJsonText(Nested(4), l).ok());
  EXPECT_TRUE(CheckJsonText(R"({"a": {"b": [{"c": 1}]}})", l).ok());
  const absl::Status s = CheckJsonText(Nested(5), l);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "JSON nests deeper than 4 levels (at byte 4)");
  EXPECT_FALSE(CheckJsonText(R"({"a": {"b": [{"c": [1]}]}})", l).ok());
  // Siblings do not add up: depth is what is open at once.
  EXPECT_TRUE(CheckJsonText("[[[]],[[]],[[[]]]]", l).ok());
  // The default (32) and a 200,000-level attack.
  EXPECT_TRUE(CheckJsonText(Nested(32)).ok());
  EXPECT_EQ(CheckJsonText(Nested(200000)).message(),
            "JSON nests deeper than 32 levels (at byte 32)");
}

TEST(JsonLimitsTest, BracketsAndQuotesInsideStringsDoNotCount) {
  JsonLimits l;
  l.max_depth = 2;
  l.max_array_elements = 2;
  EXPECT_TRUE(CheckJsonText(R"({"a": "[[[[{{{{,,,,"})", l).ok());
  EXPECT_TRUE(CheckJsonText(R"({"a": ["x\"[[[[", "\\"]})", l).ok());
  EXPECT_FALSE(CheckJsonText(R"({"a": ["\\", [[1]]]})", l).ok());  // the \\ closes no quote
}

TEST(JsonLimitsTest, ArrayElementsAreCountedPerArray) {
  JsonLimits l;
  l.max_array_elements = 3;
  EXPECT_TRUE(CheckJsonText("[1, 2, 3]", l).ok());
  EXPECT_TRUE(CheckJsonText("[[1, 2, 3], [4, 5, 6], [7, 8, 9]]", l).ok());
  EXPECT_TRUE(CheckJsonText(R"([{"a": 1, "b": 2, "c": 3, "d": 4}, "x", true])", l).ok());
  EXPECT_TRUE(CheckJsonText("[]", l).ok());
  EXPECT_EQ(CheckJsonText("[1, 2, 3, 4]", l).message(),
            "a JSON array has more than 3 elements (at byte 10)");
  EXPECT_FALSE(CheckJsonText(R"([[1], "a", {"b": 2}, null])", l).ok());
  EXPECT_FALSE(CheckJsonText("[[1, 2, 3, 4]]", l).ok());
  // Multi-byte numbers and literals are one element each.
  EXPECT_TRUE(CheckJsonText("[12345, -6.5e3, false]", l).ok());
}

// Object members are counted per object (keys; values are not members), so a
// body cannot hold an object whose key-ordered parse is quadratic in its size.
TEST(JsonLimitsTest, ObjectMembersAreCountedPerObject) {
  JsonLimits l;
  l.max_object_members = 3;
  EXPECT_TRUE(
      CheckJsonText(R"({"a": 1, "b": [1, 2, 3, 4], "c": {"x": 1, "y": 2, "z": 3}})", l).ok());
  EXPECT_TRUE(CheckJsonText("{}", l).ok());
  EXPECT_TRUE(CheckJsonText(R"({"a,b": "c,d", "e": ",", "f": "{"})", l).ok());
  EXPECT_EQ(CheckJsonText(R"({"a": 1, "b": 2, "c": 3, "d": 4})", l).message(),
            "a JSON object has more than 3 members (at byte 25)");
  EXPECT_FALSE(CheckJsonText(R"([{"a": 1, "b": 2, "c": 3, "d": 4}])", l).ok());
  // The array limit still applies to arrays alone.
  l.max_array_elements = 2;
  EXPECT_TRUE(CheckJsonText(R"({"a": 1, "b": 2, "c": 3})", l).ok());
}

TEST(JsonLimitsTest, LongStringsFailAtTheirOpeningQuote) {
  JsonLimits l;
  l.max_string_bytes = 8;
  EXPECT_TRUE(CheckJsonText(R"({"k": "12345678"})", l).ok());
  EXPECT_EQ(CheckJsonText(R"({"k": "123456789"})", l).message(),
            "a JSON string is longer than 8 bytes (string at byte 6)");
  EXPECT_FALSE(CheckJsonText(R"({"0123456789": 1})", l).ok());  // keys are strings too
}

TEST(JsonLimitsTest, MalformedTextWithinTheLimitsIsTheParsersToReport) {
  EXPECT_TRUE(CheckJsonText("").ok());
  EXPECT_TRUE(CheckJsonText("]]]]{").ok());
  EXPECT_TRUE(CheckJsonText("\"unterminated").ok());
  EXPECT_TRUE(CheckJsonText("not json at all, [1,,2]").ok());
}

}  // namespace
}  // namespace pagedserve
