// Protocol v1: request parsing/validation, reply serialization, round trips.
#include "runtime/frontend/protocol.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tests/frontend/protocol_fuzz_entry.h"

namespace pagedserve::protocol {
namespace {

using json = nlohmann::json;

// Expects a rejection with this code whose message contains `needle`.
void ExpectError(std::string_view msg, ErrorCode code, std::string_view needle,
                 std::string_view id = "", const ParseOptions& opt = {}) {
  ParseResult r = ParseRequest(msg, opt);
  ASSERT_FALSE(r.ok()) << msg;
  EXPECT_EQ(ErrorCodeName(r.error.code), ErrorCodeName(code)) << msg << " -> " << r.error.message;
  EXPECT_NE(r.error.message.find(needle), std::string::npos)
      << "message: " << r.error.message << "\nexpected to contain: " << needle;
  EXPECT_EQ(r.error.id, id) << msg;
  // The error reply itself is well-formed protocol.
  json wire = json::parse(SerializeReply(r.error));
  EXPECT_EQ(wire["version"], 1);
  EXPECT_EQ(wire["type"], "error");
  EXPECT_EQ(wire["code"], ErrorCodeName(code));
  EXPECT_EQ(wire["message"], r.error.message);
  EXPECT_EQ(wire.contains("id"), !id.empty());
}

std::string Gen(const std::string& extra) {
  return R"({"version":1,"type":"generate","id":"r7","prompt":"Hi")" + extra + "}";
}

TEST(ProtocolTest, BadInputsFromTheIssue) {
  ExpectError("not json", ErrorCode::kInvalidJson, "message is not valid JSON");
  ExpectError("{\"version\":1,", ErrorCode::kInvalidJson, "not valid JSON");
  ExpectError("", ErrorCode::kInvalidJson, "not valid JSON");
  ExpectError("[1,2]", ErrorCode::kInvalidRequest, "message must be a JSON object, got array");
  ExpectError("42", ErrorCode::kInvalidRequest, "must be a JSON object, got integer");
  ExpectError("\"hello\"", ErrorCode::kInvalidRequest, "got string");
  // Wrong types.
  ExpectError(Gen(R"(,"max_tokens":"10")"), ErrorCode::kInvalidRequest,
              "field 'max_tokens' must be an integer, got string \"10\"", "r7");
  ExpectError(Gen(R"(,"stream":"yes")"), ErrorCode::kInvalidRequest,
              "field 'stream' must be true or false, got string", "r7");
  ExpectError(Gen(R"(,"temperature":"hot")"), ErrorCode::kInvalidRequest,
              "field 'temperature' must be a number, got string", "r7");
  ExpectError(Gen(R"(,"stop":5)"), ErrorCode::kInvalidRequest,
              "field 'stop' must be a string or an array of strings, got integer 5", "r7");
  ExpectError(Gen(R"(,"stop":["a",3])"), ErrorCode::kInvalidRequest,
              "field 'stop[1]' must be a string", "r7");
  ExpectError(Gen(R"(,"seed":1.5)"), ErrorCode::kInvalidRequest,
              "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got 1.5", "r7");
  ExpectError(Gen(R"(,"n":true)"), ErrorCode::kInvalidRequest,
              "field 'n' must be an integer, got boolean", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt":5})", ErrorCode::kInvalidRequest,
              "field 'prompt' must be a string, got integer 5", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","messages":"hi"})",
              ErrorCode::kInvalidRequest, "field 'messages' must be a non-empty array", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","messages":[{"role":"user"}]})",
              ErrorCode::kInvalidRequest,
              "field 'messages[0].content' is required for a 'user' message", "r7");
  ExpectError(
      R"({"version":1,"type":"generate","id":"r7","messages":[{"role":"robot","content":"x"}]})",
      ErrorCode::kInvalidRequest,
      "'messages[0].role' must be one of system, developer, user, assistant, tool", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt_token_ids":[1,"2"]})",
              ErrorCode::kInvalidRequest, "field 'prompt_token_ids[1]' must be an integer token id",
              "r7");
  ExpectError(R"({"version":1,"type":"generate","id":7,"prompt":"x"})", ErrorCode::kInvalidRequest,
              "field 'id' must be a string, got integer 7");
  ExpectError(R"({"version":1,"type":5})", ErrorCode::kInvalidRequest,
              "field 'type' must be a string");
  // Unknown type, missing type.
  ExpectError(R"({"version":1,"type":"fly","id":"q"})", ErrorCode::kUnknownType,
              "unknown message type \"fly\" (expected generate, abort, health or stats)", "q");
  ExpectError(R"({"version":1,"id":"q"})", ErrorCode::kInvalidRequest, "missing field 'type'", "q");
  // Missing / empty prompt.
  ExpectError(R"({"version":1,"type":"generate","id":"r7"})", ErrorCode::kInvalidRequest,
              "missing prompt: one of 'prompt', 'prompt_token_ids' or 'messages' is required",
              "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt":null})",
              ErrorCode::kInvalidRequest, "missing prompt", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt":""})",
              ErrorCode::kInvalidRequest, "field 'prompt' must be a non-empty string", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt_token_ids":[]})",
              ErrorCode::kInvalidRequest, "field 'prompt_token_ids' must be a non-empty array",
              "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","messages":[]})",
              ErrorCode::kInvalidRequest, "field 'messages' must be a non-empty array", "r7");
  ExpectError(R"({"version":1,"type":"generate","id":"r7","prompt":"a","prompt_token_ids":[1]})",
              ErrorCode::kInvalidRequest, "only one of 'prompt', 'prompt_token_ids' or 'messages'",
              "r7");
  // Ranges (messages come from SamplingParams::Validate).
  ExpectError(Gen(R"(,"max_tokens":0)"), ErrorCode::kInvalidRequest,
              "max_tokens must be >= 1, got 0", "r7");
  ExpectError(Gen(R"(,"max_tokens":-1)"), ErrorCode::kInvalidRequest,
              "max_tokens must be >= 1, got -1", "r7");
  ExpectError(Gen(R"(,"top_k":0.5)"), ErrorCode::kInvalidRequest,
              "field 'top_k' must be an integer, got number 0.5", "r7");
  ExpectError(Gen(R"(,"top_k":-2)"), ErrorCode::kInvalidRequest,
              "top_k must be -1 (disabled) or >= 1, got -2", "r7");
  ExpectError(Gen(R"(,"top_p":0)"), ErrorCode::kInvalidRequest, "top_p must be in (0, 1], got 0",
              "r7");
  ExpectError(Gen(R"(,"top_p":1.5)"), ErrorCode::kInvalidRequest,
              "top_p must be in (0, 1], got 1.5", "r7");
  ExpectError(Gen(R"(,"temperature":-1)"), ErrorCode::kInvalidRequest,
              "temperature must be a finite number >= 0, got -1", "r7");
  ExpectError(Gen(R"(,"temperature":1e300)"), ErrorCode::kInvalidRequest,
              "field 'temperature' is out of range", "r7");
  ExpectError(Gen(R"(,"n":65)"), ErrorCode::kInvalidRequest, "n must be in [1, 64], got 65", "r7");
  ExpectError(Gen(R"(,"max_tokens":99999999999)"), ErrorCode::kInvalidRequest,
              "field 'max_tokens' is out of range", "r7");
  ExpectError(Gen(R"(,"logprobs":21)"), ErrorCode::kInvalidRequest,
              "logprobs must be in [-1, 20], got 21", "r7");
  ExpectError(Gen(R"(,"stop":[""])"), ErrorCode::kInvalidRequest,
              "stop[0] must be a non-empty string", "r7");
  // Unknown fields are rejected, not ignored.
  ExpectError(Gen(R"(,"max_token":5)"), ErrorCode::kInvalidRequest,
              "unknown field \"max_token\" in generate request", "r7");
  ExpectError(R"({"version":1,"type":"health","verbose":true})", ErrorCode::kInvalidRequest,
              "unknown field \"verbose\" in health request");
  // Versions.
  ExpectError(R"({"type":"health","id":"h"})", ErrorCode::kUnsupportedVersion,
              "missing field 'version' (this server speaks protocol version 1)", "h");
  ExpectError(R"({"version":2,"type":"health","id":"h"})", ErrorCode::kUnsupportedVersion,
              "unsupported protocol version 2 (this server speaks version 1)", "h");
  ExpectError(R"({"version":"1","type":"health"})", ErrorCode::kUnsupportedVersion,
              "unsupported protocol version \"1\"");
  // Ids.
  ExpectError(R"({"version":1,"type":"abort"})", ErrorCode::kInvalidRequest, "missing field 'id'");
  ExpectError(R"({"version":1,"type":"generate","id":"","prompt":"x"})", ErrorCode::kInvalidRequest,
              "field 'id' must be a non-empty string");
  ExpectError(R"({"version":1,"type":"abort","id":")" + std::string(300, 'x') + "\"}",
              ErrorCode::kInvalidRequest, "field 'id' is longer than 256 bytes");
}

