// runtime/chat against Python jinja2 with Hugging Face's apply_chat_template
// environment, on the real chat templates of llama.cpp's tree
// (tests/chat/fetch_templates.sh puts them in a cache folder) over the
// conversations of tests/fixtures/chat_templates.json (tests/chat/make_fixtures.py
// rendered them with jinja2). Every render jinja2 completes must be identical
// byte for byte; every render jinja2 refuses must fail here too, with the
// template's own message when raise_exception raised it.
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/chat/json_value.h"
#include "runtime/chat/template.h"
#include "runtime/frontend/chat_messages.h"
#include "runtime/tokenizer/chat_template.h"

namespace pagedserve::chat {
namespace {

using Json = nlohmann::ordered_json;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string SourceDir() {
  const char* dir = std::getenv("PAGEDSERVE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::string TemplatesDir() {
  if (const char* dir = std::getenv("PAGEDSERVE_TEMPLATES_DIR"); dir != nullptr && *dir != '\0')
    return dir;
  const char* cache = std::getenv("XDG_CACHE_HOME");
  const std::string base =
      cache != nullptr && *cache != '\0' ? cache : std::string(std::getenv("HOME")) + "/.cache";
  return base + "/pagedserve/templates/llama-cpp-python-0.3.36";
}

std::string Fnv1a64(const std::string& data) {
  uint64_t h = 0xCBF29CE484222325ULL;
  for (unsigned char c : data) h = (h ^ c) * 0x100000001B3ULL;
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The fixture's fixed clock ("2025-03-07T14:05:09") as a broken-down time.
std::tm FixedNow(const std::string& iso) {
  std::tm tm{};
  std::sscanf(iso.c_str(), "%d-%d-%dT%d:%d:%d", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
              &tm.tm_min, &tm.tm_sec);
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  const std::time_t t = timegm(&tm);  // fills in the weekday and day of the year
  gmtime_r(&t, &tm);
  return tm;
}

// Where two texts first differ, with context, for a failure message.
std::string Difference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 80 ? i - 80 : 0;
  std::ostringstream os;
  os << "first difference at byte " << i << " (expected " << want.size() << " bytes, got "
     << got.size() << ")\n  expected: ..." << nlohmann::json(want.substr(from, 200)).dump()
     << "\n  got:      ..." << nlohmann::json(got.substr(from, 200)).dump();
  return os.str();
}

class ConformanceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = SourceDir() + "/tests/fixtures/chat_templates.json";
    fixture_ = Json::parse(ReadFile(path));
    clock_ = [now = FixedNow(fixture_["now"].get<std::string>())] { return now; };
  }

  Dict Context(const Json& conversation, bool add_generation_prompt) const {
    Dict vars;
    vars.Set("messages", FromJson(conversation["messages"]));
    vars.Set("tools",
             conversation.contains("tools") ? FromJson(conversation["tools"]) : Value(nullptr));
    vars.Set("documents", Value(nullptr));
    vars.Set("add_generation_prompt", Value(add_generation_prompt));
    vars.Set("bos_token", Value(fixture_["bos_token"].get<std::string>()));
    vars.Set("eos_token", Value(fixture_["eos_token"].get<std::string>()));
    return vars;
  }

  // Checks one template's cases; returns whether all matched.
  bool CheckTemplate(const std::string& name, const Json& entry, const std::string& source,
                     int* renders, int* errors) {
    absl::StatusOr<Template> tmpl = Template::Parse(source);
    if (entry.contains("error")) {
      EXPECT_FALSE(tmpl.ok()) << name << ": jinja2 refuses to compile it (" << entry["error"]
                              << ") but it parsed";
      ++*errors;
      return !tmpl.ok();
    }
    if (!tmpl.ok()) {
      ADD_FAILURE() << name << ": " << tmpl.status();
      return false;
    }
    bool all = true;
    int index = 0;
    std::vector<std::string> outputs;  // the expected output of each case so far ("" for errors)
    for (const Json& c : entry["cases"]) {
      outputs.push_back(ExpectedOutput(c, outputs));
      const Json& conversation = fixture_["conversations"][c["conversation"].get<int>()];
      const std::string what =
          name + " case " + std::to_string(index++) + " (" +
          conversation["name"].get<std::string>() +
          ", add_generation_prompt=" + (c["add_generation_prompt"].get<bool>() ? "true" : "false") +
          ")";
      absl::StatusOr<std::string> got =
          tmpl->Render(Context(conversation, c["add_generation_prompt"]), {}, clock_);
      all = CheckCase(what, c, outputs.back(), got, renders, errors) && all;
    }
    return all;
  }

  // A case's output: the text, or (make_fixtures.py's compact form) the first
  // `keep` bytes of an earlier case's output followed by `text`.
  static std::string ExpectedOutput(const Json& c, const std::vector<std::string>& earlier) {
    if (!c.contains("output")) return "";
    const Json& out = c["output"];
    if (out.is_string()) return out.get<std::string>();
    return earlier.at(out["from"].get<size_t>()).substr(0, out["keep"].get<size_t>()) +
           out["text"].get<std::string>();
  }

