// End to end: the forward pass with an fp8 KV cache (kernels/types.h: e4m3 /
// e5m2, per-layer scales 1.0 as the worker uses them) against the same model
// with an fp32 KV cache, on the default model (SmolLM2-135M-Instruct, GGUF
// Q4_1 weights in their stored format; PAGEDSERVE_TEST_MODEL) and the prompts
// of its transformers fixture (PAGEDSERVE_TEST_REFERENCE, 10 prompts of 1 to
// 304 tokens).
//
//   1. Greedy: 32 tokens per prompt with the fp32 cache (one prefill step,
//      then batched decode steps), and the same with each fp8 cache;
//      reported: prompts whose 32 tokens are identical, mean length of the
//      identical prefix.
//   2. Teacher-forced top-1 agreement: every prompt followed by the fp32
//      cache's greedy continuation, run as one prefill with logits for the 32
//      predicting rows of each prompt (320 rows), with each cache dtype; the
//      fraction of rows whose argmax equals the fp32 cache's is checked
//      against a measured bound (below), as is the largest |logit diff|.
//   3. Negative control: an e4m3 cache with k_scale = 1e4 (keys flushed to
//      zero: attention degenerates to a uniform average) must fail the bound.
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
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"
#include "tests/worker/batch_vectors.h"
#include "tests/worker/reference_fixture.h"

