// The OpenAI request validation (openai_api.h) without a server: every prompt
// form, the field types and ranges, the error object, the response formats,
// and the constant-time key comparison of the HTTP server.
#include "runtime/frontend/openai_api.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"
#include "runtime/frontend/http_server.h"
#include "runtime/frontend/protocol.h"
#include "runtime/tokenizer/loaders.h"
#include "tests/common/fixture_tokenizer.h"
#include "tests/http/openai_fuzz_entry.h"

namespace pagedserve::openai {
namespace {

using json = nlohmann::json;

const Tokenizer& Tok() { return testing::FixtureTokenizer(); }

const ServedModel kModel{"smol", 128, 49152, {}};

ParseOutcome Completions(const std::string& body) {
  return ParseRequest(Endpoint::kCompletions, body, kModel, Tok(), nullptr);
}

// The error's status and `param` of a request that must be refused.
std::pair<int, std::string> Refused(const std::string& body) {
  ParseOutcome o = Completions(body);
  EXPECT_FALSE(o.request.has_value()) << body;
  return {o.error.status, o.error.param};
}

TEST(OpenAiApiTest, EveryPromptForm) {
  ParseOutcome text = Completions(R"({"prompt": "Hello world"})");
  ASSERT_TRUE(text.request.has_value()) << text.error.message;
  const std::vector<int32_t> ids = Tok().Encode("Hello world");
  EXPECT_EQ(text.request->prompts, std::vector<std::vector<int32_t>>{ids});
  EXPECT_EQ(text.request->params.max_tokens, 16);  // OpenAI's default for completions
  EXPECT_EQ(text.request->model, "smol");

  json as_ids = {{"prompt", ids}};
  ParseOutcome by_ids = Completions(as_ids.dump());
  ASSERT_TRUE(by_ids.request.has_value());
  EXPECT_EQ(by_ids.request->prompts, text.request->prompts);

  ParseOutcome several = Completions(R"({"prompt": ["a", "b c"], "n": 2})");
  ASSERT_TRUE(several.request.has_value());
  EXPECT_EQ(several.request->prompts.size(), 2u);
  ParseOutcome nested = Completions(R"({"prompt": [[1, 2], [3]]})");
  ASSERT_TRUE(nested.request.has_value());
  EXPECT_EQ(nested.request->prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
}

// The sampling fields both front ends read alike (request_fields.h
// ReadSamplingFields): the same value is refused with the same message, and
// the HTTP error names the field.
TEST(OpenAiApiTest, SharedSamplingFieldsFailAsOnZeroMq) {
  for (const char* field :
       {R"("temperature": "hot")", R"("top_k": 0.5)", R"("top_p": 1e300)", R"("seed": 1.5)",
        R"("stop": 5)", R"("stop": ["a", 3])", R"("stop_token_ids": [1, -3])", R"("ignore_eos": 1)",
        R"("early_stopping": "sometimes")", R"("best_of": true)", R"("top_k": -2)", R"("n": 65)"}) {
    SCOPED_TRACE(field);
    ParseOutcome http = Completions(absl::StrCat(R"({"prompt": "x", )", field, "}"));
    ASSERT_FALSE(http.request.has_value());
    protocol::ParseOptions opt;
    opt.vocab_size = 49152;
    protocol::ParseResult zmq = protocol::ParseRequest(
        absl::StrCat(R"({"version":1,"type":"generate","id":"a","prompt":"x",)", field, "}"), opt);
    ASSERT_FALSE(zmq.ok());
    EXPECT_EQ(http.error.message, zmq.error.message);
    EXPECT_EQ(http.error.status, 400);
    EXPECT_FALSE(http.error.param.empty());
  }
}

TEST(OpenAiApiTest, SamplingFieldsAreMapped) {
  ParseOutcome o =
      Completions(R"({"prompt": "x", "max_tokens": 7, "n": 3, "temperature": 0.5, "top_p": 0.9,
      "top_k": 0, "min_p": 0.1, "seed": 42, "presence_penalty": 0.5, "frequency_penalty": -0.5,
      "repetition_penalty": 1.1, "stop": "\n", "stop_token_ids": [2], "ignore_eos": true, "logprobs": 3,
      "user": "u", "some_future_field": {"x": 1}, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  const SamplingParams& p = o.request->params;
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_EQ(p.n, 3);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_EQ(p.top_k, -1);  // 0 = off, as in vLLM
  ASSERT_TRUE(p.seed.has_value());
  EXPECT_EQ(*p.seed, 42u);
  EXPECT_EQ(p.stop, std::vector<std::string>{"\n"});
  EXPECT_EQ(p.stop_token_ids, std::vector<int32_t>{2});
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.logprobs, 3);
  EXPECT_TRUE(o.request->stream);
  EXPECT_TRUE(o.request->include_usage);
  // max_completion_tokens is the newer name of max_tokens.
  ParseOutcome m = Completions(R"({"prompt": "x", "max_completion_tokens": 5})");
  ASSERT_TRUE(m.request.has_value());
  EXPECT_EQ(m.request->params.max_tokens, 5);
}

// vLLM's beam-search extra body fields.
// The model's generation_config.json defaults (--generation-config auto)
// fill what a request leaves out, never what it sets; a beam search takes
// none of them.
TEST(OpenAiApiTest, ModelSamplingDefaultsFillOmittedFields) {
  ServedModel m = kModel;
  m.defaults.temperature = 0.7f;
  m.defaults.top_p = 0.8f;
  m.defaults.top_k = 20;
  m.defaults.repetition_penalty = 1.05f;
  ParseOutcome o = ParseRequest(Endpoint::kCompletions, R"({"prompt": "hi"})", m, Tok(), nullptr);
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_FLOAT_EQ(o.request->params.temperature, 0.7f);
  EXPECT_FLOAT_EQ(o.request->params.top_p, 0.8f);
  EXPECT_EQ(o.request->params.top_k, 20);
  EXPECT_FLOAT_EQ(o.request->params.repetition_penalty, 1.05f);
  EXPECT_FLOAT_EQ(o.request->params.min_p, SamplingParams{}.min_p);  // unset: SamplingParams'
  o = ParseRequest(Endpoint::kCompletions, R"({"prompt": "hi", "temperature": 0, "top_k": -1})", m,
                   Tok(), nullptr);
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_FLOAT_EQ(o.request->params.temperature, 0.0f);
  EXPECT_EQ(o.request->params.top_k, -1);
  EXPECT_FLOAT_EQ(o.request->params.top_p, 0.8f);
  o = ParseRequest(Endpoint::kCompletions, R"({"prompt": "hi", "use_beam_search": true,
                   "best_of": 2, "n": 2})",
                   m, Tok(), nullptr);
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_FLOAT_EQ(o.request->params.temperature, 0.0f);
  EXPECT_FLOAT_EQ(o.request->params.top_p, 1.0f);
  EXPECT_EQ(o.request->params.top_k, -1);
  // Without defaults: SamplingParams' own.
  o = Completions(R"({"prompt": "hi"})");
  ASSERT_TRUE(o.request.has_value());
  EXPECT_FLOAT_EQ(o.request->params.temperature, SamplingParams{}.temperature);
}

TEST(OpenAiApiTest, BeamSearchFields) {
  ParseOutcome o = Completions(
      R"({"prompt": "x", "n": 2, "use_beam_search": true, "best_of": 3, "length_penalty": 0.7,
          "early_stopping": "never"})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  const SamplingParams& p = o.request->params;
  EXPECT_TRUE(p.use_beam_search);
  EXPECT_EQ(p.best_of, 3);
  EXPECT_FLOAT_EQ(p.length_penalty, 0.7f);
  EXPECT_EQ(p.early_stopping, EarlyStopping::kNever);
  EXPECT_EQ(p.temperature, 0.0f);  // absent: 0 with beam search
  ParseOutcome t =
      Completions(R"({"prompt": "x", "use_beam_search": true, "n": 2, "early_stopping": true})");
  ASSERT_TRUE(t.request.has_value()) << t.error.message;
  EXPECT_EQ(t.request->params.early_stopping, EarlyStopping::kTrue);
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": true, "early_stopping": "x"})"),
            std::make_pair(400, std::string("early_stopping")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": "yes"})"),
            std::make_pair(400, std::string("use_beam_search")));
  ParseOutcome hot =
      Completions(R"({"prompt": "x", "use_beam_search": true, "n": 2, "temperature": 1})");
  ASSERT_FALSE(hot.request.has_value());
  EXPECT_NE(hot.error.message.find("temperature must be 0"), std::string::npos)
      << hot.error.message;
  ParseOutcome wide =
      Completions(R"({"prompt": "x", "use_beam_search": true, "n": 4, "best_of": 2})");
  ASSERT_FALSE(wide.request.has_value());
  EXPECT_NE(wide.error.message.find("n (4) must be <= best_of (2)"), std::string::npos)
      << wide.error.message;
}

