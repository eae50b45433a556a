// The CUDA backend's sampling kernel (runtime/worker/cuda/sampling_kernels.cuh:
// repetition / frequency / presence penalties over the row's history (as
// listed by sample_penalties.h), greedy, temperature, top-k, top-p, min-p
// and the inverse-CDF draw on the device) run
// on the CPU through tests/kernels/simt_emulator.h against the host sampler it
// stands in for (runtime/sampling/sampler.h), on rows with ties everywhere,
// -inf holes, probabilities that underflow to 0, a vocabulary of one, and the
// rows the sampler refuses:
//   - seeded draws: for the sampler's own uniforms (Sampler::SeededUniform of
//     the row's seed, sample index and position) the kernel draws exactly the
//     tokens Sampler::Sample returns;
//   - the whole distribution: for a grid of uniforms over [0, 1) the kernel's
//     token is the inverse CDF of Sampler::Process's distribution (its
//     survivors with their probabilities, walked in the sampler's order:
//     probability descending after top-k or top-p, token-id order
//     otherwise), except within 1e-9 of a
//     boundary of the cumulative sum, where the two sums' rounding may differ;
//   - refused rows (a NaN or +inf logit, only -inf ones) give -1;
//   - logprobs: for rows asking 0, 1, 5 or 20 (and a vocabulary smaller than
//     that), the drawn tokens' logprobs and the top-N lists equal
//     Sampler::Sample's (ids exactly, values to one float ulp: the log-sum
//     is summed in another order; the emulator uses the host's expf, a
//     device's may differ by 2 ulp, see sampling_kernels.cuh), penalized
//     tokens included (their raw logit, not the penalized one).
// Negative controls: the same checks fail for a kernel given a temperature
// 2% off, top_k off by one, a repetition penalty 10% off, or one logit
// 0.01 higher than the sampler's row (logprobs).
#include "tests/kernels/simt_emulator.h"  // must precede the kernel header

// The kernel bodies use threadIdx, __syncthreads, ... unqualified; in this
// host build they come from the emulator's namespace.
namespace pagedserve::cuda_model {
using namespace ::pagedserve::kernels::cuda;  // NOLINT
}  // namespace pagedserve::cuda_model

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/sampling_params.h"
#include "runtime/sampling/sampler.h"
#include "runtime/worker/cuda/model_kernels.h"
#include "runtime/worker/cuda/sample_penalties.h"
#include "runtime/worker/cuda/sampling_kernels.cuh"
#include "runtime/worker/model_backend.h"

