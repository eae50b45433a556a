// The engine end to end on the random-weight Llama (PAGEDSERVE_TEST_MODEL)
// against the transformers greedy reference (PAGEDSERVE_TEST_REFERENCE):
// batched greedy, seeded n = 2, stop strings across tokens, stop token ids,
// exact max_tokens, abort, a request over the pool, prefix caching (cold, warm,
// after an aborted / stopped warm-up), preemption by swap and by recompute
// (greedy tokens; penalties and seeded n = 2 equal to a numpy reference with
// and without preemption), and many forks in one step (the c77901d use-after-free).
// Also built under ASan + UBSan (label sanitized, a lighter filter there).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "distributed/communicator.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/launch/local_executor.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/loaders.h"
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

// An executor over a worker shared by the whole suite (the model loads once),
// reporting a smaller pool when asked (tiny pools force preemption).
class SharedWorkerExecutor : public Executor {
 public:
  SharedWorkerExecutor(Worker* w, int64_t device_blocks, int64_t cpu_blocks)
      : w_(w), device_(device_blocks), cpu_(cpu_blocks) {}
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override { return w_->Execute(plan); }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return device_; }
  int64_t num_cpu_blocks() const override { return cpu_; }

 private:
  Worker* w_;
  int64_t device_, cpu_;
};

struct Collected {
  std::vector<std::string> text;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::string> reason;
  std::vector<double> cumulative_logprob, beam_score;  // beam search, NaN otherwise
  bool finished = false;
  Usage usage;
};

class EngineModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = Env("PAGEDSERVE_TEST_MODEL");
    reference_ = new std::vector<ReferencePrompt>(LoadReference(Env("PAGEDSERVE_TEST_REFERENCE")));
    auto t = LoadHfTokenizer(model_);
    ASSERT_TRUE(t.ok()) << t.status();
    tokenizer_ = t->release();
    comm_ = MakeSingleRankCommunicator().release();
    WorkerOptions o;
    o.model_path = model_;
    o.dtype = WeightDType::kFloat32;  // the exact path the transformers fixtures check
    o.block_size = kBlockSize;
    o.kv_cache_memory = 64LL << 20;
    o.swap_space = 4LL << 20;
    auto w = Worker::Create(o, comm_);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = w->release();
  }
  static void TearDownTestSuite() {
    for (auto& [layers, w] : draft_workers_) delete w;
    draft_workers_.clear();
    delete worker_;
    delete comm_;
    delete tokenizer_;
    delete reference_;
  }

  static const ReferencePrompt& Ref(const std::string& name) {
    for (const ReferencePrompt& p : *reference_) {
      if (p.name == name) return p;
    }
    ADD_FAILURE() << "no reference prompt " << name;
    return reference_->front();
  }

  struct Config {
    int64_t device_blocks = 256;
    int64_t cpu_blocks = 0;
    int32_t max_model_len = 512;
    bool prefix_caching = false;
    PreemptionMode mode = PreemptionMode::kRecompute;
    SpeculativeConfig spec;    // off unless set
    Worker* worker = nullptr;  // null: the suite's worker (no draft model)
    int32_t sliding_window = 0;
    int32_t max_num_batched_tokens = 2048;
    int32_t max_num_seqs = 256;
    bool prefill_first = false;
  };
  static std::unique_ptr<Engine> MakeEngine(const Config& c,
                                            std::unique_ptr<Executor> exec = nullptr) {
    if (!exec)
      exec = std::make_unique<SharedWorkerExecutor>(c.worker != nullptr ? c.worker : worker_,
                                                    c.device_blocks, c.cpu_blocks);
    EngineOptions o;
    o.scheduler.block_size = kBlockSize;
    o.scheduler.max_model_len = c.max_model_len;
    o.scheduler.enable_prefix_caching = c.prefix_caching;
    o.scheduler.preemption_mode = c.mode;
    o.scheduler.speculative = c.spec;
    o.scheduler.sliding_window = c.sliding_window;
    o.scheduler.max_num_batched_tokens = c.max_num_batched_tokens;
    o.scheduler.max_num_seqs = c.max_num_seqs;
    o.scheduler.prefill_first = c.prefill_first;
    auto e = Engine::Create(o, tokenizer_, std::move(exec), {tokenizer_->eos_id()});
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static EngineRequest Greedy(const std::string& id, const std::vector<int32_t>& prompt,
                              int max_tokens) {
    EngineRequest r;
    r.request_id = id;
    r.prompt_token_ids = prompt;
    r.params.temperature = 0;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;  // the reference does not stop at EOS
    return r;
  }

  static void Collect(const std::vector<EngineOutput>& outs,
                      std::map<std::string, Collected>* all) {
    for (const EngineOutput& o : outs) {
      Collected& c = (*all)[o.request_id];
      EXPECT_TRUE(o.error.ok()) << o.error;
      for (const SequenceDelta& d : o.deltas) {
        if (c.text.size() <= static_cast<size_t>(d.index)) {
          c.text.resize(d.index + 1), c.tokens.resize(d.index + 1), c.reason.resize(d.index + 1);
          c.cumulative_logprob.resize(d.index + 1, std::nan("")),
              c.beam_score.resize(d.index + 1, std::nan(""));
        }
        if (d.cumulative_logprob) c.cumulative_logprob[d.index] = *d.cumulative_logprob;
        if (d.beam_score) c.beam_score[d.index] = *d.beam_score;
        c.text[d.index] += d.text;
        c.tokens[d.index].insert(c.tokens[d.index].end(), d.token_ids.begin(), d.token_ids.end());
        if (d.finished) c.reason[d.index] = std::string(FinishReasonName(d.finish_reason));
      }
      if (o.finished) c.finished = true, c.usage = o.usage;
    }
  }

  static std::map<std::string, Collected> RunAll(Engine& e) {
    std::map<std::string, Collected> all;
    for (int i = 0; i < 1000 && e.HasUnfinishedRequests(); ++i) {
      auto outs = e.Step();
      EXPECT_TRUE(outs.ok()) << outs.status();
      if (!outs.ok()) break;
      Collect(*outs, &all);
      EXPECT_TRUE(e.scheduler().CheckInvariants().ok()) << e.scheduler().CheckInvariants();
    }
    EXPECT_FALSE(e.HasUnfinishedRequests());
    return all;
  }

  static void ExpectAllFreed(Engine& e) {
    auto outs = e.Step();  // applies pending finishes
    ASSERT_TRUE(outs.ok()) << outs.status();
    const SchedulerStats st = e.stats();
    EXPECT_EQ(st.num_running + st.num_waiting + st.num_swapped, 0);
    EXPECT_EQ(st.device_kv_usage, 0.0);
    EXPECT_EQ(st.cpu_kv_usage, 0.0);
    EXPECT_TRUE(e.scheduler().CheckInvariants().ok()) << e.scheduler().CheckInvariants();
  }

  static std::string Decode(const std::vector<int32_t>& ids) {
    auto r = tokenizer_->Decode(ids);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : "";
  }

  // A worker of the suite's model with a draft model (speculative decoding):
  // the same checkpoint cut to its first `layers` layers (a config that says
  // fewer layers; the loader reads only theirs), or all of them (the target
  // itself: acceptance near 1). Created once per layer count.
  static Worker* DraftWorker(int layers) {
    Worker*& w = draft_workers_[layers];
    if (w != nullptr) return w;
    const std::string dir = absl::StrCat(::testing::TempDir(), "/draft_", layers, "_layers");
    std::filesystem::create_directories(dir);
    for (const auto& f : std::filesystem::directory_iterator(model_)) {
      const std::filesystem::path link = dir / f.path().filename();
      if (f.path().filename() == "config.json" || std::filesystem::exists(link)) continue;
      std::filesystem::create_symlink(std::filesystem::absolute(f.path()), link);
    }
    nlohmann::json config = nlohmann::json::parse(std::ifstream(model_ + "/config.json"));
    if (layers > 0) config["num_hidden_layers"] = layers;
    std::ofstream(dir + "/config.json") << config.dump();
    WorkerOptions o;
    o.model_path = model_;
    o.draft_model_path = dir;
    o.dtype = WeightDType::kFloat32;
    o.block_size = kBlockSize;
    o.kv_cache_memory = 64LL << 20;
    o.swap_space = 8LL << 20;
    auto made = Worker::Create(o, comm_);
    EXPECT_TRUE(made.ok()) << made.status();
    w = made.ok() ? made->release() : nullptr;
    return w;
  }

  static std::string model_;
  static std::vector<ReferencePrompt>* reference_;
  static Tokenizer* tokenizer_;
  static Communicator* comm_;
  static Worker* worker_;
  static std::map<int, Worker*> draft_workers_;
};
std::map<int, Worker*> EngineModelTest::draft_workers_;
std::string EngineModelTest::model_;
std::vector<ReferencePrompt>* EngineModelTest::reference_ = nullptr;
Tokenizer* EngineModelTest::tokenizer_ = nullptr;
Communicator* EngineModelTest::comm_ = nullptr;
Worker* EngineModelTest::worker_ = nullptr;