TEST(OpenAiApiTest, WrongTypesAndValuesName) {
  EXPECT_EQ(Refused("{not json"), std::make_pair(400, std::string()));
  EXPECT_EQ(Refused("[1, 2]"), std::make_pair(400, std::string()));
  EXPECT_EQ(Refused(R"({})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Refused(R"({"prompt": ""})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Refused(R"({"prompt": [true]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Refused(R"({"prompt": [49152]})"), std::make_pair(400, std::string("prompt")));
  // A list of prompts is all strings or all id arrays (OpenAI: string[] | int[][]).
  EXPECT_EQ(Refused(R"({"prompt": ["a", [1, 2]]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Refused(R"({"prompt": [[1, 2], "a"]})"), std::make_pair(400, std::string("prompt")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "max_tokens": "8"})"),
            std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "max_tokens": 0})"),
            std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "n": 65})"), std::make_pair(400, std::string("n")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "temperature": "hot"})"),
            std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "temperature": 1e300})"),
            std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "stop": 3})"), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "logprobs": 21})"),
            std::make_pair(400, std::string("logprobs")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "seed": 18446744073709551616})"),
            std::make_pair(400, std::string("seed")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "stream": "yes"})"),
            std::make_pair(400, std::string("stream")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "echo": true, "logprobs": 1, "stream": true})"),
            std::make_pair(400, std::string("echo")));
  // echo + logprobs (not streamed) scores the prompt: prompt logprobs.
  EXPECT_EQ(Completions(R"({"prompt": "x", "echo": true, "logprobs": 2})")
                .request->params.prompt_logprobs,
            2);
  // Token-id prompts: the message (the reader of every front end,
  // TokenIdsFromJson) says what is wrong with which element; param "prompt".
  ParseOutcome nested = Completions(R"({"prompt": [[[1, 2]]]})");
  EXPECT_EQ(nested.error.message, "field 'prompt[0][0]' must be an integer token id, got array");
  EXPECT_EQ(nested.error.param, "prompt");
  ParseOutcome range = Completions(R"({"prompt": [1, 49152]})");
  EXPECT_EQ(range.error.message, "field 'prompt[1]' must be a token id in [0, 49152), got 49152");
  EXPECT_EQ(range.error.param, "prompt");
  ParseOutcome fraction = Completions(R"({"prompt": [[1], [2, 3.5]]})");
  EXPECT_EQ(fraction.error.message,
            "field 'prompt[1][1]' must be an integer token id, got number 3.5");
  EXPECT_EQ(fraction.error.param, "prompt");
  // Ranges of SamplingParams::Validate: the message names the field.
  ParseOutcome o = Completions(R"({"prompt": "x", "top_p": 1.5})");
  ASSERT_FALSE(o.request.has_value());
  EXPECT_NE(o.error.message.find("top_p"), std::string::npos) << o.error.message;
  // Another model: 404 model_not_found.
  ParseOutcome other = Completions(R"({"prompt": "x", "model": "gpt-4"})");
  EXPECT_EQ(other.error.status, 404);
  EXPECT_EQ(other.error.code, "model_not_found");
  const json e = json::parse(ErrorBody(other.error));
  EXPECT_EQ(e["error"]["code"], "model_not_found");
  EXPECT_EQ(e["error"]["param"], "model");
  EXPECT_TRUE(e["error"]["message"].is_string());
}

// cache_salt (runtime/common/cache_salt.h): kept as given when well-formed,
// absent or null = none; otherwise a 400 naming the field, never echoing it.
// Errors of a rule over several fields (SamplingParams::Validate) and of
// admission (Engine::CheckRequest, mapped by http_server.cc) name the field in
// "param" instead of null.
TEST(OpenAiApiTest, CrossFieldErrorsNameTheirField) {
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": true, "n": 2, "temperature": 1})"),
            std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": true, "n": 4, "best_of": 2})"),
            std::make_pair(400, std::string("n")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "n": 1, "best_of": 3})"),
            std::make_pair(400, std::string("best_of")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "length_penalty": 0.5})"),
            std::make_pair(400, std::string("length_penalty")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": true, "stop": ["a"]})"),
            std::make_pair(400, std::string("stop")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "use_beam_search": true, "logprobs": 2})"),
            std::make_pair(400, std::string("logprobs")));
  // Admission errors (Scheduler::CheckAdmissible, Engine::CheckRequest) carry
  // their field as a payload (field_error.h); the endpoint names it its way.
  EXPECT_EQ(ParamOf(FieldError("prompt", "prompt has 300 tokens"), Endpoint::kCompletions),
            "prompt");
  EXPECT_EQ(ParamOf(FieldError("prompt", "prompt has 300 tokens"), Endpoint::kChat), "messages");
  EXPECT_EQ(ParamOf(FieldError("logprobs", "logprobs must be -1 or 0"), Endpoint::kChat),
            "top_logprobs");
  EXPECT_EQ(ParamOf(FieldError("best_of", "the beam width (8) exceeds"), Endpoint::kChat),
            "best_of");
  EXPECT_EQ(ParamOf(absl::UnavailableError("the engine is shutting down"), Endpoint::kCompletions),
            "");
}

// One mapping from a Submit refusal to the HTTP error (SubmitErrorKindOf).
TEST(OpenAiApiTest, SubmitErrorsMapByKind) {
  ValidatedRequest r;
  r.endpoint = Endpoint::kChat;
  r.params.n = 23;
  const absl::Status kv = FieldError("max_tokens", "request needs 3000 KV blocks");
  ApiError e = SubmitError(kv, r);
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.param, "n");  // the client sent no max_tokens: n is what it chose
  EXPECT_NE(e.message.find("max_tokens was not given"), std::string::npos) << e.message;
  r.max_tokens_given = true;
  EXPECT_EQ(SubmitError(kv, r).param, "max_tokens");
  EXPECT_EQ(SubmitError(FieldError("prompt", "too long", absl::StatusCode::kOutOfRange), r).param,
            "messages");
  EXPECT_EQ(SubmitError(absl::ResourceExhaustedError("queue full"), r).status, 429);
  EXPECT_EQ(SubmitError(absl::UnavailableError("draining"), r).status, 503);
  EXPECT_EQ(SubmitError(absl::FailedPreconditionError("engine failed"), r).status, 503);
  EXPECT_EQ(SubmitError(absl::InternalError("?"), r).status, 500);
}

// max_tokens_given tells a default from the client's value.
TEST(OpenAiApiTest, MaxTokensGivenIsRecorded) {
  EXPECT_FALSE(Completions(R"({"prompt": "x"})").request->max_tokens_given);
  EXPECT_TRUE(Completions(R"({"prompt": "x", "max_tokens": 3})").request->max_tokens_given);
  EXPECT_TRUE(
      Completions(R"({"prompt": "x", "max_completion_tokens": 3})").request->max_tokens_given);
}

TEST(OpenAiApiTest, CacheSaltIsValidatedAtTheEdge) {
  ParseOutcome salted = Completions(R"({"prompt": "hi", "cache_salt": "tenant-A_1"})");
  ASSERT_TRUE(salted.request.has_value()) << salted.error.message;
  EXPECT_EQ(salted.request->cache_salt, "tenant-A_1");
  for (const char* body : {R"({"prompt": "hi"})", R"({"prompt": "hi", "cache_salt": null})"}) {
    ParseOutcome none = Completions(body);
    ASSERT_TRUE(none.request.has_value()) << body;
    EXPECT_EQ(none.request->cache_salt, "") << body;
  }
  const std::string long_salt(257, 's');
  for (const std::string& bad :
       {std::string(R"("two words")"), std::string(R"("")"), std::string("7"),
        "\"" + long_salt + "\"", std::string(R"("tab\there")")}) {
    ParseOutcome o = Completions(R"({"prompt": "hi", "cache_salt": )" + bad + "}");
    EXPECT_FALSE(o.request.has_value()) << bad;
    EXPECT_EQ(o.error.status, 400) << bad;
    EXPECT_EQ(o.error.param, "cache_salt") << bad;
    EXPECT_EQ(o.error.message.find("words"), std::string::npos) << o.error.message;
    EXPECT_EQ(o.error.message.find(long_salt), std::string::npos) << bad;
  }
}

