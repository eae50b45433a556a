// One engine step of the coordinator with N running sequences in decode:
// Schedule() (budgets, block appends, copy-on-write checks, step plan with block
// tables and slot mapping) + a StepResult with one token per sequence +
// ProcessResult() (append, stop checks, prefix-cache registration when on).
// Goal (issue 14): <= 50 us per step at N = 256 and <= 200 us at N = 1024,
// prefix caching on and off. Counters plan_bytes / plan_bytes_1000: the size
// of a decode step's plan as the MPI executor encodes it
// (distributed/step_plan_codec.h) on a fresh batch and 1000 steps later.
#include <memory>

#include "benchmark/benchmark.h"
#include "distributed/step_plan_codec.h"
#include "runtime/coordinator/scheduler.h"

namespace pagedserve {
namespace {

constexpr int32_t kPrompt = 128;
constexpr int32_t kMaxModelLen = 4096;

std::unique_ptr<Scheduler> MakeRunning(int32_t n, bool caching) {
  SchedulerConfig c;
  c.block_size = 16;
  c.num_device_blocks = n * (kMaxModelLen / 16) + 64;
  c.max_num_seqs = n;
  c.max_num_batched_tokens = std::max(8192, n);
  c.max_model_len = kMaxModelLen;
  c.enable_prefix_caching = caching;
  auto s = *Scheduler::Create(c, {2});
  for (int32_t i = 0; i < n; ++i) {
    Request r;
    r.request_id = "r" + std::to_string(i);
    for (int32_t t = 0; t < kPrompt; ++t) r.prompt_token_ids.push_back(1000 + i * kPrompt + t);
    r.params.max_tokens = kMaxModelLen;
    r.params.temperature = 0.0f;
    r.params.ignore_eos = true;
    (void)s->AddRequest(std::move(r));
  }
  // Prefill everything.
  while (true) {
    auto plan = *s->Schedule();
    StepResult res;
    res.step_id = plan.step_id;
    bool any_prefill = false;
    for (const SequenceStep& st : plan.seqs) {
      any_prefill |= st.is_prefill();
      if (st.sample) res.tokens.push_back(SampledToken{st.seq_id, 7, 0.0f, {}, {}});
    }
    (void)s->ProcessResult(res);
    if (!any_prefill) break;
  }
  return s;
}

// Runs `steps` decode steps; returns the encoded size of the last plan.
size_t DecodeSteps(Scheduler& s, int steps) {
  size_t bytes = 0;
  for (int i = 0; i < steps; ++i) {
    auto plan = s.Schedule();
    bytes = EncodeStepPlan(*plan).size();
    StepResult res;
    res.step_id = plan->step_id;
    for (const SequenceStep& st : plan->seqs)
      res.tokens.push_back(SampledToken{st.seq_id, 7, 0.0f, {}, {}});
    benchmark::DoNotOptimize(s.ProcessResult(res));
  }
  return bytes;
}

// One timed step: Schedule(), a StepResult with one token per sampled
// sequence (token 7 + salt), ProcessResult(), the outputs destroyed. As the
// engine does, the plan goes back into `spare`, whose memory the next
// Schedule reuses. Not inlined, so that a profiler can count exactly this
// (valgrind --toggle-collect, see docs/benchmarks-history.md). Returns the tokens fed.
[[gnu::noinline]] int64_t OneStep(Scheduler& s, StepPlan& spare, StepResult& res, int32_t salt) {
  auto plan = s.Schedule(std::move(spare));
  res.step_id = plan->step_id;
  res.tokens.clear();
  for (const SequenceStep& st : plan->seqs) {
    if (st.sample) res.tokens.push_back(SampledToken{st.seq_id, 7 + salt, 0.0f, {}, {}});
  }
  auto out = s.ProcessResult(res);
  benchmark::DoNotOptimize(out);
  const int64_t tokens = plan->num_tokens();
  spare = *std::move(plan);
  return tokens;
}

void BM_DecodeStep(benchmark::State& state) {
  const int32_t n = static_cast<int32_t>(state.range(0));
  const bool caching = state.range(1) != 0;
  auto sched = MakeRunning(n, caching);
  int steps = 0;
  StepPlan spare;
  StepResult res;
  res.tokens.reserve(n);
  int64_t tokens = 0;
  for (auto _ : state) {
    if (++steps == 3000) {  // contexts near max_model_len: start over
      state.PauseTiming();
      sched = MakeRunning(n, caching);
      steps = 0;
      state.ResumeTiming();
    }
    tokens += OneStep(*sched, spare, res, steps & 15);
  }
  state.counters["seqs_per_step"] =
      benchmark::Counter(static_cast<double>(tokens) / state.iterations());
  if (state.range(2) != 0) return;  // the fixed-count profiling run
  // Outside the timed loop: the wire size of a decode step's plan on a fresh
  // batch (contexts of kPrompt + 1 tokens) and 1000 steps later.
  auto fresh = MakeRunning(n, caching);
  state.counters["plan_bytes"] = static_cast<double>(DecodeSteps(*fresh, 1));
  state.counters["plan_bytes_1000"] = static_cast<double>(DecodeSteps(*fresh, 1000));
}
BENCHMARK(BM_DecodeStep)
    ->ArgsProduct({{256, 1024}, {0, 1}, {0}})
    ->ArgNames({"seqs", "prefix_caching", "fixed"})
    ->Unit(benchmark::kMicrosecond);
// For profilers: exactly 64 steps (every sequence fills 4 blocks, the same
// share of block-filling steps as a long run), no plan-size counters. Run it
// alone: --benchmark_filter='fixed:1'.
BENCHMARK(BM_DecodeStep)
    ->ArgsProduct({{256, 1024}, {0, 1}, {1}})
    ->ArgNames({"seqs", "prefix_caching", "fixed"})
    ->Iterations(64)
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedserve

BENCHMARK_MAIN();