// The near-tie rule of tests/worker/llama_reference_test.cc: at the first
// token that differs from the reference, the reference's own top-1 margin must
// be below the logit tolerance; later tokens are not compared.
void ExpectSameGreedy(const ReferencePrompt& p, const std::vector<int32_t>& got) {
  ASSERT_LE(got.size(), p.greedy_ids.size()) << p.name;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] == p.greedy_ids[i]) continue;
    ASSERT_LT(i, p.greedy_margins.size());
    EXPECT_LT(p.greedy_margins[i], 1e-3)
        << p.name << ": greedy token " << i << " is " << got[i] << ", reference " << p.greedy_ids[i]
        << " with a clear margin " << p.greedy_margins[i];
    return;
  }
}

TEST_F(EngineModelTest, GreedyBatchMatchesTransformersThroughTheLocalExecutor) {
  WorkerOptions o;
  o.model_path = model_;
  o.dtype = WeightDType::kFloat32;
  o.block_size = kBlockSize;
  o.kv_cache_memory = 16LL << 20;
  o.swap_space = 0;
  auto exec = CreateLocalExecutor(o);
  ASSERT_TRUE(exec.ok()) << exec.status();
  auto e = MakeEngine(Config{}, *std::move(exec));
  ASSERT_NE(e, nullptr);
  const std::vector<std::string> names = {"plain_english", "code", "chat_single"};
  for (const std::string& n : names)
    ASSERT_TRUE(e->AddRequest(Greedy(n, Ref(n).prompt_ids, 16)).ok());
  auto all = RunAll(*e);
  for (const std::string& n : names) {
    const Collected& c = all[n];
    ASSERT_TRUE(c.finished) << n;
    EXPECT_EQ(c.tokens[0].size(), 16u) << n;
    EXPECT_EQ(c.reason[0], "length") << n;
    ExpectSameGreedy(Ref(n), c.tokens[0]);
    EXPECT_EQ(c.text[0], Decode(c.tokens[0])) << n;
    EXPECT_EQ(c.usage.prompt_tokens, static_cast<int32_t>(Ref(n).prompt_ids.size()));
    EXPECT_EQ(c.usage.completion_tokens, 16);
  }
  ExpectAllFreed(*e);
}

// --prefill-first with arrivals while others decode, prompts in 32-token
// chunks: every arrival's prefill steps run without decodes, and every
// request still gets transformers' greedy tokens.
TEST_F(EngineModelTest, PrefillFirstWithStaggeredArrivalsMatchesTransformers) {
  Config c;
  c.prefill_first = true;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 8;
  auto e = MakeEngine(c);
  ASSERT_NE(e, nullptr);
  const std::vector<std::string> names = {"plain_english", "code", "chat_single"};
  std::map<std::string, Collected> all;
  size_t next = 0;
  int arrivals_alone = 0;  // steps of an arrival's first chunk in which no earlier request advanced
  for (int step = 0; step < 500 && (next < names.size() || e->HasUnfinishedRequests()); ++step) {
    std::map<std::string, size_t> earlier;  // unfinished requests' token counts before the step
    const bool arrival = next < names.size() && step % 3 == 0;
    if (arrival) {
      for (size_t i = 0; i < next; ++i) {
        if (!all[names[i]].finished) earlier[names[i]] = all[names[i]].tokens[0].size();
      }
      ASSERT_TRUE(e->AddRequest(Greedy(names[next], Ref(names[next]).prompt_ids, 12)).ok());
      ++next;
    }
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    Collect(*outs, &all);
    if (!arrival || earlier.empty()) continue;
    bool none_advanced = true;
    for (const auto& [id, n] : earlier) none_advanced &= all[id].tokens[0].size() == n;
    arrivals_alone += none_advanced;
  }
  for (const std::string& n : names) {
    ASSERT_TRUE(all[n].finished) << n;
    ASSERT_EQ(all[n].tokens[0].size(), 12u) << n;
    ExpectSameGreedy(Ref(n), all[n].tokens[0]);
  }
  // The two later arrivals came while earlier requests were decoding; their
  // first steps ran without those decodes (without prefill_first: 0).
  EXPECT_EQ(arrivals_alone, 2);
  ExpectAllFreed(*e);
}

// A model whose every layer has a sliding window (the mistral_sliding_window
// fixture; its own CTest entry): with chunked prefill the block manager frees
// the blocks that leave the window, so the 1016-token prompt (64 blocks)
// runs in a pool of 8 blocks, its greedy tokens still those of transformers
// (a worker that read a freed, reused block would see other tokens' K/V).
// Then all prompts together, one of them forked (n = 2), in a pool that holds
// far fewer blocks than their full contexts, every block back at the end.
TEST_F(EngineModelTest, SlidingWindowHoldsTheWindowsBlocksAndMatchesTransformers) {
  auto model = LoadModelConfig(model_);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_GT(model->sliding_window, 0) << "run on a model with a sliding window on every layer";
  for (int l = 0; l < model->num_layers; ++l)
    ASSERT_EQ(model->LayerSlidingWindow(l), model->sliding_window) << "layer " << l;
  Config c;
  c.sliding_window = model->sliding_window;
  c.max_num_batched_tokens = 64;
  c.max_num_seqs = 16;
  c.max_model_len = 1100;
  c.device_blocks = 8;  // (24 - 1 + 64) / 16 + 1 = 7 blocks at most per sequence
  const ReferencePrompt& longest = Ref("long");
  ASSERT_GT(longest.prompt_ids.size(), 60u * kBlockSize);
  {
    auto e = MakeEngine(c);
    ASSERT_NE(e, nullptr);
    const int n = static_cast<int>(longest.greedy_ids.size());
    ASSERT_TRUE(e->AddRequest(Greedy("long", longest.prompt_ids, n)).ok());
    std::map<std::string, Collected> all;
    double peak = 0;
    for (int i = 0; i < 1000 && e->HasUnfinishedRequests(); ++i) {
      auto outs = e->Step();
      ASSERT_TRUE(outs.ok()) << outs.status();
      Collect(*outs, &all);
      ASSERT_TRUE(e->scheduler().CheckInvariants().ok()) << e->scheduler().CheckInvariants();
      peak = std::max(peak, e->stats().device_kv_usage);
    }
    ASSERT_TRUE(all["long"].finished);
    EXPECT_EQ(all["long"].tokens[0].size(), static_cast<size_t>(n));
    ExpectSameGreedy(longest, all["long"].tokens[0]);
    EXPECT_LE(peak * c.device_blocks, 7.0);
    ExpectAllFreed(*e);
  }
  // Control: without freeing, the same pool cannot hold one such sequence.
  Config full = c;
  full.sliding_window = 0;
  EngineOptions o;
  o.scheduler.block_size = kBlockSize;
  o.scheduler.max_model_len = full.max_model_len;
  o.scheduler.max_num_batched_tokens = full.max_num_batched_tokens;
  o.scheduler.max_num_seqs = full.max_num_seqs;
  auto refused = Engine::Create(
      o, tokenizer_, std::make_unique<SharedWorkerExecutor>(worker_, full.device_blocks, 0),
      {tokenizer_->eos_id()});
  EXPECT_NE(refused.status().message().find("the KV cache holds 8 blocks"), std::string::npos)
      << refused.status();
  // Every prompt at once, one with n = 2 (forked siblings share the window's
  // blocks), preempted by recompute when the 24-block pool runs short.
  c.device_blocks = 24;
  auto e = MakeEngine(c);
  ASSERT_NE(e, nullptr);
  for (const ReferencePrompt& p : *reference_) {
    EngineRequest r = Greedy(p.name, p.prompt_ids, static_cast<int>(p.greedy_ids.size()));
    if (p.name == "code") r.params.n = 2;
    ASSERT_TRUE(e->AddRequest(r).ok()) << p.name;
  }
  auto all = RunAll(*e);
  for (const ReferencePrompt& p : *reference_) {
    const Collected& got = all[p.name];
    ASSERT_TRUE(got.finished) << p.name;
    for (const auto& tokens : got.tokens) ExpectSameGreedy(p, tokens);
  }
  ExpectAllFreed(*e);
}

