// The strongest check: seeded random workloads (arrivals, n > 1, aborts, stop
// strings, tight pools forcing preemption by swap and by recompute, prefix
// caching with a real and with a constant hash) run through the FakeEngine,
// which verifies after every step that each sequence's KV context read
// through its block table equals its token history. Outputs must also equal
// those of a run with a pool so large that nothing is preempted, and a warm
// prefix-cache run must equal a cold one.
#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <random>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "runtime/coordinator/scheduler.h"
#include "tests/coordinator/fake_engine.h"

namespace pagedserve {
namespace {

// Every configuration's max_model_len; workloads stay within it.
constexpr int kMaxModelLen = 96;

using testing::FakeEngine;
using Outputs = std::map<std::string, std::map<int32_t, std::vector<int32_t>>>;

struct Workload {
  struct Item {
    int step;  // arrival step
    Request req;
    int abort_at = -1;  // step at which the client aborts (-1: never)
    int stop_at = -1;   // step at which a "stop string" finishes it
  };
  std::vector<Item> items;
};

Workload MakeWorkload(uint64_t seed, int n, bool with_aborts, bool with_beams = false) {
  std::mt19937_64 rng(seed);
  auto rand = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  Workload w;
  std::vector<int32_t> system_prompt;
  system_prompt.reserve(21);
  for (int i = 0; i < 21; ++i) system_prompt.push_back(700 + i);
  int step = 0;
  for (int i = 0; i < n; ++i) {
    Workload::Item it;
    step += rand(0, 1);
    it.step = step;
    Request& r = it.req;
    r.request_id = "q" + std::to_string(i);
    r.arrival_time = step + 0.001 * i;
    if (rand(0, 2) == 0) r.prompt_token_ids = system_prompt;  // shared prefix
    const int len = rand(1, 40);
    for (int k = 0; k < len; ++k)
      r.prompt_token_ids.push_back(rand(1, 6));  // tiny vocab: shared blocks
    // Within the context (prompt + max_tokens <= max_model_len: the admission bound).
    r.params.max_tokens =
        std::min(rand(1, 60), kMaxModelLen - static_cast<int>(r.prompt_token_ids.size()));
    r.params.n = rand(0, 4) == 0 ? rand(2, 3) : 1;
    r.params.temperature = r.params.n > 1 ? 1.0f : 0.0f;
    r.params.ignore_eos = rand(0, 1) == 0;
    if (with_beams && rand(0, 3) != 0) {  // beam search: 2..4 beams, 1..k returned
      r.params.use_beam_search = true;
      r.params.temperature = 0.0f;
      r.params.best_of = rand(2, 4);
      r.params.n = rand(1, r.params.best_of);
      r.params.length_penalty = std::array<float, 4>{0.0f, 0.5f, 1.0f, 2.0f}[rand(0, 3)];
      r.params.early_stopping = static_cast<EarlyStopping>(rand(0, 2));
      if (rand(0, 3) == 0) r.params.stop_token_ids = {rand(0, 63)};
      // 4 beams x 60 tokens fit the tight pool's admission bound.
      if (r.prompt_token_ids.size() > 30) r.prompt_token_ids.resize(30);
      r.params.max_tokens = std::min(r.params.max_tokens, 30);
    }
    if (with_aborts && rand(0, 5) == 0) it.abort_at = step + rand(0, 6);
    if (with_aborts && rand(0, 7) == 0) it.stop_at = step + rand(1, 8);
    w.items.push_back(std::move(it));
  }
  return w;
}

// An Abort or FinishRequest(kStop) the workload made on a live request, and
// what the request held then.
struct EarlyFinish {
  std::string request_id;
  FinishReason reason = FinishReason::kNone;
  int step = 0;
  std::vector<SeqId> seq_ids;
  std::vector<int32_t> device_blocks, cpu_blocks;
};

struct RunOptions {
  // Negative control: record the workload's aborts and stops as made, but do
  // not call the scheduler (a scheduler whose Abort does nothing).
  bool drop_finishes = false;
  // The fake model's vocabulary: a small one makes n-gram drafts match often
  // (speculative decoding tests).
  int32_t vocab = 64;
};

struct RunResult {
  Outputs outputs;
  std::vector<EarlyFinish> early;  // in the order made
  // Broken abort / stop rules (see CheckEarlyFinishApplied), one line each.
  std::vector<std::string> finish_problems;
  std::map<std::string, std::map<int32_t, double>> scores;  // beam search
  SchedulerStats stats;
  int64_t forks = 0;     // sequences started from another (fork_from) in plans
  int64_t released = 0;  // sequence ids in plans' finished lists
};

// The block-table rows the worker rebuilt from the plans' deltas equal the
// scheduler's tables for every sequence of the plan, and continuing sequences
// were sent only what changed: nothing when the row is unchanged.
absl::Status CheckMirroredBlockTables(const Scheduler& sched, const StepPlan& plan,
                                      const FakeEngine& engine) {
  absl::flat_hash_map<SeqId, const Sequence*> coordinator;
  for (const SequenceGroup* g : sched.running_requests()) {
    for (const auto& s : g->seqs) coordinator[s->id] = s.get();
  }
  for (const SequenceStep& st : plan.seqs) {
    auto it = coordinator.find(st.seq_id);
    if (it == coordinator.end())
      return absl::InternalError(absl::StrCat("seq ", st.seq_id, " not running"));
    const StepPlanMirror::Sequence* m = engine.mirror().Find(st.seq_id);
    if (m == nullptr) return absl::InternalError(absl::StrCat("seq ", st.seq_id, " not mirrored"));
    if (m->block_table != it->second->block_table) {
      return absl::InternalError(absl::StrCat("seq ", st.seq_id, ": mirrored block table differs"));
    }
    // A decode writes into at most one new or copied block; only a swap-in
    // (this step) rewrites a continuing sequence's whole row.
    if (!st.starts() && st.token_ids.size() == 1 && plan.swap_in.empty() &&
        st.block_table.size() > 1) {
      return absl::InternalError(absl::StrCat("seq ", st.seq_id, ": a decode resent ",
                                              st.block_table.size(), " block-table entries"));
    }
  }
  return absl::OkStatus();
}

// References to each block from the block tables of the live requests'
// unfinished sequences (device and CPU pools apart), read from the requests
// themselves, not from the block manager's own bookkeeping.
void LiveRefs(const Scheduler& sched, const Workload& w, std::map<int32_t, int>* dev,
              std::map<int32_t, int>* cpu) {
  for (const auto& it : w.items) {
    const SequenceGroup* g = sched.FindRequest(it.req.request_id);
    if (g == nullptr) continue;
    for (const auto& s : g->seqs) {
      if (s->finished()) continue;
      for (int32_t b : s->block_table) ++(*(s->blocks_on_cpu ? cpu : dev))[b];
    }
  }
}

// After the Schedule() that follows an abort / stop: the request is gone, all
// of its sequences are in the plan's finished list (workers drop them), and
// every block it held is referenced only by the live requests' tables: its
// own references were dropped (freed, or evictable in the prefix cache).
void CheckEarlyFinishApplied(const Scheduler& sched, const Workload& w, const StepPlan& plan,
                             const EarlyFinish& e, std::vector<std::string>* problems) {
  const std::string who =
      absl::StrCat(e.request_id, " (", e.reason == FinishReason::kAbort ? "abort" : "stop",
                   " at step ", e.step, "): ");
  if (sched.FindRequest(e.request_id) != nullptr) problems->push_back(who + "still known");
  for (SeqId id : e.seq_ids) {
    if (std::find(plan.finished.begin(), plan.finished.end(), id) == plan.finished.end()) {
      problems->push_back(absl::StrCat(who, "sequence ", id, " not in plan.finished"));
    }
  }
  std::map<int32_t, int> dev, cpu;
  LiveRefs(sched, w, &dev, &cpu);
  const BlockManager& bm = sched.block_manager();
  for (int32_t b : e.device_blocks) {
    if (bm.device().ref_count(b) != dev[b]) {
      problems->push_back(absl::StrCat(who, "device block ", b, " ref ", bm.device().ref_count(b),
                                       " but ", dev[b], " live references"));
    }
  }
  for (int32_t b : e.cpu_blocks) {
    if (bm.cpu().ref_count(b) != cpu[b]) {
      problems->push_back(absl::StrCat(who, "cpu block ", b, " ref ", bm.cpu().ref_count(b),
                                       " but ", cpu[b], " live references"));
    }
  }
}

RunResult RunWorkload(const SchedulerConfig& c, const Workload& w, int32_t eos,
                      const RunOptions& opt = {}) {
  RunResult rr;
  auto sched_or = Scheduler::Create(c, {eos});
  EXPECT_TRUE(sched_or.ok()) << sched_or.status();
  if (!sched_or.ok()) return rr;
  Scheduler& sched = **sched_or;
  FakeEngine engine(c.num_device_blocks, c.num_cpu_blocks, c.block_size, opt.vocab, eos);
  size_t next = 0;
  for (int step = 0; step < 20000; ++step) {
    while (next < w.items.size() && w.items[next].step <= step) {
      const absl::Status added = sched.AddRequest(w.items[next].req);
      EXPECT_TRUE(added.ok()) << w.items[next].req.request_id << ": " << added;
      ++next;
    }
    const size_t early_before = rr.early.size();
    for (const auto& it : w.items) {
      for (const FinishReason reason : {FinishReason::kAbort, FinishReason::kStop}) {
        if ((reason == FinishReason::kAbort ? it.abort_at : it.stop_at) != step) continue;
        // The request may have finished already (then NotFound), or have an
        // abort / stop pending from this step (the first one wins).
        const SequenceGroup* g = sched.FindRequest(it.req.request_id);
        if (g == nullptr || g->pending_finish != FinishReason::kNone) continue;
        if (std::any_of(rr.early.begin() + early_before, rr.early.end(),
                        [&](const EarlyFinish& e) { return e.request_id == it.req.request_id; })) {
          continue;
        }
        EarlyFinish e{it.req.request_id, reason, step, {}, {}, {}};
        for (const auto& sq : g->seqs) {
          e.seq_ids.push_back(sq->id);
          for (int32_t b : sq->block_table)
            (sq->blocks_on_cpu ? e.cpu_blocks : e.device_blocks).push_back(b);
        }
        if (!opt.drop_finishes) {
          const absl::Status st = reason == FinishReason::kAbort
                                      ? sched.Abort(it.req.request_id)
                                      : sched.FinishRequest(it.req.request_id, reason);
          EXPECT_TRUE(st.ok()) << it.req.request_id << ": " << st;
          if (g->pending_finish != reason) {
            rr.finish_problems.push_back(absl::StrCat(it.req.request_id, ": pending finish reason ",
                                                      static_cast<int>(g->pending_finish)));
          }
        }
        rr.early.push_back(std::move(e));
      }
    }
    if (next == w.items.size() && !sched.HasUnfinishedRequests()) break;
    auto plan = sched.Schedule();
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return rr;
    for (size_t i = early_before; i < rr.early.size(); ++i)
      CheckEarlyFinishApplied(sched, w, *plan, rr.early[i], &rr.finish_problems);
    for (const SequenceStep& st : plan->seqs) rr.forks += st.fork_from != kNoSeq;
    rr.released += static_cast<int64_t>(plan->finished.size());
    StepResult result;
    absl::Status s = engine.Run(*plan, &result);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return rr;
    s = CheckMirroredBlockTables(sched, *plan, engine);
    EXPECT_TRUE(s.ok()) << "step " << step << ": " << s;
    if (!s.ok()) return rr;
    auto outs = sched.ProcessResult(result);
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) return rr;
    for (const RequestOutput& o : *outs) {
      for (const EarlyFinish& e : rr.early) {
        if (e.request_id == o.request_id) {
          rr.finish_problems.push_back(absl::StrCat(o.request_id, ": output at step ", step,
                                                    " after its finish at step ", e.step));
        }
      }
      for (const SequenceOutput& so : o.seqs) {
        for (const SampledToken& t : so.new_tokens)
          rr.outputs[o.request_id][so.index].push_back(t.token_id);
        if (so.beam_score) rr.scores[o.request_id][so.index] = *so.beam_score;
      }
    }
    absl::Status inv = sched.CheckInvariants();
    EXPECT_TRUE(inv.ok()) << "step " << step << ": " << inv;
    if (!inv.ok()) return rr;
  }
  EXPECT_FALSE(sched.HasUnfinishedRequests()) << "workload did not finish (deadlock?)";
  // Everything went back to the pools.
  EXPECT_EQ(sched.block_manager().device().num_in_use(), 0);
  EXPECT_EQ(sched.block_manager().cpu().num_in_use(), 0);
  rr.stats = sched.stats();
  return rr;
}

SchedulerConfig Base(int32_t blocks, int32_t cpu_blocks) {
  SchedulerConfig c;
  c.block_size = 4;
  c.num_device_blocks = blocks;
  c.num_cpu_blocks = cpu_blocks;
  c.max_num_seqs = 12;
  c.max_num_batched_tokens = 24;
  c.max_model_len = kMaxModelLen;
  c.watermark = 0.02;
  return c;
}

class RandomWorkloadTest
    : public ::testing::TestWithParam<std::tuple<uint64_t, PreemptionMode, bool /*caching*/>> {};

TEST_P(RandomWorkloadTest, KvContentsMatchHistoriesAndOutputsMatchUnpreemptedRun) {
  const auto [seed, mode, caching] = GetParam();
  const Workload w = MakeWorkload(seed, 60, /*with_aborts=*/false);
  SchedulerConfig big = Base(4000, 0);
  const RunResult ref = RunWorkload(big, w, /*eos=*/5);
  ASSERT_EQ(ref.stats.num_preemptions_recompute + ref.stats.num_preemptions_swap, 0);
  SchedulerConfig tight = Base(76, seed % 2 ? 40 : 12);  // 76 blocks: one 3 x 96-token group fits
  tight.preemption_mode = mode;
  tight.enable_prefix_caching = caching;
  const RunResult got = RunWorkload(tight, w, 5);
  EXPECT_GT(got.stats.num_preemptions_recompute + got.stats.num_preemptions_swap, 0);
  EXPECT_EQ(got.outputs, ref.outputs);
  if (caching) {
    EXPECT_GT(got.stats.prefix_cache_hits, 0);
  }
  std::printf(
      "preemptions: swap %lld recompute %lld (fallbacks %lld); prefix hits %lld / %lld tokens\n",
      static_cast<long long>(got.stats.num_preemptions_swap),
      static_cast<long long>(got.stats.num_preemptions_recompute),
      static_cast<long long>(got.stats.num_swap_fallbacks),
      static_cast<long long>(got.stats.prefix_cache_hits),
      static_cast<long long>(got.stats.prefix_cache_queries));
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomWorkloadTest,
                         ::testing::Combine(::testing::Values(11u, 12u, 13u),
                                            ::testing::Values(PreemptionMode::kRecompute,
                                                              PreemptionMode::kSwap),
                                            ::testing::Bool()));

// Speculative decoding (n-gram drafts, and a fake draft model's on the
// worker side) on the fake model: with random
// acceptance patterns (a 2-token vocabulary: drafts often match, often not),
// preemption by swap and recompute, n > 1 siblings sharing blocks (copy on
// write), prefix caching and every k from 1 to 8, the fake worker reads every
// sequence's K/V through its mirrored block table after each step (a rolled
// back block that was not dropped, or a stale slot, changes the context), the
// block manager's invariants hold after every step (no block beyond the
// verified tokens), and the outputs equal a run without speculation and
// without preemption token for token.
class SpecWorkloadTest
    : public ::testing::TestWithParam<std::tuple<uint64_t, PreemptionMode, bool /*caching*/>> {};

TEST_P(SpecWorkloadTest, SameTokensAsWithoutSpeculationUnderPreemption) {
  const auto [seed, mode, caching] = GetParam();
  const Workload w = MakeWorkload(seed, 40, /*with_aborts=*/false);
  RunOptions opt;
  opt.vocab = 2;
  const RunResult ref = RunWorkload(Base(4000, 0), w, /*eos=*/5, opt);
  ASSERT_EQ(ref.stats.num_preemptions_recompute + ref.stats.num_preemptions_swap, 0);
  for (int32_t k = 1; k <= 8; ++k) {
    // The fake draft model on odd k, prompt lookup on even k.
    const bool draft_model = k % 2 == 1;
    SCOPED_TRACE(::testing::Message()
                 << "k = " << k << (draft_model ? ", draft model" : ", ngram"));
    SchedulerConfig tight = Base(76, seed % 2 ? 40 : 12);
    tight.preemption_mode = mode;
    tight.enable_prefix_caching = caching;
    tight.speculative.method = draft_model ? "draft_model" : "ngram";
    tight.speculative.model = draft_model ? "fake" : "";
    tight.speculative.num_speculative_tokens = k;
    tight.speculative.prompt_lookup_min = 1 + static_cast<int32_t>(seed % 2);
    tight.speculative.prompt_lookup_max = 3;
    const RunResult got = RunWorkload(tight, w, 5, opt);
    EXPECT_EQ(got.outputs, ref.outputs);
    EXPECT_GT(got.stats.num_preemptions_recompute + got.stats.num_preemptions_swap, 0);
    // Both acceptance and rejection happened, runs of two accepted too.
    EXPECT_GT(got.stats.spec_accepted_tokens, 0);
    EXPECT_GT(got.stats.spec_draft_tokens, got.stats.spec_accepted_tokens);
    ASSERT_EQ(got.stats.spec_accepted_per_pos.size(), static_cast<size_t>(k));
    EXPECT_GT(got.stats.spec_accepted_per_pos[std::min(k, 2) - 1], 0);
    EXPECT_LE(got.stats.spec_emitted_tokens,
              got.stats.spec_accepted_tokens + got.stats.spec_num_drafts);
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SpecWorkloadTest,
                         ::testing::Combine(::testing::Values(21u, 22u),
                                            ::testing::Values(PreemptionMode::kRecompute,
                                                              PreemptionMode::kSwap),
                                            ::testing::Bool()));

// The workload without its aborts and stop strings.
Workload WithoutEarlyFinishes(Workload w) {
  for (auto& it : w.items) it.abort_at = it.stop_at = -1;
  return w;
}

// Every abort / stop the workload made on a live request took effect (the
// request's pending reason, then at the next step: gone, its sequences
// released, its blocks' references dropped; no output after), and every
// other request's tokens equal those of a run without aborts on a pool too
// large to preempt; an aborted or stopped request's tokens are a prefix of
// its unaborted ones.
void CheckEarlyFinishes(const Workload& w, const RunResult& got, const RunResult& ref,
                        std::vector<std::string>* problems) {
  *problems = got.finish_problems;
  std::set<std::string> early;
  for (const EarlyFinish& e : got.early) early.insert(e.request_id);
  for (const auto& it : w.items) {
    const std::string& id = it.req.request_id;
    const auto g = got.outputs.find(id);
    const auto r = ref.outputs.find(id);
    if (!early.count(id)) {
      if (g == got.outputs.end() || r == ref.outputs.end() || g->second != r->second) {
        problems->push_back(id + ": tokens differ from the run without aborts");
      }
      continue;
    }
    if (g == got.outputs.end()) continue;  // aborted before its first token
    for (const auto& [index, toks] : g->second) {
      const std::vector<int32_t>* full = nullptr;
      if (r != ref.outputs.end() && r->second.count(index)) full = &r->second.at(index);
      if (full == nullptr || toks.size() > full->size() ||
          !std::equal(toks.begin(), toks.end(), full->begin())) {
        problems->push_back(
            absl::StrCat(id, "[", index, "]: tokens not a prefix of the unaborted run"));
      }
    }
  }
}

TEST(RandomWorkloadTest, AbortsAndStopStringsTakeEffectAndNeverLeakBlocks) {
  for (uint64_t seed : {21u, 22u, 23u, 24u}) {
    SCOPED_TRACE(seed);
    const Workload w = MakeWorkload(seed, 60, /*with_aborts=*/true);
    const RunResult ref = RunWorkload(Base(4000, 0), WithoutEarlyFinishes(w), 5);
    SchedulerConfig c = Base(76, 30);
    c.preemption_mode = seed % 2 ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    c.enable_prefix_caching = true;
    const RunResult got = RunWorkload(c, w, 5);  // also checks contexts, invariants, no leak
    int aborts = 0, stops = 0;
    for (const EarlyFinish& e : got.early) (e.reason == FinishReason::kAbort ? aborts : stops)++;
    // Measured with these seeds: 4-13 aborts and 4-7 stops took effect per run.
    EXPECT_GE(aborts, 3);
    EXPECT_GE(stops, 3);
    std::vector<std::string> problems;
    CheckEarlyFinishes(w, got, ref, &problems);
    EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "\n");
    std::printf("seed %llu: %d aborts, %d stops took effect\n",
                static_cast<unsigned long long>(seed), aborts, stops);

    // Negative control: a scheduler that ignores aborts and stops fails the check.
    const RunResult ignored = RunWorkload(c, w, 5, RunOptions{.drop_finishes = true});
    CheckEarlyFinishes(w, ignored, ref, &problems);
    EXPECT_FALSE(problems.empty()) << "dropping every abort and stop went unnoticed";
    std::printf("seed %llu, aborts and stops ignored: %zu problems found\n",
                static_cast<unsigned long long>(seed), problems.size());
  }
}

TEST(RandomWorkloadTest, ConstantHashCollisionsNeverServeWrongData) {
  const Workload w = MakeWorkload(31, 60, false);
  const RunResult ref = RunWorkload(Base(4000, 0), w, 5);
  SchedulerConfig c = Base(76, 20);
  c.enable_prefix_caching = true;
  c.hash_fn = [](const BlockHash&, absl::Span<const int32_t>, absl::Span<const int64_t>) {
    return BlockHash{0, 0};  // every block collides
  };
  const RunResult got = RunWorkload(c, w, 5);
  EXPECT_EQ(got.outputs, ref.outputs);
}

// Warm run (cache filled by a warm-up batch that was aborted mid-prefill or
// ended on a stop string) gives the same tokens as a cold run.
TEST(PrefixCacheTest, WarmRunEqualsColdRunEvenAfterAbortedWarmup) {
  const Workload w = MakeWorkload(41, 30, false);
  SchedulerConfig c = Base(200, 0);
  c.enable_prefix_caching = true;
  const RunResult cold = RunWorkload(c, w, 5);

  auto sched = *Scheduler::Create(c, {5});
  FakeEngine engine(c.num_device_blocks, 0, c.block_size, 64, 5);
  auto step = [&]() {
    auto plan = sched->Schedule();
    ASSERT_TRUE(plan.ok());
    StepResult r;
    ASSERT_TRUE(engine.Run(*plan, &r).ok());
    ASSERT_TRUE(sched->ProcessResult(r).ok());
  };
  // Warm-up: the same prompts, aborted after one prefill chunk or stopped early.
  for (size_t i = 0; i < w.items.size(); ++i) {
    Request r = w.items[i].req;
    r.request_id = "warm" + std::to_string(i);
    r.params.max_tokens = std::min(60, kMaxModelLen - static_cast<int>(r.prompt_token_ids.size()));
    ASSERT_TRUE(sched->AddRequest(r).ok());
  }
  step();
  step();
  for (size_t i = 0; i < w.items.size(); i += 2) (void)sched->Abort("warm" + std::to_string(i));
  for (size_t i = 1; i < w.items.size(); i += 2)
    (void)sched->FinishRequest("warm" + std::to_string(i), FinishReason::kStop);
  step();
  ASSERT_FALSE(sched->HasUnfinishedRequests());
  ASSERT_GT(sched->block_manager().device().num_evictable(), 0);
  // Warm run of the real workload on the same scheduler.
  Outputs warm;
  size_t next = 0;
  for (int s = 0; s < 5000; ++s) {
    while (next < w.items.size() && w.items[next].step <= s)
      ASSERT_TRUE(sched->AddRequest(w.items[next++].req).ok());
    if (next == w.items.size() && !sched->HasUnfinishedRequests()) break;
    auto plan = sched->Schedule();
    ASSERT_TRUE(plan.ok());
    StepResult r;
    ASSERT_TRUE(engine.Run(*plan, &r).ok()) << engine.Run(*plan, &r);
    auto outs = sched->ProcessResult(r);
    ASSERT_TRUE(outs.ok());
    for (const RequestOutput& o : *outs) {
      for (const SequenceOutput& so : o.seqs) {
        for (const SampledToken& t : so.new_tokens)
          warm[o.request_id][so.index].push_back(t.token_id);
      }
    }
  }
  EXPECT_GT(sched->stats().prefix_cache_hits, 0);
  EXPECT_EQ(warm, cold.outputs);
}

// Beam search under random load: thousands of beam forks and frees (every
// step forks the chosen parents and frees the others) with preemption by swap
// and by recompute, prefix caching on and off. After every step the fake
// worker checks each beam's KV context against its history and the block
// manager its reference counts (CheckInvariants); at the end every block is
// free, and the beams and scores equal those of a run that never preempts.
class BeamWorkloadTest
    : public ::testing::TestWithParam<std::tuple<uint64_t, PreemptionMode, bool /*caching*/>> {};

TEST_P(BeamWorkloadTest, NoLeaksAndSameBeamsWithPreemption) {
  const auto [seed, mode, caching] = GetParam();
  const Workload w = MakeWorkload(seed, 150, /*with_aborts=*/false, /*with_beams=*/true);
  const RunResult ref = RunWorkload(Base(4000, 0), w, /*eos=*/5);
  ASSERT_EQ(ref.stats.num_preemptions_recompute + ref.stats.num_preemptions_swap, 0);
  SchedulerConfig tight = Base(76, seed % 2 ? 40 : 12);
  tight.preemption_mode = mode;
  tight.enable_prefix_caching = caching;
  const RunResult got = RunWorkload(tight, w, 5);
  EXPECT_GT(got.stats.num_preemptions_recompute + got.stats.num_preemptions_swap, 0);
  EXPECT_GT(got.forks, 1000);
  EXPECT_GT(got.released, 1000);
  EXPECT_EQ(got.outputs, ref.outputs);
  EXPECT_EQ(got.scores, ref.scores);
  EXPECT_FALSE(ref.scores.empty());
  // Every request answered with n outputs.
  for (const auto& it : w.items) {
    EXPECT_EQ(got.outputs.count(it.req.request_id) ? got.outputs.at(it.req.request_id).size() : 0u,
              static_cast<size_t>(it.req.params.n))
        << it.req.request_id;
  }
  std::printf(
      "beam workload: %lld forks, %lld released ids, preemptions swap %lld recompute %lld\n",
      static_cast<long long>(got.forks), static_cast<long long>(got.released),
      static_cast<long long>(got.stats.num_preemptions_swap),
      static_cast<long long>(got.stats.num_preemptions_recompute));
}

INSTANTIATE_TEST_SUITE_P(Seeds, BeamWorkloadTest,
                         ::testing::Combine(::testing::Values(41u, 42u),
                                            ::testing::Values(PreemptionMode::kRecompute,
                                                              PreemptionMode::kSwap),
                                            ::testing::Bool()));

TEST(BeamWorkloadTest, AbortsTakeEffectAndNeverLeakBlocks) {
  for (uint64_t seed : {51u, 52u, 53u, 54u}) {
    SCOPED_TRACE(seed);
    const Workload w = MakeWorkload(seed, 150, /*with_aborts=*/true, /*with_beams=*/true);
    const RunResult ref = RunWorkload(Base(4000, 0), WithoutEarlyFinishes(w), 5);
    SchedulerConfig c = Base(76, 30);
    c.preemption_mode = seed % 2 ? PreemptionMode::kSwap : PreemptionMode::kRecompute;
    c.enable_prefix_caching = seed % 4 < 2;
    // Checks inside: contexts, invariants, all blocks free at the end.
    const RunResult got = RunWorkload(c, w, 5);
    int aborts = 0, stops = 0;
    for (const EarlyFinish& e : got.early) (e.reason == FinishReason::kAbort ? aborts : stops)++;
    std::vector<std::string> problems;
    CheckEarlyFinishes(w, got, ref, &problems);
    EXPECT_TRUE(problems.empty()) << absl::StrJoin(problems, "\n");
    // Measured with these seeds: 25-30 aborts and 11-16 stops took effect per run.
    EXPECT_GE(aborts, 20);
    EXPECT_GE(stops, 8);
    std::printf("seed %llu: %d aborts, %d stops took effect\n",
                static_cast<unsigned long long>(seed), aborts, stops);
    const RunResult ignored = RunWorkload(c, w, 5, RunOptions{.drop_finishes = true});
    CheckEarlyFinishes(w, ignored, ref, &problems);
    EXPECT_FALSE(problems.empty()) << "dropping every abort and stop went unnoticed";
    std::printf("seed %llu, aborts and stops ignored: %zu problems found\n",
                static_cast<unsigned long long>(seed), problems.size());
  }
}

}  // namespace
}  // namespace pagedserve
