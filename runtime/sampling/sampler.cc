#include "runtime/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Cand {
  float s;  // processed logit (after temperature, max subtracted), <= 0
  int32_t id;
  float e;  // exp(s), filled once needed
};

// Strict total order: larger value first, then lower token id.
inline bool Before(const Cand& a, const Cand& b) {
  return a.s > b.s || (a.s == b.s && a.id < b.id);
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The row's structure (what the step plan and the worker's mirror give it).
absl::Status CheckRow(const SamplerRow& row, int32_t vocab_size, size_t row_index) {
  auto where = [&] { return absl::StrCat("sampler row ", row_index, " (seq ", row.seq_id, "): "); };
  if (row.params == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(where(), "params is null"));
  if (absl::Status s = row.params->Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where(), s.message()));
  }
  if (row.num_samples < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), "num_samples must be >= 1, got ", row.num_samples));
  }
  // num_samples is a request's n (at most 64, SamplingParams) on its final
  // prefill step; the bound keeps a corrupt step plan from sizing the output
  // and the draws by it.
  constexpr int32_t kMaxNumSamples = 64;
  if (row.num_samples > kMaxNumSamples) {
    return absl::InvalidArgumentError(absl::StrCat(where(), "num_samples ", row.num_samples,
                                                   " exceeds ", kMaxNumSamples, " (largest n)"));
  }
  if (row.prompt_len < 0 || static_cast<size_t>(row.prompt_len) > row.token_history.size()) {
    return absl::InvalidArgumentError(absl::StrCat(where(), "prompt_len ", row.prompt_len,
                                                   " outside [0, ", row.token_history.size(), "]"));
  }
  for (size_t i = 0; i < row.token_history.size(); ++i) {
    const int32_t t = row.token_history[i];
    if (t < 0 || t >= vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), "token_history[", i, "] = ", t, " outside [0, ", vocab_size, ")"));
    }
  }
  return absl::OkStatus();
}

// The row's logits (the model's output, not the step's structure): no NaN or
// +inf, at least one finite logit, and one the structured-output mask allows.
absl::Status CheckLogits(std::span<const float> logits_row, const SamplerRow& row,
                         size_t row_index) {
  auto where = [&] { return absl::StrCat("sampler row ", row_index, " (seq ", row.seq_id, "): "); };
  // Branch-free scan first (vectorizes); locate the culprit only when there is one.
  constexpr float kMax = std::numeric_limits<float>::max();
  bool bad = false, any_finite = false;
  for (const float v : logits_row) {
    bad |= !(v <= kMax) & (v != kNegInf);  // NaN or +inf
    any_finite |= (v > kNegInf);
  }
  if (bad) {
    for (size_t i = 0; i < logits_row.size(); ++i) {
      const float v = logits_row[i];
      if (std::isnan(v) || v > kMax) {
        return absl::InvalidArgumentError(absl::StrCat(where(), "logit of token ", i, " is ", v));
      }
    }
  }
  if (!any_finite) return absl::InvalidArgumentError(absl::StrCat(where(), "every logit is -inf"));
  if (!row.allowed_tokens.empty()) {
    bool allowed_finite = false;
    for (size_t i = 0; i < logits_row.size() && !allowed_finite; ++i) {
      allowed_finite = (i >> 6) < row.allowed_tokens.size() &&
                       ((row.allowed_tokens[i >> 6] >> (i & 63)) & 1) && logits_row[i] > kNegInf;
    }
    if (!allowed_finite) {
      return absl::InvalidArgumentError(absl::StrCat(
          where(), "no token allowed by the structured-output mask has a finite logit"));
    }
  }
  return absl::OkStatus();
}

// Output tokens the row has so far.
std::span<const int32_t> OutputTokens(const SamplerRow& row) {
  return row.token_history.subspan(row.prompt_len);
}

