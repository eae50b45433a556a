// pagedserve_tp_driver: drives the mpirun process model (runtime/launch/)
// without the engine, for the distributed tests and the TP decode benchmark.
//
//   mpirun -np 1+TP pagedserve_tp_driver --model PATH --tp TP [flags]
//
// Rank 0 builds the step plans itself (greedy decoding, contiguous block
// tables, one prefill step for every prompt then decode steps) and runs them
// through MakeMpiExecutor. The plans are incremental as the scheduler's
// (runtime/common/step_plan.h): a sequence's first step carries its full block
// table, later steps none (its row is allocated up front and never changes)
// except the whole row after a swap-in; the other ranks run RunWorkerRank. Without mpirun
// (one rank) the plans run on an in-process worker. Output on stdout of rank 0:
//   "seq I: T1 T2 ..."  the generated token ids of each prompt
//   "step N"            before every step (the kill test waits for these)
//   "stats ..."         with --bench: per-step times (see bench/tp_decode.sh)
//   "plan bytes ..."    encoded step plan size (EncodeStepPlan): the prefill
//                       step's and the mean over decode steps
// Flags:
//   --prompts "1 2 3,4 5"  token ids of the prompts (default: 3 fixed prompts)
//   --max-tokens N         tokens generated per prompt (default 8)
//   --swap-at S            at decode step S swap sequence 0 out to the CPU pool,
//                          run one step without it, then swap it back in to
//                          other device blocks (the tokens must not change);
//                          prints "swap out: N blocks at decode step S" and
//                          "swap in: N blocks at decode step S"
//   --bench-seqs B         instead of --prompts: B prompts of 8 tokens each
//   --step-timeout-ms T    executor step timeout (default kDefaultStepTimeout)
//   --step-delay-ms D      sleep before each step (gives the kill test time)
//   --kv-cache-memory B / --swap-space B   per-worker pool budgets in bytes
//   --worker-block-size B  the worker ranks' block size (default: the coordinator's
//                          16); a different one must fail the start-up handshake
// Exit code: 0 on success, 1 on an executor error, 2 on bad usage.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "distributed/communicator.h"
#include "distributed/step_plan_codec.h"
#include "runtime/engine/executor.h"
#include "runtime/launch/mpi_executor.h"
#include "runtime/launch/mpi_process.h"
#include "runtime/launch/worker_rank.h"
#include "runtime/worker/worker.h"

namespace pagedserve {
namespace {

struct DriverFlags {
  std::string model;
  int tp = 1;
  std::vector<std::vector<int32_t>> prompts = {
      {1, 15, 2000, 345, 77, 9001},
      {42, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34},
      {5}};
  int max_tokens = 8;
  int swap_at = -1;
  int bench_seqs = 0;
  int64_t step_timeout_ms = absl::ToInt64Milliseconds(kDefaultStepTimeout);
  int64_t step_delay_ms = 0;
  int64_t kv_cache_memory = 64LL << 20;
  int64_t swap_space = 16LL << 20;
  int block_size = 16;
  int worker_block_size = 16;
  // Weight precision (--dtype); float32 by default so that TP equality is
  // checked on the exact path.
  WeightDType dtype = WeightDType::kFloat32;
};

bool ParseFlags(int argc, char** argv, DriverFlags* f, std::string* err) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : std::string(); };
    int64_t v = 0;
    auto num = [&](int64_t* out) {
      std::string s = value();
      if (!absl::SimpleAtoi(s, out)) {
        *err = absl::StrCat(a, ": not a number: '", s, "'");
        return false;
      }
      return true;
    };
    if (a == "--model") {
      f->model = value();
    } else if (a == "--prompts") {
      f->prompts.clear();
      for (absl::string_view p : absl::StrSplit(value(), ',', absl::SkipEmpty())) {
        std::vector<int32_t> ids;
        for (absl::string_view t : absl::StrSplit(p, ' ', absl::SkipEmpty())) {
          int32_t id = 0;
          if (!absl::SimpleAtoi(t, &id)) {
            *err = "--prompts: bad token id '" + std::string(t) + "'";
            return false;
          }
          ids.push_back(id);
        }
        if (!ids.empty()) f->prompts.push_back(ids);
      }
    } else if (a == "--tp") {
      if (!num(&v)) return false;
      f->tp = static_cast<int>(v);
    } else if (a == "--max-tokens") {
      if (!num(&v)) return false;
      f->max_tokens = static_cast<int>(v);
    } else if (a == "--swap-at") {
      if (!num(&v)) return false;
      f->swap_at = static_cast<int>(v);
    } else if (a == "--bench-seqs") {
      if (!num(&v)) return false;
      f->bench_seqs = static_cast<int>(v);
    } else if (a == "--step-timeout-ms") {
      if (!num(&f->step_timeout_ms)) return false;
    } else if (a == "--step-delay-ms") {
      if (!num(&f->step_delay_ms)) return false;
    } else if (a == "--kv-cache-memory") {
      if (!num(&f->kv_cache_memory)) return false;
    } else if (a == "--swap-space") {
      if (!num(&f->swap_space)) return false;
    } else if (a == "--worker-block-size") {
      if (!num(&v)) return false;
      f->worker_block_size = static_cast<int>(v);
    } else if (a == "--dtype") {
      absl::StatusOr<WeightDType> d = ParseWeightDType(value());
      if (!d.ok()) {
        *err = std::string(d.status().message());
        return false;
      }
      f->dtype = *d;
    } else {
      *err = "unknown flag " + a;
      return false;
    }
  }
  if (f->model.empty()) {
    *err = "--model is required";
    return false;
  }
  if (f->bench_seqs > 0) {
    f->prompts.clear();
    for (int s = 0; s < f->bench_seqs; ++s) {
      std::vector<int32_t> ids;
      ids.reserve(8);
      for (int t = 0; t < 8; ++t) ids.push_back(100 + 37 * s + 11 * t);
      f->prompts.push_back(ids);
    }
  }
  return true;
}

