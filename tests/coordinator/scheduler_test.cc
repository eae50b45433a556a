// Scheduler scenarios. Every step runs through the FakeEngine, which checks
// that each sequence's KV context (through its block table) equals its history.
#include "runtime/coordinator/scheduler.h"
#include "runtime/common/field_error.h"

#include <limits>
#include <map>
#include <set>

#include "gtest/gtest.h"
#include "tests/coordinator/fake_engine.h"

namespace pagedserve {
namespace {

using testing::FakeEngine;

SchedulerConfig Config(int32_t blocks, int32_t cpu_blocks = 0, int32_t bs = 4) {
  SchedulerConfig c;
  c.block_size = bs;
  c.num_device_blocks = blocks;
  c.num_cpu_blocks = cpu_blocks;
  c.max_num_seqs = 8;
  c.max_num_batched_tokens = 64;
  c.max_model_len = 64;
  c.watermark = 0.0;
  return c;
}

Request Req(std::string id, int32_t prompt_len, int32_t max_tokens, int32_t first_token = 1) {
  Request r;
  r.request_id = std::move(id);
  for (int32_t i = 0; i < prompt_len; ++i) r.prompt_token_ids.push_back(first_token + i);
  r.params.max_tokens = max_tokens;
  r.params.temperature = 0.0f;
  r.params.ignore_eos = true;
  return r;
}

SampledToken Tok(SeqId id, int32_t token) {
  SampledToken t;
  t.seq_id = id;
  t.token_id = token;
  return t;
}

// Runs the engine loop; collects every request's tokens per sample index.
struct Driver {
  std::unique_ptr<Scheduler> sched;
  FakeEngine engine;
  std::map<std::string, std::map<int32_t, std::vector<int32_t>>> tokens;
  std::map<std::string, std::map<int32_t, FinishReason>> reasons;
  std::vector<StepPlan> plans;
  // Schedule(StepPlan) with the previous step's plan (the engine's pattern).
  bool recycle_plans = false;
  StepPlan spare;

  Driver(const SchedulerConfig& c, std::vector<int32_t> eos = {}, int32_t engine_eos = -1)
      : sched(*Scheduler::Create(c, std::move(eos))),
        engine(c.num_device_blocks, c.num_cpu_blocks, c.block_size, 1000, engine_eos) {}

  // One step; returns false on the first error (reported through gtest).
  bool Step() {
    auto plan = recycle_plans ? sched->Schedule(std::move(spare)) : sched->Schedule();
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return false;
    StepResult result;
    absl::Status s = engine.Run(*plan, &result);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return false;
    plans.push_back(*plan);
    auto outs = sched->ProcessResult(result);
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) return false;
    for (const RequestOutput& o : *outs) {
      for (const SequenceOutput& so : o.seqs) {
        for (const SampledToken& t : so.new_tokens)
          tokens[o.request_id][so.index].push_back(t.token_id);
        if (so.finished) reasons[o.request_id][so.index] = so.finish_reason;
      }
    }
    if (recycle_plans) spare = *std::move(plan);
    absl::Status inv = sched->CheckInvariants();
    EXPECT_TRUE(inv.ok()) << inv;
    return inv.ok();
  }
  bool RunToCompletion(int max_steps = 5000) {
    for (int i = 0; i < max_steps && sched->HasUnfinishedRequests(); ++i) {
      if (!Step()) return false;
    }
    EXPECT_FALSE(sched->HasUnfinishedRequests()) << "did not finish in " << max_steps << " steps";
    return !sched->HasUnfinishedRequests();
  }
};

TEST(SchedulerConfigTest, StartupCheckRefusesUnschedulableSettings) {
  SchedulerConfig c = Config(64);
  EXPECT_TRUE(c.Validate().ok());
  c.enable_chunked_prefill = false;
  c.max_num_batched_tokens = 32;  // < max_model_len 64
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--max-num-batched-tokens"), std::string::npos) << s;
  c = Config(15);  // 15 blocks * 4 < max_model_len 64
  s = c.Validate();
  EXPECT_NE(s.message().find("--max-model-len"), std::string::npos) << s;
  c = Config(64);
  c.max_num_batched_tokens = 4;  // < max_num_seqs
  EXPECT_FALSE(c.Validate().ok());
  c = Config(64);
  c.watermark = 0.5;  // 32 usable blocks >= 16: fine
  EXPECT_TRUE(c.Validate().ok());
  c.watermark = 0.8;  // 13 usable < 16
  EXPECT_FALSE(c.Validate().ok());
  EXPECT_FALSE(Scheduler::Create(c, {}).ok());
  EXPECT_FALSE(ParsePreemptionMode("swapp").ok());
}

// With a sliding window and chunked prefill a sequence holds at most
// ceil((window - 1 + step tokens) / block_size) + 1 blocks, whatever its
// length: the startup check, admission and the pool's longest sequence count
// with that bound; without chunked prefill (a prompt fed whole) they do not.
TEST(SchedulerConfigTest, SlidingWindowBoundsTheBlocksOfASequence) {
  SchedulerConfig c = Config(12);  // 48 tokens
  c.max_model_len = 1000;
  c.max_num_batched_tokens = 16;
  EXPECT_FALSE(c.Validate().ok());  // 250 blocks for one sequence
  EXPECT_EQ(c.LongestSequenceInPool(), 48);
  c.sliding_window = 10;  // (9 + 16) / 4 -> 7, + 1 = 8 blocks <= 12
  EXPECT_EQ(c.MaxBlocksPerSequence(1000), 8);
  EXPECT_EQ(c.MaxBlocksPerSequence(12), 3);  // short: its own blocks
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  EXPECT_EQ(c.LongestSequenceInPool(), std::numeric_limits<int32_t>::max());
  Driver d(c);
  Request r = Req("long", 500, 400);
  r.params.n = 1;
  EXPECT_TRUE(d.sched->CheckAdmissible(500, r.params).ok());
  r.params.n = 2;  // 2 x 8 blocks > 12
  EXPECT_FALSE(d.sched->CheckAdmissible(500, r.params).ok());
  c.enable_chunked_prefill = false;
  c.max_num_batched_tokens = 1000;
  EXPECT_EQ(c.MaxBlocksPerSequence(1000), 250);
  EXPECT_FALSE(c.Validate().ok());
}

TEST(SchedulerTest, RequestLargerThanPoolIsRejectedAndTheNextRuns) {
  SchedulerConfig c = Config(20);  // 80 tokens
  c.max_model_len = 64;
  Driver d(c);
  // prompt + max_tokens over max_model_len: refused naming max_tokens and the
  // room (vLLM's rule), not cut short with "length" later.
  Request over = Req("big", 60, 30);
  const absl::Status too_long = d.sched->AddRequest(over);
  EXPECT_EQ(too_long.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(too_long), "max_tokens");
  EXPECT_NE(too_long.message().find("at most 4 tokens can be generated"), std::string::npos)
      << too_long;
  Request big = Req("big", 60, 4);  // 64 tokens = 16 blocks: fits, exactly max_model_len
  EXPECT_TRUE(d.sched->AddRequest(big).ok());
  Request huge = Req("huge", 30, 20);
  huge.params.n = 2;  // 2 x 50 tokens = 26 blocks > 20
  absl::Status s = d.sched->AddRequest(huge);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("KV blocks"), std::string::npos) << s;
  EXPECT_EQ(d.sched->CheckAdmissible(30, huge.params).message(), s.message());  // same bound
  EXPECT_EQ(FieldOf(s), "max_tokens");  // typed (field_error.h): the front ends read the field
  const absl::Status long_prompt = d.sched->AddRequest(Req("long", 64, 1));
  EXPECT_EQ(long_prompt.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FieldOf(long_prompt), "prompt");
  Request wide = Req("wide", 5, 1);
  wide.params.n = c.max_num_seqs + 1;
  EXPECT_EQ(FieldOf(d.sched->CheckAdmissible(5, wide.params)), "n") << c.max_num_seqs;
  wide.params.n = 1;
  wide.params.use_beam_search = true;
  wide.params.temperature = 0;
  wide.params.best_of = c.max_num_seqs + 1;
  EXPECT_EQ(FieldOf(d.sched->CheckAdmissible(5, wide.params)), "best_of");
  EXPECT_TRUE(d.sched->AddRequest(Req("next", 5, 3)).ok());
  ASSERT_TRUE(d.RunToCompletion());
  EXPECT_EQ(d.tokens["next"][0].size(), 3u);
  EXPECT_EQ(d.tokens["big"][0].size(), 4u);  // max_tokens, ending at max_model_len: 60 + 4 = 64
  EXPECT_EQ(d.reasons["big"][0], FinishReason::kLength);
  EXPECT_EQ(d.tokens.count("huge"), 0u);
}