TEST_F(EngineModelTest, SeededParallelSamplingIsReproducibleAndBatchIndependent) {
  EngineRequest r;
  r.request_id = "n2";
  r.prompt_token_ids = Ref("story").prompt_ids;
  r.params.n = 2;
  r.params.temperature = 1.0f;
  r.params.seed = 42;
  r.params.max_tokens = 8;
  r.params.ignore_eos = true;
  auto alone = MakeEngine(Config{});
  ASSERT_TRUE(alone->AddRequest(r).ok());
  auto a = RunAll(*alone)["n2"];
  ExpectAllFreed(*alone);
  auto busy = MakeEngine(Config{});
  ASSERT_TRUE(busy->AddRequest(Greedy("other", Ref("code").prompt_ids, 8)).ok());
  ASSERT_TRUE(busy->AddRequest(r).ok());
  auto b = RunAll(*busy)["n2"];
  ASSERT_EQ(a.tokens.size(), 2u);
  ASSERT_EQ(b.tokens.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(a.tokens[i].size(), 8u);
    EXPECT_EQ(a.tokens[i], b.tokens[i]) << "sample " << i;
    EXPECT_EQ(a.text[i], Decode(a.tokens[i]));
  }
  // Two samples of a near-uniform 49152-way distribution.
  EXPECT_NE(a.tokens[0], a.tokens[1]);
  EXPECT_EQ(a.usage.completion_tokens, 16);
}

// vLLM's prompt_logprobs against transformers: the prompt is a reference
// prompt followed by the first 3 tokens of its greedy continuation, so that
// the last 3 scored positions are the reference's steps 0..2 (logprob =
// logit - logsumexp of the full vector, the top 5 the reference's top
// logits). Every position is scored once, in order, with its own token;
// through whole prefills, 7-token chunks (the chunk's last position scores
// the next chunk's first token), with the prefix cache warm (a request that
// scores its prompt never reads it) and with a batch neighbour sampling.
TEST_F(EngineModelTest, PromptLogprobsMatchTransformers) {
  constexpr int kTop = 5;
  constexpr double kTol = 5e-4;  // 1e-4 on logits and on logsumexp, each side
  struct Setup {
    const char* name;
    int32_t max_num_batched_tokens;
    bool prefix_caching;
  };
  for (const Setup& setup :
       {Setup{"whole prefill", 2048, false}, Setup{"7-token chunks", 7, true}}) {
    SCOPED_TRACE(setup.name);
    Config c;
    c.max_num_batched_tokens = setup.max_num_batched_tokens;
    c.max_num_seqs = 4;
    c.prefix_caching = setup.prefix_caching;
    auto e = MakeEngine(c);
    ASSERT_NE(e, nullptr);
    int checked = 0;
    for (const ReferencePrompt& p : *reference_) {
      if (p.steps.size() < 3 || p.greedy_ids.size() < 3 || p.prompt_ids.size() > 300) continue;
      std::vector<int32_t> prompt = p.prompt_ids;
      prompt.insert(prompt.end(), p.greedy_ids.begin(), p.greedy_ids.begin() + 3);
      if (setup.prefix_caching) {  // warm the cache with the same prompt
        ASSERT_TRUE(e->AddRequest(Greedy("warm-" + p.name, prompt, 1)).ok());
        RunAll(*e);
      }
      EngineRequest r = Greedy(p.name, prompt, 2);
      r.params.prompt_logprobs = kTop;
      ASSERT_TRUE(e->AddRequest(r).ok());
      ASSERT_TRUE(e->AddRequest(Greedy("neighbour-" + p.name, p.prompt_ids, 4)).ok());
      std::vector<PromptLogprob> got;
      int outputs_with_them = 0;
      for (int i = 0; i < 1000 && e->HasUnfinishedRequests(); ++i) {
        auto outs = e->Step();
        ASSERT_TRUE(outs.ok()) << outs.status();
        for (const EngineOutput& o : *outs) {
          ASSERT_TRUE(o.error.ok()) << o.error;
          if (o.prompt_logprobs.empty()) continue;
          EXPECT_EQ(o.request_id, p.name);
          got = o.prompt_logprobs;
          ++outputs_with_them;
        }
      }
      ASSERT_EQ(outputs_with_them, 1) << p.name;
      ASSERT_EQ(got.size(), prompt.size() - 1) << p.name;
      for (size_t i = 0; i < got.size(); ++i) {
        const PromptLogprob& lp = got[i];
        EXPECT_EQ(lp.position, static_cast<int32_t>(i + 1));
        EXPECT_EQ(lp.token_id, prompt[i + 1]);
        EXPECT_LE(lp.logprob, 0.0f);
        EXPECT_GE(lp.rank, 1);
        ASSERT_EQ(lp.top_token_ids.size(), static_cast<size_t>(kTop));
        EXPECT_TRUE(std::is_sorted(lp.top_logprobs.rbegin(), lp.top_logprobs.rend()));
        // The token's own logprob is consistent with its rank in the top list.
        if (lp.rank <= kTop) {
          EXPECT_NEAR(lp.top_logprobs[lp.rank - 1], lp.logprob, 1e-6);
        } else {
          EXPECT_LT(lp.logprob, lp.top_logprobs.back());
        }
      }
      for (int k = 0; k < 3; ++k) {
        const testing::ReferenceStep& ref = p.steps[k];
        const PromptLogprob& lp = got[p.prompt_ids.size() + k - 1];
        ASSERT_EQ(ref.context_length, static_cast<int>(p.prompt_ids.size()) + k);
        EXPECT_EQ(lp.token_id, p.greedy_ids[k]);
        EXPECT_NEAR(lp.logprob, ref.top_logits[0] - ref.logsumexp, kTol) << p.name << " step " << k;
        if (ref.top1_margin > 1e-3) {
          EXPECT_EQ(lp.rank, 1) << p.name << " step " << k;
        }
        for (int j = 0; j < kTop; ++j) {
          const bool clear = ref.top_logits[j] - ref.top_logits[j + 1] > 1e-3 &&
                             (j == 0 || ref.top_logits[j - 1] - ref.top_logits[j] > 1e-3);
          if (clear) {
            EXPECT_EQ(lp.top_token_ids[j], ref.top_ids[j]) << p.name << " step " << k;
          }
          EXPECT_NEAR(lp.top_logprobs[j], ref.top_logits[j] - ref.logsumexp, kTol)
              << p.name << " step " << k << " top " << j;
        }
        ++checked;
      }
      ExpectAllFreed(*e);
    }
    EXPECT_GE(checked, 6);
  }
}

