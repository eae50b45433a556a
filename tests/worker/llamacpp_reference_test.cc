// The stored-format forward pass (--dtype auto: Q4_1 weights run by
// kernels::Linear with 8-bit activation blocks, fp16 KV cache) against
// llama.cpp on the same GGUF (tests/fixtures/smollm2/llamacpp_reference.json,
// made by tests/fixtures/make_reference.py through llama-cpp-python; llama.cpp
// also multiplies Q4_1 weights with activations quantized to 8 bits per 32-block
// and keeps an fp16 KV cache).
//
// Per position (10 prompts x 4 steps; context = prompt_ids + llama.cpp's
// greedy_ids[:k]) the test measures
//  * top-1 agreement with llama.cpp's argmax, and
//  * KL(P_llama.cpp || P_ours) over the 65 outcomes {llama.cpp's top-64 ids,
//    everything else}; the fixture has only the top-64 logits and the
//    logsumexp, and by the data-processing inequality this coarsened KL is a
//    lower bound of the full-vocabulary KL.
// and, for comparison only, the same for the --dtype float32 path (dequantize
// at load, fp32 activations and cache: transformers' function).
//
// Measured (x86-64, the AVX2 path of kernels::Linear, 2 threads, 40 positions;
// two versions of the kernels, whose fp32 summation order differs):
//                      quantized path              float32 path
//   top-1 agreement    39, 38 / 40                 38 / 40
//   KL mean            0.0053, 0.0048              0.0038
//   KL max             0.034, 0.033 (one_token 3)  0.030 (one_token 3)
// The quantized top-1 misses are multilingual step 0 (llama.cpp's own top-1
// margin 0.032 logits) and, with the second kernels, story step 2 (margin 0.20,
// where the float32 path disagrees with llama.cpp too). The quantized path is
// not closer to llama.cpp than fp32 is: both differ from it by quantization and
// rounding noise of the same size (logit differences of 0.2-0.4 are typical
// between correct implementations; tests/fixtures/README.md). The bounds below
// are about 3x the measured figures: a wrong scale, block layout, permutation or
// KV conversion moves the KL by orders of magnitude (one wrong layer gives KL > 1).
// Greedy continuations (32 tokens, common prefix with llama.cpp's) are printed
// and recorded in docs/benchmarks-history.md; they are not asserted: after the first
// near tie two correct implementations part ways.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"
#include "tests/worker/batch_vectors.h"
#include "tests/worker/reference_fixture.h"

