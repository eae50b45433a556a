// EngineLoop: the engine on one thread, front ends on others. A scripted
// executor (no model) whose Execute can be held at a gate shows that Submit,
// Abort, Snapshot and healthy() never wait for a step in progress, that
// outputs reach each request's channel, that an abort frees the request's KV
// blocks, that the waiting-queue bound and the one admission check hold, and
// that the shutdown drains. Written to be ThreadSanitizer-clean.
#include "runtime/engine/engine_loop.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/tokenizer/loaders.h"
#include "tests/common/fixture_tokenizer.h"
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

// A ScriptedExecutor whose steps wait while the gate is closed.
class GatedExecutor : public Executor {
 public:
  explicit GatedExecutor(std::unique_ptr<ScriptedExecutor> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int step = ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_ || step <= free_steps_; });
    return inner_->Execute(plan);
  }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return inner_->num_device_blocks(); }
  int64_t num_cpu_blocks() const override { return inner_->num_cpu_blocks(); }

  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    cv_.notify_all();
  }
  // While closed, steps 1..n (counting from the start) still run.
  void SetFreeSteps(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    free_steps_ = n;
    cv_.notify_all();
  }
  // Waits until `n` steps have entered Execute (counting from the start).
  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return entered_ >= n; });
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }

 private:
  std::unique_ptr<ScriptedExecutor> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int free_steps_ = 0;
  int entered_ = 0;
};

struct Fixture {
  GatedExecutor* exec = nullptr;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineLoop> loop;
  std::atomic<bool> stop{false}, abort_now{false};
  std::thread thread;
  absl::Status run_status;

  explicit Fixture(EngineLoopOptions lo = {}, int32_t max_model_len = 256) {
    auto inner = std::make_unique<ScriptedExecutor>(
        ScriptedExecutor::Script{{Ids("A")[0], {Ids(" one two three")}}}, 64, 0, 16, Ids(" x")[0]);
    auto gated = std::make_unique<GatedExecutor>(std::move(inner));
    exec = gated.get();
    EngineOptions o;
    o.scheduler.block_size = 16;
    o.scheduler.max_model_len = max_model_len;
    o.scheduler.max_num_batched_tokens = 512;
    auto e = Engine::Create(o, &Tok(), std::move(gated), {Tok().eos_id()});
    EXPECT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
    lo.idle_wait = absl::Milliseconds(5);
    loop = std::make_unique<EngineLoop>(engine.get(), lo);
    thread = std::thread([this] { run_status = loop->Run(stop, abort_now); });
  }
  ~Fixture() {
    exec->SetOpen(true);
    stop.store(true);
    abort_now.store(true);
    thread.join();
  }
};

EngineRequest Req(const std::string& id, const std::string& prompt, int max_tokens,
                  bool ignore_eos = false) {
  EngineRequest r;
  r.request_id = id;
  r.prompt_token_ids = Ids(prompt);
  r.params.max_tokens = max_tokens;
  r.params.temperature = 0;
  r.params.ignore_eos = ignore_eos;
  return r;
}

// Pops outputs until the final one; returns the text of sample 0 and its reason.
std::pair<std::string, FinishReason> Drain(RequestChannel& c) {
  std::string text;
  FinishReason reason = FinishReason::kNone;
  while (true) {
    std::optional<EngineOutput> o = c.WaitPop(absl::Seconds(60));
    if (!o.has_value()) {
      ADD_FAILURE() << "no output within 60 s";
      return {text, reason};
    }
    for (const SequenceDelta& d : o->deltas) {
      text += d.text;
      if (d.finished) reason = d.finish_reason;
    }
    if (o->finished) return {text, reason};
  }
}

TEST(EngineLoopTest, RequestsFromSeveralThreadsGetTheirOutputs) {
  Fixture f;
  std::vector<std::thread> clients;
  clients.reserve(4);
  std::vector<std::string> texts(4);
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      auto c = std::make_shared<RequestChannel>();
      ASSERT_TRUE(f.loop->Submit(Req("r" + std::to_string(i), "A", 3), c).ok());
      auto [text, reason] = Drain(*c);
      texts[i] = text;
      EXPECT_EQ(reason, FinishReason::kLength);
    });
  }
  for (auto& t : clients) t.join();
  for (const std::string& t : texts) EXPECT_EQ(t, " one two three");
}