// Beam search: the admission bound and max_num_seqs count beam_width
// sequences (best_of), not n; a beam request decodes in beam_width slots, its
// beams sharing the prompt blocks (forked), and ends with n outputs, each
// whole, capped by max_model_len like any sequence.
TEST(SchedulerTest, BeamSearchCountsTheBeamWidthAndSharesThePrompt) {
  SchedulerConfig c = Config(20);  // 80 tokens
  Driver d(c);
  Request beam = Req("beam", 30, 20);
  beam.params.use_beam_search = true;
  beam.params.n = 1;
  beam.params.best_of = 2;  // 2 x 50 tokens = 26 blocks > 20, although n = 1
  absl::Status s = d.sched->AddRequest(beam);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("the beam width 2"), std::string::npos) << s;
  beam.params.best_of = 9;  // > max_num_seqs 8
  EXPECT_NE(d.sched->AddRequest(beam).message().find("the beam width (9) exceeds --max-num-seqs"),
            std::string::npos);
  Request ok = Req("ok", 12, 8);
  ok.params.use_beam_search = true;
  ok.params.n = 2;
  ok.params.best_of = 3;
  ok.params.ignore_eos = false;
  ok.params.logprobs = 0;
  ASSERT_TRUE(d.sched->AddRequest(ok).ok());
  ASSERT_TRUE(d.Step());  // prefill: one sequence, top 6 logprobs asked of the worker
  ASSERT_EQ(d.plans[0].seqs.size(), 1u);
  EXPECT_EQ(d.plans[0].seqs[0].sampling.logprobs, 6);
  EXPECT_FALSE(d.plans[0].seqs[0].sampling.use_beam_search);
  EXPECT_TRUE(d.sched->FindRequest("ok")->seqs.size() == 3u);  // 3 live beams after the first step
  ASSERT_TRUE(d.Step());
  ASSERT_EQ(d.plans[1].seqs.size(), 3u);
  int forked = 0;
  for (const SequenceStep& st : d.plans[1].seqs) forked += st.fork_from != kNoSeq;
  EXPECT_EQ(forked, 2);  // one beam continues its parent in place, two fork
  // The 12-token prompt's 3 full blocks are shared by every beam.
  const SequenceGroup* g = d.sched->FindRequest("ok");
  for (const auto& b : g->seqs) {
    for (int i = 0; i < 3; ++i) EXPECT_EQ(b->block_table[i], g->seqs[0]->block_table[i]);
  }
  ASSERT_TRUE(d.RunToCompletion());
  ASSERT_EQ(d.tokens["ok"].size(), 2u);
  EXPECT_EQ(d.tokens["ok"][0].size(), 8u);
  EXPECT_EQ(d.tokens["ok"][1].size(), 8u);
  EXPECT_NE(d.tokens["ok"][0], d.tokens["ok"][1]);
  EXPECT_EQ(d.sched->block_manager().device().num_in_use(), 0);
}

TEST(SchedulerTest, ExactlyMaxTokensAndStopConditions) {
  SchedulerConfig c = Config(64);
  Driver d(c, /*eos=*/{999});
  for (int m : {1, 2, 7, 30})
    ASSERT_TRUE(d.sched->AddRequest(Req("m" + std::to_string(m), 5, m)).ok());
  ASSERT_TRUE(d.RunToCompletion());
  for (int m : {1, 2, 7, 30}) {
    EXPECT_EQ(d.tokens["m" + std::to_string(m)][0].size(), static_cast<size_t>(m));
    EXPECT_EQ(d.reasons["m" + std::to_string(m)][0], FinishReason::kLength);
  }
  // Learn what the fake model generates, then stop on its 3rd token.
  const std::vector<int32_t> free_run = d.tokens["m30"][0];
  Driver d2(c, /*eos=*/{free_run[2]});
  Request eos = Req("m30", 5, 30);
  eos.params.ignore_eos = false;
  ASSERT_TRUE(d2.sched->AddRequest(eos).ok());
  Request ignore = Req("ignore", 5, 30);  // same prompt, ignore_eos
  ASSERT_TRUE(d2.sched->AddRequest(ignore).ok());
  Request stop_id = Req("stopid", 5, 30);
  stop_id.params.stop_token_ids = {free_run[4]};
  ASSERT_TRUE(d2.sched->AddRequest(stop_id).ok());
  ASSERT_TRUE(d2.RunToCompletion());
  size_t first_eos = std::find(free_run.begin(), free_run.end(), free_run[2]) - free_run.begin();
  EXPECT_EQ(d2.tokens["m30"][0].size(), first_eos + 1);  // EOS is the last token
  EXPECT_EQ(d2.reasons["m30"][0], FinishReason::kStop);
  EXPECT_EQ(d2.tokens["ignore"][0].size(), 30u);
  size_t first_stop = std::find(free_run.begin(), free_run.end(), free_run[4]) - free_run.begin();
  EXPECT_EQ(d2.tokens["stopid"][0].size(), first_stop + 1);
  EXPECT_EQ(d2.reasons["stopid"][0], FinishReason::kStop);
}