namespace pagedserve {
namespace {

using testing::LoadReference;
using testing::ReferencePrompt;
using testing::ReferenceStep;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 32;  // 512 tokens: the longest context is ~340

constexpr double kMaxKl = 0.1;        // per position (measured max 0.034)
constexpr double kMaxMeanKl = 0.015;  // over the 40 positions (measured 0.0053)
// llama.cpp's top-1 must be ours wherever its margin over the runner-up exceeds
// this many logits (above the typical 0.2-0.4 difference between correct
// implementations; the measured misses had margins of 0.032 and 0.20).
constexpr double kTop1Margin = 0.5;
constexpr int kMinTop1 = 36;  // of 40 (measured 38-39)

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A model with its own paged KV pool of `dtype`.
struct ModelUnderTest {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<LlamaModel> model;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<kernels::KVCacheView> views;
  int vocab = 0;
};

std::unique_ptr<ModelUnderTest> Make(const std::string& path, WeightDType dtype,
                                     kernels::DType kv) {
  auto m = std::make_unique<ModelUnderTest>();
  auto weights = LoadLlamaWeights(path, 0, 1, dtype);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return nullptr;
  const ModelConfig c = weights->config;
  m->vocab = c.vocab_size;
  m->comm = MakeSingleRankCommunicator();
  auto model = LlamaModel::Create(std::move(*weights), m->comm.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  m->model = std::move(*model);
  kernels::KVCacheShape shape{kNumBlocks, c.num_kv_heads, c.head_size, kBlockSize, kv};
  for (int l = 0; l < c.num_layers; ++l) {
    m->storage.emplace_back(shape.block_bytes() * kNumBlocks);
    m->storage.emplace_back(shape.block_bytes() * kNumBlocks);
    m->views.push_back({m->storage[m->storage.size() - 2].data(), m->storage.back().data(), shape,
                        kernels::Device::kCPU});
  }
  return m;
}

// Feeds context[start, end) (positions start..end-1, blocks 0..) and returns the
// logits of the last position.
std::vector<float> Step(ModelUnderTest& m, const std::vector<int32_t>& context, int start) {
  testing::BatchVectors b;
  b.ids.assign(context.begin() + start, context.end());
  const int n = static_cast<int>(b.ids.size());
  b.pos.resize(n);
  std::iota(b.pos.begin(), b.pos.end(), start);
  b.slots.assign(b.pos.begin(), b.pos.end());  // block k holds positions 16k..
  b.width = kNumBlocks;
  b.tables.resize(kNumBlocks);
  std::iota(b.tables.begin(), b.tables.end(), 0);
  b.qsl.push_back(n);
  b.lens = {static_cast<int32_t>(context.size())};
  b.rows = {n - 1};
  std::vector<float> logits;
  absl::Status s = m.model->Forward(b.view(), m.views, &logits);
  EXPECT_TRUE(s.ok()) << s;
  return logits;
}

double LogSumExp(const std::vector<float>& v) {
  const double mx = *std::max_element(v.begin(), v.end());
  double sum = 0;
  for (float x : v) sum += std::exp(static_cast<double>(x) - mx);
  return mx + std::log(sum);
}

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// KL(P_ref || P_ours) over {ref top ids..., rest} (see the file comment).
double CoarseKl(const ReferenceStep& ref, const std::vector<float>& logits) {
  const double lse = LogSumExp(logits);
  double kl = 0, p_top = 0, q_top = 0;
  for (size_t i = 0; i < ref.top_ids.size(); ++i) {
    const double lp = ref.top_logits[i] - ref.logsumexp;
    const double lq = logits[ref.top_ids[i]] - lse;
    kl += std::exp(lp) * (lp - lq);
    p_top += std::exp(lp);
    q_top += std::exp(lq);
  }
  const double p_rest = std::max(0.0, 1 - p_top), q_rest = std::max(1e-300, 1 - q_top);
  if (p_rest > 0) kl += p_rest * std::log(p_rest / q_rest);
  return kl;
}

// 32 greedy tokens (argmax, ties to the lower id) after the prompt.
std::vector<int32_t> Greedy(ModelUnderTest& m, const std::vector<int32_t>& prompt) {
  std::vector<int32_t> context = prompt, out;
  int start = 0;
  while (out.size() < 32) {
    std::vector<float> logits = Step(m, context, start);
    if (logits.empty()) break;
    start = static_cast<int>(context.size());
    out.push_back(Argmax(logits));
    context.push_back(out.back());
  }
  return out;
}

size_t CommonPrefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

TEST(LlamaCppReferenceTest, QuantizedPathAgreesWithLlamaCpp) {
  const std::string path = Env("PAGEDSERVE_TEST_MODEL");
  if (path.empty()) GTEST_SKIP() << "PAGEDSERVE_TEST_MODEL is not set";
  const std::vector<ReferencePrompt> ref =
      LoadReference("tests/fixtures/smollm2/llamacpp_reference.json");
  ASSERT_EQ(ref.size(), 10u);
  auto quant = Make(path, WeightDType::kAuto, kernels::DType::kFloat16);
  auto fp32 = Make(path, WeightDType::kFloat32, kernels::DType::kFloat32);
  ASSERT_TRUE(quant && fp32);

  double sum_kl_q = 0, sum_kl_f = 0, max_kl_q = 0, max_kl_f = 0;
  int positions = 0, top1_q = 0, top1_f = 0;
  for (const ReferencePrompt& p : ref) {
    SCOPED_TRACE(p.name);
    std::vector<int32_t> context = p.prompt_ids;
    int start = 0;
    for (size_t k = 0; k < p.steps.size(); ++k) {
      const ReferenceStep& s = p.steps[k];
      ASSERT_EQ(static_cast<int>(context.size()), s.context_length);
      std::vector<float> lq = Step(*quant, context, start);
      std::vector<float> lf = Step(*fp32, context, start);
      ASSERT_EQ(lq.size(), static_cast<size_t>(quant->vocab));
      const double kq = CoarseKl(s, lq), kf = CoarseKl(s, lf);
      std::printf(
          "%-16s step %zu  KL quant %.5f  fp32 %.5f  argmax ref %d quant %d fp32 %d "
          "(ref margin %.3f)\n",
          p.name.c_str(), k, kq, kf, s.argmax, Argmax(lq), Argmax(lf), s.top1_margin);
      EXPECT_LT(kq, kMaxKl) << "step " << k;
      if (s.top1_margin > kTop1Margin) {
        EXPECT_EQ(Argmax(lq), s.argmax) << "step " << k;
      }
      sum_kl_q += kq;
      sum_kl_f += kf;
      max_kl_q = std::max(max_kl_q, kq);
      max_kl_f = std::max(max_kl_f, kf);
      ++positions;
      top1_q += Argmax(lq) == s.argmax;
      top1_f += Argmax(lf) == s.argmax;
      start = static_cast<int>(context.size());
      context.push_back(p.greedy_ids[k]);  // follow llama.cpp's greedy path
    }
  }
  std::printf(
      "positions %d  top-1 agreement quant %d fp32 %d  KL mean quant %.5f fp32 %.5f  "
      "max quant %.5f fp32 %.5f\n",
      positions, top1_q, top1_f, sum_kl_q / positions, sum_kl_f / positions, max_kl_q, max_kl_f);
  EXPECT_LT(sum_kl_q / positions, kMaxMeanKl);
  EXPECT_GE(top1_q, kMinTop1);

  for (const ReferencePrompt& p : ref) {
    const std::vector<int32_t> g = Greedy(*quant, p.prompt_ids);
    std::printf("%-16s greedy common prefix with llama.cpp: %zu of 32\n", p.name.c_str(),
                CommonPrefix(g, p.greedy_ids));
  }
}

}  // namespace
}  // namespace pagedserve
