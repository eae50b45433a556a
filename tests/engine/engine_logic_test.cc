// Engine logic without a model: a scripted executor emits known tokens (SmolLM2
// tokenizer), so stop strings, held-back text, per-sample stops, abort,
// validation, failures and preemption are checked against exact expectations.
#include <algorithm>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/common/field_error.h"
#include "runtime/engine/engine.h"
#include "runtime/tokenizer/loaders.h"
#include "tests/common/fixture_tokenizer.h"
#include "tests/engine/metrics_probe.h"
#include "tests/engine/scripted_executor.h"

namespace pagedserve {
namespace {

using testing::ScriptedExecutor;

const Tokenizer& Tok() { return testing::FixtureTokenizer(); }

std::vector<int32_t> Ids(const std::string& text) {
  EncodeOptions o;
  o.add_special_tokens = false;
  return Tok().Encode(text, o);
}

std::string Decode(const std::vector<int32_t>& ids) {
  auto r = Tok().Decode(ids);
  return r.ok() ? *r : "<decode error>";
}

// Everything one request produced, per sample index.
struct Collected {
  std::vector<std::vector<std::string>> deltas;
  std::vector<std::string> text;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  std::vector<std::string> reason;
  bool finished = false;
  Usage usage;
  absl::Status error;
};

void Collect(const std::vector<EngineOutput>& outs, std::map<std::string, Collected>* all) {
  for (const EngineOutput& o : outs) {
    Collected& c = (*all)[o.request_id];
    EXPECT_FALSE(c.finished) << o.request_id << ": output after the final one";
    for (const SequenceDelta& d : o.deltas) {
      const size_t i = d.index;
      if (c.text.size() <= i) {
        c.deltas.resize(i + 1), c.text.resize(i + 1), c.tokens.resize(i + 1),
            c.logprobs.resize(i + 1), c.reason.resize(i + 1);
      }
      EXPECT_TRUE(c.reason[i].empty()) << o.request_id << "[" << i << "]: delta after its finish";
      EXPECT_EQ(SanitizeUtf8(d.text, true), d.text) << "broken UTF-8 in a delta";
      c.deltas[i].push_back(d.text);
      c.text[i] += d.text;
      c.tokens[i].insert(c.tokens[i].end(), d.token_ids.begin(), d.token_ids.end());
      c.logprobs[i].insert(c.logprobs[i].end(), d.logprobs.begin(), d.logprobs.end());
      if (d.finished) c.reason[i] = std::string(FinishReasonName(d.finish_reason));
    }
    if (o.finished) {
      c.finished = true;
      c.usage = o.usage;
      c.error = o.error;
    }
  }
}

// Steps until nothing is left, checking the scheduler's invariants each step.
std::map<std::string, Collected> RunAll(Engine& e, int max_steps = 2000) {
  std::map<std::string, Collected> all;
  for (int i = 0; i < max_steps && e.HasUnfinishedRequests(); ++i) {
    auto outs = e.Step();
    EXPECT_TRUE(outs.ok()) << outs.status();
    if (!outs.ok()) break;
    Collect(*outs, &all);
    EXPECT_TRUE(e.scheduler().CheckInvariants().ok()) << e.scheduler().CheckInvariants();
  }
  EXPECT_FALSE(e.HasUnfinishedRequests());
  return all;
}

struct EngineSetup {
  int64_t device_blocks = 64;
  int64_t cpu_blocks = 64;
  int32_t max_model_len = 256;
  PreemptionMode mode = PreemptionMode::kRecompute;
  bool prefix_caching = false;
  std::shared_ptr<Metrics> metrics;
};

std::unique_ptr<Engine> MakeEngine(ScriptedExecutor::Script script, const EngineSetup& s = {},
                                   ScriptedExecutor** exec_out = nullptr) {
  const int32_t filler = Ids(" x")[0];
  auto exec = std::make_unique<ScriptedExecutor>(std::move(script), s.device_blocks, s.cpu_blocks,
                                                 16, filler);
  if (exec_out) *exec_out = exec.get();
  EngineOptions o;
  o.scheduler.block_size = 16;
  o.scheduler.max_model_len = s.max_model_len;
  o.scheduler.max_num_batched_tokens = 512;
  o.scheduler.preemption_mode = s.mode;
  o.scheduler.enable_prefix_caching = s.prefix_caching;
  auto e = Engine::Create(o, &Tok(), std::move(exec), {Tok().eos_id()}, s.metrics.get());
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

EngineRequest Req(const std::string& id, const std::vector<int32_t>& prompt, int max_tokens,
                  std::vector<std::string> stop = {}, int n = 1) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = prompt;
  r.params.max_tokens = max_tokens;
  r.params.temperature = 0;
  r.params.stop = std::move(stop);
  r.params.n = n;
  return r;
}

void ExpectAllFreed(const Engine& e) {
  const SchedulerStats st = e.stats();
  EXPECT_EQ(st.num_running + st.num_waiting + st.num_swapped, 0);
  EXPECT_EQ(st.device_kv_usage, 0.0);
  EXPECT_EQ(st.cpu_kv_usage, 0.0);
  EXPECT_TRUE(e.scheduler().CheckInvariants().ok()) << e.scheduler().CheckInvariants();
}

// Key token of a request's script: the first prompt token.
int32_t Key(const std::string& word) { return Ids(word)[0]; }

TEST(EngineLogicTest, StopStringSpanningTokensIsHeldBackAndCut) {
  const std::vector<int32_t> out = Ids(" Hello world, this is a test");
  ASSERT_GE(out.size(), 6u);
  ASSERT_EQ(Decode({out[0]}), " Hello");
  ASSERT_EQ(Decode({out[1]}), " world");
  auto e = MakeEngine({{Key("A"), {out}}});
  ASSERT_TRUE(e->AddRequest(Req("r", Ids("A b c"), 16, {"lo world, th"})).ok());
  auto all = RunAll(*e);
  const Collected& c = all["r"];
  ASSERT_TRUE(c.finished);
  EXPECT_EQ(c.text[0], " Hel");
  EXPECT_EQ(c.reason[0], "stop");
  // " Hello" -> " Hel" ("lo" may start the stop string), " world" and ","
  // add nothing, " this" completes the stop string.
  ASSERT_GE(c.deltas[0].size(), 4u);
  EXPECT_EQ(c.deltas[0][0], " Hel");
  EXPECT_EQ(c.deltas[0][1], "");
  EXPECT_EQ(c.deltas[0][2], "");
  EXPECT_EQ(c.tokens[0], std::vector<int32_t>(out.begin(), out.begin() + 4));
  EXPECT_EQ(c.usage.completion_tokens, 4);
  EXPECT_EQ(c.usage.prompt_tokens, static_cast<int32_t>(Ids("A b c").size()));
  // The scheduler releases the request at the next step.
  ASSERT_TRUE(e->Step().ok());
  ExpectAllFreed(*e);
}

// The stats line's throughputs come from these counters: prompt tokens
// prefilled (a prefix-cache hit is not computed, so not counted) and tokens
// sampled, over every step.
TEST(EngineLogicTest, TokenCountersCountPrefilledAndSampledTokens) {
  EngineSetup setup;
  setup.prefix_caching = true;
  auto e = MakeEngine({}, setup);
  std::vector<int32_t> prompt;
  for (int i = 0; i < 5; ++i) {
    const std::vector<int32_t> words = Ids(" one two three four five six seven eight nine");
    prompt.insert(prompt.end(), words.begin(), words.end());
  }
  ASSERT_GE(prompt.size(), 33u);  // at least two full blocks of 16 to hit
  EXPECT_EQ(e->token_counters().prompt_tokens, 0);
  ASSERT_TRUE(e->AddRequest(Req("first", prompt, 5)).ok());
  const Collected first = RunAll(*e)["first"];
  ASSERT_TRUE(e->AddRequest(Req("second", prompt, 7)).ok());
  const Collected second = RunAll(*e)["second"];
  ASSERT_TRUE(first.finished && second.finished);
  EXPECT_GE(second.usage.cached_prompt_tokens, 32);
  const EngineTokenCounters c = e->token_counters();
  EXPECT_EQ(c.prompt_tokens,
            2 * static_cast<int64_t>(prompt.size()) - second.usage.cached_prompt_tokens);
  EXPECT_EQ(c.generation_tokens, 5 + 7);
}

TEST(EngineLogicTest, HeldBackTextIsFlushedWhenTheStopStringNeverCompletes) {
  const std::vector<int32_t> out = Ids(" this is a test");
  auto e = MakeEngine({{Key("A"), {out}}});
  ASSERT_TRUE(
      e->AddRequest(Req("r", Ids("A"), static_cast<int>(out.size()), {" test!", "xyz"})).ok());
  auto all = RunAll(*e);
  const Collected& c = all["r"];
  EXPECT_EQ(c.text[0], " this is a test");
  EXPECT_EQ(c.reason[0], "length");
  EXPECT_EQ(c.deltas[0].back(), " test");  // held back until the end
  EXPECT_EQ(c.usage.completion_tokens, static_cast<int32_t>(out.size()));
  ExpectAllFreed(*e);
}

TEST(EngineLogicTest, SamplesStopIndependently) {
  const std::vector<int32_t> s0 = Ids(" one two three four five six seven");
  const std::vector<int32_t> s1 = Ids(" alpha beta gamma delta epsilon zeta eta");
  auto e = MakeEngine({{Key("A"), {s0, s1}}});
  ASSERT_TRUE(e->AddRequest(Req("r", Ids("A b"), 6, {"two", " gamma"}, 2)).ok());
  std::map<std::string, Collected> all;
  bool checked_partial = false;
  while (e->HasUnfinishedRequests()) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &all);
    ASSERT_TRUE(e->scheduler().CheckInvariants().ok()) << e->scheduler().CheckInvariants();
    const Collected& c = all["r"];
    if (c.reason.size() == 2 && c.reason[0] == "stop" && c.reason[1].empty()) {
      // Sample 0 stopped: its sequence is finished and holds no blocks while
      // sample 1 goes on.
      const SequenceGroup* g = e->scheduler().FindRequest("r");
      ASSERT_NE(g, nullptr);
      for (const auto& s : g->seqs) {
        if (s->sample_index == 0) {
          EXPECT_TRUE(s->finished());
          EXPECT_TRUE(s->block_table.empty());
        } else {
          EXPECT_FALSE(s->finished());
        }
      }
      checked_partial = true;
    }
  }
  EXPECT_TRUE(checked_partial);
  const Collected& c = all["r"];
  EXPECT_EQ(c.text[0], " one ");
  EXPECT_EQ(c.text[1], " alpha beta");
  EXPECT_EQ(c.reason[0], "stop");
  EXPECT_EQ(c.reason[1], "stop");
  EXPECT_EQ(c.tokens[0].size(), 2u);
  EXPECT_EQ(c.tokens[1].size(), 3u);
  EXPECT_EQ(c.usage.completion_tokens, 5);
  ASSERT_TRUE(e->Step().ok());
  ExpectAllFreed(*e);
}