TEST(SchedulerTest, ChunkedPrefillPutsDecodesFirstAndRespectsTheBudget) {
  SchedulerConfig c = Config(64);
  c.max_num_batched_tokens = 10;
  Driver d(c);
  ASSERT_TRUE(d.sched->AddRequest(Req("a", 3, 20)).ok());
  ASSERT_TRUE(d.Step());  // a prefilled
  ASSERT_TRUE(d.sched->AddRequest(Req("b", 25, 2)).ok());
  ASSERT_TRUE(d.Step());
  const StepPlan& p = d.plans.back();
  ASSERT_EQ(p.seqs.size(), 2u);
  EXPECT_FALSE(p.seqs[0].is_prefill());       // a's decode first
  EXPECT_EQ(p.seqs[1].token_ids.size(), 9u);  // b's first chunk fills the budget
  EXPECT_FALSE(p.seqs[1].sample);
  EXPECT_EQ(p.num_tokens(), 10);
  ASSERT_TRUE(d.RunToCompletion());
  for (const StepPlan& plan : d.plans) EXPECT_LE(plan.num_tokens(), 10);
  EXPECT_EQ(d.tokens["b"][0].size(), 2u);
}

// prefill_first: a waiting request's prefill runs alone while a request
// decodes; the decode resumes the step after; with nothing admissible the
// step is the usual decode step, never an empty one.
TEST(SchedulerTest, PrefillFirstRunsArrivalsAloneAndFallsBackToDecodes) {
  for (bool prefill_first : {false, true}) {
    SchedulerConfig c = Config(8);  // 32 tokens
    c.max_model_len = 32;
    c.max_num_batched_tokens = 16;
    c.max_num_seqs = 2;
    c.prefill_first = prefill_first;
    Driver d(c);
    ASSERT_TRUE(d.sched->AddRequest(Req("a", 3, 12)).ok());
    ASSERT_TRUE(d.Step());  // a prefilled
    ASSERT_TRUE(d.sched->AddRequest(Req("b", 6, 6)).ok());
    ASSERT_TRUE(d.Step());
    const StepPlan& p = d.plans.back();
    if (prefill_first) {
      ASSERT_EQ(p.seqs.size(), 1u);
      EXPECT_TRUE(p.seqs[0].is_prefill());
      EXPECT_EQ(p.seqs[0].token_ids.size(), 6u);
      ASSERT_TRUE(d.Step());  // a's decode and b's first decode together
      EXPECT_EQ(d.plans.back().seqs.size(), 2u);
      EXPECT_FALSE(d.plans.back().seqs[0].is_prefill());
      EXPECT_FALSE(d.plans.back().seqs[1].is_prefill());
    } else {
      ASSERT_EQ(p.seqs.size(), 2u);  // a's decode first, then b's prefill
      EXPECT_FALSE(p.seqs[0].is_prefill());
      EXPECT_TRUE(p.seqs[1].is_prefill());
    }
    // A request that cannot be admitted now (a and b fill --max-num-seqs)
    // leaves the step to the running decodes.
    ASSERT_TRUE(d.sched->AddRequest(Req("c", 26, 2)).ok());
    ASSERT_TRUE(d.Step());
    EXPECT_FALSE(d.plans.back().seqs.empty());
    for (const SequenceStep& st : d.plans.back().seqs) EXPECT_FALSE(st.is_prefill());
    ASSERT_TRUE(d.RunToCompletion());
    EXPECT_EQ(d.tokens["a"][0].size(), 12u);
    EXPECT_EQ(d.tokens["b"][0].size(), 6u);
    EXPECT_EQ(d.tokens["c"][0].size(), 2u);
  }
}

// A short request arriving while a long prompt is chunk-prefilled: by default
// the long prompt's chunks take the budget first and the short one waits for
// the whole prefill; with prefill_first it is admitted in the next step.
TEST(SchedulerTest, ShortArrivalBehindALongPrefillWaitsUnlessPrefillFirst) {
  for (bool prefill_first : {false, true}) {
    SchedulerConfig c = Config(64);
    c.max_model_len = 256;
    c.max_num_batched_tokens = 16;
    c.prefill_first = prefill_first;
    Driver d(c);
    ASSERT_TRUE(d.sched->AddRequest(Req("long", 160, 2)).ok());
    ASSERT_TRUE(d.Step());  // the first of 10 chunks
    ASSERT_TRUE(d.sched->AddRequest(Req("short", 5, 2)).ok());
    int steps_until_admitted = 0;
    bool admitted = false;
    while (!admitted && steps_until_admitted < 20) {
      ASSERT_TRUE(d.Step());
      ++steps_until_admitted;
      for (const SequenceStep& st : d.plans.back().seqs)
        admitted |= st.is_prefill() && st.token_ids.size() == 5u;
    }
    ASSERT_TRUE(admitted);
    EXPECT_EQ(steps_until_admitted, prefill_first ? 1 : 10) << "prefill_first " << prefill_first;
    ASSERT_TRUE(d.RunToCompletion());
    EXPECT_EQ(d.tokens["short"][0].size(), 2u);
    EXPECT_EQ(d.tokens["long"][0].size(), 2u);
  }
}

TEST(SchedulerTest, NoChunkingAdmitsWholePromptsOnly) {
  SchedulerConfig c = Config(64);
  c.enable_chunked_prefill = false;
  Driver d(c);
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE(d.sched->AddRequest(Req("r" + std::to_string(i), 30, 4)).ok());
  ASSERT_TRUE(d.RunToCompletion());
  for (const StepPlan& plan : d.plans) {
    for (const SequenceStep& s : plan.seqs) {
      if (s.is_prefill()) {
        EXPECT_EQ(s.token_ids.size(), 30u);
      }
    }
  }
}

