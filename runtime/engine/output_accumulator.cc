#include "runtime/engine/output_accumulator.h"

#include <utility>

namespace pagedserve {
namespace {

template <typename T>
void Append(std::vector<T>* to, const std::vector<T>& from) {
  to->insert(to->end(), from.begin(), from.end());
}

}  // namespace

OutputAccumulator::OutputAccumulator(std::vector<std::string> engine_ids, int32_t n)
    : engine_ids_(std::move(engine_ids)),
      n_(n),
      completions_(engine_ids_.size() * static_cast<size_t>(n)),
      prompt_logprobs_(engine_ids_.size()),
      start_(std::chrono::steady_clock::now()) {}

void OutputAccumulator::KeepSubmitted(size_t count) {
  if (count < engine_ids_.size()) engine_ids_.resize(count);
}

bool OutputAccumulator::Apply(const EngineOutput& out, std::vector<CompletionNews>* news) {
  size_t p = 0;
  while (p < engine_ids_.size() && engine_ids_[p] != out.request_id) ++p;
  if (p == engine_ids_.size()) return false;
  if (!out.prompt_logprobs.empty()) prompt_logprobs_[p] = out.prompt_logprobs;
  for (const SequenceDelta& d : out.deltas) {
    if (d.index < 0 || d.index >= n_) continue;
    const int32_t choice = static_cast<int32_t>(p) * n_ + d.index;
    CompletionOutput& acc = completions_[choice];
    acc.text += d.text;
    Append(&acc.token_ids, d.token_ids);
    Append(&acc.logprobs, d.logprobs);
    Append(&acc.top_token_ids, d.top_token_ids);
    Append(&acc.top_logprobs, d.top_logprobs);
    if (d.cumulative_logprob) acc.cumulative_logprob = d.cumulative_logprob;
    if (d.finished) acc.finish_reason = d.finish_reason;
    if (!d.token_ids.empty() && !first_token_) first_token_ = std::chrono::steady_clock::now();
    const bool has_news = !d.text.empty() || !d.token_ids.empty() || d.finished;
    produced_output_ = produced_output_ || has_news;
    if (news != nullptr && has_news) {
      CompletionNews item;
      item.choice = choice;
      item.delta.text = d.text;
      item.delta.token_ids = d.token_ids;
      item.delta.logprobs = d.logprobs;
      item.delta.top_token_ids = d.top_token_ids;
      item.delta.top_logprobs = d.top_logprobs;
      item.delta.cumulative_logprob = d.cumulative_logprob;
      if (d.finished) item.delta.finish_reason = d.finish_reason;
      news->push_back(std::move(item));
    }
  }
  if (out.finished) {
    ++finished_;
    usage_.prompt_tokens += out.usage.prompt_tokens;
    usage_.completion_tokens += out.usage.completion_tokens;
    usage_.cached_prompt_tokens += out.usage.cached_prompt_tokens;
    if (!out.error.ok() && error_.ok()) error_ = out.error;
    for (int32_t i = 0; i < n_; ++i) {
      CompletionOutput& acc = completions_[p * n_ + i];
      acc.finish_reason = EndedWithRequest(acc.finish_reason, !out.error.ok());
    }
  }
  return true;
}

double OutputAccumulator::first_token_s() const {
  if (!first_token_) return -1;
  return std::chrono::duration<double>(*first_token_ - start_).count();
}

double OutputAccumulator::elapsed_s() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

}  // namespace pagedserve
