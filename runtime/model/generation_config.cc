#include "runtime/model/generation_config.h"

#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "runtime/common/sampling_params.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/json_object.h"

namespace pagedserve {

absl::StatusOr<GenerationDefaults> GenerationDefaultsFromJson(std::string_view json_text,
                                                              std::string_view source_sv) {
  using nlohmann::json;
  // Debian's absl::string_view is not std::string_view.
  const absl::string_view source(source_sv.data(), source_sv.size());
  PS_ASSIGN_OR_RETURN(const json j, ParseJsonObject(json_text, source_sv));
  auto field_error = [&](const char* field, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": field '", field, "': ", what));
  };
  GenerationDefaults d;
  const std::pair<const char*, std::optional<double>*> reals[] = {
      {"temperature", &d.temperature},
      {"top_p", &d.top_p},
      {"min_p", &d.min_p},
      {"repetition_penalty", &d.repetition_penalty}};
  for (const auto& [field, out] : reals) {
    auto it = j.find(field);
    if (it == j.end() || it->is_null()) continue;
    if (!it->is_number()) return field_error(field, "must be a number");
    *out = it->get<double>();
  }
  if (auto it = j.find("top_k"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer()) return field_error("top_k", "must be an integer");
    const bool fits = it->is_number_unsigned()
                          ? it->get<uint64_t>() <= std::numeric_limits<int32_t>::max()
                          : it->get<int64_t>() >= std::numeric_limits<int32_t>::min() &&
                                it->get<int64_t>() <= std::numeric_limits<int32_t>::max();
    if (!fits) return field_error("top_k", "out of range");
    d.top_k = static_cast<int32_t>(it->get<int64_t>());
    if (*d.top_k == 0) d.top_k = -1;
  }
  // The ranges a request's values must meet (one rule for both).
  SamplingParams p;
  if (d.temperature) p.temperature = static_cast<float>(*d.temperature);
  if (d.top_p) p.top_p = static_cast<float>(*d.top_p);
  if (d.top_k) p.top_k = *d.top_k;
  if (d.min_p) p.min_p = static_cast<float>(*d.min_p);
  if (d.repetition_penalty) p.repetition_penalty = static_cast<float>(*d.repetition_penalty);
  if (absl::Status s = p.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", s.message()));
  }
  return d;
}

absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& dir) {
  const std::string path = dir + "/generation_config.json";
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec) || !std::filesystem::exists(path, ec)) {
    return GenerationDefaults{};
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream ss;
  ss << in.rdbuf();
  return GenerationDefaultsFromJson(ss.str(), path);
}

}  // namespace pagedserve