bool MinTokensActive(const SamplerRow& row) {
  const SamplingParams& p = *row.params;
  return p.min_tokens > 0 && !p.min_tokens_end_ids.empty() &&
         OutputTokens(row).size() < static_cast<size_t>(p.min_tokens);
}

// Steps 0a-0c on `out` (a copy of the raw row): logit_bias added, then the
// min_tokens end ids and the completed bad words set to -inf. Ids outside
// the vocabulary are skipped (no such token can be sampled).
void ApplyBiasAndMasks(const SamplerRow& row, std::vector<float>& out) {
  const SamplingParams& p = *row.params;
  const auto v = static_cast<int32_t>(out.size());
  constexpr float kMax = std::numeric_limits<float>::max();
  for (const auto& [id, bias] : p.logit_bias) {
    if (id >= v || out[id] == kNegInf) continue;
    out[id] = std::clamp(out[id] + bias, -kMax, kMax);
  }
  if (MinTokensActive(row)) {
    for (int32_t id : p.min_tokens_end_ids) {
      if (id < v) out[id] = kNegInf;
    }
  }
  const auto output = OutputTokens(row);
  for (const std::vector<int32_t>& word : p.bad_words_token_ids) {
    const size_t prefix = word.size() - 1;
    if (word.back() >= v || prefix > output.size()) continue;
    if (std::equal(word.begin(), word.end() - 1, output.end() - prefix)) out[word.back()] = kNegInf;
  }
}

// Step 1: the biased, masked and penalized row.
// Finite inputs stay finite: results are clamped to +-FLT_MAX (a huge penalty can
// otherwise overflow); only the masks (logit processors here, the structured
// output mask in ApplyPenalties) make a finite logit -inf (the caller checks
// that one finite logit remains). Returns `in` itself when nothing applies (no
// copy).
std::span<const float> ApplyPenaltiesOnly(std::span<const float> in, const SamplerRow& row,
                                          std::vector<float>& out) {
  const SamplingParams& p = *row.params;
  const bool repetition = p.repetition_penalty != 1.0f && !row.token_history.empty();
  const bool additive = (p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) &&
                        static_cast<size_t>(row.prompt_len) < row.token_history.size();
  const bool processors =
      !p.logit_bias.empty() || MinTokensActive(row) || !p.bad_words_token_ids.empty();
  if (!repetition && !additive && !processors) return in;
  out.assign(in.begin(), in.end());
  if (processors) ApplyBiasAndMasks(row, out);
  constexpr float kMax = std::numeric_limits<float>::max();
  auto clamp = [](float& v) {
    if (v > kMax) v = kMax;
    if (v < -kMax) v = -kMax;
  };
  std::vector<int32_t> ids;
  if (p.repetition_penalty != 1.0f && !row.token_history.empty()) {
    ids.assign(row.token_history.begin(), row.token_history.end());
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t t : ids) {
      float& v = out[t];
      if (v == kNegInf) continue;
      v = v > 0.0f ? v / p.repetition_penalty : v * p.repetition_penalty;
      clamp(v);
    }
  }
  const auto output = row.token_history.subspan(row.prompt_len);
  if ((p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) && !output.empty()) {
    ids.assign(output.begin(), output.end());
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      while (j < ids.size() && ids[j] == ids[i]) ++j;
      float& v = out[ids[i]];
      if (v != kNegInf) {
        v -= p.frequency_penalty * static_cast<float>(j - i) + p.presence_penalty;
        clamp(v);
      }
      i = j;
    }
  }
  return out;
}

bool AllMasked(std::span<const float> w) {
  return std::all_of(w.begin(), w.end(), [](float x) { return x == kNegInf; });
}

absl::Status AllMaskedError(const SamplerRow& row) {
  return absl::InvalidArgumentError(
      absl::StrCat("sampler row of seq ", row.seq_id,
                   ": min_tokens and bad_words mask every token the model allows"));
}

