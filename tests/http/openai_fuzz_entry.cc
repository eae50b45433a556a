#include "tests/http/openai_fuzz_entry.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string_view>

#include "nlohmann/json.hpp"
#include "runtime/frontend/openai_api.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/loaders.h"

namespace pagedserve::openai {
namespace {

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
};

const Fixture& LoadFixture() {
  static const Fixture* f = [] {
    const char* root = std::getenv("PAGEDSERVE_SOURCE_DIR");
    auto tok =
        LoadHfTokenizer(std::string(root ? root : ".") + "/tests/fixtures/smollm2-tokenizer");
    if (!tok.ok()) {
      std::fprintf(stderr,
                   "openai fuzz: the fixture tokenizer does not load (%s); set "
                   "PAGEDSERVE_SOURCE_DIR to the source tree\n",
                   std::string(tok.status().message()).c_str());
      std::abort();
    }
    auto* fixture = new Fixture;
    fixture->tokenizer = *std::move(tok);
    auto ct = ChatTemplate::Create(fixture->tokenizer->spec().chat_template,
                                   fixture->tokenizer->BosText(), fixture->tokenizer->EosText());
    if (ct.ok()) fixture->chat_template = *std::move(ct);
    return fixture;
  }();
  return *f;
}

bool IsJsonObject(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return j.is_object();
}

std::string CheckRefusal(const ApiError& e) {
  if (e.status != 400 && e.status != 404) return "refusal with status " + std::to_string(e.status);
  if (e.message.empty()) return "refusal without a message";
  if (!IsJsonObject(ErrorBody(e))) return "error body is not one JSON object";
  return "";
}

std::string CheckRequest(const ValidatedRequest& r, const ServedModel& model) {
  if (r.prompts.empty()) return "accepted request without a prompt";
  for (const auto& p : r.prompts) {
    if (p.empty()) return "accepted an empty prompt";
    for (int32_t id : p) {
      if (id < 0 || id >= model.vocab_size) return "token id out of the vocabulary";
    }
  }
  if (absl::Status s = r.params.Validate(); !s.ok()) {
    return "accepted sampling parameters that Validate refuses: " + std::string(s.message());
  }
  return "";
}

}  // namespace

std::string OpenAiFuzzOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const Fixture& f = LoadFixture();
  const Tokenizer& tok = *f.tokenizer;
  const ChatTemplate* tmpl = f.chat_template ? &*f.chat_template : nullptr;
  const ServedModel model{"smol", 2048, tok.vocab_size(), {}};
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 4) {
    case 0:
    case 1: {
      const Endpoint e = data[0] % 4 == 0 ? Endpoint::kCompletions : Endpoint::kChat;
      ParseOutcome o = ParseRequest(e, body, model, tok, tmpl);
      return o.request ? CheckRequest(*o.request, model) : CheckRefusal(o.error);
    }
    case 2: {
      ApiError err;
      err.status = 0;
      const std::string out = TokenizeResponse(body, model, tok, tmpl, &err);
      if (err.status != 0) return CheckRefusal(err);
      return IsJsonObject(out) ? "" : "tokenize answer is not one JSON object";
    }
    default: {
      ApiError err;
      err.status = 0;
      const std::string out = DetokenizeResponse(body, tok, &err);
      if (err.status != 0) return CheckRefusal(err);
      return IsJsonObject(out) ? "" : "detokenize answer is not one JSON object";
    }
  }
}

}  // namespace pagedserve::openai