TEST(OpenAiApiTest, ChatNeedsATemplateAndTextParts) {
  ParseOutcome none =
      ParseRequest(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "hi"}]})", kModel,
                   Tok(), nullptr);
  EXPECT_EQ(none.error.status, 400);
  EXPECT_EQ(none.error.param, "messages");
  auto tmpl = ChatTemplate::Create(Tok().spec().chat_template, Tok().BosText(), Tok().EosText());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  ParseOutcome parts = ParseRequest(
      Endpoint::kChat,
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}],
          "logprobs": true, "top_logprobs": 2})",
      kModel, Tok(), &*tmpl);
  ParseOutcome plain =
      ParseRequest(Endpoint::kChat, R"({"messages": [{"role": "user", "content": "Hello"}]})",
                   kModel, Tok(), &*tmpl);
  ASSERT_TRUE(parts.request.has_value()) << parts.error.message;
  ASSERT_TRUE(plain.request.has_value()) << plain.error.message;
  EXPECT_EQ(parts.request->prompts, plain.request->prompts);
  EXPECT_EQ(parts.request->params.logprobs, 2);
  EXPECT_EQ(plain.request->params.logprobs, -1);
  // Chat's default max_tokens: the rest of the context.
  EXPECT_EQ(plain.request->params.max_tokens,
            128 - static_cast<int>(plain.request->prompts[0].size()));
  ParseOutcome image = ParseRequest(
      Endpoint::kChat,
      R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]})",
      kModel, Tok(), &*tmpl);
  EXPECT_EQ(image.error.status, 400);
  ParseOutcome bad_type = ParseRequest(
      Endpoint::kChat, R"({"messages": [{"role": "user", "content": [{"type": 7, "text": "x"}]}]})",
      kModel, Tok(), &*tmpl);
  EXPECT_EQ(bad_type.error.status, 400);
  EXPECT_NE(bad_type.error.message.find("only text content is supported"), std::string::npos)
      << bad_type.error.message;
  ParseOutcome no_text = ParseRequest(
      Endpoint::kChat, R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", kModel,
      Tok(), &*tmpl);
  EXPECT_EQ(no_text.error.message, "field 'messages[0].content[0].text' must be a string");
  EXPECT_EQ(no_text.error.param, "messages");
  for (const char* body :
       {R"({"messages": [{"role": "user", "content": null}]})",
        R"({"messages": [{"role": "system"}, {"role": "user", "content": "x"}]})"}) {
    ParseOutcome no_content = ParseRequest(Endpoint::kChat, body, kModel, Tok(), &*tmpl);
    EXPECT_EQ(no_content.error.status, 400) << body;
    EXPECT_NE(no_content.error.message.find("only assistant messages may omit it"),
              std::string::npos)
        << no_content.error.message;
  }
  ParseOutcome assistant_null = ParseRequest(
      Endpoint::kChat,
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
                       {"role": "user", "content": "again"}]})",
      kModel, Tok(), &*tmpl);
  EXPECT_TRUE(assistant_null.request.has_value()) << assistant_null.error.message;
  ParseOutcome not_object =
      ParseRequest(Endpoint::kChat, R"({"messages": ["hi"]})", kModel, Tok(), &*tmpl);
  EXPECT_EQ(not_object.error.message,
            "field 'messages[0]' must be an object with 'role' and 'content', got string");
  ParseOutcome no_role =
      ParseRequest(Endpoint::kChat, R"({"messages": [{"content": "hi"}]})", kModel, Tok(), &*tmpl);
  EXPECT_EQ(no_role.error.message, "field 'messages[0].role' must be a string");
  ParseOutcome top_without = ParseRequest(
      Endpoint::kChat, R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
      kModel, Tok(), &*tmpl);
  EXPECT_EQ(top_without.error.param, "top_logprobs");
}

// A body nested 200,000 levels deep (400 KB) once overflowed a handler
// thread's stack through a recursive copy of the message content: the limits
// of json_limits.h refuse it before parsing, on every route that parses JSON.
TEST(OpenAiApiTest, DeepNestingIsRefusedBeforeParsing) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  auto tmpl = ChatTemplate::Create(Tok().spec().chat_template, Tok().BosText(), Tok().EosText());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string chat = R"({"messages": [{"role": "user", "content": )" + deep + "}]}";
  ParseOutcome o = ParseRequest(Endpoint::kChat, chat, kModel, Tok(), &*tmpl);
  ASSERT_FALSE(o.request.has_value());
  EXPECT_EQ(o.error.status, 400);
  EXPECT_EQ(o.error.message,
            "the request body is refused: JSON nests deeper than 32 levels (at byte 71)");
  ParseOutcome prompt = Completions(R"({"prompt": )" + deep + "}");
  ASSERT_FALSE(prompt.request.has_value());
  EXPECT_NE(prompt.error.message.find("nests deeper than 32 levels"), std::string::npos);
  ApiError err;
  EXPECT_EQ(TokenizeResponse(chat, kModel, Tok(), &*tmpl, &err), "");
  EXPECT_NE(err.message.find("nests deeper than 32 levels"), std::string::npos) << err.message;
  err = ApiError{};
  EXPECT_EQ(DetokenizeResponse(R"({"tokens": )" + deep + "}", Tok(), &err), "");
  EXPECT_NE(err.message.find("nests deeper than 32 levels"), std::string::npos) << err.message;
  // 32 levels are still a request (here a wrong one: the message names the content).
  const std::string deep32 = R"({"messages": [{"role": "user", "content": )" +
                             std::string(29, '[') + std::string(29, ']') + "}]}";
  ParseOutcome at_limit = ParseRequest(Endpoint::kChat, deep32, kModel, Tok(), &*tmpl);
  EXPECT_NE(at_limit.error.message.find("content"), std::string::npos) << at_limit.error.message;
}

TEST(OpenAiApiTest, SyntaxErrorsSayWhyAndWhere) {
  ParseOutcome o = Completions(R"({"prompt": tru})");
  ASSERT_FALSE(o.request.has_value());
  EXPECT_EQ(o.error.status, 400);
  EXPECT_NE(o.error.message.find("the request body is not valid JSON"), std::string::npos)
      << o.error.message;
  EXPECT_NE(o.error.message.find("line 1, column 15"), std::string::npos) << o.error.message;
  EXPECT_NE(o.error.message.find("(byte 15)"), std::string::npos) << o.error.message;
  // A number beyond double is the parser's out_of_range, not a syntax error: a
  // 400 all the same (found by fuzz_openai: it used to escape as an exception).
  ParseOutcome overflow = Completions(R"({"prompt": "x", "temperature": 1e309})");
  ASSERT_FALSE(overflow.request.has_value());
  EXPECT_EQ(overflow.error.status, 400);
  EXPECT_NE(overflow.error.message.find("number overflow parsing '1e309'"), std::string::npos)
      << overflow.error.message;
  ApiError err;
  err.status = 0;
  EXPECT_EQ(DetokenizeResponse(R"({"tokens": [1e309]})", Tok(), &err), "");
  EXPECT_EQ(err.status, 400);
  ParseOutcome array = Completions("[1]");
  EXPECT_EQ(array.error.message, "the request body must be one JSON object, got array");
}

TEST(OpenAiApiTest, StreamOptionsNeedAStream) {
  EXPECT_EQ(Refused(R"({"prompt": "x", "stream_options": {"include_usage": true}})"),
            std::make_pair(400, std::string("stream_options")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "stream": false, "stream_options": {}})"),
            std::make_pair(400, std::string("stream_options")));
  EXPECT_TRUE(
      Completions(R"({"prompt": "x", "stream": true, "stream_options": {}})").request.has_value());
}