TEST_F(EngineModelTest, StopStringAcrossTokensEndsRightBeforeIt) {
  const ReferencePrompt& p = Ref("plain_english");
  const std::string t2 = Decode({p.greedy_ids[2]}), t3 = Decode({p.greedy_ids[3]});
  ASSERT_GE(t2.size(), 2u);
  ASSERT_GE(t3.size(), 2u);
  const std::string stop = t2.substr(t2.size() - 2) + t3.substr(0, 2);  // spans tokens 2 and 3
  std::string want = Decode(std::vector<int32_t>(p.greedy_ids.begin(), p.greedy_ids.begin() + 4));
  want.resize(want.find(stop));
  auto e = MakeEngine(Config{});
  EngineRequest r = Greedy("s", p.prompt_ids, 16);
  r.params.stop = {stop, "never-appears"};
  ASSERT_TRUE(e->AddRequest(r).ok());
  auto c = RunAll(*e)["s"];
  EXPECT_EQ(c.text[0], want) << "stop string '" << stop << "'";
  EXPECT_EQ(c.reason[0], "stop");
  EXPECT_EQ(c.tokens[0], std::vector<int32_t>(p.greedy_ids.begin(), p.greedy_ids.begin() + 4));
  EXPECT_EQ(c.usage.completion_tokens, 4);
  ExpectAllFreed(*e);
}

TEST_F(EngineModelTest, StopTokenIdsAndExactMaxTokens) {
  const ReferencePrompt& p = Ref("numbers");
  const int32_t stop_id = p.greedy_ids[4];
  const size_t first =
      std::find(p.greedy_ids.begin(), p.greedy_ids.end(), stop_id) - p.greedy_ids.begin();
  auto e = MakeEngine(Config{});
  EngineRequest r = Greedy("stop_id", p.prompt_ids, 16);
  r.params.stop_token_ids = {stop_id};
  ASSERT_TRUE(e->AddRequest(r).ok());
  ASSERT_TRUE(e->AddRequest(Greedy("len7", Ref("code").prompt_ids, 7)).ok());
  auto all = RunAll(*e);
  EXPECT_EQ(all["stop_id"].tokens[0],
            std::vector<int32_t>(p.greedy_ids.begin(), p.greedy_ids.begin() + first + 1));
  EXPECT_EQ(all["stop_id"].reason[0], "stop");
  EXPECT_EQ(all["stop_id"].text[0],
            Decode(std::vector<int32_t>(p.greedy_ids.begin(), p.greedy_ids.begin() + first)));
  EXPECT_EQ(all["len7"].tokens[0].size(), 7u);
  EXPECT_EQ(all["len7"].reason[0], "length");
  ExpectSameGreedy(Ref("code"), all["len7"].tokens[0]);
  ExpectAllFreed(*e);
}

TEST_F(EngineModelTest, AbortMidGenerationFreesItsBlocks) {
  auto e = MakeEngine(Config{});
  ASSERT_TRUE(e->AddRequest(Greedy("keep", Ref("story").prompt_ids, 12)).ok());
  ASSERT_TRUE(e->AddRequest(Greedy("drop", Ref("multilingual").prompt_ids, 30)).ok());
  std::map<std::string, Collected> all;
  for (int i = 0; i < 4; ++i) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok());
    Collect(*outs, &all);
  }
  ASSERT_TRUE(e->Abort("drop").ok());
  while (e->HasUnfinishedRequests()) {
    auto outs = e->Step();
    ASSERT_TRUE(outs.ok());
    Collect(*outs, &all);
  }
  EXPECT_EQ(all["drop"].reason[0], "abort");
  EXPECT_EQ(all["drop"].tokens[0].size(), 4u);
  ExpectSameGreedy(Ref("multilingual"), all["drop"].tokens[0]);
  EXPECT_EQ(all["keep"].tokens[0].size(), 12u);
  ExpectSameGreedy(Ref("story"), all["keep"].tokens[0]);
  ExpectAllFreed(*e);
}

TEST_F(EngineModelTest, RequestLargerThanThePoolIsRejectedAndTheNextRuns) {
  Config c;
  c.device_blocks = 16;  // 256 tokens
  c.max_model_len = 256;
  auto e = MakeEngine(c);
  EngineRequest big = Greedy("big", Ref("story").prompt_ids, 100);
  big.params.n = 4;  // 4 x ceil(115 / 16) = 32 blocks
  const absl::Status st = e->AddRequest(big);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_FALSE(e->HasUnfinishedRequests());
  ASSERT_TRUE(e->AddRequest(Greedy("next", Ref("plain_english").prompt_ids, 8)).ok());
  auto c2 = RunAll(*e)["next"];
  EXPECT_EQ(c2.tokens[0].size(), 8u);
  ExpectSameGreedy(Ref("plain_english"), c2.tokens[0]);
  ExpectAllFreed(*e);
}

TEST_F(EngineModelTest, PrefixCachingNeverChangesGreedyTokens) {
  Config c;
  c.prefix_caching = true;
  auto e = MakeEngine(c);
  const ReferencePrompt& p = Ref("long");
  auto run = [&](const std::string& id) {
    EXPECT_TRUE(e->AddRequest(Greedy(id, p.prompt_ids, 8)).ok());
    return RunAll(*e)[id];
  };
  const Collected cold = run("cold");
  ExpectSameGreedy(p, cold.tokens[0]);
  EXPECT_EQ(cold.usage.cached_prompt_tokens, 0);
  const Collected warm = run("warm");
  EXPECT_EQ(warm.tokens[0], cold.tokens[0]);
  EXPECT_GE(warm.usage.cached_prompt_tokens, 256);
  // A warm-up aborted right after its prefill, and one ended by a stop string.
  ASSERT_TRUE(e->AddRequest(Greedy("aborted", p.prompt_ids, 8)).ok());
  auto outs = e->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_TRUE(e->Abort("aborted").ok());
  RunAll(*e);
  EngineRequest stopped = Greedy("stopped", p.prompt_ids, 8);
  stopped.params.stop = {Decode({cold.tokens[0][1]})};
  ASSERT_TRUE(e->AddRequest(stopped).ok());
  const Collected st = RunAll(*e)["stopped"];
  EXPECT_EQ(st.reason[0], "stop");
  const Collected again = run("again");
  EXPECT_EQ(again.tokens[0], cold.tokens[0]);
  EXPECT_GT(e->stats().prefix_cache_hits, 0);
  ExpectAllFreed(*e);
}

// Regression test (commit c77901d, found by ASan): Worker::UpdateHistories
// copied a forked parent's state through a reference that
// flat_hash_map::operator[] invalidates when inserting the child rehashes the
// map. Forty-eight siblings forked in one plan rehash it several times; every
// sibling must see its parent's full history. Under ASan (scripts/test runs
// this binary sanitized) the old code is a heap-use-after-free report; without
// it, strong penalties turn a wrong history into a different token.
TEST_F(EngineModelTest, ManyForksInOneStepKeepTheParentHistory) {
  const std::vector<int32_t>& prompt = Ref("story").prompt_ids;
  const int len = static_cast<int>(prompt.size());
  const SeqId parent = 7000000;
  std::vector<int32_t> table;
  for (int b = 0; b * kBlockSize < len + 1; ++b) table.push_back(b);
  auto seq = [&](SeqId id, const std::vector<int32_t>& ids, int start) {
    SequenceStep s;
    s.seq_id = id;
    s.token_ids = ids;
    s.start_pos = start;
    s.new_state = start == 0;
    s.num_prompt_tokens = len;
    s.block_table = table;
    s.sampling.temperature = 0;
    s.sampling.repetition_penalty = 3.0f;
    s.sampling.presence_penalty = 2.0f;
    s.sampling.frequency_penalty = 2.0f;
    return s;
  };
  StepPlan prefill;
  prefill.step_id = 9000001;
  prefill.seqs.push_back(seq(parent, prompt, 0));
  auto r1 = worker_->Execute(prefill);
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_EQ(r1->tokens.size(), 1u);
  const int32_t t0 = r1->tokens[0].token_id;

  // The parent and 48 siblings forked from it decode t0 at the same position
  // over the same blocks (identical K/V written to the same slot).
  StepPlan decode;
  decode.step_id = 9000002;
  decode.seqs.push_back(seq(parent, {t0}, len));
  for (SeqId c = 1; c <= 48; ++c) {
    SequenceStep s = seq(parent + c, {t0}, len);
    s.fork_from = parent;
    decode.seqs.push_back(s);
  }
  auto r2 = worker_->Execute(decode);
  ASSERT_TRUE(r2.ok()) << r2.status();
  ASSERT_EQ(r2->tokens.size(), decode.seqs.size());
  for (const SampledToken& t : r2->tokens)
    EXPECT_EQ(t.token_id, r2->tokens[0].token_id) << "sibling " << t.seq_id - parent;

  // The same decode for a fresh sequence that never forked: its history is
  // the prompt and t0, built from scratch.
  StepPlan alone;
  alone.step_id = 9000003;
  std::vector<int32_t> all = prompt;
  all.push_back(t0);
  SequenceStep s = seq(parent + 100, all, 0);
  alone.seqs.push_back(s);
  auto r3 = worker_->Execute(alone);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_EQ(r3->tokens[0].token_id, r2->tokens[0].token_id);

  StepPlan fin;
  fin.step_id = 9000004;
  for (SeqId c = 0; c <= 48; ++c) fin.finished.push_back(parent + c);
  fin.finished.push_back(parent + 100);
  ASSERT_TRUE(worker_->Execute(fin).ok());
}

