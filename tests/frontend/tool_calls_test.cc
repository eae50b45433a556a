// Tool-call parsing against model outputs written by hand from the models'
// documentation: Hermes 2 Pro / Qwen 2.5 (`<tool_call>` blocks), Llama 3.1 /
// 3.2 JSON tool calling (Meta's prompt-format page: `{"name": ..., "parameters":
// ...}`, `<|python_tag|>`), Mistral (`[TOOL_CALLS]` with a JSON list, and the
// v11 `name[ARGS]{...}` form). Malformed outputs come back as content.
#include "runtime/frontend/tool_calls.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "nlohmann/json.hpp"
#include "runtime/grammar/compile.h"
#include "runtime/grammar/json_schema.h"

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

// Streaming calls: for every prefix of outputs of each format (cut at every
// byte), the calls StreamableToolCalls gives have the final names and
// arguments that are prefixes of the final `arguments`, each extending the
// last; on the whole output they are the final calls, complete. Strings with
// escapes, surrogate pairs and raw UTF-8, numbers that re-serialize (1.50,
// 1e2), nesting and white space are in them.
TEST(ToolCallsTest, StreamedArgumentsAddUpToTheFinalArguments) {
  const std::string args1 =
      R"({"city": "Par\"is \u00e9 \ud83d\ude00 é😀", "n": 1.50, "big": 1e2, "ok": true,)"
      R"( "tags": [ "a" , {"deep": [null, -0, 3]} ], "empty": {}, "s": "x\\y\n"})";
  const std::string args2 = R"({"q":"second"})";
  const std::pair<ToolCallFormat, std::string> outputs[] = {
      {ToolCallFormat::kHermes,
       "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
       "\"arguments\": " +
           args1 +
           "}\n</tool_call>\n<tool_call>"
           "{\"name\": \"search\", \"arguments\": " +
           args2 + "}</tool_call>"},
      {ToolCallFormat::kLlama3Json,
       "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": " + args1 +
           "}; {\"name\": \"search\", \"parameters\": " + args2 + "}"},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args1 +
           "}, {\"name\": \"search\", \"arguments\": " + args2 + "}]"},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS]get_weather[ARGS]" + args1 + "[TOOL_CALLS]search[ARGS]" + args2},
  };
  for (const auto& [format, out] : outputs) {
    SCOPED_TRACE(out);
    const ParsedToolCalls final_calls = ParseToolCalls(format, out);
    ASSERT_EQ(final_calls.calls.size(), 2u);
    const size_t start = ToolCallFreeContentPrefix(format, out);
    std::vector<std::string> last(2);
    std::vector<int> growths(2, 0);  // how many cuts extended each call's prefix
    size_t max_seen = 0;
    for (size_t cut = start; cut <= out.size(); ++cut) {
      const std::vector<PartialToolCall> calls =
          StreamableToolCalls(format, std::string_view(out).substr(start, cut - start));
      ASSERT_LE(calls.size(), 2u);
      ASSERT_GE(calls.size(), max_seen) << "a call disappeared at byte " << cut;
      max_seen = calls.size();
      for (size_t i = 0; i < calls.size(); ++i) {
        const ToolCall& want = final_calls.calls[i];
        EXPECT_EQ(calls[i].name, want.name) << "byte " << cut;
        ASSERT_EQ(want.arguments.rfind(calls[i].arguments_prefix, 0), 0u)
            << "byte " << cut << ": '" << calls[i].arguments_prefix << "' is not a prefix of '"
            << want.arguments << "'";
        ASSERT_EQ(calls[i].arguments_prefix.rfind(last[i], 0), 0u)
            << "byte " << cut << ": the prefix shrank";
        growths[i] += calls[i].arguments_prefix.size() > last[i].size();
        last[i] = calls[i].arguments_prefix;
      }
    }
    const std::vector<PartialToolCall> whole =
        StreamableToolCalls(format, std::string_view(out).substr(start));
    ASSERT_EQ(whole.size(), 2u);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(whole[i].arguments_prefix, final_calls.calls[i].arguments);
      EXPECT_TRUE(whole[i].arguments_complete);
    }
    // Streamed as written, not at the end: call 0 grew at most of its bytes.
    EXPECT_GE(growths[0], 60) << "call 0's arguments grew in " << growths[0] << " steps";
    EXPECT_GE(growths[1], 5);
  }
  // Only a name written first is streamed; an incomplete name is not.
  EXPECT_TRUE(StreamableToolCalls(ToolCallFormat::kHermes,
                                  R"(<tool_call>{"arguments": {"a": 1}, "name": "f"})")
                  .empty());
  EXPECT_TRUE(
      StreamableToolCalls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "get_wea)").empty());
  const std::vector<PartialToolCall> named =
      StreamableToolCalls(ToolCallFormat::kHermes, R"(<tool_call>{"name": "f", "argu)");
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].name, "f");
  EXPECT_EQ(named[0].arguments_prefix, "");
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

