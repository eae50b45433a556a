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

// Absent (or null) fields stay unset. top_k 0 is read as -1 (off: 0 disables
// top-k in transformers and vLLM, as in a request). The values are checked
// here against SamplingParams::Validate's ranges, so that a model folder
// whose defaults no request could send is refused at load, naming the file,
// instead of failing every request that leaves the field out.
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  bool empty() const { return !temperature && !top_p && !min_p && !repetition_penalty && !top_k; }
};

// From the text of a generation_config.json; `source` names it in errors.
// InvalidArgument for malformed JSON, a field of the wrong type or a value out
// of its range (e.g. temperature < 0, top_p outside (0, 1]).
absl::StatusOr<GenerationDefaults> GenerationDefaultsFromJson(std::string_view json_text,
                                                              std::string_view source);

// <dir>/generation_config.json when `dir` is a directory holding one; none
// (empty) otherwise, e.g. for a GGUF file, whose metadata has no such values.
// Errors as above, NotFound when the file exists but cannot be read.
absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& dir);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_GENERATION_CONFIG_H_
