#include "runtime/coordinator/speculative.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pagedserve {
namespace {

constexpr int32_t kMaxSpeculativeTokens = 16;
constexpr int32_t kMaxLookup = 16;

absl::Status Bad(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--speculative-config: \"", std::string(key), "\" ", std::string(what)));
}

absl::StatusOr<int32_t> GetInt(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) return Bad(key, absl::StrCat("must be an integer, got ", v.dump()));
  const int64_t x = v.get<int64_t>();
  // Far beyond any valid value (int32 safety); the ranges are Validate's, so
  // that -1 and 17 get the same "must be in [...]" message.
  if (x < -(1 << 20) || x > 1 << 20) return Bad(key, absl::StrCat("is out of range: ", x));
  return static_cast<int32_t>(x);
}

}  // namespace

absl::Status SpeculativeConfig::Validate() const {
  if (method.empty()) return absl::OkStatus();
  if (method != "ngram" && method != "draft_model") {
    return Bad("method",
               absl::StrCat("must be \"ngram\" or \"draft_model\", got \"", method, "\""));
  }
  if ((method == "draft_model") != !model.empty()) {
    return Bad("model", method == "ngram" ? "is for \"method\": \"draft_model\", not \"ngram\""
                                          : "(the draft model's path) is required");
  }
  if (num_speculative_tokens < 1 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return Bad("num_speculative_tokens", absl::StrCat("must be in [1, ", kMaxSpeculativeTokens,
                                                      "], got ", num_speculative_tokens));
  }
  if (method == "ngram" && (prompt_lookup_min < 1 || prompt_lookup_max > kMaxLookup ||
                            prompt_lookup_min > prompt_lookup_max)) {
    return Bad("prompt_lookup_min",
               absl::StrCat("and prompt_lookup_max must satisfy 1 <= min <= max <= ", kMaxLookup,
                            ", got min ", prompt_lookup_min, " max ", prompt_lookup_max));
  }
  if (disable_by_batch_size < 0) {
    return Bad("disable_by_batch_size",
               absl::StrCat("must be >= 0 (0 = never), got ", disable_by_batch_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<SpeculativeConfig> ParseSpeculativeConfig(std::string_view json) {
  SpeculativeConfig c;
  if (json.empty()) return c;
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-config must be a JSON object, got '", std::string(json), "'"));
  }
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k != "method" && k != "model" && k != "num_speculative_tokens" &&
        k != "prompt_lookup_max" && k != "prompt_lookup_min" && k != "disable_by_batch_size") {
      return Bad(k,
                 "is not a known key (method, model, num_speculative_tokens, prompt_lookup_max, "
                 "prompt_lookup_min, disable_by_batch_size)");
    }
  }
  if (j.contains("model")) {
    if (!j["model"].is_string() || j["model"].get<std::string>().empty())
      return Bad("model", "must be a non-empty string (the draft model's path)");
    c.model = j["model"].get<std::string>();
  }
  if (j.contains("method") && !j["method"].is_string())
    return Bad("method", "must be a string (\"ngram\" or \"draft_model\")");
  if (!j.contains("method") && c.model.empty())
    return Bad("method", "is required unless \"model\" names a draft model");
  c.method = j.contains("method") ? j["method"].get<std::string>() : "draft_model";
  if (c.method == "[ngram]") c.method = "ngram";
  if (c.method == "draft_model" &&
      (j.contains("prompt_lookup_max") || j.contains("prompt_lookup_min")))
    return Bad("prompt_lookup_max", "and prompt_lookup_min are for \"method\": \"ngram\"");
  if (!j.contains("num_speculative_tokens")) return Bad("num_speculative_tokens", "is required");
  absl::StatusOr<int32_t> v = GetInt(j, "num_speculative_tokens");
  if (!v.ok()) return v.status();
  c.num_speculative_tokens = *v;
  const bool has_max = j.contains("prompt_lookup_max");
  const bool has_min = j.contains("prompt_lookup_min");
  if (has_max) {
    if (v = GetInt(j, "prompt_lookup_max"); !v.ok()) return v.status();
    c.prompt_lookup_max = *v;
  }
  if (has_min) {
    if (v = GetInt(j, "prompt_lookup_min"); !v.ok()) return v.status();
    c.prompt_lookup_min = *v;
  }
  // Defaults (speculative.h): neither given: [1, 4]; only min: max = min;
  // only max: min = 1.
  if (c.method != "ngram") {
  } else if (!has_max && !has_min) {
    c.prompt_lookup_min = 1;
    c.prompt_lookup_max = 4;
  } else if (!has_max) {
    c.prompt_lookup_max = c.prompt_lookup_min;
  } else if (!has_min) {
    c.prompt_lookup_min = std::min(1, c.prompt_lookup_max);
  }
  if (j.contains("disable_by_batch_size")) {
    if (v = GetInt(j, "disable_by_batch_size"); !v.ok()) return v.status();
    c.disable_by_batch_size = *v;
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

void NgramProposer::Propose(std::span<const int32_t> tokens, int32_t max_tokens,
                            std::vector<int32_t>* draft) {
  draft->clear();
  const auto len = static_cast<int64_t>(tokens.size());
  if (max_tokens < 1) return;
  for (int32_t n = std::min<int64_t>(max_n_, len - 1); n >= min_n_; --n) {
    const int32_t* tail = tokens.data() + len - n;
    // The first occurrence (vLLM's and the original prompt-lookup rule): in
    // input-grounded text it is the prompt's copy, with the longest
    // continuation; the tail itself (start len - n) does not count.
    for (int64_t start = 0; start < len - n; ++start) {
      if (!std::equal(tail, tail + n, tokens.data() + start)) continue;
      const int64_t from = start + n;  // < len: the occurrence is earlier than the tail
      const int64_t count = std::min<int64_t>(max_tokens, len - from);
      draft->assign(tokens.begin() + from, tokens.begin() + from + count);
      return;
    }
  }
}

void DraftModelProposer::Propose(std::span<const int32_t> tokens, int32_t max_tokens,
                                 std::vector<int32_t>* draft) {
  (void)tokens;
  draft->assign(static_cast<size_t>(std::max(max_tokens, 0)), kNoToken);
}

std::unique_ptr<Proposer> MakeProposer(const SpeculativeConfig& config) {
  if (!config.enabled()) return nullptr;
  if (config.method == "draft_model") return std::make_unique<DraftModelProposer>();
  return std::make_unique<NgramProposer>(config.prompt_lookup_min, config.prompt_lookup_max);
}

int32_t AcceptedDraftLength(std::span<const int32_t> draft, std::span<const int32_t> target) {
  int32_t a = 0;
  while (static_cast<size_t>(a) < draft.size() && static_cast<size_t>(a) < target.size() &&
         draft[a] == target[a]) {
    ++a;
  }
  return a;
}

}  // namespace pagedserve
