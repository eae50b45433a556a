// The forward pass and the worker against Hugging Face transformers (fp32) on
// the same weights: logits of the first steps within tolerance, 32-token greedy
// continuations identical, and a mixed batch equal to each sequence alone.
//
// Model under test: PAGEDSERVE_TEST_MODEL (a .gguf or HF directory) with its
// fixture PAGEDSERVE_TEST_REFERENCE (relative to the source dir).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"
#include "runtime/worker/worker.h"
#include "tests/worker/reference_fixture.h"

namespace pagedserve {
namespace {

using testing::LoadReference;
using testing::ReferencePrompt;

constexpr int kBlockSize = 16;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Logit tolerance: transformers and this runtime both run fp32 but sum in a
// different order (BLAS blocking, attention accumulation), over 4-30 layers.
constexpr double kLogitAbsTol = 2e-3;
constexpr double kLogitRelTol = 2e-3;

class LlamaReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_path_ = Env("PAGEDSERVE_TEST_MODEL");
    reference_ = LoadReference(Env("PAGEDSERVE_TEST_REFERENCE"));
  }
  static std::string model_path_;
  static std::vector<ReferencePrompt> reference_;
};
std::string LlamaReferenceTest::model_path_;
std::vector<ReferencePrompt> LlamaReferenceTest::reference_;

// A step plan that runs `tokens` for sequence `id` whose blocks are the
// contiguous range starting at `first_block` (the test does its own placement).
SequenceStep MakeStep(SeqId id, const std::vector<int32_t>& tokens, int start_pos, int first_block,
                      int context_capacity) {
  SequenceStep s;
  s.seq_id = id;
  s.token_ids = tokens;
  s.start_pos = start_pos;
  s.new_state = start_pos == 0;
  s.num_prompt_tokens = start_pos == 0 ? static_cast<int32_t>(tokens.size()) : 0;
  const int blocks = (context_capacity + kBlockSize - 1) / kBlockSize;
  for (int b = 0; b < blocks; ++b) s.block_table.push_back(first_block + b);
  s.block_table.resize((start_pos + tokens.size() + kBlockSize - 1) / kBlockSize);
  s.sampling.temperature = 0.0f;
  s.sampling.max_tokens = 32;
  return s;
}

TEST_F(LlamaReferenceTest, LogitsMatchTransformers) {
  auto weights = LoadLlamaWeights(model_path_);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const int layers = weights->config.num_layers;
  const int kv_heads = weights->config.num_kv_heads;
  const int head = weights->config.head_size;
  const int vocab = weights->config.vocab_size;
  auto comm = MakeSingleRankCommunicator();
  auto model = LlamaModel::Create(std::move(*weights), comm.get());
  ASSERT_TRUE(model.ok()) << model.status();

  const int num_blocks = 64;
  kernels::KVCacheShape shape{num_blocks, kv_heads, head, kBlockSize, kernels::DType::kFloat32};
  std::vector<std::vector<float>> storage;
  std::vector<kernels::KVCacheView> views;
  for (int l = 0; l < layers; ++l) {
    storage.emplace_back(shape.block_elems() * num_blocks);
    storage.emplace_back(shape.block_elems() * num_blocks);
    views.push_back({storage[storage.size() - 2].data(), storage.back().data(), shape,
                     kernels::Device::kCPU});
  }

  double worst = 0;
  for (const ReferencePrompt& p : reference_) {
    SCOPED_TRACE(p.name);
    std::vector<int32_t> context = p.prompt_ids;
    std::vector<int32_t> block_table(num_blocks);
    // Reverse order so the blocks are not contiguous.
    std::iota(block_table.rbegin(), block_table.rend(), 0);
    int start = 0;
    for (size_t step = 0; step < p.steps.size(); ++step) {
      const auto& ref = p.steps[step];
      std::vector<int32_t> ids(context.begin() + start, context.end());
      std::vector<int32_t> pos(ids.size());
      std::vector<int64_t> slots(ids.size());
      for (size_t i = 0; i < ids.size(); ++i) {
        pos[i] = start + static_cast<int>(i);
        slots[i] = static_cast<int64_t>(block_table[pos[i] / kBlockSize]) * kBlockSize +
                   pos[i] % kBlockSize;
      }
      std::vector<int32_t> qsl = {0, static_cast<int32_t>(ids.size())};
      std::vector<int32_t> lens = {static_cast<int32_t>(context.size())};
      std::vector<int32_t> rows = {static_cast<int32_t>(ids.size()) - 1};
      ASSERT_EQ(lens[0], ref.context_length);
      ForwardBatch b;
      b.token_ids = ids;
      b.positions = pos;
      b.slot_mapping = slots;
      b.query_start_loc = qsl;
      b.seq_lens = lens;
      b.block_tables = block_table;
      b.max_blocks_per_seq = num_blocks;
      b.logits_rows = rows;
      std::vector<float> logits;
      ASSERT_TRUE((*model)->Forward(b, views, &logits).ok());
      ASSERT_EQ(logits.size(), static_cast<size_t>(vocab));
      for (size_t i = 0; i < ref.top_ids.size(); ++i) {
        const double got = logits[ref.top_ids[i]];
        const double want = ref.top_logits[i];
        worst = std::max(worst, std::abs(got - want));
        ASSERT_NEAR(got, want, kLogitAbsTol + kLogitRelTol * std::abs(want))
            << "step " << step << " token " << ref.top_ids[i];
      }
      double m = *std::max_element(logits.begin(), logits.end()), sum = 0;
      for (float v : logits) sum += std::exp(static_cast<double>(v) - m);
      EXPECT_NEAR(m + std::log(sum), ref.logsumexp, 1e-2);
      start = static_cast<int>(context.size());
      context.push_back(ref.argmax);  // follow the reference's greedy path
    }
  }
  std::printf("max |logit - reference| over the top-64 of every step: %.3g\n", worst);
}