int32_t ArgMax(std::span<const float> v) {
  // First maximum: ties go to the lowest id. -inf entries never beat a finite one.
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Steps 3-6 on penalized logits `w`. Leaves the survivors in `cands` with `e`
// filled (unnormalized probabilities, > 0). `sorted` tells whether they are in
// Before() order; otherwise they are in token-id order.
//
// Cost: the filters are prefixes of the Before() order, so no full sort is needed.
// Small top-k uses one pass with a k-entry heap; top-p first drops tokens with
// p_i < (1 - top_p) / |K| (everything ranked at or below such a token weighs less
// than 1 - top_p, so it lies outside the nucleus) and then sorts chunk by chunk
// until the nucleus is complete; min-p (a prefix too) is applied before the top-p
// walk, which cannot change the result because the walk's normalizer is fixed.
void Filter(std::span<const float> w, const SamplingParams& p, std::vector<Cand>& cands,
            bool& sorted) {
  const float max = *std::max_element(w.begin(), w.end());
  const float inv_t = 1.0f / p.temperature;  // temperature >= 1e-5 here: finite
  const size_t v = w.size();
  cands.clear();
  sorted = false;
  const bool top_k_active = p.top_k > 0 && static_cast<size_t>(p.top_k) < v;
  double z = 0.0;         // normalizer over the top-k survivors (what top-p renormalizes by)
  size_t k_count = 0;     // |K|
  float keep_min = 0.0f;  // survivors need e >= keep_min (and e > 0)
  if (p.min_p > 0.0f) keep_min = p.min_p;
  // Top-p prefilter: p_i < (1 - top_p) / |K| lies outside the nucleus.
  auto RaiseKeepMinForTopP = [&] {
    if (p.top_p < 1.0f) {
      keep_min = std::max(keep_min, static_cast<float>((1.0 - p.top_p) * z / k_count));
    }
  };
  auto DropBelowKeepMin = [&] {
    cands.erase(
        std::remove_if(cands.begin(), cands.end(),
                       [keep_min](const Cand& c) { return !(c.e > 0.0f && c.e >= keep_min); }),
        cands.end());
  };
  if (top_k_active && static_cast<size_t>(p.top_k) * 8 <= v) {
    // Heap of the k best (front = worst kept), one pass. Ranked by the
    // processed value s, as every other path: two logits that round to the
    // same s tie, and the lower id wins.
    const size_t k = static_cast<size_t>(p.top_k);
    cands.reserve(k);
    for (size_t i = 0; i < v; ++i) {
      const Cand c{(w[i] - max) * inv_t, static_cast<int32_t>(i), 0.0f};
      if (cands.size() < k) {
        if (w[i] == kNegInf) continue;
        cands.push_back(c);
        std::push_heap(cands.begin(), cands.end(), Before);
      } else if (Before(c, cands.front())) {
        std::pop_heap(cands.begin(), cands.end(), Before);
        cands.back() = c;
        std::push_heap(cands.begin(), cands.end(), Before);
      }
    }
    for (Cand& c : cands) {
      c.e = std::exp(c.s);
      z += c.e;
    }
    k_count = cands.size();
    RaiseKeepMinForTopP();
    DropBelowKeepMin();
  } else {
    std::vector<float> e(v);
    for (size_t i = 0; i < v; ++i) {
      e[i] = std::exp((w[i] - max) * inv_t);  // exp(-inf) = 0 for masked tokens
      z += e[i];
    }
    if (top_k_active) {
      // Large k: select by value among all tokens, then recompute the normalizer.
      cands.reserve(v);
      for (size_t i = 0; i < v; ++i) {
        if (w[i] != kNegInf) cands.push_back({(w[i] - max) * inv_t, static_cast<int32_t>(i), e[i]});
      }
      if (static_cast<size_t>(p.top_k) < cands.size()) {
        std::nth_element(cands.begin(), cands.begin() + p.top_k, cands.end(), Before);
        cands.resize(p.top_k);
      }
      z = 0.0;
      for (const Cand& c : cands) z += c.e;
      k_count = cands.size();
      RaiseKeepMinForTopP();
      DropBelowKeepMin();
    } else {
      for (size_t i = 0; i < v; ++i) k_count += (w[i] != kNegInf);
      RaiseKeepMinForTopP();
      for (size_t i = 0; i < v; ++i) {
        if (e[i] > 0.0f && e[i] >= keep_min) {
          cands.push_back({(w[i] - max) * inv_t, static_cast<int32_t>(i), e[i]});
        }
      }
    }
  }
  // The maximum (e = 1) always passes keep_min <= 1, so cands is never empty.
  if (p.top_p < 1.0f) {
    const double threshold = static_cast<double>(p.top_p) * z;
    size_t done = 0, cut = cands.size();
    double acc = 0.0;
    while (done < cands.size() && cut == cands.size()) {
      const size_t chunk = std::max<size_t>(64, done);
      const size_t end = std::min(cands.size(), done + chunk);
      if (end < cands.size()) {
        std::nth_element(cands.begin() + done, cands.begin() + end, cands.end(), Before);
      }
      std::sort(cands.begin() + done, cands.begin() + end, Before);
      for (size_t i = done; i < end; ++i) {
        if (i > 0 && acc >= threshold) {
          cut = i;
          break;
        }
        acc += cands[i].e;
      }
      done = end;
    }
    cands.resize(cut);
    sorted = true;
  }
  if (!sorted && top_k_active) {
    std::sort(cands.begin(), cands.end(), Before);
    sorted = true;
  }
}

// Inverse CDF over the survivors in their current (deterministic) order.
int32_t Draw(const std::vector<Cand>& cands, double u) {
  double total = 0.0;
  for (const Cand& c : cands) total += c.e;
  const double target = u * total;
  double acc = 0.0;
  for (const Cand& c : cands) {
    acc += c.e;
    if (target < acc) return c.id;
  }
  return cands.back().id;  // u * total rounded up to total
}

// Raw log-softmax normalizer and the top n of a row (computed once per row).
struct RawLogprobs {
  double log_z = 0.0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// Before with NaN ordered after every number (by id among NaNs): a strict
// weak order even on a raw row holding NaN (prompt logprobs score rows the
// sampler's checks never saw; std::sort and the heap need a valid order).
inline bool BeforeNanLast(const Cand& a, const Cand& b) {
  const bool a_nan = std::isnan(a.s), b_nan = std::isnan(b.s);
  if (a_nan || b_nan) return a_nan == b_nan ? a.id < b.id : b_nan;
  return Before(a, b);
}

RawLogprobs ComputeRawLogprobs(std::span<const float> raw, int n) {
  RawLogprobs out;
  const float max = *std::max_element(raw.begin(), raw.end());
  double sum = 0.0;
  for (float v : raw) sum += std::exp(v - max);  // fp32 exp, fp64 sum
  out.log_z = static_cast<double>(max) + std::log(sum);
  if (n <= 0) return out;
  n = std::min<int>(n, static_cast<int>(raw.size()));
  // One pass with an n-entry heap (front = worst kept), then sort the n.
  std::vector<Cand> heap;
  heap.reserve(n);
  for (size_t i = 0; i < raw.size(); ++i) {
    const Cand c{raw[i], static_cast<int32_t>(i), 0.0f};
    if (heap.size() < static_cast<size_t>(n)) {
      heap.push_back(c);
      std::push_heap(heap.begin(), heap.end(), BeforeNanLast);
    } else if (BeforeNanLast(c, heap.front())) {
      std::pop_heap(heap.begin(), heap.end(), BeforeNanLast);
      heap.back() = c;
      std::push_heap(heap.begin(), heap.end(), BeforeNanLast);
    }
  }
  std::sort(heap.begin(), heap.end(), BeforeNanLast);
  for (const Cand& c : heap) {
    out.top_ids.push_back(c.id);
    out.top_logprobs.push_back(static_cast<float>(static_cast<double>(c.s) - out.log_z));
  }
  return out;
}

}  // namespace

PromptLogprob Sampler::ScoreToken(std::span<const float> row, int32_t token, int top_n) {
  const RawLogprobs lp = ComputeRawLogprobs(row, top_n);
  PromptLogprob out;
  out.token_id = token;
  const float x = row[static_cast<size_t>(token)];
  out.logprob = static_cast<float>(static_cast<double>(x) - lp.log_z);
  out.rank = 1 + static_cast<int32_t>(
                     std::count_if(row.begin(), row.end(), [x](float v) { return v > x; }));
  out.top_token_ids = lp.top_ids;
  out.top_logprobs = lp.top_logprobs;
  return out;
}

Sampler::Sampler(int32_t vocab_size) : vocab_size_(std::max<int32_t>(vocab_size, 1)) {}

uint64_t Sampler::StreamKey(uint64_t seed, int64_t sample_index, int64_t position) {
  uint64_t k = SplitMix64(seed);
  k = SplitMix64(k ^ static_cast<uint64_t>(sample_index));
  k = SplitMix64(k ^ static_cast<uint64_t>(position));
  return k;
}

double Sampler::SeededUniform(uint64_t seed, int64_t sample_index, int64_t position) {
  std::mt19937_64 gen(StreamKey(seed, sample_index, position));
  return static_cast<double>(gen() >> 11) * 0x1.0p-53;
}

// Steps 1 and 1b: the penalized row, then the structured-output mask (tokens
// not in row.allowed_tokens set to -inf). Returns `in` itself when neither applies.
std::span<const float> ApplyPenalties(std::span<const float> in, const SamplerRow& row,
                                      std::vector<float>& out) {
  const std::span<const float> w = ApplyPenaltiesOnly(in, row, out);
  if (row.allowed_tokens.empty()) return w;
  if (w.data() != out.data()) out.assign(in.begin(), in.end());
  const size_t words = row.allowed_tokens.size();
  for (size_t i = 0; i < out.size(); ++i) {
    const bool allowed = (i >> 6) < words && ((row.allowed_tokens[i >> 6] >> (i & 63)) & 1);
    if (!allowed) out[i] = kNegInf;
  }
  return out;
}

absl::StatusOr<ProcessedDistribution> Sampler::Process(std::span<const float> logits_row,
                                                       const SamplerRow& row) const {
  if (logits_row.size() != static_cast<size_t>(vocab_size_)) {
    return absl::InvalidArgumentError(absl::StrCat("logits row has ", logits_row.size(),
                                                   " entries, vocab_size is ", vocab_size_));
  }
  if (absl::Status s = CheckRow(row, vocab_size_, 0); !s.ok()) return s;
  if (absl::Status s = CheckLogits(logits_row, row, 0); !s.ok()) return s;
  std::vector<float> buf;
  const std::span<const float> w = ApplyPenalties(logits_row, row, buf);
  if (w.data() != logits_row.data() && AllMasked(w)) return AllMaskedError(row);
  ProcessedDistribution out;
  if (row.params->greedy()) {
    out.token_ids = {ArgMax(w)};
    out.probs = {1.0};
    return out;
  }
  std::vector<Cand> cands;
  bool sorted = false;
  Filter(w, *row.params, cands, sorted);
  if (!sorted) std::sort(cands.begin(), cands.end(), Before);
  double total = 0.0;
  for (const Cand& c : cands) total += c.e;
  for (const Cand& c : cands) {
    out.token_ids.push_back(c.id);
    out.probs.push_back(c.e / total);
  }
  return out;
}

absl::StatusOr<std::vector<SampledToken>> Sampler::Sample(std::span<const float> logits,
                                                          std::span<const SamplerRow> rows,
                                                          std::vector<RowFailure>* failures) {
  const size_t v = static_cast<size_t>(vocab_size_);
  if (logits.size() != rows.size() * v) {
    return absl::InvalidArgumentError(absl::StrCat("logits have ", logits.size(),
                                                   " entries, expected ", rows.size(),
                                                   " rows x vocab_size ", v));
  }
  // Validation and every random draw happen up front, sequentially, so that the
  // parallel part below is deterministic and touches no shared generator.
  std::vector<size_t> first_out(rows.size() + 1, 0);
  // failed[r] = 1: the row's logits cannot be sampled (reported, not drawn).
  std::vector<uint8_t> failed(rows.size(), 0);
  for (size_t r = 0; r < rows.size(); ++r) {
    if (absl::Status s = CheckRow(rows[r], vocab_size_, r); !s.ok()) {
      return s;
    }
    first_out[r + 1] = first_out[r] + static_cast<size_t>(rows[r].num_samples);
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    absl::Status s = CheckLogits(logits.subspan(r * v, v), rows[r], r);
    if (s.ok()) continue;
    if (failures == nullptr) return s;
    failed[r] = 1;
    failures->push_back({r, std::move(s)});
  }
  std::vector<double> uniforms(first_out.back(), 0.0);
  for (size_t r = 0; r < rows.size(); ++r) {
    const SamplerRow& row = rows[r];
    if (row.params->greedy() || failed[r] != 0) continue;
    for (int32_t j = 0; j < row.num_samples; ++j) {
      uniforms[first_out[r] + j] =
          row.params->seed.has_value()
              ? SeededUniform(*row.params->seed, int64_t{row.sample_index} + j, row.position)
              : absl::Uniform<double>(absl::IntervalClosedOpen, unseeded_, 0.0, 1.0);
    }
  }

  std::vector<SampledToken> out(first_out.back());
  const int64_t num_rows = static_cast<int64_t>(rows.size());
  std::vector<uint8_t> all_masked(rows.size(), 0);
#pragma omp parallel for schedule(dynamic, 1) if (num_rows > 1)
  for (int64_t r = 0; r < num_rows; ++r) {
    const SamplerRow& row = rows[r];
    if (failed[r] != 0) {
      for (int32_t j = 0; j < row.num_samples; ++j) {
        out[first_out[r] + j].seq_id = row.seq_id;
        out[first_out[r] + j].token_id = kNoToken;
      }
      continue;
    }
    const SamplingParams& p = *row.params;
    const auto raw = logits.subspan(static_cast<size_t>(r) * v, v);
    std::vector<float> buf;
    const std::span<const float> w = ApplyPenalties(raw, row, buf);
    if (w.data() != raw.data() && AllMasked(w)) {
      all_masked[r] = 1;
      continue;
    }
    std::vector<Cand> cands;
    int32_t greedy_token = -1;
    if (p.greedy()) {
      greedy_token = ArgMax(w);
    } else {
      bool sorted = false;
      Filter(w, p, cands, sorted);
    }
    RawLogprobs lp;
    if (p.logprobs >= 0) lp = ComputeRawLogprobs(raw, p.logprobs);
    for (int32_t j = 0; j < row.num_samples; ++j) {
      SampledToken& t = out[first_out[r] + j];
      t.seq_id = row.seq_id;
      t.token_id = greedy_token >= 0 ? greedy_token : Draw(cands, uniforms[first_out[r] + j]);
      if (p.logprobs >= 0) {
        t.logprob = static_cast<float>(static_cast<double>(raw[t.token_id]) - lp.log_z);
        t.top_token_ids = lp.top_ids;
        t.top_logprobs = lp.top_logprobs;
      }
    }
  }
  for (size_t r = 0; r < rows.size(); ++r) {
    if (all_masked[r] == 0) continue;
    if (failures == nullptr) return AllMaskedError(rows[r]);
    for (int32_t j = 0; j < rows[r].num_samples; ++j) {
      out[first_out[r] + j].seq_id = rows[r].seq_id;
      out[first_out[r] + j].token_id = kNoToken;
    }
    failures->push_back({r, AllMaskedError(rows[r])});
  }
  return out;
}

}  // namespace pagedserve
