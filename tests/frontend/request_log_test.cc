// The request log line (request_log.h): what it carries and what it never does.
#include "runtime/frontend/request_log.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

namespace pagedserve {
namespace {

RequestLogRecord Record() {
  RequestLogRecord r;
  r.front_end = "zmq";
  r.request_id = "00ab/req-1";
  r.prompt_tokens = 12;
  r.completion_tokens = 5;
  r.cached_prompt_tokens = 8;
  r.finish_reasons = {"stop", "length"};
  r.first_output_s = 0.25;
  r.e2e_s = 1.5;
  return r;
}

TEST(RequestLogTest, CarriesIdsCountsAndTimingsOnly) {
  const std::string line = FormatRequestLog(Record());
  EXPECT_EQ(line,
            "request zmq: id=\"00ab/req-1\" prompt_tokens=12 completion_tokens=5 "
            "cached_prompt_tokens=8 finish_reason=stop,length e2e_s=1.5000 first_output_s=0.2500");
  RequestLogRecord none = Record();
  none.first_output_s = -1;
  EXPECT_EQ(FormatRequestLog(none).find("first_output_s"), std::string::npos);
  EXPECT_EQ(FormatRequestLog(none).find("client_disconnected"), std::string::npos);
  RequestLogRecord gone = Record();
  gone.front_end = "http";
  gone.client_disconnected = true;
  EXPECT_EQ(FormatRequestLog(gone),
            "request http: id=\"00ab/req-1\" prompt_tokens=12 completion_tokens=5 "
            "cached_prompt_tokens=8 finish_reason=stop,length e2e_s=1.5000 first_output_s=0.2500 "
            "client_disconnected");
}

TEST(RequestLogTest, ContentOnlyWhenGivenAndAlwaysOneLine) {
  RequestLogRecord r = Record();
  r.request_id = "evil\nrequest zmq: id=\"forged\"";
  r.prompt = "line one\nline \"two\"";
  r.completions = {"a\rb", "\xff"};
  const std::string line = FormatRequestLog(r);
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_EQ(line.find('\r'), std::string::npos) << line;
  EXPECT_NE(line.find("id=\"evil\\nrequest zmq: id=\\\"forged\\\"\""), std::string::npos) << line;
  EXPECT_NE(line.find("prompt=\"line one\\nline \\\"two\\\"\""), std::string::npos) << line;
  EXPECT_NE(line.find("completion[0]=\"a\\rb\" completion[1]=\"\\377\""), std::string::npos)
      << line;
}

// The record every front end builds from its OutputAccumulator: usage, one
// finish reason per completion, and the text only when the prompt is logged.
TEST(RequestLogTest, RecordOfAnAccumulatedRequest) {
  OutputAccumulator output({"p0"}, 2);
  EngineOutput out;
  out.request_id = "p0";
  SequenceDelta d;
  d.index = 1;
  d.text = "hi";
  d.token_ids = {4};
  d.finished = true;
  d.finish_reason = FinishReason::kLength;
  out.deltas = {d};
  out.finished = true;
  out.usage = {6, 1, 2};
  ASSERT_TRUE(output.Apply(out));

  RequestLogRecord r = LogRecordOf("http", "cmpl-1", output, true, std::nullopt);
  EXPECT_EQ(r.front_end, "http");
  EXPECT_EQ(r.request_id, "cmpl-1");
  EXPECT_EQ(r.prompt_tokens, 6);
  EXPECT_EQ(r.completion_tokens, 1);
  EXPECT_EQ(r.cached_prompt_tokens, 2);
  // Sample 0 reported nothing and the request ended without error: an abort.
  EXPECT_EQ(r.finish_reasons, (std::vector<std::string>{"abort", "length"}));
  EXPECT_GE(r.first_output_s, 0);
  EXPECT_GE(r.e2e_s, r.first_output_s);
  EXPECT_TRUE(r.client_disconnected);
  EXPECT_FALSE(r.prompt.has_value());
  EXPECT_TRUE(r.completions.empty());

  r = LogRecordOf("zmq", "x/1", output, false, "the prompt");
  EXPECT_EQ(r.prompt, "the prompt");
  EXPECT_EQ(r.completions, (std::vector<std::string>{"", "hi"}));
}

TEST(RequestLogTest, DescribesEveryPromptForm) {
  EXPECT_EQ(DescribePrompt(protocol::Prompt(std::string("hi"))), "hi");
  EXPECT_EQ(DescribePrompt(protocol::Prompt(std::vector<int32_t>{1, 2, 3})), "token_ids=[1,2,3]");
  EXPECT_EQ(DescribePrompt(protocol::Prompt(
                std::vector<protocol::ChatMessage>{{"system", "be brief"}, {"user", "hi"}})),
            "system: be brief | user: hi");
}

}  // namespace
}  // namespace pagedserve