// Greedy continuation through Worker::Execute. At the first token that differs
// from the reference the reference's own top-1 margin must be below the logit
// tolerance (a near tie that fp32 summation order may flip); otherwise fail.
void ExpectSameGreedy(const ReferencePrompt& p, const std::vector<int32_t>& got) {
  ASSERT_EQ(got.size(), p.greedy_ids.size()) << p.name;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == p.greedy_ids[i]) continue;
    ASSERT_LT(i, p.greedy_margins.size());
    EXPECT_LT(p.greedy_margins[i], 1e-3)
        << p.name << ": greedy token " << i << " is " << got[i] << ", reference "
        << p.greedy_ids[i] << " with a clear margin " << p.greedy_margins[i];
    return;
  }
}

std::unique_ptr<Worker> MakeWorker(Communicator* comm, const std::string& path) {
  WorkerOptions o;
  o.model_path = path;
  o.dtype = WeightDType::kFloat32;  // the exact path the transformers fixtures check
  o.block_size = kBlockSize;
  o.kv_cache_memory = 256LL << 20;  // 10 sequences x 32 blocks for SmolLM2
  o.swap_space = 0;
  auto w = Worker::Create(o, comm);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? std::move(*w) : nullptr;
}

// Runs all `prompts` for 32 greedy tokens in one batch (or one at a time)
// through the worker with hand-made plans.
std::vector<std::vector<int32_t>> RunGreedy(Worker& w, const std::vector<ReferencePrompt>& prompts) {
  const int cap = 512;
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<int32_t> next(prompts.size());
  static uint64_t step_id = 0;
  static SeqId seq_base = 0;
  seq_base += 1000;
  for (int step = 0; step < 32; ++step) {
    StepPlan plan;
    plan.step_id = ++step_id;
    // Decodes first, then prefills (the order the scheduler uses).
    for (size_t i = 0; i < prompts.size(); ++i) {
      const auto& p = prompts[i];
      const int first_block = static_cast<int>(i) * (cap / kBlockSize);
      if (step == 0) continue;
      int start = static_cast<int>(p.prompt_ids.size()) + step - 1;
      plan.seqs.push_back(MakeStep(seq_base + i, {next[i]}, start, first_block, cap));
    }
    if (step == 0)
      for (size_t i = 0; i < prompts.size(); ++i)
        plan.seqs.push_back(MakeStep(seq_base + i, prompts[i].prompt_ids, 0,
                                     static_cast<int>(i) * (cap / kBlockSize), cap));
    auto res = w.Execute(plan);
    EXPECT_TRUE(res.ok()) << res.status();
    if (!res.ok()) return out;
    EXPECT_EQ(res->tokens.size(), prompts.size());
    for (const SampledToken& t : res->tokens) {
      size_t i = t.seq_id - seq_base;
      out[i].push_back(t.token_id);
      next[i] = t.token_id;
    }
  }
  StepPlan fin;
  fin.step_id = ++step_id;
  for (size_t i = 0; i < prompts.size(); ++i) fin.finished.push_back(seq_base + i);
  EXPECT_TRUE(w.Execute(fin).ok());
  return out;
}

// Each prompt alone matches the reference; all prompts in one batch (mixed
// prefill lengths, then batched decode) give the same tokens as each alone.
TEST_F(LlamaReferenceTest, GreedyAloneMatchesTransformersAndBatchMatchesAlone) {
  auto comm = MakeSingleRankCommunicator();
  auto w = MakeWorker(comm.get(), model_path_);
  ASSERT_NE(w, nullptr);
  std::vector<std::vector<int32_t>> alone;
  for (const ReferencePrompt& p : reference_) {
    alone.push_back(RunGreedy(*w, {p})[0]);
    ExpectSameGreedy(p, alone.back());
  }
  auto batched = RunGreedy(*w, reference_);
  for (size_t i = 0; i < reference_.size(); ++i)
    EXPECT_EQ(batched[i], alone[i]) << reference_[i].name;
}

}  // namespace
}  // namespace pagedserve