// vLLM's prompt_logprobs shape: per choice of a completion, a list with
// null for the first prompt token, then per token a map from token id to
// {logprob, rank, decoded_token} holding the prompt token and the top N.
TEST(OpenAiApiTest, PromptLogprobsResponse) {
  ParseOutcome o = Completions(R"({"prompt": [11, 22, 33], "prompt_logprobs": 1, "n": 2})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_EQ(o.request->params.prompt_logprobs, 1);
  std::vector<PromptLogprob> lps(2);
  lps[0] = {0, 1, 22, -2.5f, 4, {44}, {-0.25f}};  // not the top token
  lps[1] = {0, 2, 33, -0.125f, 1, {33}, {-0.125f}};
  CompletionOutput c;
  c.text = "x";
  c.finish_reason = FinishReason::kLength;
  const json r = json::parse(CompletionResponse(*o.request, "cmpl-1", 7, {c, c}, {}, Tok(), {lps}));
  for (int i = 0; i < 2; ++i) {
    const json& p = r["choices"][i]["prompt_logprobs"];
    ASSERT_EQ(p.size(), 3u) << r.dump();
    EXPECT_TRUE(p[0].is_null());
    EXPECT_EQ(p[1].size(), 2u);
    EXPECT_EQ(p[1]["22"]["logprob"], -2.5);
    EXPECT_EQ(p[1]["22"]["rank"], 4);
    DecodeOptions raw;
    raw.skip_special_tokens = false;
    raw.strip_leading_space = false;
    EXPECT_EQ(p[1]["22"]["decoded_token"], Tok().TokenBytes(22, /*first=*/false, raw));
    EXPECT_EQ(p[1]["44"]["rank"], 1);
    EXPECT_EQ(p[2].size(), 1u);
    EXPECT_EQ(p[2]["33"]["logprob"], -0.125);
  }
  EXPECT_FALSE(r.contains("prompt_logprobs"));  // top level on chat only
  // echo + logprobs: the legacy logprobs start with the prompt's tokens (null
  // first), each position's top N plus the token itself, offsets from 0.
  o = Completions(R"({"prompt": [11, 22, 33], "echo": true, "logprobs": 1})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  c.token_ids = {44};
  c.logprobs = {-0.5f};
  c.top_token_ids = {{44}};
  c.top_logprobs = {{-0.5f}};
  const json e = json::parse(CompletionResponse(*o.request, "cmpl-1", 7, {c}, {}, Tok(), {lps}));
  const json& l = e["choices"][0]["logprobs"];
  DecodeOptions raw;
  raw.skip_special_tokens = false;
  raw.strip_leading_space = false;
  std::vector<std::string> t;
  for (int32_t id : {11, 22, 33, 44}) t.push_back(Tok().TokenBytes(id, /*first=*/false, raw));
  EXPECT_EQ(l["tokens"], json(t)) << e.dump();
  EXPECT_EQ(l["token_logprobs"], json::parse("[null, -2.5, -0.125, -0.5]"));
  EXPECT_TRUE(l["top_logprobs"][0].is_null());
  EXPECT_EQ(l["top_logprobs"][1].size(), 2u);  // the top 1 (44) and the token (22)
  EXPECT_EQ(l["top_logprobs"][1][t[1]], -2.5);
  EXPECT_EQ(l["top_logprobs"][1][t[3]], -0.25);
  EXPECT_EQ(l["top_logprobs"][2].size(), 1u);
  EXPECT_EQ(l["text_offset"][0], 0);
  EXPECT_EQ(l["text_offset"][3], t[0].size() + t[1].size() + t[2].size());
  // Not asked for: no field.
  o = Completions(R"({"prompt": [11, 22, 33]})");
  ASSERT_TRUE(o.request.has_value());
  EXPECT_FALSE(
      json::parse(CompletionResponse(*o.request, "cmpl-1", 7, {c}, {}, Tok()))["choices"][0]
          .contains("prompt_logprobs"));
}

TEST(OpenAiApiTest, ResponseFormats) {
  ParseOutcome o = Completions(R"({"prompt": "x", "logprobs": 1, "stream": true,
                      "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  CompletionOutput c;
  c.text = " Paris";
  c.token_ids = {Tok().Encode(" Paris", {false, true})[0]};
  c.logprobs = {-0.5f};
  c.top_token_ids = {{c.token_ids[0]}};
  c.top_logprobs = {{-0.5f}};
  c.finish_reason = FinishReason::kLength;
  Usage u{3, 1, 2};
  const json r = json::parse(CompletionResponse(*o.request, "cmpl-1", 7, {c}, u, Tok()));
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["choices"][0]["text"], " Paris");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["choices"][0]["logprobs"]["tokens"][0], " Paris");
  EXPECT_EQ(r["choices"][0]["logprobs"]["top_logprobs"][0][" Paris"], -0.5);
  EXPECT_EQ(r["usage"]["total_tokens"], 4);
  EXPECT_EQ(r["usage"]["prompt_tokens_details"]["cached_tokens"], 2);
  size_t offset = 0;
  const json chunk = json::parse(StreamChunk(*o.request, "cmpl-1", 7, 0, c, true, Tok(), &offset));
  EXPECT_TRUE(chunk["usage"].is_null());  // include_usage: null on every chunk but the last
  const json last = json::parse(UsageChunk(*o.request, "cmpl-1", 7, u));
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 1);
  // A schema keeps the client's member order (members are generated in the
  // order of `properties`, as XGrammar and OpenAI's strict mode do).
  o = Completions(R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema":
      {"name": "n", "schema": {"type": "object", "properties": {"z": {}, "a": {}}}}}})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_EQ(o.request->params.structured_output.spec,
            R"({"type":"object","properties":{"z":{},"a":{}}})");
}

// A stream's legacy text_offset counts from the start of the completion, as the
// whole response's does (found by a break test: every chunk said [0]).
TEST(OpenAiApiTest, StreamedTextOffsetsMatchTheWholeResponse) {
  ParseOutcome o = Completions(R"({"prompt": "x", "logprobs": 0})");
  ASSERT_TRUE(o.request.has_value());
  const std::vector<int32_t> ids = Tok().Encode(" Paris is big", {false, true});
  ASSERT_GE(ids.size(), 3u);
  CompletionOutput whole;
  whole.token_ids = ids;
  whole.logprobs.assign(ids.size(), -1.0f);
  const json r = json::parse(CompletionResponse(*o.request, "cmpl-1", 7, {whole}, {}, Tok()));
  const json& want = r["choices"][0]["logprobs"]["text_offset"];
  ASSERT_EQ(want.size(), ids.size());
  EXPECT_GT(want.back().get<int>(), 0);
  json streamed = json::array();
  size_t offset = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    CompletionOutput d;
    d.token_ids = {ids[i]};
    d.logprobs = {-1.0f};
    const json chunk =
        json::parse(StreamChunk(*o.request, "cmpl-1", 7, 0, d, i == 0, Tok(), &offset));
    for (const json& v : chunk["choices"][0]["logprobs"]["text_offset"]) streamed.push_back(v);
  }
  EXPECT_EQ(streamed, want);
}