// TP = 1 without mpirun: the plans run on a worker in this process.
class InProcessExecutor final : public Executor {
 public:
  static absl::StatusOr<std::unique_ptr<Executor>> Create(const WorkerOptions& options) {
    auto e = std::unique_ptr<InProcessExecutor>(new InProcessExecutor());
    e->comm_ = MakeSingleRankCommunicator();
    auto w = Worker::Create(options, e->comm_.get());
    if (!w.ok()) return w.status();
    e->worker_ = std::move(*w);
    return std::unique_ptr<Executor>(std::move(e));
  }
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    return worker_->Execute(plan);
  }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return worker_->num_device_blocks(); }
  int64_t num_cpu_blocks() const override { return worker_->num_cpu_blocks(); }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Worker> worker_;
};

struct Seq {
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;
  int32_t cached = 0;           // tokens whose K/V are in the cache
  std::vector<int32_t> blocks;  // device blocks
  std::vector<int32_t> generated;
  bool swapped = false;
  bool send_full_row = true;  // the workers' mirror of its row is stale (start, swap-in)
};

// Runs the whole generation on rank 0 in named phases: allocate blocks, then per
// step plan the swap, build the plan, execute it, apply its tokens and record
// its figures; finally print the results.
class Coordinator {
 public:
  Coordinator(const DriverFlags& f, Executor& exec) : f_(f), exec_(exec) {
    greedy_.temperature = 0.0f;
    greedy_.max_tokens = f.max_tokens;
    greedy_.ignore_eos = true;
  }