namespace pagedserve {
namespace {

constexpr int kBlockSize = 16;
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

// One paged pool (all layers) big enough for every sequence: sequence s owns
// blocks [s * per_seq, (s + 1) * per_seq).
struct Pool {
  kernels::KVCacheShape shape;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<kernels::KVCacheView> views;
  int per_seq = 0;
  Pool(const ModelConfig& c, kernels::DType dt, int num_seqs, int max_len, float k_scale) {
    per_seq = (max_len + kBlockSize - 1) / kBlockSize;
    shape = {static_cast<int64_t>(num_seqs) * per_seq, c.num_kv_heads, c.head_size, kBlockSize, dt};
    for (int l = 0; l < c.num_layers; ++l) {
      storage.emplace_back(shape.block_bytes() * shape.num_blocks);
      storage.emplace_back(shape.block_bytes() * shape.num_blocks);
      views.push_back({storage[storage.size() - 2].data(), storage.back().data(), shape,
                       kernels::Device::kCPU, k_scale, 1.0f});
    }
  }
};

// A step: sequence s contributes tokens[s] at positions start[s].. and wants
// the logits of `rows[s]` of its tokens (indices into tokens[s]).
std::vector<float> Step(LlamaModel& m, Pool& pool, const std::vector<std::vector<int32_t>>& tokens,
                        const std::vector<int>& start, const std::vector<std::vector<int>>& rows) {
  testing::BatchVectors b;
  b.width = pool.per_seq;
  for (size_t s = 0; s < tokens.size(); ++s) {
    const int base = static_cast<int>(b.ids.size());
    for (size_t i = 0; i < tokens[s].size(); ++i) {
      b.ids.push_back(tokens[s][i]);
      b.pos.push_back(start[s] + static_cast<int>(i));
      b.slots.push_back(static_cast<int64_t>(s) * pool.per_seq * kBlockSize + start[s] + i);
    }
    for (int r : rows[s]) b.rows.push_back(base + r);
    b.qsl.push_back(static_cast<int32_t>(b.ids.size()));
    b.lens.push_back(start[s] + static_cast<int>(tokens[s].size()));
    for (int k = 0; k < pool.per_seq; ++k)
      b.tables.push_back(static_cast<int32_t>(s) * pool.per_seq + k);
  }
  std::vector<float> logits;
  absl::Status st = m.Forward(b.view(), pool.views, &logits);
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

int Argmax(const float* row, int n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

// Greedy continuation of every prompt (kGenerate tokens).
std::vector<std::vector<int32_t>> Greedy(Model& m, const std::vector<testing::ReferencePrompt>& ps,
                                         kernels::DType dt) {
  const int vocab = m.model->config().vocab_size;
  int max_len = 0;
  for (const auto& p : ps) max_len = std::max<int>(max_len, p.prompt_ids.size() + kGenerate);
  Pool pool(m.model->config(), dt, static_cast<int>(ps.size()), max_len, 1.0f);
  std::vector<std::vector<int32_t>> out(ps.size());
  std::vector<std::vector<int32_t>> tokens;
  std::vector<int> start(ps.size(), 0);
  std::vector<std::vector<int>> rows;
  for (const auto& p : ps) {
    tokens.push_back(p.prompt_ids);
    rows.push_back({static_cast<int>(p.prompt_ids.size()) - 1});
  }
  for (int step = 0; step < kGenerate; ++step) {
    const std::vector<float> logits = Step(*m.model, pool, tokens, start, rows);
    if (logits.size() != ps.size() * vocab) return out;
    for (size_t s = 0; s < ps.size(); ++s) {
      const int32_t next = Argmax(logits.data() + s * vocab, vocab);
      out[s].push_back(next);
      start[s] += static_cast<int>(tokens[s].size());
      tokens[s] = {next};
      rows[s] = {0};
    }
  }
  return out;
}

// Logits of the kGenerate rows predicting each continuation token, with the
// continuation given (one prefill per prompt, all prompts in one batch).
// kv_absmax (fp32 cache only): the largest |K| and |V| written, any layer.
std::vector<float> TeacherForced(Model& m, const std::vector<testing::ReferencePrompt>& ps,
                                 const std::vector<std::vector<int32_t>>& cont, kernels::DType dt,
                                 float k_scale = 1.0f, float* kv_absmax = nullptr) {
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
  std::vector<float> logits = Step(*m.model, pool, tokens, std::vector<int>(ps.size(), 0), rows);
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

// Teacher-forced top-1 agreement with the fp32 cache: lower bounds and logit
// bounds per cache dtype, set from the measured figures (RelWithDebInfo,
// x86-64 AVX2, 320 rows; also in docs/serving.md), top-1 / max |logit diff|:
//   fp16 0.959 / 2.0, e4m3 0.925 / 5.0, e5m2 0.878 / 13.5;
//   the control (keys lost) 0.056 / 46.5.
// This small model's greedy continuations are often near-ties (the
// transformers fixture: 17% of greedy steps have a top-1 margin < 0.25), so
// even the fp16 cache flips 4% of the rows. Bounds: top-1 about 5 rows (1.5%)
// plus 10% of the measured disagreement below, max |diff| about 1.5-2x.
struct Bound {
  kernels::DType dt;
  double min_top1;
  double max_diff;
};
constexpr Bound kBounds[] = {
    {kernels::DType::kFloat16, 0.93, 4.0},
    {kernels::DType::kFloat8E4M3, 0.89, 10.0},
    {kernels::DType::kFloat8E5M2, 0.84, 20.0},
};

TEST(Fp8KvForwardTest, GreedyTop1AgreesWithFloat32Cache) {
  const char* model_path = std::getenv("PAGEDSERVE_TEST_MODEL");
  const char* ref_path = std::getenv("PAGEDSERVE_TEST_REFERENCE");
  ASSERT_NE(model_path, nullptr);
  ASSERT_NE(ref_path, nullptr);
  const std::vector<testing::ReferencePrompt> prompts = testing::LoadReference(ref_path);
  ASSERT_FALSE(prompts.empty());
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
  // The fp32 cache's teacher-forced argmax reproduces its own greedy tokens.
  int self = 0;
  for (size_t s = 0; s < prompts.size(); ++s)
    for (int i = 0; i < kGenerate; ++i)
      self += Argmax(ref.data() + (s * kGenerate + i) * vocab, vocab) == greedy32[s][i];
  std::printf("fp32 cache: teacher-forced argmax equals its greedy token in %d / %zu rows\n", self,
              prompts.size() * kGenerate);

  for (const Bound& b : kBounds) {
    SCOPED_TRACE(kernels::DTypeName(b.dt));
    const Agreement a = Compare(TeacherForced(m, prompts, greedy32, b.dt), ref, vocab);
    int identical = 0;
    double prefix = 0;
    if (kernels::IsFp8(b.dt)) {
      const auto g = Greedy(m, prompts, b.dt);
      for (size_t s = 0; s < prompts.size(); ++s) {
        identical += g[s] == greedy32[s];
        size_t k = 0;
        while (k < g[s].size() && g[s][k] == greedy32[s][k]) ++k;
        prefix += static_cast<double>(k) / prompts.size();
      }
      std::printf(
          "%s cache: greedy %d / %zu prompts identical for %d tokens, mean identical "
          "prefix %.1f tokens\n",
          kernels::DTypeName(b.dt), identical, prompts.size(), kGenerate, prefix);
    }
    std::printf(
        "%s cache: teacher-forced top-1 agreement %.4f (%zu rows), max |logit diff| %.3g, "
        "RMS logit diff %.3g\n",
        kernels::DTypeName(b.dt), a.top1, prompts.size() * kGenerate, a.max_diff, a.rms_diff);
    EXPECT_GE(a.top1, b.min_top1);
    EXPECT_LE(a.max_diff, b.max_diff);
  }

  // Negative control: keys flushed to zero by a bad k_scale fail the e4m3 bound.
  const Agreement broken =
      Compare(TeacherForced(m, prompts, greedy32, kernels::DType::kFloat8E4M3, 1e4f), ref, vocab);
  std::printf("control (e4m3, k_scale 1e4): top-1 agreement %.4f, max |logit diff| %.3g\n",
              broken.top1, broken.max_diff);
  EXPECT_TRUE(broken.top1 < kBounds[1].min_top1 || broken.max_diff > kBounds[1].max_diff)
      << "a cache that loses every key passes the fp8 bounds";
}

}  // namespace
}  // namespace pagedserve