// Beam search against Hugging Face transformers' generate(num_beams=k,
// num_return_sequences=k, do_sample=False) in float32
// (tests/fixtures/make_beam_reference.py -> random_llama/beam_reference.json):
// the same k beams (token ids, best first), cumulative logprobs and scores.
struct BeamCase {
  std::string name;
  std::vector<int32_t> prompt_ids;
  int k = 0;
  float length_penalty = 1.0f;
  EarlyStopping early_stopping = EarlyStopping::kFalse;
  int32_t eos = 2;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<double> score, cumulative_logprob;
  std::vector<int32_t> greedy_ids;
};

std::vector<BeamCase> LoadBeamCases(int* max_new_tokens) {
  std::ifstream f(Env("PAGEDSERVE_SOURCE_DIR") +
                  "/tests/fixtures/random_llama/beam_reference.json");
  EXPECT_TRUE(f.good());
  const nlohmann::json j = nlohmann::json::parse(f);
  *max_new_tokens = j.at("max_new_tokens").get<int>();
  std::vector<BeamCase> out;
  for (const auto& c : j.at("cases")) {
    BeamCase b;
    b.name = c.at("name").get<std::string>();
    b.prompt_ids = c.at("prompt_ids").get<std::vector<int32_t>>();
    b.k = c.at("num_beams").get<int>();
    b.length_penalty = c.at("length_penalty").get<float>();
    const auto& es = c.at("early_stopping");
    b.early_stopping = es.is_string()   ? EarlyStopping::kNever
                       : es.get<bool>() ? EarlyStopping::kTrue
                                        : EarlyStopping::kFalse;
    b.eos = c.at("eos_token_id").get<int32_t>();
    for (const auto& beam : c.at("beams")) {
      b.tokens.push_back(beam.at("token_ids").get<std::vector<int32_t>>());
      b.score.push_back(beam.at("score").get<double>());
      b.cumulative_logprob.push_back(beam.at("cumulative_logprob").get<double>());
    }
    b.greedy_ids = c.at("greedy_ids").get<std::vector<int32_t>>();
    out.push_back(std::move(b));
  }
  return out;
}

EngineRequest BeamRequest(const BeamCase& c, int max_tokens, int32_t model_eos) {
  EngineRequest r;
  r.request_id = c.name;
  r.prompt_token_ids = c.prompt_ids;
  r.params.temperature = 0;
  r.params.max_tokens = max_tokens;
  r.params.n = c.k;
  r.params.best_of = c.k;
  r.params.use_beam_search = true;
  r.params.length_penalty = c.length_penalty;
  r.params.early_stopping = c.early_stopping;
  r.params.logprobs = 0;
  if (c.eos != model_eos) {  // the case's beam-ending token stands in for EOS
    r.params.ignore_eos = true;
    r.params.stop_token_ids = {c.eos};
  }
  return r;
}

// Score tolerance, from measurement: the fp32 path's logprobs differ from
// transformers' by rounding only; the largest |score difference| over the 14
// cases was 4.3e-6 (printed by the test), so 1e-4 (~25x) leaves room for
// another CPU's summation order while a wrong candidate (the closest
// returned beams of a case in the fixture are 5.3e-4 apart) would still fail.
constexpr double kBeamScoreTolerance = 1e-4;

TEST_F(EngineModelTest, BeamSearchMatchesTransformers) {
  int max_new = 0;
  const std::vector<BeamCase> cases = LoadBeamCases(&max_new);
  ASSERT_GE(cases.size(), 8u);
  auto e = MakeEngine(Config{});
  ASSERT_EQ(tokenizer_->eos_id(), 2);
  for (const BeamCase& c : cases)
    ASSERT_TRUE(e->AddRequest(BeamRequest(c, max_new, 2)).ok()) << c.name;
  auto all = RunAll(*e);
  double max_diff = 0.0;
  for (const BeamCase& c : cases) {
    const Collected& got = all[c.name];
    ASSERT_TRUE(got.finished) << c.name;
    ASSERT_EQ(got.tokens.size(), static_cast<size_t>(c.k)) << c.name;
    for (int i = 0; i < c.k; ++i) {
      EXPECT_EQ(got.tokens[i], c.tokens[i]) << c.name << " beam " << i;
      EXPECT_NEAR(got.beam_score[i], c.score[i], kBeamScoreTolerance) << c.name << " beam " << i;
      EXPECT_NEAR(got.cumulative_logprob[i], c.cumulative_logprob[i], kBeamScoreTolerance * max_new)
          << c.name << " beam " << i;
      max_diff = std::max(max_diff, std::abs(got.beam_score[i] - c.score[i]));
      const bool ended = !c.tokens[i].empty() && c.tokens[i].back() == c.eos;
      EXPECT_EQ(got.reason[i], ended ? "stop" : "length") << c.name << " beam " << i;
      // The ending token is reported but is not text (as for sampling).
      std::vector<int32_t> text_ids = got.tokens[i];
      if (ended) text_ids.pop_back();
      EXPECT_EQ(got.text[i], Decode(text_ids)) << c.name << " beam " << i;
    }
  }
  std::printf("beam search: max |score - transformers score| = %.3g over %zu cases\n", max_diff,
              cases.size());
  ExpectAllFreed(*e);
}

// Negative control: the comparison above can fail. Greedy decoding (n = 1)
// gives transformers' greedy tokens, which differ from the best beam on
// several prompts, so an engine that ignored use_beam_search would fail it.
TEST_F(EngineModelTest, BeamSearchNegativeControlGreedyDiffers) {
  int max_new = 0;
  const std::vector<BeamCase> cases = LoadBeamCases(&max_new);
  auto e = MakeEngine(Config{});
  for (const BeamCase& c : cases) {
    EngineRequest r = BeamRequest(c, max_new, 2);
    r.params = SamplingParams{};
    r.params.temperature = 0;
    r.params.max_tokens = max_new;
    if (c.eos != 2) r.params.ignore_eos = true, r.params.stop_token_ids = {c.eos};
    ASSERT_TRUE(e->AddRequest(r).ok());
  }
  auto all = RunAll(*e);
  int differs = 0;
  for (const BeamCase& c : cases) {
    EXPECT_EQ(all[c.name].tokens[0], c.greedy_ids) << c.name;
    differs += all[c.name].tokens[0] != c.tokens[0];
  }
  EXPECT_GE(differs, 3);
}

// The sliding-window fixture (every layer windowed: the scheduler frees the
// blocks behind the window) refuses a draft model, whose K/V lives in the
// same blocks. Runs in engine_sliding_window_test.
TEST_F(EngineModelTest, SlidingWindowTargetRefusesADraftModel) {
  WorkerOptions o;
  o.model_path = model_;
  o.draft_model_path = model_;
  o.dtype = WeightDType::kFloat32;
  o.block_size = kBlockSize;
  o.kv_cache_memory = 16LL << 20;
  auto w = Worker::Create(o, comm_);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(w.status().message().find("sliding window (24 tokens)"), std::string::npos)
      << w.status();
}