// Issue 32's request fields: parsed into SamplingParams, refused naming the field.
TEST(OpenAiApiTest, LogitProcessorAndOutputFields) {
  ParseOutcome o = Completions(R"({"prompt": "x", "max_tokens": 9, "logit_bias": {"7": -100,
      "49151": 2.5}, "min_tokens": 3, "bad_words": ["foo", " bar baz"],
      "skip_special_tokens": false, "include_stop_str_in_output": true})");
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  const SamplingParams& p = o.request->params;
  std::vector<std::pair<int32_t, float>> bias = p.logit_bias;
  std::sort(bias.begin(), bias.end());
  EXPECT_EQ(bias, (std::vector<std::pair<int32_t, float>>{{7, -100.0f}, {49151, 2.5f}}));
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_EQ(p.bad_words, (std::vector<std::string>{"foo", " bar baz"}));
  EXPECT_EQ(p.skip_special_tokens, std::optional<bool>(false));
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_FALSE(Completions(R"({"prompt": "x"})").request->params.skip_special_tokens.has_value());
  const std::pair<std::string, std::string> refused[] = {
      {R"("logit_bias": {"49152": 1})", "logit_bias"},
      {R"("logit_bias": {"x": 1})", "logit_bias"},
      {R"("logit_bias": {"-1": 1})", "logit_bias"},
      {R"("logit_bias": {"1": 100.5})", "logit_bias"},
      {R"("logit_bias": {"1": "a"})", "logit_bias"},
      {R"("logit_bias": {"1": 1, "01": 2})", "logit_bias"},
      {R"("logit_bias": [1])", "logit_bias"},
      {R"("min_tokens": -1)", "min_tokens"},
      {R"("min_tokens": 17)", "min_tokens"},  // > max_tokens (16)
      {R"("min_tokens": 1.5)", "min_tokens"},
      {R"("bad_words": "foo")", "bad_words"},
      {R"("bad_words": [""])", "bad_words"},
      {R"("bad_words": [1])", "bad_words"},
      {R"("skip_special_tokens": 1)", "skip_special_tokens"},
      {R"("include_stop_str_in_output": "yes")", "include_stop_str_in_output"},
      {R"("prompt_logprobs": 21)", "prompt_logprobs"},
      {R"("prompt_logprobs": 1, "stream": true)", "prompt_logprobs"},
      {R"("prompt_logprobs": true)", "prompt_logprobs"},
      {R"("suffix": "end")", "suffix"},
      {R"("guided_grammar": 5)", "guided_grammar"},
      {R"("structured_outputs": {"structural_tag": "{}"})", "structured_outputs.structural_tag"},
      {R"("use_beam_search": true, "min_tokens": 2)", "min_tokens"},
  };
  for (const auto& [fields, param] : refused) {
    EXPECT_EQ(Refused(R"({"prompt": "x", )" + fields + "}"), std::make_pair(400, param)) << fields;
  }
  // Their "off" values are accepted; unknown fields are ignored and named.
  ParseOutcome off = Completions(
      R"({"prompt": "x", "prompt_logprobs": null, "suffix": "", "zeta": 1, "alpha": {}})");
  ASSERT_TRUE(off.request.has_value()) << off.error.message;
  EXPECT_EQ(off.ignored_fields, (std::vector<std::string>{"alpha", "zeta"}));
  EXPECT_TRUE(Completions(R"({"prompt": "x", "user": "u"})").ignored_fields.empty());
}

// Fields a break test found accepted and silently ignored (issue 31): each is
// now applied or refused. request_id names the response; chat_template_kwargs
// and reasoning_effort reach the chat template; priority, web_search_options and
// guided_decoding_backend are refused unless "off".
TEST(OpenAiApiTest, RequestIdAndTemplateVariablesAppliedUnsupportedFieldsRefused) {
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Create(
      "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
      "{% if enable_thinking is defined and not enable_thinking %}[no think]{% endif %}"
      "{% if reasoning_effort is defined %}[effort {{ reasoning_effort }}]{% endif %}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const auto chat = [&](const std::string& fields) {
    return ParseRequest(Endpoint::kChat,
                        R"({"messages": [{"role": "user", "content": "hi"}])" + fields + "}",
                        kModel, Tok(), &*tmpl);
  };
  const auto prompt_text = [&](const ParseOutcome& o) {
    EXPECT_TRUE(o.request.has_value()) << o.error.message;
    return o.request.has_value() ? Tok().Decode(o.request->prompts[0]).value_or("?")
                                 : std::string();
  };
  EXPECT_EQ(prompt_text(chat("")), "user: hi\n");
  EXPECT_EQ(prompt_text(chat(R"(, "chat_template_kwargs": {"enable_thinking": false})")),
            "user: hi\n[no think]");
  EXPECT_EQ(prompt_text(chat(R"(, "reasoning_effort": "low")")), "user: hi\n[effort low]");
  EXPECT_EQ(prompt_text(chat(R"(, "chat_template_kwargs": {"reasoning_effort": "high"},
      "reasoning_effort": "medium")")),
            "user: hi\n[effort medium]");
  EXPECT_EQ(prompt_text(chat(R"(, "chat_template_kwargs": null, "reasoning_effort": null)")),
            "user: hi\n");
  ParseOutcome named = chat(R"(, "request_id": "trace-42")");
  ASSERT_TRUE(named.request.has_value()) << named.error.message;
  EXPECT_EQ(named.request->request_id, "trace-42");
  EXPECT_TRUE(chat("").request->request_id.empty());
  const std::pair<std::string, std::string> refused[] = {
      {R"("chat_template_kwargs": {"messages": []})", "chat_template_kwargs"},
      {R"("chat_template_kwargs": {"bos_token": "x"})", "chat_template_kwargs"},
      {R"("chat_template_kwargs": [1])", "chat_template_kwargs"},
      {R"("reasoning_effort": "extreme")", "reasoning_effort"},
      {R"("reasoning_effort": 1)", "reasoning_effort"},
      {R"("request_id": "")", "request_id"},
      {R"("request_id": "a b")", "request_id"},
      {R"("request_id": 7)", "request_id"},
      {R"("request_id": ")" + std::string(257, 'x') + "\"", "request_id"},
      {R"("priority": 1)", "priority"},
      {R"("priority": "high")", "priority"},
      {R"("web_search_options": {})", "web_search_options"},
      {R"("guided_decoding_backend": "xgrammar")", "guided_decoding_backend"},
  };
  for (const auto& [fields, param] : refused) {
    ParseOutcome o = chat(", " + fields);
    EXPECT_FALSE(o.request.has_value()) << fields;
    EXPECT_EQ(std::make_pair(o.error.status, o.error.param), std::make_pair(400, param)) << fields;
  }
  // Chat-only fields on completions; the off values are accepted.
  EXPECT_EQ(Refused(R"({"prompt": "x", "chat_template_kwargs": {}})"),
            std::make_pair(400, std::string("chat_template_kwargs")));
  EXPECT_EQ(Refused(R"({"prompt": "x", "reasoning_effort": "low"})"),
            std::make_pair(400, std::string("reasoning_effort")));
  ParseOutcome off = Completions(
      R"({"prompt": "x", "priority": 0, "guided_decoding_backend": "auto", "request_id": "r1"})");
  ASSERT_TRUE(off.request.has_value()) << off.error.message;
  EXPECT_EQ(off.request->request_id, "r1");
  EXPECT_TRUE(off.ignored_fields.empty());
  // With --scheduling-policy priority a request's priority reaches the engine.
  ServedModel prioritized = kModel;
  prioritized.priority_scheduling = true;
  ParseOutcome urgent = ParseRequest(Endpoint::kCompletions, R"({"prompt": "x", "priority": -5})",
                                     prioritized, Tok(), nullptr);
  ASSERT_TRUE(urgent.request.has_value()) << urgent.error.message;
  EXPECT_EQ(urgent.request->priority, -5);
  EXPECT_EQ(ParseRequest(Endpoint::kCompletions, R"({"prompt": "x", "priority": 1.5})", prioritized,
                         Tok(), nullptr)
                .error.param,
            "priority");
  // A template refusal names the kwargs when the conversation renders without
  // them, the messages otherwise.
  absl::StatusOr<ChatTemplate> strict = ChatTemplate::Create(
      "{% if mode is defined and mode == 'broken' %}{{ raise_exception('unknown mode') }}"
      "{% endif %}{% for m in messages %}{% if m.role == 'system' %}"
      "{{ raise_exception('no system role') }}{% endif %}{{ m.content }}{% endfor %}",
      "", "");
  ASSERT_TRUE(strict.ok()) << strict.status();
  const auto strict_error = [&](const std::string& body) {
    ParseOutcome o = ParseRequest(Endpoint::kChat, body, kModel, Tok(), &*strict);
    EXPECT_FALSE(o.request.has_value()) << body;
    return std::make_pair(o.error.param, o.error.message);
  };
  EXPECT_EQ(
      strict_error(R"({"messages": [{"role": "user", "content": "hi"}],
                             "chat_template_kwargs": {"mode": "broken"}})"),
      std::make_pair(std::string("chat_template_kwargs"),
                     std::string("chat_template_kwargs: chat template: line 1: unknown mode")));
  EXPECT_EQ(strict_error(R"({"messages": [{"role": "system", "content": "hi"}],
                             "chat_template_kwargs": {"mode": "fine"}})"),
            std::make_pair(std::string("messages"),
                           std::string("messages: chat template: line 1: no system role")));
  EXPECT_EQ(strict_error(R"({"messages": [{"role": "system", "content": "hi"}]})").first,
            "messages");
  // /tokenize renders the kwargs the same way.
  ApiError err;
  const json tokens = json::parse(TokenizeResponse(
      R"({"messages": [{"role": "user", "content": "hi"}],
          "chat_template_kwargs": {"enable_thinking": false}})",
      kModel, Tok(), &*tmpl, &err));
  EXPECT_EQ(Tok().Decode(tokens["tokens"].get<std::vector<int32_t>>()).value_or("?"),
            "user: hi\n[no think]");
}