// tool_choice "required" / a named function: the grammar of the calls.
constexpr char kTools[] = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12},
                   "unit": {"enum": ["celsius", "fahrenheit"]},
                   "days": {"type": "integer", "minimum": 1, "maximum": 14}},
    "required": ["city", "days"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {
    "properties": {"tz": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
    "required": ["tz"]}}},
  {"type": "function", "function": {"name": "ping"}}])";

std::shared_ptr<const grammar::Grammar> ToolGrammar(ToolCallFormat f, const std::string& fn,
                                                    bool parallel) {
  absl::StatusOr<StructuredOutput> c = ToolChoiceConstraint(f, kTools, fn, parallel);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  EXPECT_EQ(c->kind, StructuredOutput::Kind::kToolCalls);
  auto g = grammar::CompileConstraint(*c);
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? *g : nullptr;
}

TEST(ToolChoiceGrammar, SentencesOfEachFormat) {
  const std::string w = R"({"name": "get_weather", "arguments": {"city":"Paris","days":3}})";
  const std::string t = R"({"name": "get_time", "arguments": {"tz":"Europe/Paris"}})";
  auto hermes = ToolGrammar(ToolCallFormat::kHermes, "", true);
  EXPECT_TRUE(hermes->Matches("<tool_call>\n" + w + "\n</tool_call>"));
  EXPECT_TRUE(hermes->Matches("<tool_call>\n" + w + "\n</tool_call>\n<tool_call>\n" + t +
                              "\n</tool_call>"));
  EXPECT_TRUE(
      hermes->Matches("<tool_call>\n{\"name\": \"ping\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(hermes->Matches(""));                                            // at least one call
  EXPECT_FALSE(hermes->Matches("Sure. <tool_call>\n" + w + "\n</tool_call>"));  // no prose
  EXPECT_FALSE(hermes->Matches(  // days out of [1, 14]
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\",\"days\":15}}"
      "\n</tool_call>"));
  EXPECT_FALSE(hermes->Matches(  // a function that is not a tool
      "<tool_call>\n{\"name\": \"rm\", \"arguments\": {}}\n</tool_call>"));
  auto single = ToolGrammar(ToolCallFormat::kHermes, "", false);
  EXPECT_TRUE(single->Matches("<tool_call>\n" + w + "\n</tool_call>"));
  EXPECT_FALSE(single->Matches("<tool_call>\n" + w + "\n</tool_call>\n<tool_call>\n" + t +
                               "\n</tool_call>"));
  auto named = ToolGrammar(ToolCallFormat::kHermes, "get_time", true);
  EXPECT_TRUE(named->Matches("<tool_call>\n" + t + "\n</tool_call>"));
  EXPECT_FALSE(named->Matches("<tool_call>\n" + w + "\n</tool_call>"));
  EXPECT_FALSE(named->Matches("<tool_call>\n" + t + "\n</tool_call>\n<tool_call>\n" + t +
                              "\n</tool_call>"));  // named: exactly one call
  auto llama = ToolGrammar(ToolCallFormat::kLlama3Json, "", true);
  EXPECT_TRUE(llama->Matches(
      R"({"name": "get_time", "parameters": {"tz":"Asia/Tokyo"}}; {"name": "ping", "parameters": {}})"));
  EXPECT_FALSE(llama->Matches(R"({"name": "get_time", "arguments": {"tz":"Asia/Tokyo"}})"));
  auto mistral = ToolGrammar(ToolCallFormat::kMistral, "", true);
  EXPECT_TRUE(mistral->Matches("[TOOL_CALLS][" + w + ", " + t + "]"));
  EXPECT_FALSE(mistral->Matches("[TOOL_CALLS][]"));
}

TEST(ToolChoiceGrammar, BadChoicesAreErrors) {
  EXPECT_FALSE(ToolChoiceConstraint(ToolCallFormat::kHermes, kTools, "rm", true).ok());
  EXPECT_FALSE(ToolChoiceConstraint(ToolCallFormat::kHermes, "[]", "", true).ok());
  // Arguments that are not an object would not parse as a call: refused.
  auto c = ToolChoiceConstraint(
      ToolCallFormat::kHermes,
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"string"}}}])", "", true);
  ASSERT_TRUE(c.ok());
  auto g = grammar::CompileConstraint(*c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("tools[0] 'f'"), std::string::npos) << g.status();
  c = ToolChoiceConstraint(
      ToolCallFormat::kHermes,
      R"([{"type":"function","function":{"name":"f","parameters":{"type":"object","not":{}}}}])",
      "", true);
  ASSERT_TRUE(c.ok());
  g = grammar::CompileConstraint(*c);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("'not'"), std::string::npos) << g.status();
}