// A draft model must share the target's vocabulary (its token ids are fed
// to the target as they are): another one is refused when the worker loads,
// naming the file and both sizes.
TEST_F(EngineModelTest, DraftModelOfAnotherVocabularyIsRefused) {
  const std::string other = Env("PAGEDSERVE_OTHER_VOCAB_MODEL");  // 600 tokens
  ASSERT_FALSE(other.empty());
  WorkerOptions o;
  o.model_path = model_;
  o.draft_model_path = other;
  o.dtype = WeightDType::kFloat32;
  o.block_size = kBlockSize;
  o.kv_cache_memory = 16LL << 20;
  auto w = Worker::Create(o, comm_);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(w.status().message().find("vocabulary of 600 tokens, the target 49152"),
            std::string::npos)
      << w.status();
  EXPECT_NE(w.status().message().find(other), std::string::npos) << w.status();
}

SpeculativeConfig DraftModelSpec(int32_t k) {
  SpeculativeConfig c;
  c.method = "draft_model";
  c.model = "(the worker's)";  // the worker was created with it
  c.num_speculative_tokens = k;
  return c;
}

// Speculative decoding with a draft model, greedy: batches of 32 (every
// reference prompt, cycled), 6 and 1 give token for token what the same
// prompts give without speculation and the transformers reference (near-tie
// rule). Two drafts of the one vocabulary: the target cut to 3 of its 4
// layers (drafts accepted and rejected: a rejected run's draft K/V is fed
// again from the history) and the target itself (every draft accepted but
// near-ties: fewer steps).
TEST_F(EngineModelTest, DraftModelGreedyEqualsPlainGreedy) {
  const std::vector<std::string> all_names = {
      "plain_english", "story",     "code",        "multilingual", "numbers",
      "long",          "one_token", "chat_single", "chat_system",  "chat_multi_turn"};
  constexpr int kTokens = 24;
  // Request i of a batch of n asks for prompt all_names[i % 10].
  auto run = [&](const Config& c, int n, SchedulerStats* st) {
    auto e = MakeEngine(c);
    for (int i = 0; i < n; ++i) {
      const std::string& name = all_names[i % all_names.size()];
      EXPECT_TRUE(
          e->AddRequest(Greedy(absl::StrCat(name, "#", i), Ref(name).prompt_ids, kTokens)).ok());
    }
    auto all = RunAll(*e);
    *st = e->stats();
    ExpectAllFreed(*e);
    return all;
  };
  SchedulerStats plain_stats;
  const auto plain = run(Config{}, 32, &plain_stats);
  struct Case {
    int layers;  // of the draft; 0 = all
    int32_t k;
    int batch;
  };
  for (const Case& cs :
       std::vector<Case>{{3, 1, 6}, {3, 4, 32}, {3, 8, 1}, {0, 4, 6}, {0, 8, 32}}) {
    SCOPED_TRACE(::testing::Message()
                 << "draft layers " << cs.layers << ", k = " << cs.k << ", batch " << cs.batch);
    Config c;
    c.spec = DraftModelSpec(cs.k);
    c.worker = DraftWorker(cs.layers);
    ASSERT_NE(c.worker, nullptr);
    SchedulerStats st;
    const auto got = run(c, cs.batch, &st);
    for (int i = 0; i < cs.batch; ++i) {
      const std::string& name = all_names[i % all_names.size()];
      const std::string id = absl::StrCat(name, "#", i);
      // Request i of the plain batch of 32 asked for the same prompt.
      EXPECT_EQ(got.at(id).tokens[0], plain.at(id).tokens[0]) << id;
      ExpectSameGreedy(Ref(name), got.at(id).tokens[0]);
      EXPECT_EQ(got.at(id).usage.completion_tokens, kTokens) << id;
    }
    EXPECT_GT(st.spec_accepted_tokens, 0);
    if (cs.layers == 0) {
      // The target as its own draft: all but near-ties accepted.
      EXPECT_GE(st.spec_accepted_tokens * 10, st.spec_draft_tokens * 9)
          << st.spec_accepted_tokens << " of " << st.spec_draft_tokens;
      if (cs.batch == 32) {
        EXPECT_LT(st.num_steps * 2, plain_stats.num_steps);
      }
    } else {
      EXPECT_GT(st.spec_draft_tokens, st.spec_accepted_tokens);
    }
  }
  // Back-off (disable_by_batch_size 3): no drafts while 3 or more run, so the
  // draft sees nothing of those steps; as requests finish (max_tokens 4..24)
  // the rest speculate, and the draft first catches up on every token it
  // missed. With the target as its own draft that keeps acceptance near 1.
  {
    Config c;
    c.spec = DraftModelSpec(4);
    c.spec.disable_by_batch_size = 3;
    c.worker = DraftWorker(0);
    auto e = MakeEngine(c);
    for (int i = 0; i < 6; ++i) {
      const std::string& name = all_names[i];
      EXPECT_TRUE(
          e->AddRequest(Greedy(absl::StrCat(name, "#", i), Ref(name).prompt_ids, 4 + 4 * i)).ok());
    }
    const auto got = RunAll(*e);
    const SchedulerStats st = e->stats();
    for (int i = 0; i < 6; ++i) {
      const std::string id = absl::StrCat(all_names[i], "#", i);
      const std::vector<int32_t>& want = plain.at(id).tokens[0];
      EXPECT_EQ(got.at(id).tokens[0], std::vector<int32_t>(want.begin(), want.begin() + 4 + 4 * i))
          << id;
    }
    EXPECT_GT(st.spec_num_drafts, 0);
    EXPECT_GE(st.spec_accepted_tokens * 10, st.spec_draft_tokens * 9)
        << st.spec_accepted_tokens << " of " << st.spec_draft_tokens;
    ExpectAllFreed(*e);
  }
  // Prefix caching: a second request of a finished one's prompt starts from
  // its cached blocks, whose draft K/V the draft model reads as well.
  Config c;
  c.prefix_caching = true;
  c.spec = DraftModelSpec(4);
  c.worker = DraftWorker(3);
  auto e = MakeEngine(c);
  const ReferencePrompt& p = Ref("long");
  for (const char* id : {"first", "second"}) {
    EXPECT_TRUE(e->AddRequest(Greedy(id, p.prompt_ids, kTokens)).ok());
    const auto all = RunAll(*e);
    ExpectSameGreedy(p, all.at(id).tokens[0]);
    if (std::string(id) == "second") {
      EXPECT_GT(all.at(id).usage.cached_prompt_tokens, 0);
    }
  }
  ExpectAllFreed(*e);
}

class EnginePreemptionTest : public EngineModelTest,
                             public ::testing::WithParamInterface<PreemptionMode> {
 protected:
  // The body of PenaltiesAndSeedsMatchNumpyWithAndWithoutPreemption, with spec_.
  void CheckPenaltiesAndSeeds();
  SpeculativeConfig spec_;         // the speculative variants below set it
  Worker* spec_worker_ = nullptr;  // with a draft model: DraftWorker's
};

SpeculativeConfig Ngram(int32_t k, int32_t min_n = 1, int32_t max_n = 3) {
  SpeculativeConfig c;
  c.method = "ngram";
  c.num_speculative_tokens = k;
  c.prompt_lookup_min = min_n;
  c.prompt_lookup_max = max_n;
  return c;
}