  // Returns the exit code.
  int Run() {
    if (!AllocateBlocks()) return 2;
    while (AnyUnfinished()) {
      StepPlan plan;
      plan.step_id = step_id_;
      const bool prefill = step_id_ == 0;
      if (!prefill) PlanSwap(plan);
      BuildPlan(prefill, plan);
      std::printf("step %llu\n", static_cast<unsigned long long>(step_id_));
      std::fflush(stdout);
      if (f_.step_delay_ms > 0)
        std::this_thread::sleep_for(std::chrono::milliseconds(f_.step_delay_ms));
      const auto t0 = std::chrono::steady_clock::now();
      absl::StatusOr<StepResult> r = exec_.Execute(plan);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!ApplyTokens(plan, r)) return 1;
      RecordStep(plan, prefill, dt);
      ++step_id_;
    }
    PrintResults();
    return 0;
  }

 private:
  // Contiguous device blocks for every sequence's prompt and generated tokens
  // (and, with --swap-at, a fresh range for sequence 0's swap-in). False, with
  // a message, when the pools are too small.
  bool AllocateBlocks() {
    const int bs = f_.block_size;
    seqs_.resize(f_.prompts.size());
    int32_t next_block = 0;
    for (size_t i = 0; i < seqs_.size(); ++i) {
      seqs_[i].tokens = f_.prompts[i];
      seqs_[i].prompt_len = static_cast<int32_t>(f_.prompts[i].size());
      const int need = (seqs_[i].prompt_len + f_.max_tokens + bs - 1) / bs;
      for (int b = 0; b < need; ++b) seqs_[i].blocks.push_back(next_block++);
    }
    // Sequence 0 is swapped back in to a fresh range after --swap-at.
    swap_in_base_ = next_block;
    const int64_t blocks_needed = next_block + (f_.swap_at >= 0 ? seqs_[0].blocks.size() : 0);
    if (blocks_needed > exec_.num_device_blocks() ||
        (f_.swap_at >= 0 &&
         static_cast<int64_t>(seqs_[0].blocks.size()) > exec_.num_cpu_blocks())) {
      std::fprintf(
          stderr, "driver: need %lld device blocks (have %lld) and %zu swap blocks (have %lld)\n",
          static_cast<long long>(blocks_needed), static_cast<long long>(exec_.num_device_blocks()),
          seqs_[0].blocks.size(), static_cast<long long>(exec_.num_cpu_blocks()));
      return false;
    }
    return true;
  }

  bool AnyUnfinished() const {
    bool any = false;
    for (const Seq& s : seqs_) any |= static_cast<int>(s.generated.size()) < f_.max_tokens;
    return any;
  }

  // A decode step's swap of sequence 0: out to the CPU pool at --swap-at, back
  // in to the fresh device range on the next step.
  void PlanSwap(StepPlan& plan) {
    Seq& s0 = seqs_[0];
    if (f_.swap_at >= 0 && decode_step_ == f_.swap_at && !s0.swapped && !swapped_in_pending_) {
      for (size_t b = 0; b < s0.blocks.size(); ++b)
        plan.swap_out.push_back({s0.blocks[b], static_cast<int32_t>(b)});
      s0.swapped = true;
      std::printf("swap out: %zu blocks at decode step %d\n", plan.swap_out.size(), decode_step_);
    } else if (s0.swapped) {
      for (size_t b = 0; b < s0.blocks.size(); ++b) {
        plan.swap_in.push_back({static_cast<int32_t>(b), swap_in_base_ + static_cast<int32_t>(b)});
        s0.blocks[b] = swap_in_base_ + static_cast<int32_t>(b);
      }
      s0.swapped = false;
      s0.send_full_row = true;  // its row moved to other device blocks
      swapped_in_pending_ = true;
      std::printf("swap in: %zu blocks at decode step %d\n", plan.swap_in.size(), decode_step_);
    }
  }

  // The incremental entries of every running sequence, and the sequences that
  // finished on the previous step.
  void BuildPlan(bool prefill, StepPlan& plan) {
    for (size_t i = 0; i < seqs_.size(); ++i) {
      Seq& s = seqs_[i];
      if (s.swapped || static_cast<int>(s.generated.size()) >= f_.max_tokens) continue;
      SequenceStep st;
      st.seq_id = i;
      st.start_pos = s.cached;
      st.token_ids.assign(s.tokens.begin() + s.cached, s.tokens.end());
      // Block-table delta: the whole row when the workers' copy is stale, else
      // nothing (start = the row's length).
      if (s.send_full_row) {
        st.block_table = s.blocks;
        s.send_full_row = false;
      } else {
        st.block_table_start = static_cast<int32_t>(s.blocks.size());
      }
      st.sampling = greedy_;  // sent only when the sequence starts
      st.num_prompt_tokens = s.prompt_len;
      st.new_state = prefill;
      plan.seqs.push_back(std::move(st));
    }
    plan.finished = finished_;
    finished_.clear();
  }

  // Appends each sampled token to its sequence; false, with a message, when the
  // step failed or its result does not match the plan.
  bool ApplyTokens(const StepPlan& plan, const absl::StatusOr<StepResult>& r) {
    if (!r.ok()) {
      std::fprintf(stderr, "driver: step %llu failed: %s\n",
                   static_cast<unsigned long long>(step_id_), r.status().ToString().c_str());
      return false;
    }
    if (r->tokens.size() != plan.seqs.size()) {
      std::fprintf(stderr, "driver: step %llu: %zu tokens for %zu sequences\n",
                   static_cast<unsigned long long>(step_id_), r->tokens.size(), plan.seqs.size());
      return false;
    }
    for (const SampledToken& t : r->tokens) {
      if (t.seq_id >= seqs_.size()) {
        std::fprintf(stderr, "driver: step %llu: token for unknown sequence %llu\n",
                     static_cast<unsigned long long>(step_id_),
                     static_cast<unsigned long long>(t.seq_id));
        return false;
      }
      Seq& s = seqs_[t.seq_id];
      s.cached = static_cast<int32_t>(s.tokens.size());
      s.tokens.push_back(t.token_id);
      s.generated.push_back(t.token_id);
      if (static_cast<int>(s.generated.size()) >= f_.max_tokens) finished_.push_back(t.seq_id);
    }
    return true;
  }

  // The step's time and encoded plan size, as prefill or decode.
  void RecordStep(const StepPlan& plan, bool prefill, double dt) {
    const size_t plan_bytes = EncodeStepPlan(plan).size();
    if (prefill) {
      prefill_s_ += dt;
      prefill_plan_bytes_ = plan_bytes;
    } else {
      decode_plan_bytes_ += plan_bytes;
      decode_s_ += dt;
      decode_tokens_ += static_cast<int64_t>(plan.seqs.size());
      ++decode_step_;
    }
  }

  // The "seq I: ...", "plan bytes ..." and "stats ..." lines.
  void PrintResults() {
    for (size_t i = 0; i < seqs_.size(); ++i)
      std::printf("seq %zu: %s\n", i, absl::StrJoin(seqs_[i].generated, " ").c_str());
    std::printf("plan bytes prefill=%zu decode_mean=%.1f\n", prefill_plan_bytes_,
                decode_step_ > 0 ? static_cast<double>(decode_plan_bytes_) / decode_step_ : 0.0);
    if (auto st = GetMpiExecutorStats(exec_); st.ok() && st->steps > 0) {
      std::printf(
          "stats steps=%lld prefill_s=%.6f decode_steps=%d decode_s=%.6f decode_tok_per_s=%.2f "
          "send_ms_per_step=%.4f wait_ms_per_step=%.4f worker_forward_ms_per_step=%.4f "
          "worker_collective_ms_per_step=%.4f\n",
          static_cast<long long>(st->steps), prefill_s_, decode_step_, decode_s_,
          decode_s_ > 0 ? decode_tokens_ / decode_s_ : 0.0, 1e3 * st->send_seconds / st->steps,
          1e3 * st->wait_seconds / st->steps, 1e3 * st->worker_forward_seconds / st->steps,
          1e3 * st->worker_collective_seconds / st->steps);
    } else {
      std::printf(
          "stats steps=%llu prefill_s=%.6f decode_steps=%d decode_s=%.6f decode_tok_per_s=%.2f\n",
          static_cast<unsigned long long>(step_id_), prefill_s_, decode_step_, decode_s_,
          decode_s_ > 0 ? decode_tokens_ / decode_s_ : 0.0);
    }
    std::fflush(stdout);
  }

  const DriverFlags& f_;
  Executor& exec_;
  SamplingParams greedy_;
  std::vector<Seq> seqs_;
  int32_t swap_in_base_ = 0;
  uint64_t step_id_ = 0;
  int decode_step_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
  int64_t decode_tokens_ = 0;
  size_t prefill_plan_bytes_ = 0, decode_plan_bytes_ = 0;
  std::vector<SeqId> finished_;
  bool swapped_in_pending_ = false;
};

