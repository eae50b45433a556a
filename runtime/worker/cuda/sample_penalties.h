// Internal: the host side of the sampling kernel's inputs (LaunchSampleRows
// in model_kernels.h): a kSample RowSampling turned into the kernel's
// SampleRowArgs and its penalty list (the distinct token ids of the history
// with their output counts). Used by the CUDA backend (cuda_backend.cc) and
// the emulation test (tests/worker/cuda_sampling_emulation_test.cc), so that
// both run the same rules. Host C++20 only.
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

// Entries of the row's top logprobs list: min(r.logprobs, vocab), or 0.
inline int32_t TopLogprobCount(const RowSampling& r, int64_t vocab) {
  return r.logprobs >= 1 ? static_cast<int32_t>(std::min<int64_t>(r.logprobs, vocab)) : 0;
}

// The kernel's args for a kSample row `r` whose draws start at index
// `first_draw` (r.uniforms.size() draws) and whose top logprobs list (if
// any) at `first_top`: greedy (temperature < 1e-5, the sampler's rule) with
// inv_temperature 1, else 1 / temperature; the filters and logprobs as
// given; the penalties appended to *penalties (AppendSamplePenalties).
// False, with nothing appended and *args untouched, when the host sampler
// must take the row (AppendSamplePenalties refuses its history, more than
// kMaxSampleDraws draws, or logprobs above kMaxSampleTopLogprobs).
inline bool BuildSampleRowArgs(const RowSampling& r, int64_t vocab, int32_t first_draw,
                               int32_t first_top, SampleRowArgs* args,
                               std::vector<SamplePenalty>* penalties) {
  if (r.uniforms.size() > static_cast<size_t>(kMaxSampleDraws) ||
      r.logprobs > kMaxSampleTopLogprobs)
    return false;
  SampleRowArgs a;
  if (!AppendSamplePenalties(r, vocab, &a, penalties)) return false;
  const bool greedy = r.temperature < 1e-5f;
  a.greedy = greedy ? 1 : 0;
  a.inv_temperature = greedy ? 1.0f : 1.0f / r.temperature;
  a.top_k = r.top_k;
  a.top_p = r.top_p;
  a.min_p = r.min_p;
  a.num_draws = static_cast<int32_t>(r.uniforms.size());
  a.first_draw = first_draw;
  a.logprobs = r.logprobs < 0 ? -1 : r.logprobs;
  a.top_begin = first_top;
  *args = a;
  return true;
}

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLE_PENALTIES_H_