TEST(EngineLogicTest, EosAndStopTokenIdsEndWithoutTheirText) {
  std::vector<int32_t> a = Ids(" Hi there");
  a.push_back(Tok().eos_id());
  a.push_back(Ids(" never")[0]);
  const std::vector<int32_t> b = Ids(" a b c d e");
  auto e = MakeEngine({{Key("A"), {a}}, {Key("B"), {b}}});
  ASSERT_TRUE(e->AddRequest(Req("eos", Ids("A"), 10)).ok());
  EngineRequest r = Req("stop_id", Ids("B"), 10);
  r.params.stop_token_ids = {Ids(" c")[0]};
  ASSERT_TRUE(e->AddRequest(r).ok());
  auto all = RunAll(*e);
  EXPECT_EQ(all["eos"].text[0], " Hi there");
  EXPECT_EQ(all["eos"].reason[0], "stop");
  EXPECT_EQ(all["eos"].tokens[0], std::vector<int32_t>(a.begin(), a.begin() + 3));
  EXPECT_EQ(all["stop_id"].text[0], " a b");
  EXPECT_EQ(all["stop_id"].reason[0], "stop");
  EXPECT_EQ(all["stop_id"].tokens[0].size(), 3u);
  ExpectAllFreed(*e);
}

// Issue 32's output options: include_stop_str_in_output keeps the stop
// string; before min_tokens outputs no stop string ends a sample (vLLM);
// skip_special_tokens per request.
TEST(EngineLogicTest, StopStringOptionsAndMinTokens) {
  const std::vector<int32_t> out = Ids(" a b c d e");
  ASSERT_EQ(out.size(), 5u);
  std::vector<int32_t> special = Ids(" x");
  special.push_back(Tok().bos_id() >= 0 ? Tok().bos_id() : 0);  // "<|im_start|>"-like
  special.push_back(Ids(" y")[0]);
  auto e = MakeEngine({{Key("A"), {out}}, {Key("B"), {special}}});
  EngineRequest keep = Req("keep", Ids("A"), 5, {" c"});
  keep.params.include_stop_str_in_output = true;
  ASSERT_TRUE(e->AddRequest(keep).ok());
  ASSERT_TRUE(e->AddRequest(Req("cut", Ids("A 1"), 5, {" b"})).ok());  // negative control
  EngineRequest late = Req("late", Ids("A 2"), 5, {" b"});
  late.params.min_tokens = 3;  // " b" is output 2: not matched, ever
  ASSERT_TRUE(e->AddRequest(late).ok());
  EngineRequest late_d = Req("late_d", Ids("A 3"), 5, {" b", " d"});
  late_d.params.min_tokens = 3;  // " d" is output 4: matched
  ASSERT_TRUE(e->AddRequest(late_d).ok());
  EngineRequest raw = Req("raw", Ids("B"), 3);
  raw.params.skip_special_tokens = false;
  ASSERT_TRUE(e->AddRequest(raw).ok());
  ASSERT_TRUE(e->AddRequest(Req("skip", Ids("B 1"), 3)).ok());
  auto all = RunAll(*e);
  EXPECT_EQ(all["keep"].text[0], " a b c");
  EXPECT_EQ(all["keep"].reason[0], "stop");
  EXPECT_EQ(all["cut"].text[0], " a");
  EXPECT_EQ(all["late"].text[0], " a b c d e");
  EXPECT_EQ(all["late"].reason[0], "length");
  EXPECT_EQ(all["late_d"].text[0], " a b c");
  EXPECT_EQ(all["late_d"].reason[0], "stop");
  const std::string special_text = Tok().TokenBytes(special[1], false, DecodeOptions{false});
  ASSERT_FALSE(special_text.empty());
  EXPECT_NE(all["raw"].text[0].find(special_text), std::string::npos) << all["raw"].text[0];
  EXPECT_EQ(all["skip"].text[0].find(special_text), std::string::npos) << all["skip"].text[0];
  ExpectAllFreed(*e);
}