TEST(ProtocolTest, SizeDepthAndVocabularyLimits) {
  // A 10 MB message is refused before parsing.
  std::string huge = Gen(R"(,"stop":")" + std::string(10 << 20, 'a') + "\"");
  ExpectError(huge, ErrorCode::kMessageTooLarge, "message is 10485" /* 10485xxx bytes */);
  ParseOptions small;
  small.max_message_bytes = 20;
  ExpectError(R"({"version":1,"type":"health"})", ErrorCode::kMessageTooLarge,
              "message is 29 bytes, the limit is 20", "", small);
  std::string deep = std::string(100, '[') + std::string(100, ']');
  ExpectError(deep, ErrorCode::kInvalidJson,
              "message: JSON nests deeper than 32 levels (at byte 32)");
  ParseOptions vocab;
  vocab.vocab_size = 100;
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[5,100]})",
              ErrorCode::kInvalidRequest,
              "field 'prompt_token_ids[1]' must be a token id in [0, 100), got 100", "v", vocab);
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[-3]})",
              ErrorCode::kInvalidRequest, "must be a token id in [0, 100), got -3", "v", vocab);
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt":"x","stop_token_ids":[1000]})",
              ErrorCode::kInvalidRequest,
              "field 'stop_token_ids[0]' must be a token id in [0, 100)", "v", vocab);
}