int Main(int argc, char** argv) {
  absl::StatusOr<LaunchInfo> info = InitMpi(&argc, &argv);
  if (!info.ok()) {
    std::fprintf(stderr, "driver: %s\n", info.status().ToString().c_str());
    return 1;
  }
  DriverFlags f;
  std::string err;
  if (!ParseFlags(argc, argv, &f, &err)) {
    std::fprintf(stderr, "driver rank %d: %s\n", info->world_rank, err.c_str());
    FinalizeMpi();
    return 2;
  }
  if (absl::Status s = CheckWorldSize(*info, f.tp); !s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", info->world_rank, s.ToString().c_str());
    FinalizeMpi();
    return 2;
  }
  WorkerOptions wo;
  wo.model_path = f.model;
  wo.block_size = f.block_size;
  wo.kv_cache_memory = f.kv_cache_memory;
  wo.swap_space = f.swap_space;
  wo.dtype = f.dtype;
  if (!info->coordinator()) {
    wo.block_size = f.worker_block_size;
    const int rc = RunWorkerRank(*info, wo);
    FinalizeMpi(rc != 0, rc);
    return rc;
  }
  absl::StatusOr<std::unique_ptr<Executor>> exec =
      info->world_size > 1 ? MakeMpiExecutor(*info, f.block_size, kDefaultStartupTimeout,
                                             absl::Milliseconds(f.step_timeout_ms))
                           : InProcessExecutor::Create(wo);
  if (!exec.ok()) {
    std::fprintf(stderr, "driver: cannot start the workers: %s\n",
                 exec.status().ToString().c_str());
    FinalizeMpi(true, 1);
    return 1;
  }
  std::printf("coordinator pid %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  int rc = Coordinator(f, **exec).Run();
  if (absl::Status s = (*exec)->Shutdown(); !s.ok()) {
    std::fprintf(stderr, "driver: shutdown failed: %s\n", s.ToString().c_str());
    if (rc == 0) rc = 1;
  }
  exec->reset();
  FinalizeMpi(rc != 0, rc);
  return rc;
}

}  // namespace
}  // namespace pagedserve

int main(int argc, char** argv) { return pagedserve::Main(argc, argv); }