// Completions echo: the prompt's text before the choice's (the first chunk of
// a stream); the string as given, or token ids decoded.
TEST(OpenAiApiTest, EchoPutsThePromptFirst) {
  const std::vector<int32_t> ids = Tok().Encode("Hi there", {false, true});
  // Token ids are decoded (a list holds one prompt form: strings or id arrays).
  json ids_body = {{"prompt", json::array({ids})}, {"echo", true}};
  ParseOutcome from_ids = Completions(ids_body.dump());
  ASSERT_TRUE(from_ids.request.has_value()) << from_ids.error.message;
  EXPECT_EQ(from_ids.request->echo_texts, (std::vector<std::string>{"Hi there"}));
  json body = {{"prompt", json::array({"The sky", "Hi there"})}, {"echo", true}, {"n", 2}};
  ParseOutcome o = Completions(body.dump());
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_EQ(o.request->echo_texts, (std::vector<std::string>{"The sky", "Hi there"}));
  std::vector<CompletionOutput> cs(4);
  for (CompletionOutput& c : cs) c.text = " is";
  const json r = json::parse(CompletionResponse(*o.request, "cmpl-1", 7, cs, {}, Tok()));
  EXPECT_EQ(r["choices"][1]["text"], "The sky is");
  EXPECT_EQ(r["choices"][2]["text"], "Hi there is");
  size_t offset = 0;
  json first = json::parse(StreamChunk(*o.request, "c", 7, 3, cs[3], true, Tok(), &offset));
  EXPECT_EQ(first["choices"][0]["text"], "Hi there is");
  json later = json::parse(StreamChunk(*o.request, "c", 7, 3, cs[3], false, Tok(), &offset));
  EXPECT_EQ(later["choices"][0]["text"], " is");
  ParseOutcome chat =
      ParseRequest(Endpoint::kChat, R"({"messages": [], "echo": true})", kModel, Tok(), nullptr);
  EXPECT_EQ(chat.error.param, "echo");
}

// Tool calling (issue 32): tools rendered by the template, tool_choice
// none/auto accepted, required/named constrained to the tools' calls (bad
// ones refused naming tool_choice), the output parsed into tool_calls whole
// and streamed.
TEST(OpenAiApiTest, ToolCalling) {
  // A Hermes-style template: tools, calls and tool turns all show in the prompt.
  auto tmpl = ChatTemplate::Create(
      "{% if tools %}TOOLS{{ tools | tojson }}\n{% endif %}{% for m in messages %}{{ m.role }}:"
      "{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}"
      "{{ c.function.arguments | tojson }}</tool_call>{% endfor %}{% if m.tool_call_id %}"
      "[{{ m.tool_call_id }}]{% endif %}\n{% endfor %}",
      "", "");
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string body = R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
       "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"C\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "21"}],
      "tools": [{"type": "function", "function": {"name": "get_weather", "parameters":
       {"type": "object", "properties": {"city": {"type": "string"}}}}}]})";
  ParseOutcome o = ParseRequest(Endpoint::kChat, body, kModel, Tok(), &*tmpl);
  ASSERT_TRUE(o.request.has_value()) << o.error.message;
  EXPECT_TRUE(o.request->parse_tool_calls);
  EXPECT_EQ(
      o.request->tools_json,
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}])");
  absl::StatusOr<std::string> prompt = Tok().Decode(o.request->prompts[0]);
  ASSERT_TRUE(prompt.ok());
  EXPECT_NE(prompt->find(R"(TOOLS[{"type": "function", "function": {"name": "get_weather")"),
            std::string::npos)
      << *prompt;  // the client's key order, as json.dumps writes it
  EXPECT_NE(prompt->find(R"(<tool_call>get_weather{"city": "Paris", "unit": "C"}</tool_call>)"),
            std::string::npos)
      << *prompt;
  EXPECT_NE(prompt->find("tool:21[call_1]"), std::string::npos) << *prompt;

  auto chat = [&](const std::string& extra) {
    return ParseRequest(Endpoint::kChat,
                        R"({"messages": [{"role": "user", "content": "hi"}], )" + extra + "}",
                        kModel, Tok(), &*tmpl);
  };
  const std::string tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  EXPECT_FALSE(chat(tools + R"(, "tool_choice": "none")").request->parse_tool_calls);
  EXPECT_TRUE(chat(tools + R"(, "tool_choice": "auto")").request->parse_tool_calls);
  // required / named: parsed, and constrained to calls of the tools.
  for (const std::string& choice :
       {std::string(R"("required")"),
        std::string(R"({"type": "function", "function": {"name": "f"}})")}) {
    ParseOutcome r = chat(absl::StrCat(tools, R"(, "tool_choice": )", choice));
    ASSERT_TRUE(r.request.has_value()) << choice << ": " << r.error.message;
    EXPECT_TRUE(r.request->parse_tool_calls);
    EXPECT_EQ(r.request->params.structured_output.kind, StructuredOutput::Kind::kToolCalls);
    EXPECT_NE(r.request->params.structured_output.spec.find(R"("name":"f")"), std::string::npos)
        << r.request->params.structured_output.spec;
  }
  for (const std::string& bad :
       {tools + R"(, "tool_choice": {"type": "function", "function": {"name": "g"}})",
        tools + R"(, "tool_choice": {"type": "function"})",
        tools + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})",
        std::string(R"("tool_choice": "required")"), tools + R"(, "tool_choice": "sometimes")",
        std::string(R"("tool_choice": "auto")")}) {
    ParseOutcome r = chat(bad);
    EXPECT_FALSE(r.request.has_value()) << bad;
    EXPECT_EQ(r.error.param, "tool_choice") << bad;
  }
  EXPECT_EQ(chat(R"("tools": [{"type": "function", "function": {}}])").error.param, "tools");
  EXPECT_EQ(chat(R"("tools": {})").error.param, "tools");
  EXPECT_EQ(ParseRequest(Endpoint::kChat,
                         R"({"messages": [{"role": "user", "content": "x", "tool_calls": []}]})",
                         kModel, Tok(), &*tmpl)
                .error.param,
            "messages");  // tool_calls on a user turn

  // Non-streamed: the calls, content null, finish_reason tool_calls.
  ParseOutcome auto_req = chat(tools);
  ASSERT_TRUE(auto_req.request.has_value());
  CompletionOutput c;
  c.text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"b\": 1, \"a\": 2}}\n</tool_call>";
  c.finish_reason = FinishReason::kStop;
  json r = json::parse(CompletionResponse(*auto_req.request, "chatcmpl-1", 7, {c}, {}, Tok()));
  const json& msg = r["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["arguments"], R"({"b":1,"a":2})");
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "tool_calls");
  // Malformed: plain content, the engine's finish reason.
  c.text = "<tool_call>{oops</tool_call>";
  r = json::parse(CompletionResponse(*auto_req.request, "chatcmpl-1", 7, {c}, {}, Tok()));
  EXPECT_EQ(r["choices"][0]["message"]["content"], c.text);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");

  // Streamed: content before the call as it comes, then name and argument deltas.
  ToolStreamState st;
  std::vector<json> chunks;
  auto feed = [&](const std::string& text, FinishReason f) {
    for (const std::string& s : ToolStreamChunks(*auto_req.request, "x", 7, 0, text, f, &st))
      chunks.push_back(json::parse(s));
  };
  const std::string out =
      "Sure.<tool_call>{\"name\": \"f\", \"arguments\": {\"q\": \"a\"}}</tool_call>";
  feed("Sure.<tool", FinishReason::kNone);
  feed(out.substr(0, 30), FinishReason::kNone);  // the name is complete: the header goes out
  ASSERT_EQ(chunks.size(), 2u);
  feed(out.substr(0, 51), FinishReason::kNone);  // ... {"q": "a   (an open string)
  ASSERT_EQ(chunks.size(), 3u);
  EXPECT_EQ(chunks[2]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
            R"({"q":"a)");
  feed(out, FinishReason::kStop);
  ASSERT_EQ(chunks.size(), 5u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["content"], "Sure.");
  const json& named = chunks[1]["choices"][0]["delta"]["tool_calls"][0];
  EXPECT_EQ(named["index"], 0);
  EXPECT_EQ(named["function"]["name"], "f");
  EXPECT_EQ(named["function"]["arguments"], "");
  EXPECT_EQ(named["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(chunks[3]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"], R"("})");
  EXPECT_FALSE(chunks[3]["choices"][0]["delta"]["tool_calls"][0].contains("id"))
      << "the header is sent once";
  EXPECT_EQ(chunks[4]["choices"][0]["finish_reason"], "tool_calls");
  // Logprobs are refused in such a stream.
  EXPECT_EQ(chat(tools + R"(, "stream": true, "logprobs": true)").error.param, "logprobs");
}