// Speculative decoding (n-gram drafts), greedy: a batch of reference prompts
// gives token for token what the same batch gives without speculation, and
// the transformers reference (near-tie rule), with k_max = 2 and 8 (the
// per-sequence k adapts within 1..k_max; runs of 3 accepted tokens occur);
// drafts were
// both accepted and rejected (the random model repeats itself, so prompt
// lookup finds matches), and every block is freed. Then batch 1.
TEST_F(EngineModelTest, SpeculativeGreedyEqualsPlainGreedyForEveryK) {
  const std::vector<std::string> names = {"story", "numbers", "code", "one_token", "chat_system"};
  constexpr int kTokens = 24;
  auto run = [&](const Config& c, const std::vector<std::string>& batch, SchedulerStats* st) {
    auto e = MakeEngine(c);
    for (const std::string& n : batch)
      EXPECT_TRUE(e->AddRequest(Greedy(n, Ref(n).prompt_ids, kTokens)).ok());
    auto all = RunAll(*e);
    *st = e->stats();
    ExpectAllFreed(*e);
    return all;
  };
  SchedulerStats plain_stats;
  const auto plain = run(Config{}, names, &plain_stats);
  for (int32_t k : {2, 8}) {
    Config c;
    c.spec = Ngram(k);
    SchedulerStats st;
    const auto got = run(c, names, &st);
    for (const std::string& n : names) {
      EXPECT_EQ(got.at(n).tokens[0], plain.at(n).tokens[0]) << n << ", k = " << k;
      ExpectSameGreedy(Ref(n), got.at(n).tokens[0]);
      EXPECT_EQ(got.at(n).text[0], Decode(got.at(n).tokens[0])) << n;
      EXPECT_EQ(got.at(n).usage.completion_tokens, kTokens) << n;
    }
    EXPECT_GT(st.spec_accepted_tokens, 0) << "k = " << k;
    EXPECT_GT(st.spec_draft_tokens, st.spec_accepted_tokens) << "k = " << k;
    ASSERT_EQ(st.spec_accepted_per_pos.size(), static_cast<size_t>(k));
    for (int32_t j = 0; j < std::min(k, 3); ++j)
      EXPECT_GT(st.spec_accepted_per_pos[j], 0) << "k = " << k << ", position " << j;
    // Fewer forward passes than tokens: the point of it.
    EXPECT_LT(st.num_steps, plain_stats.num_steps) << "k = " << k;
  }
  // Stop strings inside speculative runs: the tokens after one are dropped and
  // the generation-token counter counts what the client got; one in the text
  // of the tokens before min_tokens never matches, as one token per step. Both
  // give what the same request gives without speculation.
  {
    const ReferencePrompt& p = Ref("numbers");
    const std::string late = Decode({p.greedy_ids[14], p.greedy_ids[15], p.greedy_ids[16]});
    const std::string early = Decode({p.greedy_ids[2]});
    auto run = [&](std::optional<SpeculativeConfig> spec, int min_tokens) {
      Config c;
      if (spec) c.spec = *spec;
      auto e = MakeEngine(c);
      EngineRequest r = Greedy("stopped", p.prompt_ids, kTokens);
      r.params.stop = {min_tokens > 0 ? early : late};
      r.params.min_tokens = min_tokens;
      EXPECT_TRUE(e->AddRequest(r).ok());
      Collected got = RunAll(*e)["stopped"];
      EXPECT_EQ(e->token_counters().generation_tokens, got.usage.completion_tokens);
      if (spec) {
        EXPECT_GT(e->stats().spec_accepted_tokens, 0);
      }
      ExpectAllFreed(*e);
      return got;
    };
    for (int min_tokens : {0, 6}) {
      SCOPED_TRACE(absl::StrCat("min_tokens ", min_tokens));
      const Collected plain = run(std::nullopt, min_tokens);
      const Collected spec = run(Ngram(8), min_tokens);
      EXPECT_EQ(spec.tokens[0], plain.tokens[0]);
      EXPECT_EQ(spec.text[0], plain.text[0]);
      EXPECT_EQ(spec.reason[0], plain.reason[0]);
      EXPECT_EQ(spec.usage.completion_tokens, plain.usage.completion_tokens);
    }
  }
  // Batch 1.
  Config c;
  c.spec = Ngram(5, 2, 4);
  SchedulerStats st;
  const auto got = run(c, {"story"}, &st);
  EXPECT_EQ(got.at("story").tokens[0], plain.at("story").tokens[0]) << "story alone";
  EXPECT_GT(st.spec_accepted_tokens, 0);
}

TEST_P(EnginePreemptionTest, PreemptedRequestsGiveTheSameGreedyTokens) {
  Config c;
  c.device_blocks = 8;  // 128 tokens for four requests that need 10 blocks together
  c.cpu_blocks = 16;
  c.max_model_len = 64;
  c.mode = GetParam();
  auto e = MakeEngine(c);
  const std::vector<std::string> names = {"plain_english", "story", "code", "numbers"};
  for (const std::string& n : names)
    ASSERT_TRUE(e->AddRequest(Greedy(n, Ref(n).prompt_ids, 16)).ok());
  auto all = RunAll(*e);
  const SchedulerStats st = e->stats();
  if (GetParam() == PreemptionMode::kSwap) {
    EXPECT_GT(st.num_preemptions_swap, 0);
  } else {
    EXPECT_GT(st.num_preemptions_recompute, 0);
  }
  for (const std::string& n : names) {
    EXPECT_EQ(all[n].tokens[0].size(), 16u) << n;
    ExpectSameGreedy(Ref(n), all[n].tokens[0]);
    EXPECT_EQ(all[n].text[0], Decode(all[n].tokens[0])) << n;
  }
  ExpectAllFreed(*e);
}

// The token history the sampler sees after preemption and after forks:
// penalties (repetition over prompt + output, presence / frequency over the
// output) and seeded parallel samples (n = 2: siblings forked on the worker)
// give exactly the tokens of a numpy reference
// (tests/fixtures/random_llama/sampling_engine_reference.json, written by
// tests/fixtures/make_sampling_engine_reference.py from transformers' logits,
// free-running, with the documented sampler algorithm and seeded stream
// reimplemented in Python), with a roomy pool and with one that forces
// preemption. A history that lost the prompt on recompute, a sibling that did
// not inherit its parent's tokens, a swapped-in sequence sampling with another
// history, or a seeded stream keyed by anything but (seed, sample, position)
// changes the penalized logits or the uniform and so the tokens. The
// reference's margins (>= 1e-3 logits greedy, >= 2e-4 of the mass from a CDF
// boundary sampled) are far above the ~1e-5 logit noise against transformers.
TEST_P(EnginePreemptionTest, PenaltiesAndSeedsMatchNumpyWithAndWithoutPreemption) {
  CheckPenaltiesAndSeeds();
}

