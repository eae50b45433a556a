// Tool-call parsing against model outputs written by hand from the models'
// documentation: Hermes 2 Pro / Qwen 2.5 (`<tool_call>` blocks), Llama 3.1 /
// 3.2 JSON tool calling (Meta's prompt-format page: `{"name": ..., "parameters":
// ...}`, `<|python_tag|>`), Mistral (`[TOOL_CALLS]` with a JSON list, and the
// v11 `name[ARGS]{...}` form). Malformed outputs come back as content.
#include "runtime/frontend/tool_calls.h"

#include <gtest/gtest.h>

#include <string>

#include "nlohmann/json.hpp"

namespace pagedserve {
namespace {

using ordered_json = nlohmann::ordered_json;

void ExpectCall(const ToolCall& c, const std::string& name, const std::string& args) {
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(c.arguments, args);  // compact JSON, the model's key order
  EXPECT_EQ(c.id.rfind("call_", 0), 0u) << c.id;
  EXPECT_EQ(c.id.size(), 29u) << c.id;
}

TEST(ToolCallsTest, HermesBlocks) {
  const std::string out =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {\"tz\": \"Europe/Paris\"}}\n</tool_call>";
  ParsedToolCalls p = ParseToolCalls(ToolCallFormat::kHermes, out);
  EXPECT_EQ(p.content, "Let me check.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  ExpectCall(p.calls[0], "get_weather", R"({"city":"Paris","unit":"celsius"})");
  ExpectCall(p.calls[1], "get_time", R"({"tz":"Europe/Paris"})");
  EXPECT_NE(p.calls[0].id, p.calls[1].id);
  // An unclosed last block (generation stopped at </tool_call>'s first token).
  p = ParseToolCalls(ToolCallFormat::kHermes,
                     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": \"}\"}}\n");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  ExpectCall(p.calls[0], "f", R"({"x":"}"})");
}

TEST(ToolCallsTest, Llama3Json) {
  ParsedToolCalls p = ParseToolCalls(
      ToolCallFormat::kLlama3Json,
      R"({"name": "get_current_conditions", "parameters": {"location": "San Francisco, CA", "unit": "Fahrenheit"}})");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "");
  ExpectCall(p.calls[0], "get_current_conditions",
             R"({"location":"San Francisco, CA","unit":"Fahrenheit"})");
  p = ParseToolCalls(ToolCallFormat::kLlama3Json,
                     "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", "
                     "\"arguments\": {\"k\": [1, 2]}}");
  ASSERT_EQ(p.calls.size(), 2u);
  ExpectCall(p.calls[0], "a", "{}");
  ExpectCall(p.calls[1], "b", R"({"k":[1,2]})");
  // Prose that merely mentions JSON later is content.
  p = ParseToolCalls(ToolCallFormat::kLlama3Json, R"(Use {"name": "a", "parameters": {}})");
  EXPECT_TRUE(p.calls.empty());
}

TEST(ToolCallsTest, Mistral) {
  ParsedToolCalls p = ParseToolCalls(
      ToolCallFormat::kMistral,
      R"([TOOL_CALLS][{"name": "get_current_weather", "arguments": {"location": "Paris, France", "format": "celsius"}}])");
  ASSERT_EQ(p.calls.size(), 1u);
  ExpectCall(p.calls[0], "get_current_weather",
             R"({"location":"Paris, France","format":"celsius"})");
  p = ParseToolCalls(
      ToolCallFormat::kMistral,
      R"(Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]now[ARGS]{})");
  EXPECT_EQ(p.content, "Sure. ");
  ASSERT_EQ(p.calls.size(), 2u);
  ExpectCall(p.calls[0], "get_weather", R"({"city":"Oslo"})");
  ExpectCall(p.calls[1], "now", "{}");
}

TEST(ToolCallsTest, MalformedOutputIsContent) {
  const std::pair<ToolCallFormat, std::string> bad[] = {
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}"},
      {ToolCallFormat::kHermes, "<tool_call>{\"arguments\": {}}</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\", \"arguments\": \"x\"}</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>not json</tool_call>"},
      {ToolCallFormat::kHermes, "<tool_call>{\"name\": \"f\"}</tool_call> trailing"},
      {ToolCallFormat::kHermes,
       "<tool_call>" + std::string(100, '[') + std::string(100, ']') + "</tool_call>"},
      {ToolCallFormat::kLlama3Json, "{\"name\": 3, \"parameters\": {}}"},
      {ToolCallFormat::kLlama3Json, "{\"name\": \"f\", \"parameters\": {}} and more"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][]"},
      {ToolCallFormat::kMistral, "[TOOL_CALLS]f[ARGS]{\"a\": "},
      {ToolCallFormat::kMistral, "[TOOL_CALLS][{\"name\": \"f\"}, 7]"},
  };
  for (const auto& [format, text] : bad) {
    ParsedToolCalls p = ParseToolCalls(format, text);
    EXPECT_TRUE(p.calls.empty()) << text;
    EXPECT_EQ(p.content, text);
  }
  // Plain prose in every format.
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    EXPECT_EQ(ParseToolCalls(f, "The answer is 42.").content, "The answer is 42.");
  }
}

TEST(ToolCallsTest, StreamingHoldsBackWhatMayBecomeACall) {
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kHermes, "Hello <tool"), 6u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kHermes, "Hello <b>"), 9u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kHermes, "Hi<tool_call>{"), 2u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kMistral, "ok [TOOL_"), 3u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kLlama3Json, "  "), 0u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kLlama3Json, " {\"na"), 0u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kLlama3Json, "<|pyth"), 0u);
  EXPECT_EQ(ToolCallFreeContentPrefix(ToolCallFormat::kLlama3Json, "Sure {"), 6u);
}

TEST(ToolCallsTest, FormatNamesAndTemplates) {
  EXPECT_EQ(*ToolCallFormatFromName("hermes"), ToolCallFormat::kHermes);
  EXPECT_EQ(*ToolCallFormatFromName("llama3_json"), ToolCallFormat::kLlama3Json);
  EXPECT_EQ(*ToolCallFormatFromName("mistral"), ToolCallFormat::kMistral);
  EXPECT_FALSE(ToolCallFormatFromName("pythonic").ok());
  EXPECT_EQ(ToolCallFormatOfTemplate("{{ '<tool_call>\\n' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(ToolCallFormatOfTemplate("{{ '[TOOL_CALLS]' }}"), ToolCallFormat::kMistral);
  EXPECT_EQ(ToolCallFormatOfTemplate("<|start_header_id|>ipython<|end_header_id|>"),
            ToolCallFormat::kLlama3Json);
}

}  // namespace
}  // namespace pagedserve