// The scheduler hands min_tokens' end ids (EOS unless ignore_eos, and
// stop_token_ids) to the workers; bad words are tokenized the way vLLM does.
TEST(EngineLogicTest, MinTokensEndIdsAndBadWordTokens) {
  SchedulerConfig c;
  c.block_size = 16;
  c.num_device_blocks = 8;
  c.max_model_len = 64;
  auto sched = Scheduler::Create(c, {2, 0});
  ASSERT_TRUE(sched.ok());
  Request r;
  r.request_id = "m";
  r.prompt_token_ids = {5, 6};
  r.params.min_tokens = 3;
  r.params.stop_token_ids = {9, 2};
  ASSERT_TRUE((*sched)->AddRequest(r).ok());
  r.request_id = "i";
  r.params.ignore_eos = true;
  ASSERT_TRUE((*sched)->AddRequest(r).ok());
  EXPECT_EQ((*sched)->FindRequest("m")->step_params.min_tokens_end_ids,
            (std::vector<int32_t>{0, 2, 9}));
  EXPECT_EQ((*sched)->FindRequest("i")->step_params.min_tokens_end_ids,
            (std::vector<int32_t>{2, 9}));
  EXPECT_TRUE((*sched)->FindRequest("m")->params.min_tokens_end_ids.empty());

  // " hello" differs from "hello" in its first token: both forms are banned.
  const auto words = BadWordTokenIds("  hello", Tok());
  EncodeOptions eo;
  eo.add_special_tokens = false;
  ASSERT_EQ(words.size(), 2u);
  EXPECT_EQ(words[0], Tok().Encode("hello", eo));
  EXPECT_EQ(words[1], Tok().Encode(" hello", eo));
  EXPECT_TRUE(BadWordTokenIds("   ", Tok()).empty());
}

