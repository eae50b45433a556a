// The greedy reduction of logits rows (runtime/worker/model_backend.h:
// GreedyArgmax, SplitSampledRows, the default ModelBackend::LmHeadSample) against
// the sampler it stands in for (runtime/sampling/sampler.h): on rows with
// ties, -inf entries and large vocabularies the argmax equals the sampler's
// greedy token, and every row the sampler refuses (a NaN or +inf logit, only
// -inf logits) comes back as -1 with its logits, so that the worker hands it
// to the sampler for the error. The CUDA kernel with the same contract is
// checked against GreedyArgmax in cuda_model_emulation_test.cc.
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/sampling_params.h"
#include "runtime/sampling/sampler.h"
#include "runtime/worker/model_backend.h"

namespace pagedserve {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Rows of `vocab` logits in many shapes: random, with a tie for the maximum at
// random places, with -inf holes, one of -FLT_MAX only, and the refused kinds.
std::vector<std::vector<float>> Rows(int vocab, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-20.0f, 20.0f);
  std::uniform_int_distribution<int> at(0, vocab - 1);
  std::vector<std::vector<float>> rows;
  for (int r = 0; r < 24; ++r) {
    std::vector<float> row(vocab);
    for (float& v : row) v = u(rng);
    if (r % 3 == 1) {  // a tie for the maximum (two or three places)
      const float top = 30.0f;
      for (int k = 0; k < 2 + r % 2; ++k) row[at(rng)] = top;
    }
    if (r % 4 == 2)
      for (int k = 0; k < vocab / 3; ++k) row[at(rng)] = -kInf;
    if (r % 5 == 3)  // coarse values: many ties everywhere
      for (float& v : row) v = std::round(v / 8.0f);
    rows.push_back(row);
  }
  rows.emplace_back(vocab, -std::numeric_limits<float>::max());
  rows.emplace_back(vocab, -kInf);  // refused: only -inf
  std::vector<float> nan_row(vocab, 1.0f), inf_row(vocab, 1.0f);
  nan_row[at(rng)] = std::nanf("");
  inf_row[at(rng)] = kInf;
  rows.push_back(nan_row);  // refused
  rows.push_back(inf_row);  // refused
  return rows;
}

TEST(GreedyRowsTest, ArgmaxIsTheSamplersGreedyToken) {
  std::mt19937 rng(3);
  for (int vocab : {1, 2, 7, 300, 49152}) {
    SCOPED_TRACE(testing::Message() << "vocab " << vocab);
    Sampler sampler(vocab);
    SamplingParams greedy;
    greedy.temperature = 0.0f;
    std::vector<int32_t> history = {0};
    int accepted = 0, refused = 0;
    for (const std::vector<float>& row : Rows(vocab, rng)) {
      SamplerRow sr;
      sr.params = &greedy;
      sr.token_history = history;
      sr.prompt_len = 1;
      auto want = sampler.Sample(row, std::span<const SamplerRow>(&sr, 1));
      const int32_t got = GreedyArgmax(row.data(), vocab);
      if (want.ok()) {
        ASSERT_EQ(want->size(), 1u);
        EXPECT_EQ(got, (*want)[0].token_id);
        ++accepted;
      } else {
        EXPECT_EQ(got, -1) << "the sampler refuses this row: " << want.status();
        ++refused;
      }
    }
    EXPECT_EQ(refused, 3);  // the NaN, +inf and all -inf rows
    EXPECT_EQ(accepted, 25);
  }
}

// Negative control for the check above: "ties to the highest id" must fail it.
TEST(GreedyRowsTest, TieRuleIsObservable) {
  const std::vector<float> row = {1.0f, 5.0f, 2.0f, 5.0f};
  EXPECT_EQ(GreedyArgmax(row.data(), 4), 1);
  Sampler sampler(4);
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  std::vector<int32_t> history = {0};
  SamplerRow sr;
  sr.params = &greedy;
  sr.token_history = history;
  sr.prompt_len = 1;
  auto want = sampler.Sample(row, std::span<const SamplerRow>(&sr, 1));
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ((*want)[0].token_id, 1);
  EXPECT_NE((*want)[0].token_id, 3);
}

TEST(GreedyRowsTest, SplitKeepsTheRowsThatNeedLogits) {
  const int vocab = 5;
  // Row 0 greedy, row 1 sampled, row 2 greedy but refused (NaN), row 3 greedy.
  const std::vector<float> all = {0,     3,
                                  1,     3,
                                  2,  //
                                  9,     8,
                                  7,     6,
                                  5,  //
                                  1,     std::nanf(""),
                                  0,     0,
                                  0,  //
                                  -kInf, -kInf,
                                  -1,    -kInf,
                                  -2};
  // Row 1 is a sampled row with three draws: the host split leaves it (and
  // its three entries) to the sampler.
  const std::vector<double> uniforms = {0.1, 0.5, 0.9};
  std::vector<RowSampling> rows(4);
  for (int t : {0, 2, 3}) rows[t].mode = RowSampling::Mode::kGreedy;
  rows[1].mode = RowSampling::Mode::kSample;
  rows[1].uniforms = uniforms;
  rows[1].logprobs = 3;  // left to the sampler, which computes them
  SampledRows out;
  out.tokens = {7, 7};
  out.top_ids = {4};
  std::vector<float> logits = {42.0f};
  SplitSampledRows(all, 4, vocab, rows, &out, &logits);
  EXPECT_EQ(out.tokens, (std::vector<int32_t>{1, -1, -1, -1, -1, 2}));
  EXPECT_EQ(out.logprobs, std::vector<float>(6, 0.0f));
  EXPECT_EQ(out.top_begin, std::vector<int64_t>(5, 0));
  EXPECT_TRUE(out.top_ids.empty());
  EXPECT_TRUE(out.top_logprobs.empty());
  ASSERT_EQ(logits.size(), 2u * vocab);  // rows 1 and 2, in order
  EXPECT_EQ(logits[0], 9.0f);
  EXPECT_EQ(logits[4], 5.0f);
  EXPECT_EQ(logits[5], 1.0f);
  EXPECT_TRUE(std::isnan(logits[6]));
}

}  // namespace
}  // namespace pagedserve
