// Sampler throughput on SmolLM2's vocabulary (49152) at batch 64.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <random>
#include <vector>

#include "runtime/sampling/sampler.h"

namespace pagedserve {
namespace {

constexpr int kVocab = 49152;

// mode: 0 greedy, 1 temperature only, 2 top-k 50, 3 top-p 0.9, 4 top-k 50 + top-p 0.9 +
// penalties, 5 top-p 0.9 + logprobs 5.
void BM_Sample(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int mode = static_cast<int>(state.range(1));
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(batch) * kVocab);
  for (float& x : logits) x = nd(rng);
  SamplingParams p;
  p.temperature = mode == 0 ? 0.0f : 0.8f;
  if (mode == 2 || mode == 4) p.top_k = 50;
  if (mode >= 3) p.top_p = 0.9f;
  if (mode == 4) p.repetition_penalty = 1.1f, p.frequency_penalty = 0.3f;
  if (mode == 5) p.logprobs = 5;
  std::vector<int32_t> history(512);
  for (int32_t& t : history) t = static_cast<int32_t>(rng() % kVocab);
  std::vector<SamplerRow> rows(batch);
  for (int i = 0; i < batch; ++i) {
    rows[i].params = &p;
    rows[i].token_history = history;
    rows[i].prompt_len = 256;
    rows[i].position = 512;
  }
  Sampler sampler(kVocab);
  for (auto _ : state) {
    auto r = sampler.Sample(logits, rows);
    benchmark::DoNotOptimize(r);
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
// Yardstick measured in the same run: one std::max_element pass over the same
// logits (what a bare greedy argmax costs), to read BM_Sample on a noisy machine.
void BM_ArgmaxPass(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(batch) * kVocab);
  for (float& x : logits) x = nd(rng);
  for (auto _ : state) {
    for (int r = 0; r < batch; ++r) {
      const float* row = logits.data() + static_cast<size_t>(r) * kVocab;
      benchmark::DoNotOptimize(std::max_element(row, row + kVocab));
    }
  }
  state.SetItemsProcessed(state.iterations() * batch);
}
BENCHMARK(BM_ArgmaxPass)->ArgName("batch")->Arg(1)->Arg(64)->Unit(benchmark::kMillisecond);

BENCHMARK(BM_Sample)
    ->ArgNames({"batch", "mode"})
    ->ArgsProduct({{1, 64}, {0, 1, 2, 3, 4, 5}})
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pagedserve

BENCHMARK_MAIN();