// seed and prompt_token_ids follow the rule of every integer field
// (request_fields.h IntFromJson): a whole number written as a float (42.0,
// 1e3) is that integer; a fraction, a value out of range or a non-number is
// refused naming the field (the element, for a token id).
TEST(ProtocolTest, SeedAndTokenIdsTakeWholeNumbersWrittenAsFloats) {
  ParseOptions vocab;
  vocab.vocab_size = 100;
  auto seed_of = [](const std::string& v) -> std::optional<uint64_t> {
    ParseResult r = ParseRequest(Gen(R"(,"seed":)" + v));
    EXPECT_TRUE(r.ok()) << v << ": " << r.error.message;
    return r.ok() ? std::get<GenerateRequest>(*r.request).sampling.seed : std::nullopt;
  };
  EXPECT_EQ(seed_of("42.0"), std::optional<uint64_t>(42));
  EXPECT_EQ(seed_of("1e3"), std::optional<uint64_t>(1000));
  EXPECT_EQ(seed_of("-1.0"), std::nullopt);  // -1: no seed, as the integer
  EXPECT_EQ(seed_of("-7.0"), std::optional<uint64_t>(static_cast<uint64_t>(-7)));
  EXPECT_EQ(seed_of("1e19"), std::optional<uint64_t>(10000000000000000000ull));
  EXPECT_EQ(seed_of("-9.223372036854775808e18"),
            std::optional<uint64_t>(static_cast<uint64_t>(std::numeric_limits<int64_t>::min())));
  ExpectError(Gen(R"(,"seed":42.5)"), ErrorCode::kInvalidRequest,
              "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got 42.5", "r7");
  ExpectError(
      Gen(R"(,"seed":1.8446744073709552e19)"), ErrorCode::kInvalidRequest,
      "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got 1.8446744073709552e+19",
      "r7");
  ExpectError(Gen(R"(,"seed":-1e300)"), ErrorCode::kInvalidRequest,
              "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got -1e+300", "r7");
  ExpectError(Gen(R"(,"seed":"42")"), ErrorCode::kInvalidRequest,
              "field 'seed' must be an integer in [-2^63, 2^64) (-1: none), got \"42\"", "r7");

  ParseResult ids = ParseRequest(
      R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[5.0,1e1,99,0.0]})", vocab);
  ASSERT_TRUE(ids.ok()) << ids.error.message;
  EXPECT_EQ(std::get<std::vector<int32_t>>(std::get<GenerateRequest>(*ids.request).prompt),
            (std::vector<int32_t>{5, 10, 99, 0}));
  ParseResult stop = ParseRequest(
      R"({"version":1,"type":"generate","id":"v","prompt":"x","stop_token_ids":[2.0]})", vocab);
  ASSERT_TRUE(stop.ok()) << stop.error.message;
  EXPECT_EQ(std::get<GenerateRequest>(*stop.request).sampling.stop_token_ids,
            (std::vector<int32_t>{2}));
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[5,2.5]})",
              ErrorCode::kInvalidRequest,
              "field 'prompt_token_ids[1]' must be an integer token id, got number 2.5", "v",
              vocab);
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[100.0]})",
              ErrorCode::kInvalidRequest,
              "field 'prompt_token_ids[0]' must be a token id in [0, 100), got 100.0", "v", vocab);
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[-1.0]})",
              ErrorCode::kInvalidRequest,
              "field 'prompt_token_ids[0]' must be a token id in [0, 100), got -1.0", "v", vocab);
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[1e300]})",
              ErrorCode::kInvalidRequest,
              "field 'prompt_token_ids[0]' must be a token id in [0, 100), got 1e+300", "v", vocab);
  // Without a vocabulary the bound is int32's.
  ExpectError(R"({"version":1,"type":"generate","id":"v","prompt_token_ids":[2147483647.0]})",
              ErrorCode::kInvalidRequest, "must be a token id in [0, 2147483647)", "v");
}

TEST(ProtocolTest, BracketsInsideStringsDoNotCountAsNesting) {
  ParseResult r = ParseRequest(R"({"version":1,"type":"generate","id":"b","prompt":")" +
                               std::string(200, '[') + R"(\"]]"})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_EQ(std::get<std::string>(std::get<GenerateRequest>(*r.request).prompt),
            std::string(200, '[') + "\"]]");
}

// top_k 0 means off, as -1 (vLLM's rule; the HTTP API reads it the same way,
// request_fields.h ReadSamplingFields).
TEST(ProtocolTest, TopKZeroMeansOff) {
  ParseResult r = ParseRequest(Gen(R"(,"top_k":0)"));
  ASSERT_TRUE(r.ok()) << r.error.message;
  EXPECT_EQ(std::get<GenerateRequest>(*r.request).sampling.top_k, -1);
}