TEST(EngineLogicTest, Utf8NeverBrokenAndStopInsideEmoji) {
  const std::vector<int32_t> out = Ids(" ok 🙂👍🏽 done ünïcödé");
  auto e = MakeEngine({{Key("A"), {out}}, {Key("B"), {out}}});
  ASSERT_TRUE(e->AddRequest(Req("plain", Ids("A"), static_cast<int>(out.size()))).ok());
  ASSERT_TRUE(e->AddRequest(Req("stop", Ids("B"), static_cast<int>(out.size()), {"👍"})).ok());
  auto all = RunAll(*e);  // Collect checks every delta is valid UTF-8
  EXPECT_EQ(all["plain"].text[0], Decode(out));
  EXPECT_EQ(all["stop"].text[0], " ok 🙂");
  EXPECT_EQ(all["stop"].reason[0], "stop");
}

TEST(EngineLogicTest, AbortFreesEverythingAndReportsAbort) {
  auto e = MakeEngine({{Key("A"), {Ids(" one two three four five six seven eight nine ten")}}});
  ASSERT_TRUE(e->AddRequest(Req("run", Ids("A b c"), 40)).ok());
  ASSERT_TRUE(e->AddRequest(Req("wait", Ids("B b c"), 40)).ok());
  ASSERT_TRUE(e->Abort("wait").ok());  // aborted before it ever ran
  std::map<std::string, Collected> all;
  for (int i = 0; i < 3; ++i) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok());
    Collect(*outs, &all);
  }
  EXPECT_TRUE(all["wait"].finished);
  EXPECT_EQ(all["wait"].reason[0], "abort");
  EXPECT_EQ(all["wait"].usage.completion_tokens, 0);
  EXPECT_GT(e->stats().device_kv_usage, 0.0);
  ASSERT_TRUE(e->Abort("run").ok());
  EXPECT_EQ(e->Abort("nope").code(), absl::StatusCode::kNotFound);
  auto outs = e->Step();
  ASSERT_TRUE(outs.ok());
  Collect(*outs, &all);
  EXPECT_TRUE(all["run"].finished);
  EXPECT_EQ(all["run"].reason[0], "abort");
  EXPECT_EQ(all["run"].usage.completion_tokens, 3);
  EXPECT_EQ(all["run"].text[0], " one two three");
  EXPECT_FALSE(e->HasUnfinishedRequests());
  ExpectAllFreed(*e);
  EXPECT_EQ(e->Abort("run").code(), absl::StatusCode::kNotFound);
}