TEST(SchedulerTest, AbortInTheMiddleOfAPrefillChunkFreesEverything) {
  SchedulerConfig c = Config(64);
  c.max_num_batched_tokens = 8;
  c.enable_prefix_caching = true;
  Driver d(c);
  ASSERT_TRUE(d.sched->AddRequest(Req("x", 30, 5)).ok());
  ASSERT_TRUE(d.Step());            // chunk 1 (8 tokens)
  auto plan = d.sched->Schedule();  // chunk 2 in flight
  ASSERT_TRUE(plan.ok());
  const SeqId id = plan->seqs[0].seq_id;
  ASSERT_TRUE(d.sched->Abort("x").ok());
  StepResult r;
  ASSERT_TRUE(d.engine.Run(*plan, &r).ok());
  auto outs = d.sched->ProcessResult(r);
  ASSERT_TRUE(outs.ok());
  EXPECT_TRUE(outs->empty());
  auto next = d.sched->Schedule();
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->finished, std::vector<SeqId>{id});
  EXPECT_TRUE(next->seqs.empty());
  EXPECT_FALSE(d.sched->HasUnfinishedRequests());
  EXPECT_EQ(d.sched->block_manager().device().num_in_use(), 0);
  // Only the 16 computed tokens' full blocks (4) were offered to the cache.
  EXPECT_EQ(d.sched->block_manager().device().num_evictable(), 4);
  EXPECT_EQ(d.sched->Abort("x").code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(d.sched->ProcessResult({next->step_id, {}, 0, 0, {}, {}, {}}).ok());
  EXPECT_TRUE(d.sched->CheckInvariants().ok());
}

// Config(64) with n-gram speculation: up to 2 drafts from 1- or 2-token matches.
SchedulerConfig NgramConfig() {
  SchedulerConfig c = Config(64);
  c.speculative.method = "ngram";
  c.speculative.num_speculative_tokens = 2;
  c.speculative.prompt_lookup_min = 1;
  c.speculative.prompt_lookup_max = 2;
  return c;
}

// A verification entry (draft tokens) whose rows after the first rejected
// draft could not be sampled runs on: those rows are discarded. Only a
// failure of the emitted row fails the request, and it frees the blocks the
// step appended at once (the table matches the computed tokens).
TEST(SchedulerTest, UnsampleableRowsOfRejectedDraftsAreDiscarded) {
  for (const bool emitted_row_fails : {false, true}) {
    SCOPED_TRACE(emitted_row_fails ? "the emitted row fails" : "a discarded row fails");
    const SchedulerConfig c = NgramConfig();
    auto sched = *Scheduler::Create(c, {});
    Request r = Req("r", 0, 10);
    r.prompt_token_ids = {5, 6, 5, 6, 5};
    ASSERT_TRUE(sched->AddRequest(r).ok());
    auto plan = sched->Schedule();  // the prompt
    ASSERT_TRUE(plan.ok()) << plan.status();
    const SeqId id = plan->seqs[0].seq_id;
    StepResult first{plan->step_id, {Tok(id, 6)}, 0, 0, {}, {}, {}};
    ASSERT_TRUE(sched->ProcessResult(first).ok());
    plan = sched->Schedule();  // 6 fed, drafts 5, 6 (what followed "5 6" before)
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->seqs.size(), 1u);
    ASSERT_EQ(plan->seqs[0].num_draft_tokens, 2);
    StepResult verify{plan->step_id, {}, 0, 0, {}, {}, {}};
    // Row 0 rejects the first draft (7, not 5); rows 1-2 are past it.
    verify.tokens = {Tok(id, emitted_row_fails ? kNoToken : 7), Tok(id, kNoToken),
                     Tok(id, kNoToken)};
    verify.failed = {{id, "sampler row 1 (seq 0): logit of token 3 is nan"}};
    auto outs = sched->ProcessResult(verify);
    ASSERT_TRUE(outs.ok()) << outs.status();
    ASSERT_EQ(outs->size(), 1u);
    const RequestOutput& o = (*outs)[0];
    EXPECT_TRUE(sched->CheckInvariants().ok()) << sched->CheckInvariants();
    if (emitted_row_fails) {
      EXPECT_TRUE(o.finished);
      EXPECT_NE(o.error.find("is nan"), std::string::npos) << o.error;
      auto next = sched->Schedule();  // releases it
      ASSERT_TRUE(next.ok());
      EXPECT_EQ(next->finished, std::vector<SeqId>{id});
      EXPECT_EQ(sched->block_manager().device().num_in_use(), 0);
    } else {
      EXPECT_TRUE(o.error.empty()) << o.error;
      EXPECT_FALSE(o.finished);
      ASSERT_EQ(o.seqs.size(), 1u);
      ASSERT_EQ(o.seqs[0].new_tokens.size(), 1u);
      EXPECT_EQ(o.seqs[0].new_tokens[0].token_id, 7);
      EXPECT_TRUE(sched->HasUnfinishedRequests());
    }
  }
}

// A draft model's placeholders: the plan feeds the last token and k
// kNoToken drafts; the result must bring the worker's proposal for them
// (StepResult::drafts), which acceptance then reads. A result without it, or
// with the wrong count, is refused with the scheduler's state unchanged.
TEST(SchedulerTest, DraftModelProposalsComeBackInTheResult) {
  SchedulerConfig c = Config(64);
  c.speculative.method = "draft_model";
  c.speculative.model = "draft.gguf";
  c.speculative.num_speculative_tokens = 3;
  auto sched = *Scheduler::Create(c, {});
  Request r = Req("r", 0, 10);
  r.prompt_token_ids = {5, 6, 7};
  ASSERT_TRUE(sched->AddRequest(r).ok());
  auto plan = sched->Schedule();  // the prompt: no drafts
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->seqs[0].num_draft_tokens, 0);
  const SeqId id = plan->seqs[0].seq_id;
  ASSERT_TRUE(sched->ProcessResult({plan->step_id, {Tok(id, 8)}, 0, 0, {}, {}, {}}).ok());
  plan = sched->Schedule();
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->seqs[0].num_draft_tokens, 3);
  EXPECT_EQ(plan->seqs[0].token_ids, (std::vector<int32_t>{8, kNoToken, kNoToken, kNoToken}));
  StepResult verify{
      plan->step_id, {Tok(id, 9), Tok(id, 10), Tok(id, 4), Tok(id, 2)}, 0, 0, {}, {}, {}};
  // No proposal, a short one, another sequence's: refused.
  for (const std::vector<ProposedDraft>& bad : std::vector<std::vector<ProposedDraft>>{
           {}, {{id, {9, 10}}}, {{id + 1, {9, 10, 11}}}, {{id, {9, 10, 11}}, {id, {1, 1, 1}}}}) {
    verify.drafts = bad;
    auto outs = sched->ProcessResult(verify);
    EXPECT_EQ(outs.status().code(), absl::StatusCode::kInvalidArgument) << outs.status();
    EXPECT_TRUE(sched->CheckInvariants().ok());
  }
  // Drafts 9, 10, 11; the target drew 9, 10, 4: two accepted, then 4.
  verify.drafts = {{id, {9, 10, 11}}};
  auto outs = sched->ProcessResult(verify);
  ASSERT_TRUE(outs.ok()) << outs.status();
  ASSERT_EQ(outs->size(), 1u);
  std::vector<int32_t> emitted;
  for (const SampledToken& t : (*outs)[0].seqs[0].new_tokens) emitted.push_back(t.token_id);
  EXPECT_EQ(emitted, (std::vector<int32_t>{9, 10, 4}));
  EXPECT_EQ(sched->stats().spec_draft_tokens, 3);
  EXPECT_EQ(sched->stats().spec_accepted_tokens, 2);
  EXPECT_TRUE(sched->CheckInvariants().ok()) << sched->CheckInvariants();
}