namespace pagedserve::cuda_model {
namespace {

namespace kc = ::pagedserve::kernels::cuda;
constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows of `vocab` logits: random, with ties for the maximum, coarse values
// (ties everywhere), -inf holes, a wide range (probabilities that underflow
// at low temperature), and the three kinds the sampler refuses.
std::vector<std::vector<float>> Rows(int vocab, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  std::uniform_int_distribution<int> at(0, vocab - 1);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 8; ++r) {
    std::vector<float> row(vocab);
    for (float& v : row) v = u(rng);
    if (r % 4 == 1)
      for (int k = 0; k < 3; ++k) row[at(rng)] = 9.0f;  // a tied maximum
    if (r % 4 == 2)
      for (float& v : row) v = std::round(v);  // ties everywhere
    if (r % 4 == 3)
      for (int k = 0; k < vocab / 3; ++k) row[at(rng)] = -kInf;
    if (r == 4)
      for (float& v : row) v *= 30.0f;  // exp underflows for most tokens
    if (r == 5) {  // a maximum of zero, as -0 and +0 (equal: the lower id first)
      for (float& v : row) v = -std::abs(v) - 0.5f;
      row[at(rng)] = -0.0f;
      row[at(rng)] = 0.0f;
      row[at(rng)] = -0.0f;
    }
    rows.push_back(row);
  }
  rows.emplace_back(vocab, -kInf);  // refused: only -inf
  std::vector<float> nan_row(vocab, 1.0f), inf_row(vocab, 1.0f);
  nan_row[at(rng)] = std::nanf("");
  inf_row[at(rng)] = kInf;
  rows.push_back(nan_row);
  rows.push_back(inf_row);
  return rows;
}

struct Filters {
  float temperature;
  int top_k;
  float top_p;
  float min_p;
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
};

// The sampler's params for a filter setting (no seed, no logprobs).
SamplingParams ParamsFor(const Filters& f) {
  SamplingParams p;
  p.temperature = f.temperature;
  p.top_k = f.top_k;
  p.top_p = f.top_p;
  p.min_p = f.min_p;
  p.repetition_penalty = f.repetition_penalty;
  p.frequency_penalty = f.frequency_penalty;
  p.presence_penalty = f.presence_penalty;
  return p;
}

// The kernel's args for params `p` over `history`, by the CUDA backend's
// rules (BuildSampleRowArgs, sample_penalties.h).
SampleRowArgs ArgsFor(const SamplingParams& p, std::span<const int32_t> history, int prompt_len,
                      int64_t vocab, std::span<const double> uniforms, int first,
                      std::vector<SamplePenalty>* penalties, int first_top = 0) {
  RowSampling r;
  r.mode = RowSampling::Mode::kSample;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.presence_penalty = p.presence_penalty;
  r.token_history = history;
  r.prompt_len = prompt_len;
  r.uniforms = uniforms;
  r.logprobs = p.logprobs;
  SampleRowArgs a;
  EXPECT_TRUE(BuildSampleRowArgs(r, vocab, first, first_top, &a, penalties));
  return a;
}

// What the kernel writes: per draw the token and its logprob, and the top
// lists (by each row's top_begin).
struct KernelOut {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logprobs;
};

// Runs the kernel body over `rows` (each with its args) through the emulator.
template <int NUM_THREADS>
KernelOut RunKernel(const std::vector<std::vector<float>>& rows,
                    const std::vector<SampleRowArgs>& args, const std::vector<double>& uniforms,
                    const std::vector<SamplePenalty>& penalties, size_t num_top = 0) {
  const int64_t vocab = static_cast<int64_t>(rows[0].size());
  std::vector<float> logits;
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  KernelOut out;
  out.tokens.assign(uniforms.size(), -7);
  out.logprobs.assign(uniforms.size(), 7.0f);
  out.top_ids.assign(num_top, -7);
  out.top_logprobs.assign(num_top, 7.0f);
  std::vector<float> penalty_raw(penalties.size(), 7.0f);
  SampleBuffers b;
  b.args = args.data();
  b.uniforms = uniforms.data();
  b.penalties = penalties.data();
  b.penalty_raw = penalty_raw.data();
  b.tokens = out.tokens.data();
  b.logprobs = out.logprobs.data();
  b.top_ids = out.top_ids.data();
  b.top_logprobs = out.top_logprobs.data();
  kc::EmuLaunch(dim3(static_cast<unsigned>(rows.size())), dim3(NUM_THREADS), 0,
                [&] { SampleRowsBody<NUM_THREADS>(logits.data(), vocab, b); });
  return out;
}

// One vocabulary and filter setting: the seeded draws and the distribution
// grid of every row. Returns the number of disagreements (0 expected);
// `perturb` applies to the kernel's args only (negative controls).
template <int NUM_THREADS>
int Disagreements(int vocab, const Filters& f, std::mt19937& rng,
                  void (*perturb)(SampleRowArgs*) = nullptr) {
  const std::vector<std::vector<float>> rows = Rows(vocab, rng);
  Sampler sampler(vocab);
  SamplingParams p = ParamsFor(f);
  // A history with repeats: 12 prompt tokens, then 18 output tokens.
  std::uniform_int_distribution<int> any(0, vocab - 1);
  std::vector<int32_t> history(30);
  for (int32_t& t : history) t = any(rng) % std::max(1, vocab / 2);
  const int prompt_len = 12;
  std::vector<SamplePenalty> penalties;
  constexpr int kSeeded = 6, kGrid = 40;
  std::vector<SampleRowArgs> args;
  std::vector<double> uniforms;
  std::vector<std::vector<int32_t>> want;          // per row: seeded tokens, then grid tokens
  std::vector<std::vector<double>> near_boundary;  // per row: whether a grid u is within 1e-9
  for (size_t r = 0; r < rows.size(); ++r) {
    p.seed = 1000 + r;
    SamplerRow sr;
    sr.params = &p;
    sr.token_history = history;
    sr.prompt_len = prompt_len;
    sr.position = 40 + static_cast<int64_t>(r);
    sr.sample_index = 3;
    sr.num_samples = kSeeded;
    std::vector<double> row_uniforms;
    row_uniforms.reserve(kSeeded + kGrid);
    for (int j = 0; j < kSeeded; ++j)
      row_uniforms.push_back(Sampler::SeededUniform(*p.seed, sr.sample_index + j, sr.position));
    for (int j = 0; j < kGrid; ++j) row_uniforms.push_back((j + 0.37) / kGrid);
    args.push_back(ArgsFor(p, history, prompt_len, vocab, row_uniforms,
                           static_cast<int>(uniforms.size()), &penalties));
    if (perturb != nullptr) perturb(&args.back());
    uniforms.insert(uniforms.end(), row_uniforms.begin(), row_uniforms.end());
    std::vector<int32_t> w;
    std::vector<double> near(kSeeded + kGrid, 0.0);
    auto sampled = sampler.Sample(rows[r], std::span<const SamplerRow>(&sr, 1));
    auto dist = sampler.Process(rows[r], sr);
    EXPECT_EQ(sampled.ok(), dist.ok());
    if (!sampled.ok()) {  // refused: -1 for every draw
      want.emplace_back(kSeeded + kGrid, -1);
      near_boundary.push_back(near);
      continue;
    }
    for (const SampledToken& t : *sampled) w.push_back(t.token_id);
    // The sampler draws in its survivors' order: Process's (probability
    // descending) after top-k or top-p, token-id order otherwise.
    if (!(f.top_k > 0 && f.top_k < vocab) && !(f.top_p < 1.0f)) {
      std::vector<size_t> order(dist->token_ids.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      std::sort(order.begin(), order.end(),
                [&](size_t a, size_t b) { return dist->token_ids[a] < dist->token_ids[b]; });
      ProcessedDistribution by_id;
      for (size_t i : order) {
        by_id.token_ids.push_back(dist->token_ids[i]);
        by_id.probs.push_back(dist->probs[i]);
      }
      *dist = by_id;
    }
    for (int j = 0; j < kGrid; ++j) {
      const double u = uniforms[args.back().first_draw + kSeeded + j];
      double acc = 0.0;
      int32_t token = dist->token_ids.back();
      for (size_t i = 0; i < dist->token_ids.size(); ++i) {
        const double next = acc + dist->probs[i];
        if (std::abs(u - next) < 1e-9) near[kSeeded + j] = 1.0;
        if (u < next) {
          token = dist->token_ids[i];
          break;
        }
        acc = next;
      }
      w.push_back(token);
    }
    want.push_back(w);
    near_boundary.push_back(near);
  }
  const std::vector<int32_t> got = RunKernel<NUM_THREADS>(rows, args, uniforms, penalties).tokens;
  int bad = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (int j = 0; j < kSeeded + kGrid; ++j) {
      const int32_t g = got[args[r].first_draw + j];
      if (g == want[r][j] || near_boundary[r][j] != 0.0) continue;
      if (perturb == nullptr) {
        ADD_FAILURE() << "row " << r << " draw " << j << " (u " << uniforms[args[r].first_draw + j]
                      << "): kernel " << g << ", sampler " << want[r][j];
      }
      ++bad;
    }
  }
  return bad;
}

const Filters kFilterCases[] = {
    {1.0f, -1, 1.0f, 0.0f},                     // plain softmax
    {0.7f, 40, 1.0f, 0.0f},                     // top-k
    {1.3f, -1, 0.9f, 0.0f},                     // top-p
    {1.0f, 5, 0.5f, 0.0f},                      // top-k then top-p
    {0.8f, -1, 1.0f, 0.05f},                    // min-p
    {1.0f, 1, 1.0f, 0.0f},                      // top-k 1 (the argmax)
    {1.0f, -1, 1e-6f, 0.0f},                    // a nucleus of one token
    {0.05f, 100, 0.95f, 0.2f},                  // everything, low temperature (underflow)
    {0.9f, 50, 0.9f, 0.0f, 1.3f, 0.4f, 0.3f},   // penalties (all three) and filters
    {1.0f, -1, 1.0f, 0.0f, 0.7f, -0.5f, 0.0f},  // penalties that raise logits
    {0.0f, -1, 1.0f, 0.0f, 1.5f, 0.2f, 0.1f},   // greedy with penalties
};

// Equal, or one float ulp apart (infinities must be equal).
bool WithinUlp(float a, float b) { return a == b || std::nextafter(a, b) == b; }

// Rows of `vocab` logits asking for `logprobs` (0: drawn tokens' only, N:
// also the top N), `draws` seeded draws each, through the kernel and
// Sampler::Sample: returns the number of disagreeing values (tokens, drawn
// logprobs, top ids and top logprobs; 0 expected). `shift` (negative
// control) raises the kernel's copy of one logit of every row by 0.01.
template <int NUM_THREADS>
int LogprobDisagreements(int vocab, const Filters& f, int logprobs, std::mt19937& rng,
                         bool shift = false) {
  const std::vector<std::vector<float>> rows = Rows(vocab, rng);
  Sampler sampler(vocab);
  SamplingParams p = ParamsFor(f);
  p.logprobs = logprobs;
  // A history whose tokens are likely draws: the penalized ids' logprobs
  // must come from their raw logits.
  std::uniform_int_distribution<int> any(0, vocab - 1);
  std::vector<int32_t> history(24);
  for (int32_t& t : history) t = any(rng);
  constexpr int kDraws = 5;
  std::vector<SamplePenalty> penalties;
  std::vector<SampleRowArgs> args;
  std::vector<double> uniforms;
  std::vector<std::vector<SampledToken>> want;
  int num_top = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    p.seed = 77 + r;
    SamplerRow sr;
    sr.params = &p;
    sr.token_history = history;
    sr.prompt_len = 8;
    sr.position = 9 + static_cast<int64_t>(r);
    sr.num_samples = kDraws;
    std::vector<double> row_uniforms(kDraws);
    for (int j = 0; j < kDraws; ++j)
      row_uniforms[j] = Sampler::SeededUniform(*p.seed, j, sr.position);
    args.push_back(ArgsFor(p, history, sr.prompt_len, vocab, row_uniforms,
                           static_cast<int>(uniforms.size()), &penalties, num_top));
    uniforms.insert(uniforms.end(), row_uniforms.begin(), row_uniforms.end());
    num_top += std::min(std::max(logprobs, 0), vocab);
    auto sampled = sampler.Sample(rows[r], std::span<const SamplerRow>(&sr, 1));
    want.push_back(sampled.ok() ? *sampled : std::vector<SampledToken>{});
  }
  std::vector<std::vector<float>> kernel_rows = rows;
  if (shift)
    for (auto& row : kernel_rows) row[static_cast<size_t>(vocab) / 2] += 0.01f;
  const KernelOut got =
      RunKernel<NUM_THREADS>(kernel_rows, args, uniforms, penalties, static_cast<size_t>(num_top));
  int bad = 0;
  auto check = [&](bool ok, size_t r, const char* what, double g, double w) {
    if (ok) return;
    if (!shift)
      ADD_FAILURE() << "row " << r << " " << what << ": kernel " << g << ", sampler " << w;
    ++bad;
  };
  for (size_t r = 0; r < rows.size(); ++r) {
    const SampleRowArgs& a = args[r];
    if (want[r].empty()) {  // refused
      for (int j = 0; j < kDraws; ++j)
        check(got.tokens[a.first_draw + j] == -1, r, "refused token", got.tokens[a.first_draw + j],
              -1);
      continue;
    }
    for (int j = 0; j < kDraws; ++j) {
      const SampledToken& w = want[r][j];
      check(got.tokens[a.first_draw + j] == w.token_id, r, "token", got.tokens[a.first_draw + j],
            w.token_id);
      check(WithinUlp(got.logprobs[a.first_draw + j], w.logprob), r, "logprob",
            got.logprobs[a.first_draw + j], w.logprob);
    }
    const std::vector<int32_t>& top = want[r][0].top_token_ids;
    for (size_t k = 0; k < top.size(); ++k) {
      check(got.top_ids[a.top_begin + k] == top[k], r, "top id", got.top_ids[a.top_begin + k],
            top[k]);
      check(WithinUlp(got.top_logprobs[a.top_begin + k], want[r][0].top_logprobs[k]), r,
            "top logprob", got.top_logprobs[a.top_begin + k], want[r][0].top_logprobs[k]);
    }
  }
  return bad;
}