TEST(ProtocolTest, ParsesEveryFieldOfAGenerateRequest) {
  ParseResult r = ParseRequest(R"({"version":1,"type":"generate","id":"abc",
      "prompt_token_ids":[1,2,3],"n":2,"max_tokens":32,"temperature":0.7,"top_p":0.9,"top_k":40,
      "min_p":0.05,"repetition_penalty":1.1,"presence_penalty":0.5,"frequency_penalty":-0.25,
      "seed":18446744073709551615,"stop":["\n","###"],"stop_token_ids":[2],"ignore_eos":true,
      "logprobs":3,"stream":true})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  const auto& g = std::get<GenerateRequest>(*r.request);
  EXPECT_EQ(g.id, "abc");
  EXPECT_EQ(std::get<std::vector<int32_t>>(g.prompt), (std::vector<int32_t>{1, 2, 3}));
  const SamplingParams& s = g.sampling;
  EXPECT_EQ(s.n, 2);
  EXPECT_EQ(s.max_tokens, 32);
  EXPECT_TRUE(g.max_tokens_given);  // refused, not lowered, beyond the context's room
  EXPECT_FLOAT_EQ(s.temperature, 0.7f);
  EXPECT_FLOAT_EQ(s.top_p, 0.9f);
  EXPECT_EQ(s.top_k, 40);
  EXPECT_FLOAT_EQ(s.min_p, 0.05f);
  EXPECT_FLOAT_EQ(s.repetition_penalty, 1.1f);
  EXPECT_FLOAT_EQ(s.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(s.frequency_penalty, -0.25f);
  ASSERT_TRUE(s.seed.has_value());
  EXPECT_EQ(*s.seed, 18446744073709551615ull);
  EXPECT_EQ(s.stop, (std::vector<std::string>{"\n", "###"}));
  EXPECT_EQ(s.stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(s.ignore_eos);
  EXPECT_EQ(s.logprobs, 3);
  EXPECT_TRUE(g.stream);

  // Defaults, a single stop string, nulls, chat messages.
  r = ParseRequest(
      R"({"version":1,"type":"generate","id":"c","messages":[{"role":"user","content":"hé"}],
      "stop":"END","seed":null,"temperature":null})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  const auto& c = std::get<GenerateRequest>(*r.request);
  EXPECT_EQ(std::get<std::vector<ChatMessage>>(c.prompt),
            (std::vector<ChatMessage>{{"user", "hé"}}));
  EXPECT_EQ(c.sampling.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(c.sampling.seed.has_value());
  EXPECT_EQ(c.sampling.temperature, SamplingParams{}.temperature);
  EXPECT_EQ(c.sampling.max_tokens, SamplingParams{}.max_tokens);
  EXPECT_FALSE(c.max_tokens_given);  // the default: the server lowers it to the room
  EXPECT_FALSE(c.stream);

  r = ParseRequest(R"({"version":1,"type":"abort","id":"abc"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<AbortRequest>(*r.request).id, "abc");
  r = ParseRequest(R"({"version":1,"type":"health"})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(std::holds_alternative<HealthRequest>(*r.request));
  r = ParseRequest(R"({"version":1,"type":"stats","id":"s1"})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(std::get<StatsRequest>(*r.request).id, "s1");
}

TEST(ProtocolTest, ValidRequestsRoundTrip) {
  GenerateRequest g;
  g.id = "rt-1";
  g.prompt = std::vector<ChatMessage>{{"system", "Be brief."}, {"user", "2+2? \xF0\x9F\x98\x80"}};
  g.sampling.n = 2;
  g.sampling.temperature = 0.7f;
  g.sampling.top_p = 0.95f;
  g.sampling.min_p = 0.1f;
  g.sampling.top_k = 50;
  g.sampling.seed = 123;
  g.sampling.stop = {"\n\n", "User:"};
  g.sampling.stop_token_ids = {2, 0};
  g.sampling.frequency_penalty = 0.3f;
  g.sampling.logprobs = 5;
  g.stream = true;
  for (const Request& req : {Request{g}, Request{AbortRequest{"rt-1"}}, Request{HealthRequest{}},
                             Request{HealthRequest{"h"}}, Request{StatsRequest{"s"}}}) {
    const std::string wire = SerializeRequest(req);
    json j = json::parse(wire);
    EXPECT_EQ(j["version"], 1);
    ParseResult back = ParseRequest(wire);
    ASSERT_TRUE(back.ok()) << back.error.message << "\n" << wire;
    EXPECT_TRUE(*back.request == req) << wire;
  }
  // Floats travel in their shortest form.
  EXPECT_NE(SerializeRequest(g).find("\"temperature\":0.7,"), std::string::npos)
      << SerializeRequest(g);
  // Issue 32: the logit processors, output options and tool history travel too.
  g.sampling.logit_bias = {{11, 2.5f}, {7, -100.0f}};  // the wire's (string) key order
  g.sampling.min_tokens = 3;
  g.sampling.bad_words = {"foo", " bar baz"};
  g.sampling.skip_special_tokens = false;
  g.sampling.include_stop_str_in_output = true;
  g.prompt = std::vector<ChatMessage>{
      {"user", "weather?"},
      {"assistant", "",
       R"([{"id":"c1","type":"function","function":{"name":"f","arguments":{"a":1}}}])"},
      {"tool", "21", "", "c1", "f"}};
  {
    ParseResult back = ParseRequest(SerializeRequest(g));
    ASSERT_TRUE(back.ok()) << back.error.message << "\n" << SerializeRequest(g);
    EXPECT_TRUE(*back.request == Request{g}) << SerializeRequest(g);
  }
  g.prompt = std::string("plain text");
  EXPECT_TRUE(*ParseRequest(SerializeRequest(g)).request == Request{g});
  g.prompt = std::vector<int32_t>{5, 6, 7};
  EXPECT_TRUE(*ParseRequest(SerializeRequest(g)).request == Request{g});
  // max_tokens travels only when given: a default stays a default (lowered to
  // the context's room by the server), a given value stays given.
  EXPECT_EQ(json::parse(SerializeRequest(g)).count("max_tokens"), 0u);
  g.sampling.max_tokens = 40;
  g.max_tokens_given = true;
  EXPECT_EQ(json::parse(SerializeRequest(g))["max_tokens"], 40);
  EXPECT_TRUE(*ParseRequest(SerializeRequest(g)).request == Request{g});
}

// cache_salt (runtime/common/cache_salt.h): validated at the edge, never echoed.
TEST(ProtocolTest, CacheSaltIsValidatedAndRoundTrips) {
  ParseResult ok = ParseRequest(Gen(R"(,"cache_salt":"tenant-A_01+/=")"));
  ASSERT_TRUE(ok.ok()) << ok.error.message;
  EXPECT_EQ(std::get<GenerateRequest>(*ok.request).cache_salt, "tenant-A_01+/=");
  EXPECT_TRUE(std::get<GenerateRequest>(*ParseRequest(Gen("")).request).cache_salt.empty());
  EXPECT_TRUE(std::get<GenerateRequest>(*ParseRequest(Gen(R"(,"cache_salt":null)")).request)
                  .cache_salt.empty());
  const std::string max(256, 'z');
  ASSERT_TRUE(ParseRequest(Gen(",\"cache_salt\":\"" + max + "\"")).ok());

  ExpectError(Gen(R"(,"cache_salt":"")"), ErrorCode::kInvalidRequest,
              "cache_salt must be a non-empty string", "r7");
  ExpectError(Gen(",\"cache_salt\":\"" + max + "z\""), ErrorCode::kInvalidRequest,
              "cache_salt is 257 bytes; at most 256 are allowed", "r7");
  ExpectError(Gen(R"(,"cache_salt":"two words")"), ErrorCode::kInvalidRequest,
              "cache_salt byte 3 is 0x20", "r7");
  ExpectError(Gen(R"(,"cache_salt":"caf\u00e9")"), ErrorCode::kInvalidRequest,
              "cache_salt byte 3 is 0xC3", "r7");
  ExpectError(Gen(R"(,"cache_salt":"a\nb")"), ErrorCode::kInvalidRequest,
              "cache_salt byte 1 is 0x0A", "r7");
  ExpectError(Gen(R"(,"cache_salt":42)"), ErrorCode::kInvalidRequest,
              "field 'cache_salt' must be a string", "r7");
  // The message never quotes a rejected salt.
  ParseResult bad = ParseRequest(Gen(R"(,"cache_salt":"secret tenant")"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error.message.find("secret"), std::string::npos) << bad.error.message;

  GenerateRequest g = std::get<GenerateRequest>(*ok.request);
  const std::string wire = SerializeRequest(g);
  EXPECT_NE(wire.find("\"cache_salt\":\"tenant-A_01+/=\""), std::string::npos) << wire;
  EXPECT_TRUE(*ParseRequest(wire).request == Request{g});
  g.cache_salt.clear();
  EXPECT_EQ(SerializeRequest(g).find("cache_salt"), std::string::npos) << "absent when empty";
}

// vLLM's priority: as on HTTP (request_fields.h PriorityFromJson), non-zero
// only on a server with --scheduling-policy priority; it round-trips.
TEST(ProtocolTest, PriorityNeedsPrioritySchedulingAndRoundTrips) {
  ExpectError(Gen(R"(,"priority":3)"), ErrorCode::kInvalidRequest,
              "field 'priority' must be 0: priority scheduling is not enabled", "r7");
  ParseResult zero = ParseRequest(Gen(R"(,"priority":0)"));
  ASSERT_TRUE(zero.ok()) << zero.error.message;
  ParseOptions opt;
  opt.priority_scheduling = true;
  ParseResult ok = ParseRequest(Gen(R"(,"priority":-3)"), opt);
  ASSERT_TRUE(ok.ok()) << ok.error.message;
  GenerateRequest g = std::get<GenerateRequest>(*ok.request);
  EXPECT_EQ(g.priority, -3);
  EXPECT_TRUE(*ParseRequest(SerializeRequest(g), opt).request == Request{g});
  // A whole number written as a float is that integer (vLLM's lax reading).
  ParseResult whole = ParseRequest(Gen(R"(,"priority":1.0)"), opt);
  ASSERT_TRUE(whole.ok()) << whole.error.message;
  EXPECT_EQ(std::get<GenerateRequest>(*whole.request).priority, 1);
  ParseResult fraction = ParseRequest(Gen(R"(,"priority":1.5)"), opt);
  ASSERT_FALSE(fraction.ok());
  EXPECT_NE(fraction.error.message.find("field 'priority' must be an integer, got number 1.5"),
            std::string::npos)
      << fraction.error.message;
  ParseResult text = ParseRequest(Gen(R"(,"priority":"high")"), opt);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.error.message.find("field 'priority' must be an integer"), std::string::npos)
      << text.error.message;
}

// The chat template's extra variables, by the rules HTTP shares
// (request_fields.h TemplateKwargsFromJson): messages prompts only, members in
// the client's order, reasoning_effort one of three, reserved names refused.
TEST(ProtocolTest, ChatTemplateKwargsAndReasoningEffort) {
  const std::string chat = R"({"version":1,"type":"generate","id":"c1",)"
                           R"("messages":[{"role":"user","content":"hi"}])";
  ParseResult ok = ParseRequest(
      chat +
      R"(,"chat_template_kwargs":{"zeta":1,"alpha":{"b":1,"a":2}},"reasoning_effort":"low"})");
  ASSERT_TRUE(ok.ok()) << ok.error.message;
  const GenerateRequest& g = std::get<GenerateRequest>(*ok.request);
  EXPECT_EQ(g.chat_template_kwargs, R"({"zeta":1,"alpha":{"b":1,"a":2},"reasoning_effort":"low"})");
  const std::string wire = SerializeRequest(g);
  EXPECT_NE(wire.find(R"("chat_template_kwargs":{"zeta":1,"alpha":{"b":1,"a":2},)"),
            std::string::npos)
      << wire;
  EXPECT_TRUE(*ParseRequest(wire).request == Request{g}) << wire;
  EXPECT_TRUE(
      std::get<GenerateRequest>(*ParseRequest(chat + "}").request).chat_template_kwargs.empty());
  // Given at all on a text prompt, even empty: refused, as HTTP refuses them on
  // /v1/completions.
  ExpectError(Gen(R"(,"chat_template_kwargs":{"a":1})"), ErrorCode::kInvalidRequest,
              "field 'chat_template_kwargs' needs a 'messages' prompt", "r7");
  ExpectError(Gen(R"(,"chat_template_kwargs":{})"), ErrorCode::kInvalidRequest,
              "field 'chat_template_kwargs' needs a 'messages' prompt", "r7");
  ExpectError(Gen(R"(,"reasoning_effort":"low")"), ErrorCode::kInvalidRequest,
              "field 'reasoning_effort' needs a 'messages' prompt", "r7");
  EXPECT_TRUE(ParseRequest(Gen(R"(,"chat_template_kwargs":null)")).ok());
  ExpectError(chat + R"(,"chat_template_kwargs":{"messages":[]}})", ErrorCode::kInvalidRequest,
              "field 'chat_template_kwargs' may not set 'messages'", "c1");
  ExpectError(chat + R"(,"chat_template_kwargs":[1]})", ErrorCode::kInvalidRequest,
              "field 'chat_template_kwargs' must be an object", "c1");
  ExpectError(chat + R"(,"reasoning_effort":"max"})", ErrorCode::kInvalidRequest,
              "field 'reasoning_effort' must be one of", "c1");
  // request_id is HTTP's (the response id); a ZeroMQ request is named by "id".
  ExpectError(chat + R"(,"request_id":"x"})", ErrorCode::kInvalidRequest, "request_id", "c1");
}

TEST(ProtocolTest, RepliesSerializeAsDocumented) {
  DeltaReply d{"r1",
               {{0, "Hel", {9, 10}, {}, std::nullopt}, {1, "Wo", {11}, {}, FinishReason::kLength}}};
  EXPECT_EQ(json::parse(SerializeReply(d)),
            json::parse(R"({"version":1,"type":"delta","id":"r1","outputs":[
      {"index":0,"text":"Hel","token_ids":[9,10]},
      {"index":1,"text":"Wo","token_ids":[11],"finish_reason":"length"}]})"));

  FinalReply f;
  f.id = "r1";
  f.streamed = false;
  SequenceFinal s0;
  s0.index = 0;
  s0.finish_reason = FinishReason::kStop;
  s0.stop_string = "\n";
  s0.text = "Hello";
  s0.token_ids = {9, 10};
  s0.logprobs = {TokenLogprob{9, -0.5f, {9, 4}, {-0.5f, -1.25f}},
                 TokenLogprob{10, -0.125f, {}, {}}};
  f.outputs = {s0};
  f.usage = {5, 2, 4};
  EXPECT_EQ(json::parse(SerializeReply(f)),
            json::parse(R"({"version":1,"type":"final","id":"r1","stream":false,
      "outputs":[{"index":0,"finish_reason":"stop","stop_string":"\n","text":"Hello","token_ids":[9,10],
        "logprobs":[{"token_id":9,"logprob":-0.5,"top":[{"token_id":9,"logprob":-0.5},{"token_id":4,"logprob":-1.25}]},
                    {"token_id":10,"logprob":-0.125,"top":[]}]}],
      "usage":{"prompt_tokens":5,"completion_tokens":2,"cached_prompt_tokens":4}})"));
  f.streamed = true;
  EXPECT_EQ(json::parse(SerializeReply(f)),
            json::parse(R"({"version":1,"type":"final","id":"r1","stream":true,
      "outputs":[{"index":0,"finish_reason":"stop","stop_string":"\n"}],
      "usage":{"prompt_tokens":5,"completion_tokens":2,"cached_prompt_tokens":4}})"));

  EXPECT_EQ(json::parse(SerializeReply(AbortReply{"r1"})),
            json::parse(R"({"version":1,"type":"abort_ack","id":"r1"})"));
  EXPECT_EQ(json::parse(SerializeReply(HealthReply{"", true})),
            json::parse(R"({"version":1,"type":"health","status":"ok"})"));
  EXPECT_EQ(json::parse(ErrorMessage("r9", ErrorCode::kBusy, "waiting queue is full (256)")),
            json::parse(R"j({"version":1,"type":"error","id":"r9","code":"busy",
                            "message":"waiting queue is full (256)"})j"));
  EXPECT_EQ(json::parse(ErrorMessage("r8", ErrorCode::kUnavailable, "shutting down")),
            json::parse(R"j({"version":1,"type":"error","id":"r8","code":"unavailable",
                            "message":"shutting down"})j"));
  StatsReply st{"s", 3, 8, 1, 1000, 250, 0.25, 64, 2048, 256};
  EXPECT_EQ(json::parse(SerializeReply(st)), json::parse(R"({"version":1,"type":"stats","id":"s",
      "num_waiting":3,"num_running":8,"num_swapped":1,"kv_blocks_total":1000,"kv_blocks_used":250,
      "kv_usage":0.25,"max_num_seqs":64,"max_model_len":2048,"max_waiting":256})"));
  // Invalid UTF-8 in text never makes serialization throw.
  DeltaReply broken{"r2", {{0, "ok\xC3", {1}, {}, std::nullopt}}};
  EXPECT_EQ(json::parse(SerializeReply(broken))["outputs"][0]["text"], "ok\xEF\xBF\xBD");
}

// Beam search fields (vLLM's names and meanings), validated at the edge.
TEST(ProtocolTest, BeamSearchFieldsParseValidateAndRoundTrip) {
  ParseResult r = ParseRequest(Gen(
      R"(,"n":2,"use_beam_search":true,"best_of":4,"length_penalty":0.5,"early_stopping":"never")"));
  ASSERT_TRUE(r.ok()) << r.error.message;
  const SamplingParams& p = std::get<GenerateRequest>(*r.request).sampling;
  EXPECT_TRUE(p.use_beam_search);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.best_of, 4);
  EXPECT_EQ(p.beam_width(), 4);
  EXPECT_FLOAT_EQ(p.length_penalty, 0.5f);
  EXPECT_EQ(p.early_stopping, EarlyStopping::kNever);
  EXPECT_EQ(p.temperature, 0.0f);  // absent temperature: 0 with beam search
  for (const char* es : {"true", "false"}) {
    ParseResult b =
        ParseRequest(Gen(absl::StrCat(R"(,"use_beam_search":true,"n":2,"early_stopping":)", es)));
    ASSERT_TRUE(b.ok()) << b.error.message;
    EXPECT_EQ(std::get<GenerateRequest>(*b.request).sampling.early_stopping,
              std::string(es) == "true" ? EarlyStopping::kTrue : EarlyStopping::kFalse);
  }
  ExpectError(Gen(R"(,"use_beam_search":true,"early_stopping":"sometimes")"),
              ErrorCode::kInvalidRequest, "early_stopping", "r7");
  ExpectError(Gen(R"(,"use_beam_search":true,"n":2,"temperature":0.7)"), ErrorCode::kInvalidRequest,
              "temperature must be 0", "r7");
  ExpectError(Gen(R"(,"use_beam_search":true,"n":3,"best_of":2)"), ErrorCode::kInvalidRequest,
              "n (3) must be <= best_of (2)", "r7");
  ExpectError(Gen(R"(,"use_beam_search":true,"best_of":11)"), ErrorCode::kInvalidRequest,
              "must be <= 10", "r7");
  ExpectError(Gen(R"(,"use_beam_search":true,"n":2,"stop":"x")"), ErrorCode::kInvalidRequest,
              "stop strings", "r7");
  ExpectError(Gen(R"(,"use_beam_search":true,"n":2,"top_p":0.5)"), ErrorCode::kInvalidRequest,
              "top_p must be 1", "r7");
  ExpectError(Gen(R"(,"best_of":3)"), ErrorCode::kInvalidRequest, "requires use_beam_search", "r7");
  ExpectError(Gen(R"(,"length_penalty":2)"), ErrorCode::kInvalidRequest, "length_penalty must be 1",
              "r7");
  ExpectError(Gen(R"(,"early_stopping":true)"), ErrorCode::kInvalidRequest,
              "early_stopping must be false", "r7");
  // Round trip.
  GenerateRequest g;
  g.id = "b";
  g.prompt = std::string("x");
  g.sampling.temperature = 0;
  g.sampling.n = 2;
  g.sampling.best_of = 3;
  g.sampling.use_beam_search = true;
  g.sampling.length_penalty = 1.5f;
  g.sampling.early_stopping = EarlyStopping::kTrue;
  ParseResult back = ParseRequest(SerializeRequest(g));
  ASSERT_TRUE(back.ok()) << back.error.message;
  EXPECT_TRUE(*back.request == Request{g}) << SerializeRequest(g);
  // The final message carries each beam's cumulative logprob.
  FinalReply f;
  f.id = "b";
  f.outputs = {
      SequenceFinal{0, FinishReason::kLength, std::nullopt, std::nullopt, "a", {1}, {}, -3.25}};
  const std::string wire = SerializeReply(f);
  EXPECT_EQ(json::parse(wire)["outputs"][0]["cumulative_logprob"], -3.25) << wire;
  auto fb = ParseReply(wire);
  ASSERT_TRUE(fb.ok()) << fb.status();
  EXPECT_TRUE(*fb == Reply{f}) << wire;
}

// prompt_logprobs: parsed into SamplingParams, refused with stream (vLLM's
// rule) or out of range, and carried by the final message (rank included).
TEST(ProtocolTest, PromptLogprobsParseAndRoundTrip) {
  ParseResult r = ParseRequest(
      R"({"version": 1, "type": "generate", "id": "p", "prompt": "x", "prompt_logprobs": 3})");
  ASSERT_TRUE(r.ok()) << r.error.message;
  const GenerateRequest& g = std::get<GenerateRequest>(*r.request);
  EXPECT_EQ(g.sampling.prompt_logprobs, 3);
  ParseResult back = ParseRequest(SerializeRequest(g));
  ASSERT_TRUE(back.ok()) << back.error.message;
  EXPECT_EQ(std::get<GenerateRequest>(*back.request).sampling.prompt_logprobs, 3);
  for (const char* bad : {R"("prompt_logprobs": 2, "stream": true)", R"("prompt_logprobs": 21)",
                          R"("prompt_logprobs": "2")"}) {
    ParseResult e = ParseRequest(
        absl::StrCat(R"({"version": 1, "type": "generate", "id": "p", "prompt": "x", )", bad, "}"));
    ASSERT_FALSE(e.ok()) << bad;
    EXPECT_NE(e.error.message.find("prompt_logprobs"), std::string::npos) << e.error.message;
  }
  FinalReply f;
  f.id = "p";
  f.outputs = {SequenceFinal{
      0, FinishReason::kLength, std::nullopt, std::nullopt, "a", {1}, {}, std::nullopt}};
  f.prompt_logprobs = {{7, -1.5f, 3, {2, 9, 7}, {-0.5f, -1.25f, -1.5f}}, {8, -0.25f, 1, {}, {}}};
  const std::string wire = SerializeReply(f);
  EXPECT_EQ(json::parse(wire)["prompt_logprobs"][0]["rank"], 3) << wire;
  auto fb = ParseReply(wire);
  ASSERT_TRUE(fb.ok()) << fb.status();
  EXPECT_TRUE(*fb == Reply{f}) << wire;
}

// Structured output: the same fields as the HTTP API (request_fields.h), carried
// in SamplingParams and written back as structured_outputs by ToJson.
TEST(ProtocolTest, StructuredOutputFieldsParseAndRoundTrip) {
  struct Case {
    std::string extra;
    StructuredOutput::Kind kind;
    std::string spec;
  };
  for (
      const Case& c : std::vector<Case>{
          {R"(,"guided_regex":"a+b")", StructuredOutput::Kind::kRegex, "a+b"},
          {R"(,"guided_choice":["x","y"])", StructuredOutput::Kind::kChoice, R"(["x","y"])"},
          {R"(,"guided_json":{"type":"integer"})", StructuredOutput::Kind::kJsonSchema,
           R"({"type":"integer"})"},
          // Members in the client's order (generated in that order), not sorted.
          {R"(,"guided_json":{"type":"object","properties":{"z":{},"a":{}}})",
           StructuredOutput::Kind::kJsonSchema,
           R"({"type":"object","properties":{"z":{},"a":{}}})"},
          {R"(,"structured_outputs":{"json_object":true})", StructuredOutput::Kind::kJsonObject,
           ""},
          {R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":{"type":"string"}}})",
           StructuredOutput::Kind::kJsonSchema, R"({"type":"string"})"},
          {R"(,"response_format":{"type":"text"})", StructuredOutput::Kind::kNone, ""}}) {
    ParseResult r = ParseRequest(Gen(c.extra));
    ASSERT_TRUE(r.ok()) << c.extra << ": " << r.error.message;
    const GenerateRequest& g = std::get<GenerateRequest>(*r.request);
    EXPECT_EQ(g.sampling.structured_output.kind, c.kind) << c.extra;
    EXPECT_EQ(g.sampling.structured_output.spec, c.spec) << c.extra;
    ParseResult back = ParseRequest(SerializeRequest(Request{g}));
    ASSERT_TRUE(back.ok()) << back.error.message;
    EXPECT_EQ(std::get<GenerateRequest>(*back.request).sampling.structured_output,
              g.sampling.structured_output);
  }
  ExpectError(Gen(R"(,"guided_regex":"a","guided_choice":["a"])"), ErrorCode::kInvalidRequest,
              "one constraint", "r7");
  ExpectError(Gen(R"(,"guided_grammar":5)"), ErrorCode::kInvalidRequest,
              "field 'guided_grammar' must be a string (a GBNF grammar)", "r7");
  ExpectError(Gen(R"(,"structured_outputs":{"structural_tag":"{}"})"), ErrorCode::kInvalidRequest,
              "structural_tag' is not supported", "r7");
  {
    // A GBNF grammar is parsed here and compiled at admission (Engine::CheckRequest).
    ParseResult r = ParseRequest(Gen(R"(,"guided_grammar":"root ::= \"yes\" | \"no\"")"));
    ASSERT_TRUE(r.ok()) << r.error.message;
    const StructuredOutput& c = std::get<GenerateRequest>(*r.request).sampling.structured_output;
    EXPECT_EQ(c.kind, StructuredOutput::Kind::kGrammar);
    EXPECT_EQ(c.spec, R"(root ::= "yes" | "no")");
  }
  ExpectError(Gen(R"(,"guided_choice":[])"), ErrorCode::kInvalidRequest, "guided_choice", "r7");
  ExpectError(Gen(R"(,"response_format":{"type":"json_schema","json_schema":{}})"),
              ErrorCode::kInvalidRequest, "schema", "r7");
}

// Tool calling over ZeroMQ (request_fields.h's rules, as on HTTP): tools with
// messages only, tool_choice forms, a round trip through SerializeRequest;
// final replies carry the parsed calls.
TEST(ProtocolTest, ToolFieldsParseAndRoundTrip) {
  const std::string chat =
      R"({"version":1,"type":"generate","id":"t1","messages":[{"role":"user","content":"hi"}],)"
      R"("tools":[{"type":"function","function":{"name":"get_time","parameters":{"type":"object",)"
      R"("properties":{"tz":{"type":"string"},"a":{}}}}}])";
  for (const std::string& choice :
       {std::string(R"("required")"), std::string(R"("auto")"),
        std::string(R"({"type":"function","function":{"name":"get_time"}})")}) {
    ParseResult r = ParseRequest(
        absl::StrCat(chat, R"(,"tool_choice":)", choice, R"(,"parallel_tool_calls":false})"));
    ASSERT_TRUE(r.ok()) << choice << ": " << r.error.message;
    const GenerateRequest& g = std::get<GenerateRequest>(*r.request);
    EXPECT_TRUE(g.tools.parse_tool_calls());
    EXPECT_FALSE(g.tools.parallel_tool_calls);
    // The client's key order ("tz" before "a") for the chat template.
    EXPECT_NE(g.tools.tools_json.find(R"("tz":{"type":"string"},"a":{})"), std::string::npos)
        << g.tools.tools_json;
    ParseResult back = ParseRequest(SerializeRequest(Request{g}));
    ASSERT_TRUE(back.ok()) << back.error.message;
    const ToolFields& t = std::get<GenerateRequest>(*back.request).tools;
    EXPECT_EQ(t.choice, g.tools.choice);
    EXPECT_EQ(t.function, g.tools.function);
    EXPECT_EQ(t.parallel_tool_calls, g.tools.parallel_tool_calls);
    EXPECT_EQ(t.tools_json, g.tools.tools_json);  // the key order survives the wire
    EXPECT_TRUE(*back.request == Request{g});
  }
  ExpectError(Gen(R"(,"tools":[{"type":"function","function":{"name":"f"}}])"),
              ErrorCode::kInvalidRequest, "'messages'", "r7");
  ExpectError(chat + R"(,"tool_choice":"sometimes"})", ErrorCode::kInvalidRequest, "tool_choice",
              "t1");
  ExpectError(chat + R"(,"tool_choice":"required","guided_regex":"x"})", ErrorCode::kInvalidRequest,
              "another constraint", "t1");
  ExpectError(chat + R"(,"tools":{}})", ErrorCode::kInvalidRequest, "tools", "t1");

  FinalReply f;
  f.id = "t1";
  f.outputs.resize(1);
  f.outputs[0].text = "<tool_call>x</tool_call>";
  f.outputs[0].tool_calls = {{"call_1", "get_time", R"({"tz":"UTC"})"}};
  f.outputs[0].content = "Sure.";
  absl::StatusOr<Reply> back = ParseReply(SerializeReply(Reply{f}));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(std::get<FinalReply>(*back), f);
}

TEST(ProtocolTest, RepliesRoundTripThroughParseReply) {
  FinalReply f;
  f.id = "x";
  f.outputs = {
      SequenceFinal{0, FinishReason::kStop, std::nullopt, 2, "a", {1}, {}, std::nullopt},
      SequenceFinal{
          1, FinishReason::kError, std::nullopt, std::nullopt, "b", {3}, {}, std::nullopt}};
  f.usage = {1, 2, 0};
  f.error_message = "worker 1 failed";
  const std::vector<Reply> replies = {
      Reply{ErrorReply{"e", ErrorCode::kPromptTooLong,
                       "prompt has 5000 tokens, max_model_len is 2048"}},
      Reply{ErrorReply{"", ErrorCode::kInvalidJson, "m"}},
      Reply{ErrorReply{"u", ErrorCode::kUnavailable, "the server is shutting down"}},
      Reply{ErrorReply{"i", ErrorCode::kInternal, "m"}},
      Reply{DeltaReply{
          "d", {{1, "x", {4}, {TokenLogprob{4, -1.5f, {4}, {-1.5f}}}, FinishReason::kAbort}}}},
      Reply{f},
      Reply{AbortReply{"a"}},
      Reply{HealthReply{"h", false}},
      Reply{StatsReply{"", 1, 2, 3, 4, 5, 0.5, 6, 7, 8}}};
  for (const Reply& r : replies) {
    const std::string wire = SerializeReply(r);
    auto back = ParseReply(wire);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << wire;
    EXPECT_TRUE(*back == r) << wire;
  }
  EXPECT_FALSE(ParseReply("{}").ok());
  EXPECT_FALSE(ParseReply(R"({"version":2,"type":"health","status":"ok"})").ok());
  EXPECT_NE(ParseReply(R"({"version":1,"type":"error","code":"nope","message":"m"})")
                .status()
                .message()
                .find("nope"),
            std::string::npos);
}

// Replays the committed seed corpus through the fuzz entry point, so that the
// invariants the fuzzer checks run on every build (with or without clang).
TEST(ProtocolFuzzCorpusTest, SeedCorpusHoldsTheInvariants) {
  const char* root = std::getenv("PAGEDSERVE_SOURCE_DIR");
  ASSERT_NE(root, nullptr) << "PAGEDSERVE_SOURCE_DIR is set by ctest";
  const std::filesystem::path dir = std::filesystem::path(root) / "tests/frontend/corpus";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(ProtocolFuzzOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
              "")
        << entry.path();
    // Every prefix too: truncated messages are the most common malformed input.
    for (size_t n = 0; n < bytes.size(); n += 7) {
      EXPECT_EQ(ProtocolFuzzOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), n), "")
          << entry.path() << " prefix " << n;
    }
    ++files;
  }
  EXPECT_GE(files, 10);
}

}  // namespace
}  // namespace pagedserve::protocol