// A random sentence of the grammar: random allowed bytes (printable ASCII
// preferred), closing bytes preferred once the text is long.
std::string RandomSentence(const grammar::Grammar& g, std::mt19937& rng) {
  grammar::GrammarState s = g.initial();
  std::string out;
  while (out.size() < 4000) {
    const grammar::ByteSet allowed = g.Allowed(s);
    if (allowed.none() || (g.Accepting(s) && rng() % 4 == 0)) break;
    std::vector<int> choices;
    if (out.size() > 200) {
      for (const unsigned char b : {'"', '}', ']', '\n', '<', ',', '/'}) {
        if (allowed.test(b)) choices.push_back(b);
      }
    }
    for (int b = 0x20; choices.empty() && b < 0x7f; ++b) {
      if (allowed.test(b)) choices.push_back(b);
    }
    for (int b = 0; choices.empty() && b < 256; ++b) {
      if (allowed.test(b)) choices.push_back(b);
    }
    const int b = choices[rng() % choices.size()];
    out.push_back(static_cast<char>(b));
    s = g.Advance(s, static_cast<uint8_t>(b));
  }
  EXPECT_TRUE(g.Accepting(s)) << out;
  return out;
}

TEST(ToolChoiceGrammar, EverySentenceParsesIntoCallsOfTheTools) {
  const ordered_json tools = ordered_json::parse(kTools);
  std::mt19937 rng(32);
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral}) {
    for (bool parallel : {true, false}) {
      auto g = ToolGrammar(f, "", parallel);
      ASSERT_NE(g, nullptr);
      size_t several = 0;
      for (int i = 0; i < 100; ++i) {
        const std::string text = RandomSentence(*g, rng);
        const ParsedToolCalls parsed = ParseToolCalls(f, text);
        ASSERT_FALSE(parsed.calls.empty()) << ToolCallFormatName(f) << ": " << text;
        EXPECT_EQ(parsed.content, "") << text;
        if (!parallel) {
          EXPECT_EQ(parsed.calls.size(), 1u) << text;
        }
        several += parsed.calls.size() > 1;
        for (const ToolCall& call : parsed.calls) {
          // The arguments are an instance of the tool's own schema.
          const ordered_json* params = nullptr;
          for (const ordered_json& t : tools) {
            if (t["function"]["name"] == call.name) params = &t["function"];
          }
          ASSERT_NE(params, nullptr) << call.name;
          ordered_json schema = params->value("parameters", ordered_json::object());
          if (!schema.contains("type")) schema["type"] = "object";
          auto sg = grammar::CompileJsonSchema(schema.dump());
          ASSERT_TRUE(sg.ok());
          EXPECT_TRUE((*sg)->Matches(call.arguments)) << call.name << " " << call.arguments;
        }
      }
      if (parallel) {
        EXPECT_GT(several, 0u) << ToolCallFormatName(f);
      }
    }
  }
}

}  // namespace
}  // namespace pagedserve