TEST(EngineLogicTest, InvalidRequestsAreRejectedWithClearErrorsAndTheNextRuns) {
  EngineSetup s;
  s.device_blocks = 8;  // 128 tokens
  s.max_model_len = 64;
  auto e = MakeEngine({{Key("A"), {Ids(" fine")}}}, s);
  EngineRequest bad = Req("t", Ids("A"), 4);
  bad.params.temperature = -1;
  absl::Status st = e->AddRequest(bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("temperature"), std::string::npos) << st;
  bad = Req("k", Ids("A"), 4);
  bad.params.top_k = 0;
  EXPECT_NE(e->AddRequest(bad).message().find("top_k"), std::string::npos);
  std::vector<int32_t> long_prompt(64, Key("A"));
  st = e->AddRequest(Req("long", long_prompt, 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_EQ(e->CheckRequest(long_prompt, Req("x", {}, 4).params).code(),
            absl::StatusCode::kOutOfRange);
  // Larger than the pool: n = 4 sequences of 48 tokens need 12 blocks of 8.
  st = e->AddRequest(Req("big", Ids("A b c"), 45, {}, 4));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("KV"), std::string::npos) << st;
  st = e->AddRequest(Req("vocab", {Tok().vocab_size()}, 4));
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st;
  EXPECT_EQ(e->AddRequest(Req("", Ids("A"), 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e->AddRequest(Req("empty", {}, 4)).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(e->HasUnfinishedRequests());
  ASSERT_TRUE(e->AddRequest(Req("ok", Ids("A"), 1)).ok());
  EXPECT_EQ(e->AddRequest(Req("ok", Ids("A"), 1)).code(), absl::StatusCode::kAlreadyExists);
  auto all = RunAll(*e);
  EXPECT_EQ(all.size(), 1u);
  EXPECT_EQ(all["ok"].text[0], " fine");
  EXPECT_EQ(all["ok"].reason[0], "length");
}

// vLLM's rule: a max_tokens the client gave that the context has no room for
// (prompt + max_tokens > max_model_len) is refused naming max_tokens; a front
// end's default (max_tokens_is_default) is lowered to the room instead.
TEST(EngineLogicTest, MaxTokensBeyondTheContextIsRefusedUnlessItIsADefault) {
  EngineSetup s;
  s.max_model_len = 64;
  auto e = MakeEngine({}, s);
  const std::vector<int32_t> prompt(60, Key("A"));
  absl::Status st = e->AddRequest(Req("over", prompt, 5));
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_EQ(FieldOf(st), "max_tokens");
  EXPECT_NE(st.message().find("at most 4 tokens can be generated"), std::string::npos) << st;
  EXPECT_EQ(e->CheckRequest(prompt, Req("x", {}, 5).params).message(), st.message());
  EngineRequest defaulted = Req("default", prompt, 16, {}, 2);
  defaulted.max_tokens_is_default = true;
  ASSERT_TRUE(e->AddRequest(defaulted).ok());
  ASSERT_TRUE(e->AddRequest(Req("exact", prompt, 4)).ok());
  // A default under the room stays as it is.
  EngineRequest small = Req("small", Ids("A"), 3);
  small.max_tokens_is_default = true;
  ASSERT_TRUE(e->AddRequest(small).ok());
  auto all = RunAll(*e);
  ASSERT_EQ(all["default"].tokens.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(all["default"].tokens[i].size(), 4u) << i;
    EXPECT_EQ(all["default"].reason[i], "length") << i;
  }
  EXPECT_EQ(all["exact"].tokens[0].size(), 4u);
  EXPECT_EQ(all["small"].tokens[0].size(), 3u);
  ExpectAllFreed(*e);
}

// vLLM's default max_model_len: the model's context, lowered to the longest
// sequence the pool holds (less the watermark) when the pool is smaller.
TEST(EngineLogicTest, FitMaxModelLenLowersTheModelsContextToThePool) {
  auto make = [](int64_t blocks, int32_t model_len, bool fit) {
    auto exec =
        std::make_unique<ScriptedExecutor>(ScriptedExecutor::Script{}, blocks, 0, 16, Ids(" x")[0]);
    EngineOptions o;
    o.scheduler.block_size = 16;
    o.scheduler.max_model_len = model_len;
    o.scheduler.max_num_batched_tokens = 512;
    o.scheduler.watermark = 0.01;
    o.fit_max_model_len = fit;
    return Engine::Create(o, &Tok(), std::move(exec), {Tok().eos_id()});
  };
  // 200 blocks, 2 kept free by the watermark: 198 * 16 = 3168 tokens.
  auto lowered = make(200, 8192, true);
  ASSERT_TRUE(lowered.ok()) << lowered.status();
  EXPECT_EQ((*lowered)->scheduler_config().max_model_len, 3168);
  std::vector<int32_t> prompt(3168, Key("A"));
  EXPECT_EQ((*lowered)->AddRequest(Req("too-long", prompt, 1)).code(),
            absl::StatusCode::kOutOfRange);
  prompt.resize(3167);
  EXPECT_TRUE((*lowered)->AddRequest(Req("fits", prompt, 1)).ok());
  // A pool that holds the whole context keeps it.
  auto kept = make(1024, 8192, true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->scheduler_config().max_model_len, 8192);
  // Without fitting (an explicit --max-model-len) the same pool is a startup error.
  auto refused = make(200, 8192, false);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--max-model-len"), std::string::npos)
      << refused.status();
}

TEST(EngineLogicTest, ExecutorFailureFailsEveryRequestAndStopsTheEngine) {
  ScriptedExecutor* exec = nullptr;
  auto e = MakeEngine({}, EngineSetup{}, &exec);
  exec->FailAt(3);
  ASSERT_TRUE(e->AddRequest(Req("a", Ids("A"), 10)).ok());
  ASSERT_TRUE(e->AddRequest(Req("b", Ids("B"), 10, {}, 2)).ok());
  absl::Status err;
  for (int i = 0; i < 5 && err.ok(); ++i) {
    auto outs = e->Step();
    if (!outs.ok()) err = outs.status();
  }
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.message().find("scripted worker failure"), std::string::npos) << err;
  std::map<std::string, Collected> all;
  Collect(e->FailAll(err), &all);
  ASSERT_EQ(all.size(), 2u);
  for (auto& [id, c] : all) {
    EXPECT_TRUE(c.finished) << id;
    EXPECT_FALSE(c.error.ok()) << id;
    for (const std::string& r : c.reason) EXPECT_EQ(r, "error") << id;
  }
  EXPECT_EQ(all["b"].reason.size(), 2u);
  EXPECT_FALSE(e->HasUnfinishedRequests());
  EXPECT_EQ(e->Step().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(e->AddRequest(Req("c", Ids("A"), 1)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(EngineLogicTest, LogitsThatCannotBeSampledFailThatRequestAloneAndTheEngineRunsOn) {
  ScriptedExecutor* exec = nullptr;
  EngineSetup setup;
  setup.prefix_caching = true;
  auto e = MakeEngine({{Key("A"), {Ids(" one two three four five six")}},
                       {Key("B"), {Ids(" red green blue"), Ids(" cat dog cow")}}},
                      setup, &exec);
  exec->UnsampleableAt(Key("B"), 2);  // b's third token: both of its samples
  const std::vector<int32_t> long_prompt = Ids("B b c d e f g h i j k l m n o p q r s t u v w");
  ASSERT_TRUE(e->AddRequest(Req("a", Ids("A b c"), 6)).ok());
  ASSERT_TRUE(e->AddRequest(Req("b", long_prompt, 6, {}, 2)).ok());
  std::map<std::string, Collected> all;
  for (int i = 0; i < 12 && e->HasUnfinishedRequests(); ++i) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &all);
  }
  ASSERT_TRUE(all["b"].finished);
  EXPECT_EQ(all["b"].error.code(), absl::StatusCode::kInternal);
  EXPECT_NE(all["b"].error.message().find("could not be sampled: sampler row 0 (seq 1): logit"),
            std::string::npos)
      << all["b"].error;
  ASSERT_EQ(all["b"].reason.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(all["b"].reason[i], "error");
    EXPECT_EQ(all["b"].tokens[i].size(), 2u);  // the two tokens before the failure
  }
  ASSERT_TRUE(all["a"].finished);
  EXPECT_TRUE(all["a"].error.ok()) << all["a"].error;
  EXPECT_EQ(all["a"].text[0], " one two three four five six");
  // Generation tokens: what the requests got (6 + 2 x 2), not the failed rows.
  EXPECT_EQ(e->token_counters().generation_tokens, 6 + 2 * 2);
  ExpectAllFreed(*e);
  // The engine serves the next request with the same prompt (its prompt
  // blocks, computed before the failure, may come from the prefix cache).
  exec->UnsampleableAt(-1, -1);
  ASSERT_TRUE(e->AddRequest(Req("c", long_prompt, 3)).ok());
  for (int i = 0; i < 6 && e->HasUnfinishedRequests(); ++i) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &all);
  }
  ASSERT_TRUE(all["c"].finished);
  EXPECT_TRUE(all["c"].error.ok()) << all["c"].error;
  EXPECT_EQ(all["c"].text[0], " red green blue");
  ExpectAllFreed(*e);
}

TEST(EngineLogicTest, LogprobsAndMetricsAreReported) {
  std::shared_ptr<Metrics> metrics = testing::MakeProbeMetrics();
  ASSERT_NE(metrics, nullptr);
  EngineSetup s;
  s.metrics = metrics;
  auto e = MakeEngine({{Key("A"), {Ids(" one two three")}}}, s);
  EngineRequest r = Req("r", Ids("A b"), 3);
  r.params.logprobs = 1;
  ASSERT_TRUE(e->AddRequest(r).ok());
  auto all = RunAll(*e);
  const Collected& c = all["r"];
  ASSERT_EQ(c.logprobs[0].size(), 3u);
  EXPECT_FLOAT_EQ(c.logprobs[0][0], -0.25f);
  EXPECT_FLOAT_EQ(c.logprobs[0][2], -0.75f);
  const std::string text = testing::SerializeMetrics(*metrics);
  EXPECT_NE(
      text.find(
          "pagedserve_requests_finished_total{model_name=\"probe\",finish_reason=\"length\"} 1"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("pagedserve_generation_tokens_total{model_name=\"probe\"} 3"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("pagedserve_prompt_tokens_total{model_name=\"probe\"} 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("pagedserve_time_to_first_token_seconds_count{model_name=\"probe\"} 1"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("pagedserve_inter_token_latency_seconds_count{model_name=\"probe\"} 2"),
            std::string::npos)
      << text;
}

// Many requests (n = 1 and 2, stop strings, aborts) on a pool small enough to
// preempt, in both modes, with and without prefix caching: every sample's text
// is its script decoded and cut at the first stop string, whatever the
// preemptions; every block comes back.
class EngineStressTest : public ::testing::TestWithParam<std::tuple<PreemptionMode, bool>> {};

TEST_P(EngineStressTest, ScriptedOutputsSurvivePreemption) {
  std::mt19937 rng(7);
  // Tokens that decode to clean text on their own.
  std::vector<int32_t> words;
  for (int32_t id = 300; id < 6000 && words.size() < 400; id += 7) {
    const std::string t = Decode({id});
    if (!t.empty() && SanitizeUtf8(t, true) == t && t.find("\xEF\xBF\xBD") == std::string::npos &&
        !Tok().IsSpecial(id)) {
      words.push_back(id);
    }
  }
  ASSERT_GE(words.size(), 100u);
  ScriptedExecutor::Script script;
  struct Spec {
    std::string id;
    std::vector<int32_t> prompt;
    int n, max_tokens;
    std::vector<std::string> stop;
    bool abort;
  };
  std::vector<Spec> specs;
  for (int i = 0; i < 16; ++i) {
    Spec sp;
    sp.id = "req" + std::to_string(i);
    const int32_t key = 6000 + i;
    sp.prompt.push_back(key);
    const int plen = 4 + static_cast<int>(rng() % 40);
    for (int k = 1; k < plen; ++k) sp.prompt.push_back(words[rng() % 20]);  // shared-ish prefixes
    sp.n = 1 + static_cast<int>(rng() % 2);
    sp.max_tokens = 4 + static_cast<int>(rng() % 20);
    auto& samples = script[key];
    for (int s = 0; s < sp.n; ++s) {
      std::vector<int32_t> toks(30);
      for (int32_t& t : toks) t = words[rng() % words.size()];
      samples.push_back(toks);
    }
    if (i % 3 == 0) {
      // A stop string taken across a token boundary of sample 0.
      const std::string t =
          Decode(std::vector<int32_t>(samples[0].begin(), samples[0].begin() + 6));
      const std::string first = Decode({samples[0][0]}), second = Decode({samples[0][1]});
      sp.stop.push_back(t.substr(first.size() - 1, 2 + second.size()));
    }
    sp.abort = i % 5 == 4;
    specs.push_back(sp);
  }
  EngineSetup s;
  s.device_blocks = 12;  // 192 tokens for up to 16 x 2 sequences of <= 64
  s.cpu_blocks = 24;
  s.max_model_len = 96;
  s.mode = std::get<0>(GetParam());
  s.prefix_caching = std::get<1>(GetParam());
  auto e = MakeEngine(script, s);
  for (const Spec& sp : specs) {
    EngineRequest r = Req(sp.id, sp.prompt, sp.max_tokens, sp.stop, sp.n);
    ASSERT_TRUE(e->AddRequest(r).ok()) << sp.id;
  }
  std::map<std::string, Collected> all;
  int step = 0;
  while (e->HasUnfinishedRequests() && step < 3000) {
    if (++step == 6) {
      for (const Spec& sp : specs) {
        if (sp.abort) {
          EXPECT_TRUE(e->Abort(sp.id).ok());
        }
      }
    }
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &all);
    ASSERT_TRUE(e->scheduler().CheckInvariants().ok()) << e->scheduler().CheckInvariants();
  }
  ASSERT_FALSE(e->HasUnfinishedRequests());
  const SchedulerStats st = e->stats();
  EXPECT_GT(st.num_preemptions_swap + st.num_preemptions_recompute, 0);
  for (const Spec& sp : specs) {
    SCOPED_TRACE(sp.id);
    const Collected& c = all[sp.id];
    ASSERT_TRUE(c.finished);
    const auto& samples = script[sp.prompt[0]];
    for (int i = 0; i < sp.n; ++i) {
      if (sp.abort) {
        if (i < static_cast<int>(c.reason.size()) && c.reason[i] == "abort") {
          // Whatever was produced is a prefix of the script.
          EXPECT_EQ(c.tokens[i], std::vector<int32_t>(samples[i].begin(),
                                                      samples[i].begin() + c.tokens[i].size()));
        }
        continue;
      }
      ASSERT_LT(i, static_cast<int>(c.text.size()));
      // Expected: the fewest tokens whose text contains a stop string.
      size_t k = 1;
      std::string want;
      std::string reason = "length";
      for (; k <= static_cast<size_t>(sp.max_tokens); ++k) {
        want = Decode(std::vector<int32_t>(samples[i].begin(), samples[i].begin() + k));
        size_t cut = std::string::npos;
        for (const std::string& stop : sp.stop) cut = std::min(cut, want.find(stop));
        if (cut != std::string::npos) {
          want.resize(cut);
          reason = "stop";
          break;
        }
      }
      k = std::min(k, static_cast<size_t>(sp.max_tokens));
      EXPECT_EQ(c.text[i], want) << "sample " << i;
      EXPECT_EQ(c.reason[i], reason) << "sample " << i;
      EXPECT_EQ(c.tokens[i], std::vector<int32_t>(samples[i].begin(), samples[i].begin() + k))
          << "sample " << i;
    }
  }
  ASSERT_TRUE(e->Step().ok());
  ExpectAllFreed(*e);
}

INSTANTIATE_TEST_SUITE_P(Modes, EngineStressTest,
                         ::testing::Combine(::testing::Values(PreemptionMode::kSwap,
                                                              PreemptionMode::kRecompute),
                                            ::testing::Bool()));

}  // namespace
}  // namespace pagedserve