  bool CheckCase(const std::string& what, const Json& c, const std::string& want,
                 const absl::StatusOr<std::string>& got, int* renders, int* errors) {
    if (c.contains("output")) {
      ++*renders;
      if (!got.ok()) {
        ADD_FAILURE() << what << ": jinja2 renders it, we fail: " << got.status();
        return false;
      }
      if (*got != want) {
        ADD_FAILURE() << what << ": " << Difference(want, *got);
        return false;
      }
      return true;
    }
    ++*errors;
    const std::string error = c["error"].get<std::string>();
    if (got.ok()) {
      ADD_FAILURE() << what << ": jinja2 fails (" << error << ") but we render";
      return false;
    }
    // Failing for the template's reason (an error of the template or of the
    // conversation; a recursion without end reaches our call depth limit), not
    // because a construct is unsupported.
    const bool recursion = error.rfind("RecursionError", 0) == 0 &&
                           got.status().code() == absl::StatusCode::kResourceExhausted;
    if (got.status().code() != absl::StatusCode::kInvalidArgument && !recursion) {
      ADD_FAILURE() << what << ": jinja2 fails (" << error
                    << "), we fail otherwise: " << got.status();
      return false;
    }
    if (c.value("raised", false) && got.status().message().find(error) == std::string::npos) {
      ADD_FAILURE() << what << ": raise_exception(" << error << ") expected, got " << got.status();
      return false;
    }
    return true;
  }

  Json fixture_;
  Clock clock_;
};

TEST_F(ConformanceTest, EveryTemplateRendersAsJinja2) {
  const std::string dir = TemplatesDir();
  int identical = 0, renders = 0, errors = 0;
  const int total = static_cast<int>(fixture_["templates"].size());
  for (const auto& [name, entry] : fixture_["templates"].items()) {
    const std::string path = absl::StrCat(dir, "/", name);
    const std::string source = ReadFile(path);
    ASSERT_EQ(Fnv1a64(source), entry["fnv1a64"].get<std::string>())
        << path
        << " is missing or is not the file the fixture was made from: run tests/chat/fetch_templates.sh "
        << "(or set PAGEDSERVE_TEMPLATES_DIR)";
    if (CheckTemplate(name, entry, source, &renders, &errors)) ++identical;
  }
  std::cout << "chat conformance: " << identical << " of " << total
            << " templates identical to jinja2 (" << renders << " renders compared byte for byte, "
            << errors << " jinja2 errors matched)\n";
  RecordProperty("identical_templates", identical);
  EXPECT_EQ(identical, total);
}

// Issue 32: the OpenAI request path for tools (ReadChatMessages -> ChatMessage
// with tool_calls / tool_call_id / name, `tools` as ordered JSON text ->
// ChatTemplate::Render) gives what transformers' apply_chat_template gives
// for the fixture's tool conversations, on every template that does not read
// the clock. The OpenAI form carries a call's arguments as a JSON string; the
// front end parses it back into the object the templates expect (as vLLM).
TEST_F(ConformanceTest, OpenAiToolRequestsRenderAsTransformers) {
  const std::string dir = TemplatesDir();
  int compared = 0, with_tools = 0;
  for (const auto& [name, entry] : fixture_["templates"].items()) {
    if (entry.contains("error")) continue;
    const std::string source = ReadFile(absl::StrCat(dir, "/", name));
    ASSERT_EQ(Fnv1a64(source), entry["fnv1a64"].get<std::string>()) << name;
    if (source.find("strftime_now") != std::string::npos) continue;
    absl::StatusOr<ChatTemplate> tmpl = ChatTemplate::Create(
        source, fixture_["bos_token"].get<std::string>(), fixture_["eos_token"].get<std::string>());
    ASSERT_TRUE(tmpl.ok()) << name << ": " << tmpl.status();
    std::vector<std::string> outputs;
    bool uses_tools = false;
    for (const Json& c : entry["cases"]) {
      outputs.push_back(ExpectedOutput(c, outputs));
      const Json& conversation = fixture_["conversations"][c["conversation"].get<int>()];
      const std::string conv = conversation["name"].get<std::string>();
      if ((conv != "tools" && conv != "tool_call") || !c.contains("output")) continue;
      Json openai_messages = conversation["messages"];
      for (Json& m : openai_messages) {
        if (!m.contains("tool_calls")) continue;
        for (Json& call : m["tool_calls"]) {
          call["function"]["arguments"] = call["function"]["arguments"].dump();
        }
      }
      std::vector<pagedserve::ChatMessage> messages;
      absl::Status read = ReadChatMessages(nlohmann::json::parse(openai_messages.dump()),
                                           /*strict=*/false, &messages);
      ASSERT_TRUE(read.ok()) << read;
      absl::StatusOr<std::string> got = tmpl->Render(
          messages, c["add_generation_prompt"].get<bool>(), conversation["tools"].dump());
      ASSERT_TRUE(got.ok()) << name << " " << conv << ": " << got.status();
      EXPECT_EQ(*got, outputs.back())
          << name << " " << conv << ": " << Difference(outputs.back(), *got);
      ++compared;
      // A template that renders the tools differs from its render without them.
      uses_tools |= source.find("tools") != std::string::npos;
    }
    with_tools += uses_tools;
  }
  std::cout << "chat tools: " << compared << " renders through the OpenAI path compared, "
            << with_tools << " templates read tools\n";
  EXPECT_GT(compared, 100);
  EXPECT_GT(with_tools, 15);
}

}  // namespace
}  // namespace pagedserve::chat