void EnginePreemptionTest::CheckPenaltiesAndSeeds() {
  const nlohmann::json fixture = testing::ReadJson(
      testing::SourceDir() + "/tests/fixtures/random_llama/sampling_engine_reference.json");
  const nlohmann::json& refs = fixture.at("requests");
  ASSERT_EQ(refs.size(), 4u);
  auto requests = [&] {
    std::vector<EngineRequest> rs;
    for (const nlohmann::json& q : refs) {
      const nlohmann::json& p = q.at("params");
      EngineRequest r;
      r.request_id = q.at("name").get<std::string>();
      r.prompt_token_ids = q.at("prompt_ids").get<std::vector<int32_t>>();
      r.params.max_tokens = p.at("max_tokens").get<int>();
      r.params.ignore_eos = p.at("ignore_eos").get<bool>();
      r.params.repetition_penalty = p.at("repetition_penalty").get<float>();
      r.params.presence_penalty = p.at("presence_penalty").get<float>();
      r.params.frequency_penalty = p.at("frequency_penalty").get<float>();
      r.params.temperature = p.at("temperature").get<float>();
      r.params.n = p.at("n").get<int>();
      if (p.contains("seed")) {
        r.params.seed = p.at("seed").get<uint64_t>();
        r.params.top_k = p.at("top_k").get<int>();
      }
      rs.push_back(r);
    }
    return rs;
  };
  auto run = [&](Config c, SchedulerStats* st) {
    c.spec = spec_;
    c.worker = spec_worker_;
    auto e = MakeEngine(c);
    for (const EngineRequest& r : requests()) EXPECT_TRUE(e->AddRequest(r).ok());
    auto all = RunAll(*e);
    *st = e->stats();
    ExpectAllFreed(*e);
    return all;
  };
  SchedulerStats roomy_stats, tight_stats;
  const auto roomy = run(Config{}, &roomy_stats);
  EXPECT_EQ(roomy_stats.num_preemptions_swap + roomy_stats.num_preemptions_recompute, 0);
  Config tight;
  tight.device_blocks = 8;
  tight.cpu_blocks = 16;
  tight.max_model_len = 64;
  tight.mode = GetParam();
  const auto preempted = run(tight, &tight_stats);
  if (GetParam() == PreemptionMode::kSwap) {
    EXPECT_GT(tight_stats.num_preemptions_swap, 0);
  } else {
    EXPECT_GT(tight_stats.num_preemptions_recompute, 0);
  }
  int sampled = 0, differs_from_plain_greedy = 0;
  for (const nlohmann::json& q : refs) {
    const std::string name = q.at("name").get<std::string>();
    const nlohmann::json& samples = q.at("samples");
    for (const auto* got : {&roomy, &preempted}) {
      const char* pool = got == &roomy ? "roomy pool" : "tight pool";
      const Collected& c = got->at(name);
      ASSERT_EQ(c.tokens.size(), samples.size()) << name << ", " << pool;
      for (size_t k = 0; k < samples.size(); ++k) {
        EXPECT_EQ(c.tokens[k], samples[k].at("tokens").get<std::vector<int32_t>>())
            << name << " sample " << k << ", " << pool << " (numpy reference)";
      }
    }
    if (samples.size() > 1) {
      ++sampled;
      EXPECT_NE(samples[0].at("tokens"), samples[1].at("tokens")) << name;
    } else {
      differs_from_plain_greedy += samples[0].at("tokens") != samples[0].at("plain_greedy_prefix");
    }
  }
  // Both kinds are present and the penalties change greedy tokens (the test
  // would not see a lost history otherwise).
  EXPECT_EQ(sampled, 2);
  EXPECT_GT(differs_from_plain_greedy, 0);
}

// The same with speculative decoding (k = 4 with swap preemption; k = 6 and
// lookups of 1..2 tokens with recompute): penalties read the history up to each verified position
// and seeded rows draw the uniform keyed by (seed, sample index, position), so the
// accepted-or-replaced tokens equal the numpy reference exactly (the verification samples the
// target at every draft position: a draft token is kept iff it is what the target drew,
// speculative.h).
TEST_P(EnginePreemptionTest, SpeculativePenaltiesAndSeedsMatchNumpy) {
  spec_ = GetParam() == PreemptionMode::kSwap ? Ngram(4) : Ngram(6, 1, 2);
  CheckPenaltiesAndSeeds();
}

// The same with a draft model (the target cut to 3 layers, k = 3): every
// token the target drew, at every position, with its penalties and seeded
// uniform, as the numpy reference, with and without preemption (whose swaps
// and recomputes move or rebuild the draft's K/V too).
TEST_P(EnginePreemptionTest, DraftModelPenaltiesAndSeedsMatchNumpy) {
  spec_ = DraftModelSpec(3);
  spec_worker_ = DraftWorker(3);
  ASSERT_NE(spec_worker_, nullptr);
  CheckPenaltiesAndSeeds();
}

// Greedy tokens with a draft model under a pool that forces preemption.
// With the target as its own draft, acceptance stays near 1 across swaps and
// recomputes: the draft's K/V moved with the target's blocks (swap) or was
// rebuilt (recompute); a draft pool left behind would feed it stale K/V.
TEST_P(EnginePreemptionTest, DraftModelPreemptedRequestsGiveTheSameGreedyTokens) {
  for (const int layers : {3, 0}) {
    SCOPED_TRACE(::testing::Message() << "draft layers " << layers);
    Config c;
    c.device_blocks = 8;
    c.cpu_blocks = 16;
    c.max_model_len = 64;
    c.mode = GetParam();
    c.spec = DraftModelSpec(5);
    c.worker = DraftWorker(layers);
    ASSERT_NE(c.worker, nullptr);
    auto e = MakeEngine(c);
    const std::vector<std::string> names = {"plain_english", "story", "code", "numbers"};
    for (const std::string& n : names)
      ASSERT_TRUE(e->AddRequest(Greedy(n, Ref(n).prompt_ids, 16)).ok());
    auto all = RunAll(*e);
    const SchedulerStats st = e->stats();
    EXPECT_GT(st.num_preemptions_swap + st.num_preemptions_recompute, 0);
    EXPECT_GT(st.spec_accepted_tokens, 0);
    if (layers == 0) {
      EXPECT_GE(st.spec_accepted_tokens * 10, st.spec_draft_tokens * 9)
          << st.spec_accepted_tokens << " of " << st.spec_draft_tokens;
    }
    for (const std::string& n : names) {
      EXPECT_EQ(all[n].tokens[0].size(), 16u) << n;
      ExpectSameGreedy(Ref(n), all[n].tokens[0]);
    }
    ExpectAllFreed(*e);
  }
}

// Greedy tokens with speculation under a pool that forces preemption.
TEST_P(EnginePreemptionTest, SpeculativePreemptedRequestsGiveTheSameGreedyTokens) {
  Config c;
  c.device_blocks = 8;
  c.cpu_blocks = 16;
  c.max_model_len = 64;
  c.mode = GetParam();
  c.spec = Ngram(6);
  auto e = MakeEngine(c);
  const std::vector<std::string> names = {"plain_english", "story", "code", "numbers"};
  for (const std::string& n : names)
    ASSERT_TRUE(e->AddRequest(Greedy(n, Ref(n).prompt_ids, 16)).ok());
  auto all = RunAll(*e);
  const SchedulerStats st = e->stats();
  EXPECT_GT(st.num_preemptions_swap + st.num_preemptions_recompute, 0);
  EXPECT_GT(st.spec_accepted_tokens, 0);
  for (const std::string& n : names) {
    EXPECT_EQ(all[n].tokens[0].size(), 16u) << n;
    ExpectSameGreedy(Ref(n), all[n].tokens[0]);
  }
  ExpectAllFreed(*e);
}

// Beam search under preemption: the beams of a request are swapped or
// recomputed together and give the same beams and scores as with a roomy pool.
TEST_P(EnginePreemptionTest, BeamSearchSameWithAndWithoutPreemption) {
  int max_new = 0;
  std::vector<BeamCase> cases = LoadBeamCases(&max_new);
  std::erase_if(cases, [](const BeamCase& c) { return c.k != 4; });
  ASSERT_GE(cases.size(), 4u);
  auto run = [&](const Config& c) {
    auto e = MakeEngine(c);
    for (const BeamCase& bc : cases)
      EXPECT_TRUE(e->AddRequest(BeamRequest(bc, max_new, 2)).ok()) << bc.name;
    auto all = RunAll(*e);
    ExpectAllFreed(*e);
    return std::make_pair(all, e->stats());
  };
  const auto [roomy, roomy_stats] = run(Config{});
  Config tight;
  tight.device_blocks = 12;  // four beams of ~2 blocks each for several requests
  tight.cpu_blocks = 32;
  tight.max_model_len = 48;
  tight.mode = GetParam();
  const auto [preempted, st] = run(tight);
  EXPECT_GT(
      GetParam() == PreemptionMode::kSwap ? st.num_preemptions_swap : st.num_preemptions_recompute,
      0);
  for (const BeamCase& c : cases) {
    const Collected& a = roomy.at(c.name);
    const Collected& b = preempted.at(c.name);
    ASSERT_EQ(a.tokens.size(), 4u) << c.name;
    ASSERT_EQ(b.tokens.size(), 4u) << c.name;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(b.tokens[i], a.tokens[i]) << c.name << " beam " << i;
      EXPECT_NEAR(b.beam_score[i], a.beam_score[i], 1e-5) << c.name << " beam " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, EnginePreemptionTest,
                         ::testing::Values(PreemptionMode::kSwap, PreemptionMode::kRecompute),
                         [](const auto& info) {
                           return std::string(info.param == PreemptionMode::kSwap ? "Swap"
                                                                                  : "Recompute");
                         });

}  // namespace
}  // namespace pagedserve