// Structured output is not speculated: the worker's grammar mask for a
// verification row would follow the whole history, drafts included.
TEST(SchedulerTest, StructuredOutputRequestsGetNoDrafts) {
  for (const bool constrained : {false, true}) {
    const SchedulerConfig c = NgramConfig();
    auto sched = *Scheduler::Create(c, {});
    Request r = Req("r", 0, 10);
    r.prompt_token_ids = {5, 6, 5, 6, 5};
    if (constrained) r.params.structured_output.kind = StructuredOutput::Kind::kJsonObject;
    ASSERT_TRUE(sched->AddRequest(r).ok());
    auto plan = sched->Schedule();
    ASSERT_TRUE(plan.ok()) << plan.status();
    StepResult first{plan->step_id, {Tok(plan->seqs[0].seq_id, 6)}, 0, 0, {}, {}, {}};
    ASSERT_TRUE(sched->ProcessResult(first).ok());
    plan = sched->Schedule();
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->seqs[0].num_draft_tokens, constrained ? 0 : 2) << constrained;
  }
}

TEST(SchedulerTest, FinishRequestForAStopStringEndsItNextStep) {
  Driver d(Config(64));
  ASSERT_TRUE(d.sched->AddRequest(Req("s", 4, 50)).ok());
  ASSERT_TRUE(d.Step());
  ASSERT_TRUE(d.Step());
  ASSERT_TRUE(d.sched->FinishRequest("s", FinishReason::kStop).ok());
  ASSERT_TRUE(d.Step());
  EXPECT_FALSE(d.sched->HasUnfinishedRequests());
  EXPECT_EQ(d.plans.back().finished.size(), 1u);
  EXPECT_EQ(d.sched->block_manager().device().num_in_use(), 0);
}

TEST(SchedulerTest, SharedSystemPromptHitsThePrefixCache) {
  SchedulerConfig c = Config(64);
  c.enable_prefix_caching = true;
  Driver d(c);
  Request a = Req("a", 20, 3);  // 20-token "system prompt" + nothing
  ASSERT_TRUE(d.sched->AddRequest(a).ok());
  ASSERT_TRUE(d.RunToCompletion());
  Request b = Req("b", 20, 3);
  b.prompt_token_ids.insert(b.prompt_token_ids.end(), {500, 501, 502});  // same prefix + question
  ASSERT_TRUE(d.sched->AddRequest(b).ok());
  ASSERT_TRUE(d.Step());
  const SequenceStep& s = d.plans.back().seqs[0];
  EXPECT_EQ(s.start_pos, 20);  // 5 full blocks from the cache
  EXPECT_EQ(s.token_ids.size(), 3u);
  EXPECT_EQ(s.cached_prefix_token_ids.size(), 20u);
  EXPECT_TRUE(s.new_state);
  const SchedulerStats st = d.sched->stats();
  EXPECT_EQ(st.prefix_cache_queries, 20 + 23);
  EXPECT_EQ(st.prefix_cache_hits, 20);
  ASSERT_TRUE(d.RunToCompletion());
}

// Plans are incremental: the first step carries everything, later decodes only
// the fed token and the block-table entry of a block they open.
// Prompt logprobs: the parent's prefill chunks are flagged with the prompt
// token after each chunk; the request skips the prefix cache; the scored
// entries reach its first output once, in position order (a position scored
// again, as after a recompute preemption, is not appended twice); an entry
// for a sequence that does not score its prompt is refused.
TEST(SchedulerTest, PromptLogprobsFlagChunksAndReachTheFirstOutputOnce) {
  SchedulerConfig c = Config(64);
  c.enable_prefix_caching = true;
  c.max_num_batched_tokens = 8;
  Driver d(c);
  ASSERT_TRUE(d.sched->AddRequest(Req("warm", 20, 1, 100)).ok());
  ASSERT_TRUE(d.RunToCompletion());
  Request r = Req("p", 20, 2, 100);  // the same prompt: cached, but must not be read
  r.params.prompt_logprobs = 2;
  r.params.n = 2;
  ASSERT_TRUE(d.sched->AddRequest(r).ok());
  std::vector<PromptLogprob> got;
  int outputs_with_them = 0;
  for (int step = 0; step < 50 && d.sched->HasUnfinishedRequests(); ++step) {
    auto plan = d.sched->Schedule();
    ASSERT_TRUE(plan.ok()) << plan.status();
    StepResult result;
    ASSERT_TRUE(d.engine.Run(*plan, &result).ok());
    for (const SequenceStep& st : plan->seqs) {
      const bool prefill = st.start_pos + static_cast<int32_t>(st.token_ids.size()) <= 20;
      EXPECT_EQ(st.prompt_logprobs, prefill) << "step " << step;
      if (!st.prompt_logprobs) continue;
      if (step == 0) {
        EXPECT_EQ(st.start_pos, 0);  // no prefix-cache hit
      }
      const int32_t end = st.context_len();
      EXPECT_EQ(st.next_prompt_token, end < 20 ? 100 + end : -1);
      for (int32_t pos = st.start_pos + 1; pos <= end && pos < 20; ++pos) {
        PromptLogprob lp;
        lp.seq_id = st.seq_id;
        lp.position = pos;
        lp.token_id = 100 + pos;
        result.prompt_logprobs.push_back(lp);
        if (pos == 9) result.prompt_logprobs.push_back(result.prompt_logprobs[0]);  // again
      }
    }
    auto outs = d.sched->ProcessResult(result);
    ASSERT_TRUE(outs.ok()) << outs.status();
    for (const RequestOutput& o : *outs) {
      if (o.prompt_logprobs.empty()) continue;
      got = o.prompt_logprobs;
      ++outputs_with_them;
    }
  }
  EXPECT_FALSE(d.sched->HasUnfinishedRequests());
  EXPECT_EQ(outputs_with_them, 1);
  ASSERT_EQ(got.size(), 19u);
  for (int32_t i = 0; i < 19; ++i) EXPECT_EQ(got[i].position, i + 1);
  // A result scoring a sequence the plan did not flag: refused, state kept.
  ASSERT_TRUE(d.sched->AddRequest(Req("q", 4, 2)).ok());
  auto plan = d.sched->Schedule();
  ASSERT_TRUE(plan.ok());
  StepResult result;
  ASSERT_TRUE(d.engine.Run(*plan, &result).ok());
  result.prompt_logprobs.push_back(PromptLogprob{plan->seqs[0].seq_id, 1, 2, -1.0f, 1, {}, {}});
  auto bad = d.sched->ProcessResult(result);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prompt logprobs"), std::string::npos) << bad.status();
  result.prompt_logprobs.clear();
  ASSERT_TRUE(d.sched->ProcessResult(result).ok());
  ASSERT_TRUE(d.RunToCompletion());
}