TEST(CudaSamplingEmulationTest, DrawsTheSamplersTokens) {
  std::mt19937 rng(21);
  for (int vocab : {1, 2, 7, 300, 2500}) {
    for (const Filters& f : kFilterCases) {
      SCOPED_TRACE(testing::Message() << "vocab " << vocab << " T " << f.temperature << " top_k "
                                      << f.top_k << " top_p " << f.top_p << " min_p " << f.min_p
                                      << " penalties " << f.repetition_penalty << "/"
                                      << f.frequency_penalty << "/" << f.presence_penalty);
      EXPECT_EQ(Disagreements<64>(vocab, f, rng), 0);
    }
  }
}

TEST(CudaSamplingEmulationTest, LargeVocabularyAndLaunchWidth) {
  std::mt19937 rng(5);
  EXPECT_EQ(Disagreements<512>(49157, {0.9f, 50, 0.9f, 0.0f}, rng), 0);
  EXPECT_EQ(Disagreements<512>(49157, {1.0f, -1, 0.95f, 0.01f}, rng), 0);
}

TEST(CudaSamplingEmulationTest, LogprobsAreTheSamplers) {
  std::mt19937 rng(33);
  for (int vocab : {1, 7, 300, 2500}) {
    for (int logprobs : {0, 1, 5, 20}) {
      for (const Filters& f : kFilterCases) {
        SCOPED_TRACE(testing::Message() << "vocab " << vocab << " logprobs " << logprobs << " T "
                                        << f.temperature << " top_k " << f.top_k << " top_p "
                                        << f.top_p << " penalties " << f.repetition_penalty << "/"
                                        << f.frequency_penalty << "/" << f.presence_penalty);
        EXPECT_EQ(LogprobDisagreements<64>(vocab, f, logprobs, rng), 0);
      }
    }
  }
  EXPECT_EQ(LogprobDisagreements<512>(49157, {0.9f, 50, 0.9f, 0.0f, 1.2f, 0.1f, 0.0f}, 20, rng), 0);
}

