// End to end: the forward pass with an fp8 KV cache (kernels/types.h: e4m3 /
// e5m2, per-layer scales 1.0 as the worker uses them) against the same model
// with an fp32 KV cache, on the default model (SmolLM2-135M-Instruct, GGUF
// Q4_1 weights in their stored format; PAGEDSERVE_TEST_MODEL) and the prompts
// of its transformers fixture (PAGEDSERVE_TEST_REFERENCE, 10 prompts of 1 to
// 304 tokens).
//
//   1. Greedy: 32 tokens per prompt with the fp32 cache (one prefill step,
//      then batched decode steps), and the same with each 16/8-bit cache;
//      reported: prompts whose 32 tokens are identical; checked: the mean
//      length of the identical prefix.
//   2. Teacher-forced top-1 agreement: every prompt followed by the fp32
//      cache's greedy continuation, run as one prefill with logits for the 32
//      predicting rows of each prompt (320 rows), with each cache dtype; the
//      fraction of rows whose argmax equals the fp32 cache's is checked
//      against a measured bound (below), as is the largest |logit diff|.
//      Also bounded: the RMS logit difference relative to the fp32 logits'
//      spread (mean per-row std), and free-running greedy's mean identical
//      prefix.
//   3. Negative controls: an e4m3 cache with k_scale = 1e4 (keys flushed to
//      zero: attention degenerates to a uniform average), and e4m3 caches
//      read with the wrong per-layer k_scale (written at 1, read at 2 and at
//      1.25) must fail the top-1 and the RMS bounds.
//
// Measured (RelWithDebInfo, x86-64 AVX2; printed by the test): see
// kBounds below and docs/serving.md "fp8 KV cache".
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/linear.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"
#include "tests/worker/batch_vectors.h"
#include "tests/worker/paged_run.h"
#include "tests/worker/reference_fixture.h"