TEST(SchedulerTest, DecodePlansCarryOnlyWhatChanged) {
  Driver d(Config(64));
  Request r = Req("inc", 6, 12);
  r.params.temperature = 0.5f;
  r.params.stop_token_ids = {999};
  ASSERT_TRUE(d.sched->AddRequest(r).ok());
  ASSERT_TRUE(d.RunToCompletion());
  ASSERT_EQ(d.plans.size(), 12u);
  const SequenceStep& first = d.plans[0].seqs[0];
  EXPECT_TRUE(first.new_state);
  EXPECT_EQ(first.block_table_start, 0);
  EXPECT_EQ(first.block_table.size(), 2u);  // 6 tokens in blocks of 4
  EXPECT_EQ(first.sampling.temperature, 0.5f);
  EXPECT_EQ(first.sampling.stop_token_ids, std::vector<int32_t>{999});
  for (size_t i = 1; i < d.plans.size(); ++i) {
    SCOPED_TRACE(i);
    const SequenceStep& st = d.plans[i].seqs[0];
    const int32_t pos = st.start_pos;  // the fed token's position
    EXPECT_FALSE(st.starts());
    EXPECT_TRUE(st.sampling.stop_token_ids.empty());  // constants not repeated
    EXPECT_EQ(st.block_table_start, (pos + 3) / 4);   // blocks held before this token
    EXPECT_EQ(st.block_table.size(), pos % 4 == 0 ? 1u : 0u);
  }
}