TEST(CudaSamplingEmulationTest, NegativeControlsFail) {
  std::mt19937 rng(8);
  const int off_t = Disagreements<64>(2500, {1.0f, -1, 1.0f, 0.0f}, rng,
                                      [](SampleRowArgs* a) { a->inv_temperature *= 1.02f; });
  EXPECT_GT(off_t, 0) << "a temperature 2% off passed the check";
  const int off_k =
      Disagreements<64>(300, {1.0f, 3, 1.0f, 0.0f}, rng, [](SampleRowArgs* a) { a->top_k += 1; });
  EXPECT_GT(off_k, 0) << "top_k off by one passed the check";
  const int off_rep = Disagreements<64>(20, {1.0f, -1, 1.0f, 0.0f, 1.6f, 0.0f, 0.0f}, rng,
                                        [](SampleRowArgs* a) { a->repetition_penalty *= 1.1f; });
  EXPECT_GT(off_rep, 0) << "a repetition penalty 10% off passed the check";
  const int shifted = LogprobDisagreements<64>(300, {1.0f, -1, 1.0f, 0.0f}, 5, rng, true);
  EXPECT_GT(shifted, 0) << "a logit 0.01 off passed the logprobs check";
}

}  // namespace
}  // namespace pagedserve::cuda_model