namespace pagedserve {
namespace {

constexpr int kGenerate = 32;

struct Model {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<LlamaModel> model;
};

Model Load(const std::string& path) {
  Model m;
  auto weights = LoadLlamaWeights(path, 0, 1, WeightDType::kAuto);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return m;
  m.comm = MakeSingleRankCommunicator();
  auto model = LlamaModel::Create(std::move(*weights), m.comm.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (model.ok()) m.model = std::move(*model);
  return m;
}

using testing::Argmax;
using testing::Pool;
using testing::Step;

// Greedy continuation of every prompt (kGenerate tokens).
std::vector<std::vector<int32_t>> Greedy(Model& m, const std::vector<testing::ReferencePrompt>& ps,
                                         kernels::DType dt) {
  std::vector<std::vector<int32_t>> prompts(ps.size());
  for (size_t s = 0; s < ps.size(); ++s) prompts[s] = ps[s].prompt_ids;
  return testing::Greedy(*m.model, prompts, kGenerate, dt);
}

// Logits of the kGenerate rows predicting each continuation token, with the
// continuation given (one prefill per prompt, all prompts in one batch).
// kv_absmax (fp32 cache only): the largest |K| and |V| written, any layer.
// read_k_scale > 0 (a broken cache, the negative control): the prompt's keys
// but its last are written in a first step at k_scale, and the rows are
// computed in a second step that reads the cache with k_scale = read_k_scale,
// as a worker would with the wrong per-layer scale.
std::vector<float> TeacherForced(Model& m, const std::vector<testing::ReferencePrompt>& ps,
                                 const std::vector<std::vector<int32_t>>& cont, kernels::DType dt,
                                 float k_scale = 1.0f, float* kv_absmax = nullptr,
                                 float read_k_scale = 0.0f) {
  int max_len = 0;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<int>> rows;
  for (size_t s = 0; s < ps.size(); ++s) {
    std::vector<int32_t> t = ps[s].prompt_ids;
    t.insert(t.end(), cont[s].begin(),
             cont[s].end() - 1);  // the last token predicts nothing we check
    std::vector<int> r;
    r.reserve(kGenerate);
    for (int i = 0; i < kGenerate; ++i)
      r.push_back(static_cast<int>(ps[s].prompt_ids.size()) - 1 + i);
    max_len = std::max<int>(max_len, t.size());
    tokens.push_back(std::move(t));
    rows.push_back(std::move(r));
  }
  Pool pool(m.model->config(), dt, static_cast<int>(ps.size()), max_len, k_scale);
  std::vector<int> start(ps.size(), 0);
  if (read_k_scale > 0.0f) {
    std::vector<std::vector<int32_t>> head(ps.size());
    std::vector<std::vector<int>> head_rows(ps.size());
    for (size_t s = 0; s < ps.size(); ++s) {
      const int n = static_cast<int>(ps[s].prompt_ids.size()) - 1;
      head[s].assign(tokens[s].begin(), tokens[s].begin() + n);
      if (n > 0) head_rows[s] = {n - 1};
      tokens[s].erase(tokens[s].begin(), tokens[s].begin() + n);
      for (int& r : rows[s]) r -= n;
      start[s] = n;
    }
    (void)Step(*m.model, pool, head, std::vector<int>(ps.size(), 0), head_rows);
    for (kernels::KVCacheView& v : pool.views) v.k_scale = read_k_scale;
  }
  std::vector<float> logits = Step(*m.model, pool, tokens, start, rows);
  if (kv_absmax != nullptr && dt == kernels::DType::kFloat32) {
    for (size_t i = 0; i < pool.storage.size(); ++i) {
      const float* f = reinterpret_cast<const float*>(pool.storage[i].data());
      for (size_t j = 0; j < pool.storage[i].size() / 4; ++j)
        kv_absmax[i % 2] = std::max(kv_absmax[i % 2], std::abs(f[j]));
    }
  }
  return logits;
}

struct Agreement {
  double top1 = 0;      // fraction of rows with the same argmax
  double max_diff = 0;  // max |logit - fp32-cache logit|
  double rms_diff = 0;  // RMS of logit - fp32-cache logit over all rows
};

Agreement Compare(const std::vector<float>& got, const std::vector<float>& ref, int vocab) {
  Agreement a;
  const size_t rows = ref.size() / vocab;
  if (got.size() != ref.size() || rows == 0) return a;
  int same = 0;
  double sq = 0;
  for (size_t r = 0; r < rows; ++r) {
    same += Argmax(got.data() + r * vocab, vocab) == Argmax(ref.data() + r * vocab, vocab);
    for (int i = 0; i < vocab; ++i) {
      const double d = std::abs(static_cast<double>(got[r * vocab + i]) - ref[r * vocab + i]);
      a.max_diff = std::max(a.max_diff, d);
      sq += d * d;
    }
  }
  a.top1 = static_cast<double>(same) / rows;
  a.rms_diff = std::sqrt(sq / static_cast<double>(ref.size()));
  return a;
}

// The spread the differences are judged against: the standard deviation of
// the fp32 cache's logits within a row (over the vocabulary), averaged over
// the rows.
double MeanRowStd(const std::vector<float>& ref, int vocab) {
  const size_t rows = ref.size() / vocab;
  double total = 0;
  for (size_t r = 0; r < rows; ++r) {
    double sum = 0, sq = 0;
    for (int i = 0; i < vocab; ++i) {
      sum += ref[r * vocab + i];
      sq += static_cast<double>(ref[r * vocab + i]) * ref[r * vocab + i];
    }
    const double mean = sum / vocab;
    total += std::sqrt(std::max(0.0, sq / vocab - mean * mean));
  }
  return rows == 0 ? 0 : total / static_cast<double>(rows);
}

// Bounds per cache dtype against the fp32 cache, from the figures the test
// prints (RelWithDebInfo, x86-64, 10 prompts, 320 teacher-forced rows; also
// in docs/serving.md "fp8 KV cache"), measured on Linear's avx512 path (the
// default on an AVX-512 host) and its avx2 path (PAGEDSERVE_CPU_ISA=avx2: an
// AVX2-only host), each deterministic. The spread the logit differences are
// judged against: the fp32 cache's logits have a mean per-row std of 3.59
// (avx512) / 3.57 (avx2).
//
//   avx512 / avx2  top-1          RMS diff / std  max |diff|   greedy mean prefix
//   f16            0.950 / 0.966  0.069 / 0.070   1.60 / 2.89  6.9 / 12.6 tokens
//   fp8_e4m3       0.922 / 0.931  0.126 / 0.140   4.77 / 6.33  10.9 / 9.1 tokens
//   fp8_e5m2       0.869 / 0.888  0.300 / 0.297   18.4 / 18.6  5.3 / 8.0 tokens
//   controls against the e4m3 bounds:
//   k_scale 1e4            0.044 / 0.050  3.27 / 3.16  46.6 / 42.8
//   written 1, read 2      0.509 / 0.522  1.46 / 1.38  37.4 / 35.5
//   written 1, read 1.25   0.825 / 0.809  0.49 / 0.48  21.1 / 21.5
//
// Identical 32-token greedy answers: 0-1 of 10 prompts for every cache.
// This small model's greedy continuations are often near-ties (the
// transformers fixture: 17% of greedy steps have a top-1 margin < 0.25), so
// even the fp16 cache flips 3-5% of the rows, and one flipped greedy token
// changes the rest of a continuation: identical answers do not hold for any
// 16- or 8-bit cache (asserted instead: the mean identical prefix, and the
// teacher-forced top-1 rate, which does not compound). Margins, from the
// worse of the two paths: top-1 6-7 rows below; RMS diff / std 1.5x (the
// spread bound: it moved by at most 11% between the paths); max |diff| 1.5x
// (the single worst logit of 320 x 49,152, an outlier guard: it moved by
// 80% between the paths); mean identical prefix 0.5x (a chaotic figure: one
// near-tie moves it).
struct Bound {
  kernels::DType dt;
  double min_top1;
  double max_rms_rel;  // RMS logit diff / mean row std
  double max_diff;
  double min_prefix;  // greedy: mean identical prefix, tokens of kGenerate
};
constexpr Bound kBounds[] = {
    {kernels::DType::kFloat16, 0.93, 0.105, 4.3, 3.4},
    {kernels::DType::kFloat8E4M3, 0.90, 0.21, 9.5, 4.5},
    {kernels::DType::kFloat8E5M2, 0.85, 0.45, 28.0, 2.6},
};

// Which bounds an agreement breaks (empty: none).
std::string Broken(const Bound& b, const Agreement& a, double std) {
  std::string why;
  if (a.top1 < b.min_top1) why += " top-1";
  if (a.rms_diff / std > b.max_rms_rel) why += " RMS";
  if (a.max_diff > b.max_diff) why += " max";
  return why;
}

double MeanIdenticalPrefix(const std::vector<std::vector<int32_t>>& got,
                           const std::vector<std::vector<int32_t>>& ref, int* identical) {
  double prefix = 0;
  *identical = 0;
  for (size_t s = 0; s < ref.size(); ++s) {
    *identical += got[s] == ref[s];
    size_t k = 0;
    while (k < got[s].size() && k < ref[s].size() && got[s][k] == ref[s][k]) ++k;
    prefix += static_cast<double>(k) / static_cast<double>(ref.size());
  }
  return prefix;
}

TEST(Fp8KvForwardTest, GreedyTop1AgreesWithFloat32Cache) {
  const char* model_path = std::getenv("PAGEDSERVE_TEST_MODEL");
  const char* ref_path = std::getenv("PAGEDSERVE_TEST_REFERENCE");
  ASSERT_NE(model_path, nullptr);
  ASSERT_NE(ref_path, nullptr);
  const std::vector<testing::ReferencePrompt> prompts = testing::LoadReference(ref_path);
  ASSERT_FALSE(prompts.empty());
  // Every step on the integer kernels: on a CPU with AMX, steps of 32+ tokens
  // (the teacher-forced prefills here) would run on the tiles in bf16 while
  // the greedy decode steps run in 8-bit blocks, and the self-agreement below
  // would measure the two kernels' near-ties (309 / 320 measured), not the
  // cache (the tiles' accuracy: worker_interleaved_rows_test).
  const bool amx = kernels::LinearUsesAmx();
  ASSERT_TRUE(kernels::SetLinearAmx(false).ok());
  struct RestoreAmx {
    bool on;
    ~RestoreAmx() { (void)kernels::SetLinearAmx(on); }
  } restore{amx};
  Model m = Load(model_path);
  ASSERT_NE(m.model, nullptr);
  const int vocab = m.model->config().vocab_size;

  const auto greedy32 = Greedy(m, prompts, kernels::DType::kFloat32);
  for (const auto& g : greedy32) ASSERT_EQ(g.size(), static_cast<size_t>(kGenerate));
  float kv_absmax[2] = {0, 0};
  const std::vector<float> ref =
      TeacherForced(m, prompts, greedy32, kernels::DType::kFloat32, 1.0f, kv_absmax);
  std::printf(
      "fp32 cache: max |K| %.4g, max |V| %.4g over all layers (e4m3 saturates at 448 "
      "with scale 1)\n",
      kv_absmax[0], kv_absmax[1]);
  ASSERT_EQ(ref.size(), prompts.size() * kGenerate * vocab);
  const double std = MeanRowStd(ref, vocab);
  std::printf("fp32 cache: logits' mean per-row std %.3f\n", std);
  ASSERT_GT(std, 0.0);
  // The fp32 cache's teacher-forced argmax reproduces its own greedy tokens
  // (the same cache, prefill instead of decode steps: 318 / 320 measured on
  // the avx512 path, 316 / 320 on avx2, the others near-ties; bound: twice
  // the worse disagreement).
  int self = 0;
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int i = 0; i < kGenerate; ++i)
      self += Argmax(ref.data() + (s * kGenerate + i) * vocab, vocab) == greedy32[s][i];
  std::printf("fp32 cache: teacher-forced argmax equals its greedy token in %d / %zu rows\n", self,
              prompts.size() * kGenerate);
  EXPECT_GE(self, static_cast<int>(prompts.size() * kGenerate) - 8);

  for (const Bound& b : kBounds) {
    SCOPED_TRACE(kernels::DTypeName(b.dt));
    const Agreement a = Compare(TeacherForced(m, prompts, greedy32, b.dt), ref, vocab);
    int identical = 0;
    const double prefix = MeanIdenticalPrefix(Greedy(m, prompts, b.dt), greedy32, &identical);
    std::printf(
        "%s cache: greedy %d / %zu prompts identical for %d tokens, mean identical "
        "prefix %.1f tokens\n",
        kernels::DTypeName(b.dt), identical, prompts.size(), kGenerate, prefix);
    std::printf(
        "%s cache: teacher-forced top-1 agreement %.4f (%zu rows), max |logit diff| %.3g "
        "(%.2f std), RMS logit diff %.3g (%.3f std)\n",
        kernels::DTypeName(b.dt), a.top1, prompts.size() * kGenerate, a.max_diff, a.max_diff / std,
        a.rms_diff, a.rms_diff / std);
    EXPECT_GE(a.top1, b.min_top1);
    EXPECT_LE(a.rms_diff / std, b.max_rms_rel);
    EXPECT_LE(a.max_diff, b.max_diff);
    EXPECT_GE(prefix, b.min_prefix);
  }

  // Negative controls, each against the e4m3 bounds: (1) keys flushed to zero
  // by k_scale = 1e4 (attention degenerates to a uniform average); (2) the
  // wrong per-layer scale: keys written at k_scale 1 and read at 2 (every
  // attention score doubled); (3) read at 1.25.
  const Bound& e4m3 = kBounds[1];
  struct Control {
    const char* name;
    float k_scale, read_k_scale;
  };
  for (const Control& c :
       {Control{"k_scale 1e4", 1e4f, 0.0f}, Control{"written at 1, read at 2", 1.0f, 2.0f},
        Control{"written at 1, read at 1.25", 1.0f, 1.25f}}) {
    const Agreement a = Compare(TeacherForced(m, prompts, greedy32, kernels::DType::kFloat8E4M3,
                                              c.k_scale, nullptr, c.read_k_scale),
                                ref, vocab);
    const std::string why = Broken(e4m3, a, std);
    std::printf(
        "control (e4m3, %s): top-1 agreement %.4f, max |logit diff| %.3g, RMS %.3g (%.3f "
        "std); fails:%s\n",
        c.name, a.top1, a.max_diff, a.rms_diff, a.rms_diff / std,
        why.empty() ? " nothing" : why.c_str());
    EXPECT_LT(a.top1, e4m3.min_top1) << "a broken cache (" << c.name << ") passes the top-1 bound";
    EXPECT_GT(a.rms_diff / std, e4m3.max_rms_rel)
        << "a broken cache (" << c.name << ") passes the RMS bound";
  }
}

}  // namespace
}  // namespace pagedserve