TEST(SchedulerTest, ParallelSamplingForksSiblingsSharingThePrompt) {
  SchedulerConfig c = Config(64);
  Driver d(c);
  Request r = Req("n4", 10, 6);
  r.params.n = 4;
  r.params.temperature = 1.0f;
  ASSERT_TRUE(d.sched->AddRequest(r).ok());
  ASSERT_TRUE(d.Step());
  EXPECT_EQ(d.plans[0].seqs[0].num_samples, 4);
  EXPECT_EQ(d.sched->block_manager().device().num_in_use(), 3);  // prompt blocks shared
  ASSERT_TRUE(d.Step());
  int forks = 0;
  for (const SequenceStep& s : d.plans[1].seqs) forks += s.fork_from != kNoSeq;
  EXPECT_EQ(forks, 3);
  EXPECT_EQ(d.plans[1].copy.size(), 3u);  // the shared partial block, copied for 3 of 4
  ASSERT_TRUE(d.RunToCompletion());
  ASSERT_EQ(d.tokens["n4"].size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(d.tokens["n4"][i].size(), 6u);
  EXPECT_NE(d.tokens["n4"][0], d.tokens["n4"][1]);
}

// Adds "old" (8 prompt tokens, 30 to generate) and then "g", an n = 4 sampled
// group (9 prompt tokens, 30 each). "old" arrives first, so the group is the
// newest: the recompute-preemption victim.
void AddOldThenGroupOfFour(Driver& d) {
  EXPECT_TRUE(d.sched->AddRequest(Req("old", 8, 30, 300)).ok());
  Request g = Req("g", 9, 30);
  g.params.n = 4;
  g.params.temperature = 1.0f;
  g.arrival_time = 1.0;
  EXPECT_TRUE(d.sched->AddRequest(g).ok());
}

// n = 4 group preempted by recompute resumes with every sibling's tokens.
TEST(SchedulerTest, RecomputePreemptionOfAGroupKeepsAllSiblingsTokens) {
  // Reference: a pool large enough that nothing is preempted.
  auto run = [](int32_t blocks, int64_t* preemptions) {
    SchedulerConfig c = Config(blocks);
    c.max_model_len = 48;
    Driver d(c);
    AddOldThenGroupOfFour(d);
    bool g_preempted = false;
    for (int i = 0; i < 3000 && d.sched->HasUnfinishedRequests(); ++i) {
      if (!d.Step()) break;
      const SequenceGroup* grp = d.sched->FindRequest("g");
      g_preempted |= grp && grp->forked && grp->status == SequenceStatus::kWaiting;
    }
    EXPECT_FALSE(d.sched->HasUnfinishedRequests());
    *preemptions = g_preempted ? d.sched->stats().num_preemptions_recompute : 0;
    return d.tokens;
  };
  int64_t p_big = 0, p_small = 0;
  auto ref = run(200, &p_big);
  auto got = run(40, &p_small);  // n * 39 tokens need 40 blocks alone
  EXPECT_EQ(p_big, 0);
  EXPECT_GT(p_small, 0);
  EXPECT_EQ(got, ref);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(got["g"][i].size(), 30u);
}

// After a recompute preemption with a small token budget, siblings re-prefill
// in different steps while the others already decode: the request appears
// among both the decodes and the prefills of a step.
TEST(SchedulerTest, SiblingsSplitBetweenDecodeAndPrefillInOneStep) {
  auto run = [](int32_t blocks, bool* split) {
    SchedulerConfig c = Config(blocks);
    c.max_model_len = 48;
    c.max_num_batched_tokens = 12;
    Driver d(c);
    AddOldThenGroupOfFour(d);
    for (int i = 0; i < 3000 && d.sched->HasUnfinishedRequests(); ++i) {
      std::set<SeqId> ids;
      if (const SequenceGroup* grp = d.sched->FindRequest("g")) {
        for (const auto& s : grp->seqs) ids.insert(s->id);
      }
      if (!d.Step()) break;
      bool dec = false, pre = false;
      for (const SequenceStep& s : d.plans.back().seqs) {
        if (!ids.count(s.seq_id)) continue;
        (s.is_prefill() ? pre : dec) = true;
      }
      *split |= dec && pre;
    }
    EXPECT_FALSE(d.sched->HasUnfinishedRequests());
    return d.tokens;
  };
  bool split_ref = false, split = false;
  auto ref = run(200, &split_ref);
  auto got = run(40, &split);
  EXPECT_TRUE(split);
  EXPECT_EQ(got, ref);
}

TEST(SchedulerTest, SwapPreemptionRestoresIdenticalBlocks) {
  auto run = [](int32_t blocks, PreemptionMode mode, int32_t cpu, SchedulerStats* st) {
    SchedulerConfig c = Config(blocks, cpu);
    c.preemption_mode = mode;
    c.max_model_len = 40;
    Driver d(c);
    for (int i = 0; i < 6; ++i)
      EXPECT_TRUE(
          d.sched->AddRequest(Req("r" + std::to_string(i), 6 + i, std::min(30, 34 - i), 50 * i))
              .ok());
    EXPECT_TRUE(d.RunToCompletion());
    *st = d.sched->stats();
    return d.tokens;
  };
  SchedulerStats big, swap, fallback;
  auto ref = run(400, PreemptionMode::kSwap, 100, &big);
  auto got = run(24, PreemptionMode::kSwap, 100, &swap);
  auto fb = run(24, PreemptionMode::kSwap, 2, &fallback);
  EXPECT_EQ(big.num_preemptions_swap + big.num_preemptions_recompute, 0);
  EXPECT_GT(swap.num_preemptions_swap, 0);
  EXPECT_GT(fallback.num_swap_fallbacks, 0);
  EXPECT_GT(fallback.num_preemptions_recompute, 0);
  EXPECT_EQ(got, ref);
  EXPECT_EQ(fb, ref);
}

TEST(SchedulerTest, VictimIsTheMostRecentlyArrivedRunningRequest) {
  SchedulerConfig c = Config(16);
  c.max_model_len = 48;
  Driver d(c);
  Request a = Req("old", 20, 28);  // 48 tokens: max_model_len
  a.arrival_time = 1.0;
  Request b = Req("new", 20, 28, 100);
  b.arrival_time = 2.0;
  ASSERT_TRUE(d.sched->AddRequest(a).ok());
  ASSERT_TRUE(d.sched->AddRequest(b).ok());
  bool saw = false;
  for (int i = 0; i < 200 && d.sched->HasUnfinishedRequests() && !saw; ++i) {
    ASSERT_TRUE(d.Step());
    if (d.sched->stats().num_preemptions_recompute > 0) {
      saw = true;
      EXPECT_EQ(d.sched->FindRequest("new")->status, SequenceStatus::kWaiting);
      EXPECT_EQ(d.sched->FindRequest("old")->status, SequenceStatus::kRunning);
    }
  }
  EXPECT_TRUE(saw);
  ASSERT_TRUE(d.RunToCompletion());
}

TEST(SchedulerTest, PriorityOrdersAdmission) {
  SchedulerConfig c = Config(64);
  c.enable_priority = true;
  c.max_num_seqs = 1;
  c.max_num_batched_tokens = 64;
  Driver d(c);
  Request low = Req("low", 4, 2);
  low.priority = 5;
  Request high = Req("high", 4, 2, 20);
  high.priority = 0;
  high.arrival_time = 10;
  ASSERT_TRUE(d.sched->AddRequest(low).ok());
  ASSERT_TRUE(d.sched->AddRequest(high).ok());
  ASSERT_TRUE(d.Step());
  EXPECT_EQ(d.plans[0].seqs[0].token_ids[0], 20);
  ASSERT_TRUE(d.RunToCompletion());
}

// The preemption victim under priority scheduling: "low" (priority 5) arrives
// first, "mid" (1) second, "high" (0) last. All three are admitted (2 prompt
// blocks each of 16) and grow by decoding until the pool is full: the victim
// must be "low", the lowest priority, although it is the oldest request;
// with priorities off the same workload preempts "high", the newest (the
// negative control: the check tells the two policies apart). Under swap the
// victim's blocks are exactly what goes to the CPU pool; under recompute its
// sequence ids are exactly the plan's finished list.
std::string FirstPreemptionVictim(bool priority, PreemptionMode mode) {
  SchedulerConfig c = Config(16, 16);
  c.enable_priority = priority;
  c.preemption_mode = mode;
  c.max_model_len = 48;
  Driver d(c);
  const std::vector<std::pair<std::string, int32_t>> reqs = {{"low", 5}, {"mid", 1}, {"high", 0}};
  for (size_t i = 0; i < reqs.size(); ++i) {
    Request r = Req(reqs[i].first, 8, 30, 100 * static_cast<int32_t>(i + 1));
    r.priority = reqs[i].second;
    r.arrival_time = 1.0 + static_cast<double>(i);
    EXPECT_TRUE(d.sched->AddRequest(r).ok());
  }
  if (!d.Step()) return "";  // admits all three: 3 x 2 blocks of 16
  std::string victim;
  for (int step = 1; step < 200 && d.sched->HasUnfinishedRequests() && victim.empty(); ++step) {
    std::map<std::string, std::vector<int32_t>> tables;
    std::map<std::string, SeqId> ids;
    for (const auto& [name, prio] : reqs) {
      const SequenceGroup* g = d.sched->FindRequest(name);
      EXPECT_NE(g, nullptr) << name << " finished before any preemption";
      if (g == nullptr) return "";
      EXPECT_EQ(g->status, SequenceStatus::kRunning) << name << " at step " << step;
      tables[name] = g->seqs[0]->block_table;
      ids[name] = g->seqs[0]->id;
    }
    const SchedulerStats before = d.sched->stats();
    if (!d.Step()) return "";
    const SchedulerStats after = d.sched->stats();
    if (after.num_preemptions_swap + after.num_preemptions_recompute ==
        before.num_preemptions_swap + before.num_preemptions_recompute) {
      continue;
    }
    EXPECT_EQ(after.num_preemptions_swap + after.num_preemptions_recompute,
              before.num_preemptions_swap + before.num_preemptions_recompute + 1)
        << "one victim frees enough for one decode step";
    const StepPlan& plan = d.plans.back();
    for (const auto& [name, prio] : reqs) {
      const SequenceStatus st = d.sched->FindRequest(name)->status;
      if (st == SequenceStatus::kRunning) continue;
      EXPECT_TRUE(victim.empty()) << "second victim " << name;
      victim = name;
      if (mode == PreemptionMode::kSwap) {
        EXPECT_EQ(st, SequenceStatus::kSwapped);
        std::vector<int32_t> swapped;
        for (const BlockPair& p : plan.swap_out) swapped.push_back(p.src);
        std::sort(swapped.begin(), swapped.end());
        std::sort(tables[name].begin(), tables[name].end());
        EXPECT_EQ(swapped, tables[name]) << "the victim's blocks, and only them, swapped out";
      } else {
        EXPECT_EQ(st, SequenceStatus::kWaiting);
        EXPECT_EQ(plan.finished, std::vector<SeqId>{ids[name]})
            << "the victim's sequence, and only it, released";
      }
    }
  }
  EXPECT_TRUE(d.RunToCompletion());
  for (const auto& [name, prio] : reqs) EXPECT_EQ(d.tokens[name][0].size(), 30u) << name;
  return victim;
}

TEST(SchedulerTest, PreemptionVictimIsTheLowestPriorityRequest) {
  for (PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    SCOPED_TRACE(mode == PreemptionMode::kSwap ? "swap" : "recompute");
    EXPECT_EQ(FirstPreemptionVictim(/*priority=*/true, mode), "low");
    // Negative control: arrival order alone picks the newest request.
    EXPECT_EQ(FirstPreemptionVictim(/*priority=*/false, mode), "high");
  }
}

TEST(SchedulerTest, BadResultsAreRejectedWithoutChangingState) {
  Driver d(Config(64));
  ASSERT_TRUE(d.sched->AddRequest(Req("a", 4, 3)).ok());
  auto plan = d.sched->Schedule();
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(d.sched->Schedule().status().code(), absl::StatusCode::kFailedPrecondition);
  StepResult wrong_step{plan->step_id + 1, {}, 0, 0, {}, {}, {}};
  EXPECT_EQ(d.sched->ProcessResult(wrong_step).status().code(), absl::StatusCode::kInvalidArgument);
  StepResult missing{plan->step_id, {}, 0, 0, {}, {}, {}};
  EXPECT_EQ(d.sched->ProcessResult(missing).status().code(), absl::StatusCode::kInvalidArgument);
  StepResult extra{plan->step_id, {}, 0, 0, {}, {}, {}};
  extra.tokens.push_back(Tok(plan->seqs[0].seq_id, 3));
  extra.tokens.push_back(Tok(12345, 3));
  EXPECT_EQ(d.sched->ProcessResult(extra).status().code(), absl::StatusCode::kInvalidArgument);
  StepResult ok{plan->step_id, {}, 0, 0, {}, {}, {}};
  ok.tokens.push_back(Tok(plan->seqs[0].seq_id, 3));
  EXPECT_TRUE(d.sched->ProcessResult(ok).ok());
  EXPECT_EQ(d.sched->AddRequest(Req("a", 4, 3)).code(), absl::StatusCode::kAlreadyExists);
  Request bad = Req("b", 4, 3);
  bad.params.top_p = 2.0f;
  EXPECT_EQ(d.sched->AddRequest(bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.sched->AddRequest(Req("empty", 0, 3)).code(), absl::StatusCode::kInvalidArgument);
}

void ExpectSamePlan(const StepPlan& a, const StepPlan& b, size_t step) {
  SCOPED_TRACE(::testing::Message() << "plan " << step);
  EXPECT_EQ(a.step_id, b.step_id);
  EXPECT_EQ(a.swap_out, b.swap_out);
  EXPECT_EQ(a.swap_in, b.swap_in);
  EXPECT_EQ(a.copy, b.copy);
  EXPECT_EQ(a.finished, b.finished);
  EXPECT_EQ(a.shutdown, b.shutdown);
  ASSERT_EQ(a.seqs.size(), b.seqs.size());
  for (size_t i = 0; i < a.seqs.size(); ++i) {
    const SequenceStep& x = a.seqs[i];
    const SequenceStep& y = b.seqs[i];
    SCOPED_TRACE(::testing::Message() << "entry " << i << " sequence " << x.seq_id);
    EXPECT_EQ(x.seq_id, y.seq_id);
    EXPECT_EQ(x.fork_from, y.fork_from);
    EXPECT_EQ(x.token_ids, y.token_ids);
    EXPECT_EQ(x.start_pos, y.start_pos);
    EXPECT_EQ(x.block_table_start, y.block_table_start);
    EXPECT_EQ(x.block_table, y.block_table);
    EXPECT_EQ(x.sample, y.sample);
    EXPECT_EQ(x.num_samples, y.num_samples);
    EXPECT_EQ(x.new_state, y.new_state);
    EXPECT_EQ(x.sample_index, y.sample_index);
    EXPECT_TRUE(x.sampling == y.sampling);
    EXPECT_EQ(x.num_prompt_tokens, y.num_prompt_tokens);
    EXPECT_EQ(x.cached_prefix_token_ids, y.cached_prefix_token_ids);
  }
}

// Schedule(recycled plan) builds, in the old plan's memory, exactly the plan
// Schedule() builds: every field of every entry, over starts (prefix-cache
// hits with cached_prefix_token_ids, forks for n > 1 and beams, re-admission
// after preemption) landing in entries that held continuing sequences and
// the other way round, under both preemption modes.
TEST(SchedulerTest, RecycledPlansEqualFreshOnes) {
  for (PreemptionMode mode : {PreemptionMode::kSwap, PreemptionMode::kRecompute}) {
    SCOPED_TRACE(mode == PreemptionMode::kSwap ? "swap" : "recompute");
    SchedulerConfig c = Config(28, 40);  // 112 device tokens: preemption
    c.enable_prefix_caching = true;
    c.preemption_mode = mode;
    c.max_num_batched_tokens = 24;  // chunked prompts
    Driver fresh(c), recycled(c);
    recycled.recycle_plans = true;
    for (Driver* d : {&fresh, &recycled}) {
      ASSERT_TRUE(d->sched->AddRequest(Req("a", 13, 20)).ok());
      Request b = Req("b", 17, 9);  // shares a's first 3 blocks: a prefix-cache hit
      b.params.n = 3;
      b.params.temperature = 0.7f;
      b.params.seed = 5;
      ASSERT_TRUE(d->sched->AddRequest(b).ok());
      Request beam = Req("beam", 6, 7, 100);
      beam.params.use_beam_search = true;
      beam.params.best_of = 2;
      ASSERT_TRUE(d->sched->AddRequest(beam).ok());
      for (int i = 0; i < 5; ++i) {
        ASSERT_TRUE(d->sched->AddRequest(Req("r" + std::to_string(i), 9 + 5 * i, 12, 1)).ok());
      }
    }
    ASSERT_TRUE(fresh.RunToCompletion());
    ASSERT_TRUE(recycled.RunToCompletion());
    ASSERT_EQ(fresh.plans.size(), recycled.plans.size());
    for (size_t i = 0; i < fresh.plans.size(); ++i) {
      ExpectSamePlan(fresh.plans[i], recycled.plans[i], i);
    }
    EXPECT_EQ(fresh.tokens, recycled.tokens);
    const SchedulerStats st = fresh.sched->stats();
    EXPECT_GT(st.prefix_cache_hits, 0);  // the scenario covers what it claims
    EXPECT_GT(st.num_preemptions_swap + st.num_preemptions_recompute, 0);
  }
}

}  // namespace
}  // namespace pagedserve