// The one finish-reason -> error mapping: only kError is an error, a 500 of
// type server_error carrying the engine's message; the rest answer normally.
TEST(OpenAiApiTest, FinishErrorMapsOnlyEngineFailures) {
  const std::optional<ApiError> e =
      FinishError(FinishReason::kError, absl::UnavailableError("worker rank 1 lost"));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 500);
  EXPECT_EQ(e->type, "server_error");
  EXPECT_NE(e->message.find("worker rank 1 lost"), std::string::npos) << e->message;
  const json body = json::parse(ErrorBody(*e));
  EXPECT_EQ(body["error"]["type"], "server_error");
  EXPECT_TRUE(FinishError(FinishReason::kError, absl::OkStatus()).has_value());
  for (FinishReason r :
       {FinishReason::kNone, FinishReason::kStop, FinishReason::kLength, FinishReason::kAbort}) {
    EXPECT_FALSE(FinishError(r, absl::InternalError("x")).has_value()) << FinishReasonName(r);
  }
}

// Replays the committed seed corpus (tests/http/corpus) through the fuzz entry
// point, so that the invariants fuzz_openai checks run on every build (with or
// without clang), every prefix of each seed too.
TEST(OpenAiFuzzCorpusTest, SeedCorpusHoldsTheInvariants) {
  const char* root = std::getenv("PAGEDSERVE_SOURCE_DIR");
  ASSERT_NE(root, nullptr) << "PAGEDSERVE_SOURCE_DIR is set by ctest";
  int files = 0;
  for (const auto& entry :
       std::filesystem::directory_iterator(std::filesystem::path(root) / "tests/http/corpus")) {
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
    EXPECT_EQ(OpenAiFuzzOneInput(data, bytes.size()), "") << entry.path();
    for (size_t n = 0; n < bytes.size(); n += 7) {
      EXPECT_EQ(OpenAiFuzzOneInput(data, n), "") << entry.path() << " prefix " << n;
    }
    ++files;
  }
  EXPECT_GE(files, 10);
}

// The drift table of issue 31, closed: what one front end accepts the other
// accepts (chat messages, seed, stop limits), since both read these fields
// through the same rules (chat_messages.h, request_fields.h,
// SamplingParams::Validate). Each row goes through the OpenAI chat endpoint
// and protocol v1 and must get the same verdict.
TEST(FrontEndAgreementTest, HttpAndZeroMqAcceptAndRefuseAlike) {
  auto tmpl = ChatTemplate::Create(Tok().spec().chat_template, Tok().BosText(), Tok().EosText());
  ASSERT_TRUE(tmpl.ok()) << tmpl.status();
  const std::string user = R"([{"role": "user", "content": "hi"}])";
  auto stop_of = [](size_t bytes) { return R"(, "stop": ")" + std::string(bytes, 'x') + R"(")"; };
  const std::string seventeen_stops =
      R"(, "stop": ["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"])";
  const std::vector<std::pair<std::string, bool>> rows = {
      {R"("messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": "hi"}])",
       true},
      {R"("messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42"}])",
       true},
      {R"("messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                     {"type": "text", "text": "b"}]}])",
       true},
      {R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null},
                       {"role": "user", "content": "again"}])",
       true},
      {R"("messages": [{"role": "wizard", "content": "x"}])", false},
      {R"("messages": [{"role": "user", "content": [{"type": "image_url"}]}])", false},
      {R"("messages": [{"role": "user"}])", false},
      {R"("messages": [])", false},
      {R"("messages": )" + user + R"(, "seed": -1)", true},
      {R"("messages": )" + user + R"(, "seed": -7)", true},
      {R"("messages": )" + user + R"(, "seed": 18446744073709551615)", true},
      {R"("messages": )" + user + R"(, "seed": 1.5)", false},
      // seed follows the integer rule: a whole number written as a float is
      // that integer; a fraction or a value outside [-2^63, 2^64) is refused.
      {R"("messages": )" + user + R"(, "seed": 42.0)", true},
      {R"("messages": )" + user + R"(, "seed": 1e3)", true},
      {R"("messages": )" + user + R"(, "seed": -1.0)", true},
      {R"("messages": )" + user + R"(, "seed": 1e19)", true},
      {R"("messages": )" + user + R"(, "seed": 1.8446744073709552e19)", false},
      {R"("messages": )" + user + R"(, "seed": -1e300)", false},
      {R"("messages": )" + user + R"(, "seed": "42")", false},
      {R"("messages": )" + user + R"(, "stop_token_ids": [2.0, 3])", true},
      {R"("messages": )" + user + R"(, "stop_token_ids": [2.5])", false},
      {R"("messages": )" + user + stop_of(257), false},
      {R"("messages": )" + user + stop_of(256), true},
      {R"("messages": )" + user + seventeen_stops, false},
      {R"("messages": )" + user + R"(, "temperature": 1000001)", false},
      {R"("messages": )" + user + R"(, "repetition_penalty": 1000001)", false},
      {R"("messages": )" + user + R"(, "temperature": 1000000)", true},
      // Issue 32: tool history (chat_messages.h), the same on both.
      {R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
          "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "2"}])",
       true},
      {R"("messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": null,
          "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f",
          "arguments": "not json"}}]}])",
       false},
      {R"("messages": [{"role": "user", "content": "hi", "tool_calls": []}])", false},
      {R"("messages": [{"role": "tool", "tool_call_id": 5, "content": "2"}])", false},
      // Issue 32: the logit processors and output options (request_fields.h).
      {R"("messages": )" + user + R"(, "logit_bias": {"5": -100, "9": 3})", true},
      {R"("messages": )" + user + R"(, "logit_bias": {"5": 101})", false},
      {R"("messages": )" + user + R"(, "logit_bias": {"49152": 1})", false},
      {R"("messages": )" + user + R"(, "logit_bias": {"five": 1})", false},
      {R"("messages": )" + user + R"(, "max_tokens": 4, "min_tokens": 4)", true},
      {R"("messages": )" + user + R"(, "max_tokens": 4, "min_tokens": 5)", false},
      {R"("messages": )" + user + R"(, "min_tokens": -2)", false},
      {R"("messages": )" + user + R"(, "bad_words": ["a b", "c"])", true},
      {R"("messages": )" + user + R"(, "bad_words": [""])", false},
      {R"("messages": )" + user + R"(, "bad_words": "a")", false},
      {R"("messages": )" + user + R"(, "skip_special_tokens": false)", true},
      {R"("messages": )" + user + R"(, "skip_special_tokens": "no")", false},
      {R"("messages": )" + user + R"(, "include_stop_str_in_output": true)", true},
      {R"("messages": )" + user + R"(, "include_stop_str_in_output": 0)", false},
      {R"("messages": )" + user + R"(, "prompt_logprobs": 2)", true},
      {R"("messages": )" + user + R"(, "prompt_logprobs": -2)", false},
      {R"("messages": )" + user + R"(, "prompt_logprobs": 2, "stream": true)", false},
      {R"("messages": )" + user + R"(, "use_beam_search": true, "logit_bias": {"1": 1})", false},
      // An integer field takes a whole number written as a float (vLLM's lax
      // reading), never a fraction, an overflow or a string.
      {R"("messages": )" + user + R"(, "max_tokens": 4.0, "min_tokens": 2e0, "top_k": 40.0)", true},
      {R"("messages": )" + user + R"(, "max_tokens": 4.5)", false},
      {R"("messages": )" + user + R"(, "min_tokens": 0.5)", false},
      {R"("messages": )" + user + R"(, "top_k": 1e300)", false},
      {R"("messages": )" + user + R"(, "top_k": -1e10)", false},
      {R"("messages": )" + user + R"(, "max_tokens": "4")", false},
  };
  protocol::ParseOptions zmq_options;
  zmq_options.vocab_size = Tok().vocab_size();
  for (const auto& [fields, ok] : rows) {
    ParseOutcome http = ParseRequest(Endpoint::kChat, "{" + fields + "}", kModel, Tok(), &*tmpl);
    protocol::ParseResult zmq = protocol::ParseRequest(
        R"({"version": 1, "type": "generate", "id": "a", )" + fields + "}", zmq_options);
    EXPECT_EQ(http.request.has_value(), ok) << fields << "\nHTTP: " << http.error.message;
    EXPECT_EQ(zmq.ok(), ok) << fields << "\nZeroMQ: " << zmq.error.message;
    // Accepted on both: the same SamplingParams fields.
    if (!http.request.has_value() || !zmq.ok()) continue;
    const SamplingParams& h = http.request->params;
    const SamplingParams& z = std::get<protocol::GenerateRequest>(*zmq.request).sampling;
    // (without max_tokens the defaults differ: the context left on HTTP, 16 on ZeroMQ)
    if (fields.find("\"max_tokens\"") != std::string::npos) {
      EXPECT_EQ(h.max_tokens, z.max_tokens) << fields;
    }
    EXPECT_EQ(h.top_k, z.top_k) << fields;
    EXPECT_EQ(h.seed, z.seed) << fields;
    EXPECT_EQ(h.stop_token_ids, z.stop_token_ids) << fields;
    EXPECT_EQ(h.logit_bias, z.logit_bias) << fields;
    EXPECT_EQ(h.min_tokens, z.min_tokens) << fields;
    EXPECT_EQ(h.bad_words, z.bad_words) << fields;
    EXPECT_EQ(h.skip_special_tokens, z.skip_special_tokens) << fields;
    EXPECT_EQ(h.include_stop_str_in_output, z.include_stop_str_in_output) << fields;
  }
  // -1 is no seed on both; other negatives wrap (OpenAI takes any integer).
  ParseOutcome none = ParseRequest(Endpoint::kChat, R"({"messages": )" + user + R"(, "seed": -1})",
                                   kModel, Tok(), &*tmpl);
  ASSERT_TRUE(none.request.has_value());
  EXPECT_FALSE(none.request->params.seed.has_value());
  protocol::ParseResult wrapped = protocol::ParseRequest(
      R"({"version": 1, "type": "generate", "id": "a", "prompt": "x", "seed": -7})");
  ASSERT_TRUE(wrapped.ok()) << wrapped.error.message;
  EXPECT_EQ(std::get<protocol::GenerateRequest>(*wrapped.request).sampling.seed,
            std::optional<uint64_t>(static_cast<uint64_t>(-7)));
}

