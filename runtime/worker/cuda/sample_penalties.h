// Internal: the host side of the sampling kernel's penalties
// (LaunchSampleRows in model_kernels.h): the per-row list of distinct token
// ids with their output counts, built from a RowSampling's history. Used by
// the CUDA backend (cuda_backend.cc) and the emulation test
// (tests/worker/cuda_sampling_emulation_test.cc). Host C++20 only.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLE_PENALTIES_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLE_PENALTIES_H_

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "runtime/worker/cuda/model_kernels.h"
#include "runtime/worker/model_backend.h"

namespace pagedserve::cuda_model {

// The sampling kernel's penalty list of a kSample row (the sampler's step 1
// conditions: the repetition penalty over the distinct ids of prompt +
// output, the additive ones over the output's ids with their counts),
// appended to *out with args->penalty_begin / penalty_count set. False, with
// nothing appended, for a history the sampler would refuse (an id outside
// [0, vocab), prompt_len outside [0, history length]).
inline bool AppendSamplePenalties(const RowSampling& r, int64_t vocab, SampleRowArgs* args,
                                  std::vector<SamplePenalty>* out) {
  const std::span<const int32_t> history = r.token_history;
  if (r.prompt_len < 0 || static_cast<size_t>(r.prompt_len) > history.size()) return false;
  for (const int32_t id : history)
    if (id < 0 || id >= vocab) return false;
  const std::span<const int32_t> output = history.subspan(static_cast<size_t>(r.prompt_len));
  const bool repetition = r.repetition_penalty != 1.0f && !history.empty();
  const bool additive =
      (r.frequency_penalty != 0.0f || r.presence_penalty != 0.0f) && !output.empty();
  args->repetition_penalty = r.repetition_penalty;
  args->frequency_penalty = r.frequency_penalty;
  args->presence_penalty = r.presence_penalty;
  args->penalty_begin = static_cast<int32_t>(out->size());
  args->penalty_count = 0;
  if (!repetition && !additive) return true;
  const std::span<const int32_t> penalized = repetition ? history : output;
  std::vector<int32_t> ids(penalized.begin(), penalized.end());
  std::vector<int32_t> outs(output.begin(), output.end());
  std::sort(ids.begin(), ids.end());
  std::sort(outs.begin(), outs.end());
  auto o = outs.begin();
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j < ids.size() && ids[j] == ids[i]) ++j;
    while (o != outs.end() && *o < ids[i]) ++o;
    int32_t count = 0;
    while (o != outs.end() && *o == ids[i]) ++o, ++count;
    out->push_back({ids[i], additive ? count : 0});
    i = j;
  }
  args->penalty_count = static_cast<int32_t>(out->size()) - args->penalty_begin;
  return true;
}

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLE_PENALTIES_H_