TEST(EngineLoopTest, SnapshotHealthAndSubmitDoNotWaitForAStepInProgress) {
  Fixture f;
  f.exec->SetOpen(false);  // the next step blocks inside Execute
  auto c = std::make_shared<RequestChannel>();
  ASSERT_TRUE(f.loop->Submit(Req("long", "A", 50, true), c).ok());
  f.exec->WaitEntered(1);  // the engine thread is now inside the step
  // Order, not time: these return while the step is still held at the gate
  // (if they waited for it, the futures would never become ready).
  auto probe = std::async(std::launch::async, [&] {
    EngineSnapshot s = f.loop->Snapshot();
    const bool healthy = f.loop->healthy();
    const absl::Status second =
        f.loop->Submit(Req("second", "A", 2), std::make_shared<RequestChannel>());
    return std::make_tuple(s, healthy, second);
  });
  ASSERT_EQ(probe.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "blocked on the step";
  auto [snap, healthy, second] = probe.get();
  EXPECT_EQ(f.exec->entered(), 1);  // still the same step
  EXPECT_TRUE(healthy);
  EXPECT_TRUE(second.ok()) << second;
  EXPECT_EQ(snap.in_flight, 1);
  EXPECT_EQ(snap.max_model_len, 256);
  f.exec->SetOpen(true);
  EXPECT_EQ(Drain(*c).second, FinishReason::kLength);
}

TEST(EngineLoopTest, AbortFreesTheBlocksAndEndsWithAbort) {
  Fixture f;
  f.exec->SetFreeSteps(2);  // prefill and one decode, then the third step waits
  f.exec->SetOpen(false);
  auto c = std::make_shared<RequestChannel>();
  ASSERT_TRUE(f.loop->Submit(Req("a", "A", 200, true), c).ok());
  std::optional<EngineOutput> first = c->WaitPop(absl::Seconds(60));
  ASSERT_TRUE(first.has_value());
  EXPECT_FALSE(first->finished);
  f.exec->WaitEntered(3);  // step 2 was published: the request holds blocks
  EXPECT_GT(f.loop->Snapshot().kv_blocks_used, 0);
  f.loop->Abort("a");
  f.exec->SetOpen(true);
  EXPECT_EQ(Drain(*c).second, FinishReason::kAbort);
  // The blocks are back once the step that released them was published.
  for (int i = 0; i < 6000 && f.loop->Snapshot().kv_blocks_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(f.loop->Snapshot().kv_blocks_used, 0);
  EXPECT_EQ(f.loop->Snapshot().in_flight, 0);
  f.loop->Abort("a");  // finished: ignored
  f.loop->Abort("never-submitted");
}

TEST(EngineLoopTest, OneAdmissionCheck) {
  EngineLoopOptions lo;
  lo.max_queue_len = 3;
  Fixture f(lo, /*max_model_len=*/64);
  auto ch = [] { return std::make_shared<RequestChannel>(); };
  EngineRequest too_long = Req("long", "A", 1);
  too_long.prompt_token_ids.assign(64, Ids("A")[0]);
  EXPECT_EQ(f.loop->Submit(too_long, ch()).code(), absl::StatusCode::kOutOfRange);
  EngineRequest bad = Req("bad", "A", 1);
  bad.params.top_p = 0;
  EXPECT_EQ(f.loop->Submit(bad, ch()).code(), absl::StatusCode::kInvalidArgument);
  EngineRequest oov = Req("oov", "A", 1);
  oov.prompt_token_ids = {Tok().vocab_size()};
  EXPECT_EQ(f.loop->Submit(oov, ch()).code(), absl::StatusCode::kInvalidArgument);

  // Hold the engine inside a step: new adds queue up and count against the bound.
  f.exec->SetOpen(false);
  auto c0 = ch();
  ASSERT_TRUE(f.loop->Submit(Req("r0", "A", 40, true), c0).ok());
  f.exec->WaitEntered(1);
  // Waiting as last published (r0 may still count: figures are one step old).
  const int64_t waiting = f.loop->Snapshot().scheduler.num_waiting;
  ASSERT_LT(waiting, lo.max_queue_len);
  ASSERT_TRUE(f.loop->Submit(Req("r1", "A", 2), ch()).ok());
  EXPECT_EQ(f.loop->Submit(Req("r1", "A", 2), ch()).code(), absl::StatusCode::kAlreadyExists);
  for (int64_t i = 2; i <= lo.max_queue_len - waiting; ++i) {
    ASSERT_TRUE(f.loop->Submit(Req("r" + std::to_string(i), "A", 2), ch()).ok());
  }
  EXPECT_EQ(f.loop->Submit(Req("over", "A", 2), ch()).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(f.loop->Snapshot().queued_adds, lo.max_queue_len - waiting);
  EXPECT_EQ(f.exec->entered(), 1);
  f.exec->SetOpen(true);
  EXPECT_EQ(Drain(*c0).second, FinishReason::kLength);
}

TEST(EngineLoopTest, ShutdownRefusesNewRequestsAndDrains) {
  Fixture f;
  auto c = std::make_shared<RequestChannel>();
  ASSERT_TRUE(f.loop->Submit(Req("d", "A", 3), c).ok());
  f.stop.store(true);
  for (int i = 0; i < 6000 && f.loop->healthy(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(f.loop->healthy());
  EXPECT_EQ(f.loop->Submit(Req("late", "A", 3), std::make_shared<RequestChannel>()).code(),
            absl::StatusCode::kUnavailable);
  auto [text, reason] = Drain(*c);  // in-flight requests finish within the grace period
  EXPECT_EQ(text, " one two three");
  EXPECT_EQ(reason, FinishReason::kLength);
}

// A signal sets `stop` while the engine thread is inside a step (it cannot look
// at the flag until the step ends): a request submitted then is refused, not
// queued and served after the step (what the preStop drain relies on).
TEST(EngineLoopTest, StopRefusesSubmitsBeforeTheLoopNoticesIt) {
  Fixture f;
  f.exec->SetOpen(false);  // the next step blocks inside Execute
  auto c = std::make_shared<RequestChannel>();
  ASSERT_TRUE(f.loop->Submit(Req("long", "A", 20, true), c).ok());
  f.exec->WaitEntered(1);
  f.stop.store(true);
  EXPECT_FALSE(f.loop->healthy());
  EXPECT_EQ(f.loop->Submit(Req("late", "A", 3), std::make_shared<RequestChannel>()).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(f.exec->entered(), 1);  // still the same step: the loop has not looked yet
  f.exec->SetOpen(true);
  EXPECT_EQ(Drain(*c).second, FinishReason::kLength);  // the one in flight completes
}

// The engine thread is stuck inside a step (as a coordinator's can be inside
// an MPI call after a worker died): FailAll, from another thread, gives every
// request its final error output at once, refuses new requests, and drops what
// the step produces for them if it ever returns.
TEST(EngineLoopTest, FailAllWhileTheEngineThreadIsStuckInAStep) {
  Fixture f;
  f.exec->SetFreeSteps(1);  // the prefill runs, the first decode waits
  f.exec->SetOpen(false);
  auto c = std::make_shared<RequestChannel>();
  ASSERT_TRUE(f.loop->Submit(Req("stuck", "A", 20, true), c).ok());
  std::optional<EngineOutput> first = c->WaitPop(absl::Seconds(60));
  ASSERT_TRUE(first.has_value());
  ASSERT_FALSE(first->finished);
  f.exec->WaitEntered(2);  // the engine thread is inside the decode step
  const absl::Status lost = absl::UnavailableError("worker rank 2 lost: its connection closed");
  EXPECT_EQ(f.loop->FailAll(lost), 1);
  std::optional<EngineOutput> final_out = c->TryPop();  // pushed before FailAll returned
  ASSERT_TRUE(final_out.has_value());
  EXPECT_TRUE(final_out->finished);
  EXPECT_EQ(final_out->error, lost);
  EXPECT_EQ(f.exec->entered(), 2);  // still the same step
  const EngineSnapshot snap = f.loop->Snapshot();
  EXPECT_TRUE(snap.failed);
  EXPECT_EQ(snap.in_flight, 0);
  EXPECT_FALSE(f.loop->healthy());
  EXPECT_EQ(f.loop->Submit(Req("late", "A", 3), std::make_shared<RequestChannel>()).code(),
            absl::StatusCode::kFailedPrecondition);
  // The step returns after all and more run: nothing more reaches the channel.
  f.exec->SetOpen(true);
  f.exec->WaitEntered(5);
  EXPECT_FALSE(c->TryPop().has_value());
}

}  // namespace
}  // namespace pagedserve
