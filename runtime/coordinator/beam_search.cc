#include "runtime/coordinator/beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace pagedserve {
namespace {

struct Candidate {
  double score;  // cumulative logprob after the token
  int32_t beam;  // index into the step's inputs
  int32_t rank;  // place in the beam's top list
  int32_t token_id;
  float logprob;
};

bool Better(const Candidate& a, const Candidate& b) {
  if (a.score != b.score) return a.score > b.score;
  if (a.beam != b.beam) return a.beam < b.beam;
  return a.rank < b.rank;
}

}  // namespace

BeamSearch::BeamSearch(const SamplingParams& params, int32_t max_output_len)
    : width_(params.beam_width()),
      n_(params.n),
      max_output_len_(std::max(max_output_len, 1)),
      length_penalty_(params.length_penalty),
      early_stopping_(params.early_stopping) {}

double BeamSearch::Score(double cumulative_logprob, int32_t len) const {
  return cumulative_logprob /
         std::pow(static_cast<double>(len), static_cast<double>(length_penalty_));
}

void BeamSearch::AddHypothesis(BeamHypothesis h) {
  auto pos = std::upper_bound(finished_.begin(), finished_.end(), h.score,
                              [](double s, const BeamHypothesis& x) { return s > x.score; });
  if (pos - finished_.begin() >= width_) return;
  finished_.insert(pos, std::move(h));
  if (static_cast<int32_t>(finished_.size()) > width_) finished_.pop_back();
}

std::vector<BeamChoice> BeamSearch::Step(std::span<const BeamInput> beams, int32_t output_len,
                                         const std::function<bool(int32_t)>& is_stop) {
  std::vector<BeamChoice> live;
  if (done_ || beams.empty()) {
    done_ = true;
    return live;
  }
  // 1. The best 2k candidates over every live beam.
  const size_t keep = 2 * static_cast<size_t>(width_);
  std::vector<Candidate> cands;
  for (size_t b = 0; b < beams.size(); ++b) {
    const SampledToken& t = *beams[b].sampled;
    const size_t m = std::min({t.top_token_ids.size(), t.top_logprobs.size(), keep});
    for (size_t j = 0; j < m; ++j) {
      cands.push_back({beams[b].cumulative_logprob + static_cast<double>(t.top_logprobs[j]),
                       static_cast<int32_t>(b), static_cast<int32_t>(j), t.top_token_ids[j],
                       t.top_logprobs[j]});
    }
  }
  const size_t top = std::min(keep, cands.size());
  std::partial_sort(cands.begin(), cands.begin() + top, cands.end(), Better);
  cands.resize(top);

  const int32_t new_len = output_len + 1;
  const bool by_length = new_len >= max_output_len_;
  const bool full_and_true =
      early_stopping_ == EarlyStopping::kTrue && static_cast<int32_t>(finished_.size()) >= width_;
  const bool may_add = !full_and_true && heuristic_unsatisfied_;
  auto hypothesis = [&](const Candidate& c, FinishReason reason) {
    const BeamInput& in = beams[c.beam];
    BeamHypothesis h;
    h.token_ids = *in.output_tokens;
    h.token_ids.push_back(c.token_id);
    h.logprobs = *in.output_logprobs;
    h.logprobs.push_back(c.logprob);
    h.cumulative_logprob = c.score;
    h.score = Score(c.score, new_len);
    h.finish_reason = reason;
    if (reason == FinishReason::kStop) h.stop_token_id = c.token_id;
    return h;
  };
  for (size_t r = 0; r < cands.size(); ++r) {
    const Candidate& c = cands[r];
    const bool stop = is_stop(c.token_id);
    if (stop || by_length) {
      // 3. Only the top k candidates may become hypotheses.
      if (static_cast<int32_t>(r) < width_ && may_add) {
        AddHypothesis(hypothesis(c, stop ? FinishReason::kStop : FinishReason::kLength));
      }
      continue;
    }
    if (static_cast<int32_t>(live.size()) < width_) {
      live.push_back({c.beam, c.token_id, c.logprob, c.score});
    }
  }

  // 5. Stopping.
  const bool full = static_cast<int32_t>(finished_.size()) >= width_;
  if (!live.empty() && full) {
    const bool never = early_stopping_ == EarlyStopping::kNever && length_penalty_ > 0.0f;
    const double best_possible =
        Score(live.front().cumulative_logprob, never ? max_output_len_ : new_len);
    if (!(best_possible > finished_.back().score)) heuristic_unsatisfied_ = false;
  }
  done_ = by_length || live.empty() || !heuristic_unsatisfied_ ||
          (early_stopping_ == EarlyStopping::kTrue && full);
  if (!done_) return live;
  // Live beams that may have to fill up the n results.
  leftovers_.clear();
  for (const BeamChoice& l : live) {
    Candidate c{l.cumulative_logprob, l.parent, 0, l.token_id, l.logprob};
    leftovers_.push_back(hypothesis(c, FinishReason::kLength));
  }
  live.clear();
  return live;
}

std::vector<BeamHypothesis> BeamSearch::TakeResults() {
  std::vector<BeamHypothesis> out = std::move(finished_);
  finished_.clear();
  std::sort(leftovers_.begin(), leftovers_.end(),
            [](const BeamHypothesis& a, const BeamHypothesis& b) { return a.score > b.score; });
  for (BeamHypothesis& h : leftovers_) {
    if (static_cast<int32_t>(out.size()) >= n_) break;
    out.push_back(std::move(h));
  }
  leftovers_.clear();
  if (static_cast<int32_t>(out.size()) > n_) out.resize(n_);
  return out;
}

}  // namespace pagedserve