// A prompt of token ids (HTTP completions' "prompt" array, ZeroMQ's
// "prompt_token_ids") is read by one rule on both (TokenIdsFromJson): each id
// an integer, or a whole number written as a float (as every integer field),
// in the vocabulary. Same verdict, same ids, and the same message naming the
// element.
TEST(FrontEndAgreementTest, PromptTokenIdsAcceptAndRefuseAlike) {
  const std::vector<std::pair<std::string, bool>> rows = {
      {"[1, 2, 3]", true},
      {"[1.0, 2e0, 3]", true},
      {"[0.0, 49151.0]", true},
      {"[-0.0]", true},
      {"[1.5]", false},
      {"[1, 2.5]", false},
      {"[49152.0]", false},
      {"[-1.0]", false},
      {"[1e300]", false},
      {"[-1e300]", false},
      {"[1e19]", false},
      // (A list starting with a string is a list of text prompts on HTTP.)
      {R"([1, "2"])", false},
      {"[1, true]", false},
      {"[1, [2]]", false},
  };
  protocol::ParseOptions zmq_options;
  zmq_options.vocab_size = Tok().vocab_size();
  for (const auto& [ids, ok] : rows) {
    ParseOutcome http = Completions(R"({"prompt": )" + ids + R"(, "max_tokens": 4})");
    protocol::ParseResult zmq = protocol::ParseRequest(
        R"({"version": 1, "type": "generate", "id": "a", "prompt_token_ids": )" + ids + "}",
        zmq_options);
    EXPECT_EQ(http.request.has_value(), ok) << ids << "\nHTTP: " << http.error.message;
    EXPECT_EQ(zmq.ok(), ok) << ids << "\nZeroMQ: " << zmq.error.message;
    if (!ok) {
      EXPECT_EQ(http.error.status, 400) << ids;
      EXPECT_EQ(http.error.param, "prompt") << ids;
      // The same message, naming the element ("prompt[1]" / "prompt_token_ids[1]").
      std::string want = zmq.error.message;
      const size_t at = want.find("prompt_token_ids");
      ASSERT_NE(at, std::string::npos) << want;
      want.replace(at, std::string("prompt_token_ids").size(), "prompt");
      EXPECT_EQ(http.error.message, want) << ids;
      continue;
    }
    if (!http.request.has_value() || !zmq.ok()) continue;
    ASSERT_EQ(http.request->prompts.size(), 1u) << ids;
    EXPECT_EQ(
        http.request->prompts[0],
        std::get<std::vector<int32_t>>(std::get<protocol::GenerateRequest>(*zmq.request).prompt))
        << ids;
  }
  // HTTP's other forms of token ids: a list of prompts, /detokenize's tokens.
  ParseOutcome lists = Completions(R"({"prompt": [[1.0, 2], [3e0]], "max_tokens": 4})");
  ASSERT_TRUE(lists.request.has_value()) << lists.error.message;
  EXPECT_EQ(lists.request->prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
  ApiError err;
  EXPECT_EQ(DetokenizeResponse(R"({"tokens": [28120.0, 905]})", Tok(), &err),
            DetokenizeResponse(R"({"tokens": [28120, 905]})", Tok(), &err));
  EXPECT_EQ(err.message, "");
  EXPECT_EQ(DetokenizeResponse(R"({"tokens": [28120.5]})", Tok(), &err), "");
  EXPECT_EQ(err.message, "field 'tokens[0]' must be an integer token id, got number 28120.5");
  EXPECT_EQ(err.param, "tokens");
}

TEST(BearerTokenTest, TheSchemeIsCaseInsensitive) {
  EXPECT_EQ(BearerToken("Bearer k-1"), "k-1");
  EXPECT_EQ(BearerToken("bearer k-1"), "k-1");
  EXPECT_EQ(BearerToken("BEARER   k-1"), "k-1");
  EXPECT_EQ(BearerToken("Basic k-1"), "");
  EXPECT_EQ(BearerToken("Bearerk-1"), "");
  EXPECT_EQ(BearerToken("Bearer"), "");
  EXPECT_EQ(BearerToken(""), "");
}

TEST(ConstantTimeEqualsTest, ComparesWholeStrings) {
  EXPECT_TRUE(ConstantTimeEquals("s3cret", "s3cret"));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3cres"));
  EXPECT_FALSE(ConstantTimeEquals("s3cret", "s3cret2"));  // a prefix is not a match
  EXPECT_FALSE(ConstantTimeEquals("", "x"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("a\0b", 3), std::string("a\0c", 3)));
}

// "A wrong key costs no more than a right one" without a timed assert: the
// comparison visits every byte position of the longer input whatever the
// inputs (a difference in the first byte, a length mismatch, an empty key),
// so an early exit on content or length fails here.
TEST(ConstantTimeEqualsTest, VisitsEveryPositionWhateverTheInputs) {
  const std::string key(64, 'k');
  const std::vector<std::pair<std::string, std::string>> cases = {
      {key, key},                      // right key
      {"x" + key.substr(1), key},      // differs at byte 0
      {key.substr(0, 63) + "x", key},  // differs at the last byte
      {"", key},                       // empty
      {"k", key},                      // a one-byte prefix
      {key + "k", key},                // one byte longer
      {std::string(1000, 'k'), key}};  // much longer
  for (const auto& [a, b] : cases) {
    size_t visited = 0;
    const bool eq = ConstantTimeEquals(a, b, &visited);
    EXPECT_EQ(eq, a == b) << a.size();
    EXPECT_EQ(visited, std::max(a.size(), b.size())) << "|a| = " << a.size();
  }
}

}  // namespace
}  // namespace pagedserve::openai
