// The sampling defaults a Hugging Face model ships in generation_config.json,
// which vLLM applies to requests that leave the fields out (--generation-config
// auto, its default; vLLM's ModelConfig.get_diff_sampling_param): temperature,
// top_p, top_k, min_p and repetition_penalty. (Its end tokens, eos_token_id,
// are read by LoadHfConfig, model_config.h.)
#ifndef PAGEDSERVE_RUNTIME_MODEL_GENERATION_CONFIG_H_
#define PAGEDSERVE_RUNTIME_MODEL_GENERATION_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pagedserve {

// Absent (or null) fields stay unset. Values are not range-checked here: a
// request's SamplingParams::Validate checks what it ends up with.
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
};

// From the text of a generation_config.json; `source` names it in errors.
// InvalidArgument for malformed JSON or a field of the wrong type.
absl::StatusOr<GenerationDefaults> GenerationDefaultsFromJson(std::string_view json_text,
                                                              std::string_view source);

// <dir>/generation_config.json when `dir` is a directory holding one; none
// (empty) otherwise, e.g. for a GGUF file, whose metadata has no such values.
// Errors as above, NotFound when the file exists but cannot be read.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& dir);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_GENERATION_CONFIG_H_
