#include "distributed/launch.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <mpi.h>
#ifdef PAGEDSERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "distributed/communicator.h"
#include "distributed/liveness.h"
#include "distributed/plan_transport.h"
#include "kernels/cuda_device.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

// A shutdown plan with this step id tells the workers that the coordinator
// gave up (setup or step failure): they exit non-zero instead of 0.
constexpr uint64_t kAbortStepId = std::numeric_limits<uint64_t>::max();
// Bounds on FinalizeMpi (see launch.h): MPI_Abort, then MPI_Finalize.
constexpr absl::Duration kAbortExitGrace = absl::Seconds(2);
constexpr absl::Duration kFinalizeExitGrace = absl::Seconds(30);
// How long the coordinator tries to hand the abort plan to the workers.
constexpr absl::Duration kAbortSendTimeout = absl::Milliseconds(500);

// Process-wide MPI state (one MPI world per process).
struct MpiState {
  bool initialized_here = false;  // MPI_Init_thread was called by InitMpi
  bool finalized = false;
  // Set when a worker failure was seen (coordinator) or a worker rank gave up:
  // FinalizeMpi must abort since MPI_Finalize waits for every rank.
  std::atomic<bool> failed{false};
  // The coordinator's host name and pid (for the workers' liveness check).
  char coordinator_host[MPI_MAX_PROCESSOR_NAME] = {};
  int64_t coordinator_pid = 0;
  // Liveness links (distributed/liveness.h): the coordinator's monitor and
  // the endpoint every rank learns at start-up ("" when the monitor failed).
  std::unique_ptr<LivenessMonitor> liveness;
  char liveness_endpoint[kLivenessEndpointBytes] = {};
};
MpiState& State() {
  static MpiState* state = new MpiState();
  return *state;
}

// Launch messages go to stderr: stdout belongs to the command (generated text).
spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("launch");
    return l ? l : spdlog::stderr_color_mt("launch");
  }();
  return *logger;
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// ---------------------------------------------------------------------------
// Worker-side watchdog: a plain thread (no MPI calls; MPI is FUNNELED) that
// ends the process when the rank can no longer be told to stop over MPI.
// ---------------------------------------------------------------------------
std::atomic<bool> g_sigterm{false};

// True when `pid` (on this host) has exited: no such process, or a zombie that
// its parent (mpirun's daemon, busy stopping the job) has not reaped yet.
bool ProcessGone(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return false;  // no procfs: only the kill() check
  char state = '?';
  const int scanned = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return scanned == 1 && (state == 'Z' || state == 'X');
}
extern "C" void OnSigterm(int) { g_sigterm.store(true); }

class Watchdog {
 public:
  Watchdog(absl::Duration grace, bool check_coordinator)
      : grace_(grace),
        check_coordinator_(check_coordinator),
        last_progress_(std::chrono::steady_clock::now().time_since_epoch().count()),
        thread_([this] { Run(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void Progress() {
    last_progress_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  }

 private:
  void Run() {
    const auto grace = absl::ToChronoNanoseconds(grace_);
    std::unique_lock<std::mutex> l(mu_);
    std::chrono::steady_clock::time_point term_seen{};
    while (!cv_.wait_for(l, std::chrono::milliseconds(200), [this] { return stop_; })) {
      const auto now = std::chrono::steady_clock::now();
      if (check_coordinator_ && State().coordinator_pid > 0 &&
          ProcessGone(State().coordinator_pid)) {
        Log().error("coordinator process {} is gone; worker rank exits", State().coordinator_pid);
        std::fflush(nullptr);
        _exit(3);
      }
      if (g_sigterm.load()) {
        if (term_seen == std::chrono::steady_clock::time_point{}) term_seen = now;
        const auto last = std::chrono::steady_clock::time_point(
            std::chrono::steady_clock::duration(last_progress_.load()));
        if (now - std::max(last, term_seen) > grace) {
          Log().error("SIGTERM and no step progress for {}; worker rank exits",
                      absl::FormatDuration(grace_));
          std::fflush(nullptr);
          _exit(128 + SIGTERM);
        }
      }
    }
  }

  const absl::Duration grace_;
  const bool check_coordinator_;
  std::atomic<int64_t> last_progress_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the fields above are set
};

// The TP group: every world rank but the coordinator, in world-rank order.
// MPI_Comm_create_group is collective only over the members, so the
// coordinator takes no part.
absl::StatusOr<MPI_Comm> MakeWorkerComm(const LaunchInfo& info) {
  MPI_Group world_group, worker_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  int range[1][3] = {{1, info.world_size - 1, 1}};
  MPI_Group_range_incl(world_group, 1, range, &worker_group);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, worker_group, /*tag=*/7, &comm);
  MPI_Group_free(&worker_group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
    return absl::InternalError("MPI_Comm_create_group for the worker ranks failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

// Where a worker rank runs (see RunWorkerRank in launch.h): the environment
// variable PAGEDSERVE_WORKER_DEVICE = auto (default) | cpu | cuda. auto picks
// CUDA when options.device already says kCUDA or when the build has CUDA and
// a device answers (kernels::CudaDeviceAvailable), else CPU.
absl::StatusOr<kernels::Device> ChooseWorkerDevice(const WorkerOptions& options, std::string* why) {
  const char* env = std::getenv("PAGEDSERVE_WORKER_DEVICE");
  const std::string policy = env != nullptr && *env != '\0' ? env : "auto";
  if (policy == "cpu") {
    *why = "PAGEDSERVE_WORKER_DEVICE=cpu";
    return kernels::Device::kCPU;
  }
  if (policy == "cuda") {
    *why = "PAGEDSERVE_WORKER_DEVICE=cuda";
    return kernels::Device::kCUDA;
  }
  if (policy != "auto")
    return absl::InvalidArgumentError(
        absl::StrCat("PAGEDSERVE_WORKER_DEVICE must be auto, cpu or cuda, got '", policy, "'"));
  if (options.device == kernels::Device::kCUDA) {
    *why = "WorkerOptions.device";
    return kernels::Device::kCUDA;
  }
  std::string reason;
  if (kernels::CudaDeviceAvailable(&reason)) {
    *why = "a CUDA device is available";
    return kernels::Device::kCUDA;
  }
  *why = absl::StrCat("no CUDA device: ", reason);
  return kernels::Device::kCPU;
}

// The CUDA device of this worker rank: its rank among the worker ranks on the
// same host (MPI_Comm_split_type SHARED over the TP group) modulo the number
// of visible devices.
absl::StatusOr<int> LocalCudaDevice(MPI_Comm tp_comm) {
#ifdef PAGEDSERVE_WITH_CUDA
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device is visible");
#else
  const int count = 1;  // Worker::Create reports that the build has no CUDA
#endif
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(tp_comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS ||
      node == MPI_COMM_NULL)
    return absl::InternalError("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  return local_rank % count;
}

// ---------------------------------------------------------------------------
// Coordinator-side executor.
// ---------------------------------------------------------------------------
class MpiExecutor final : public Executor {
 public:
  MpiExecutor(int num_workers, absl::Duration step_timeout, int64_t device_blocks,
              int64_t cpu_blocks, const std::vector<WorkerHello>& workers = {})
      : sender_(MPI_COMM_WORLD, num_workers, step_timeout),
        num_workers_(num_workers),
        step_timeout_(step_timeout),
        device_blocks_(device_blocks),
        cpu_blocks_(cpu_blocks) {
    // Workers on this host are watched directly: a dead one is an error within
    // ~20 ms instead of at the step timeout.
    // Workers on other hosts are watched through their liveness links: a dead
    // process is seen at once, a dead host or link within kLivenessTimeout.
    std::vector<int> local_ranks;
    for (const WorkerHello& h : workers)
      if (h.pid > 0 && h.host == State().coordinator_host) {
        local_workers_.push_back({h.world_rank, h.pid});
        local_ranks.push_back(h.world_rank);
      }
    if (!local_workers_.empty() || State().liveness != nullptr) {
      sender_.SetLivenessCheck([this, local_ranks]() -> absl::Status {
        for (const auto& [rank, pid] : local_workers_)
          if (ProcessGone(pid))
            return absl::UnavailableError(
                absl::StrCat("worker rank ", rank, " (pid ", pid, ") exited"));
        if (State().liveness != nullptr) return State().liveness->Probe(local_ranks);
        return absl::OkStatus();
      });
    }
  }

  ~MpiExecutor() override {
    if (failed_ && !abort_sent_) SendAbortPlan();
    if (!shut_down_ && !failed_) {
      // Not shut down by the owner: stop the workers anyway (no hang at exit).
      Abort(absl::CancelledError("executor destroyed without Shutdown")).IgnoreError();
    }
  }

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    if (failed_)
      return absl::FailedPreconditionError(
          absl::StrCat("MPI executor failed earlier: ", error_.message()));
    if (shut_down_) return absl::FailedPreconditionError("MPI executor is shut down");
    if (plan.shutdown) return absl::InvalidArgumentError("use Shutdown() to stop the workers");
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = sender_.Send(plan); !s.ok()) return Fail(s);
    const auto t1 = std::chrono::steady_clock::now();
    absl::StatusOr<StepResult> result = sender_.Receive();
    if (!result.ok()) return Fail(result.status());
    if (result->step_id != plan.step_id)
      return Fail(absl::InternalError(absl::StrCat("result for step ", result->step_id,
                                                   " while waiting for step ", plan.step_id)));
    const auto t2 = std::chrono::steady_clock::now();
    ++stats_.steps;
    stats_.send_seconds += Seconds(t1 - t0);
    stats_.wait_seconds += Seconds(t2 - t1);
    stats_.worker_forward_seconds += result->forward_seconds;
    stats_.worker_collective_seconds += result->collective_seconds;
    return result;
  }

  absl::Status Shutdown() override {
    if (shut_down_) return absl::OkStatus();
    if (failed_) return error_;
    StepPlan plan;
    plan.step_id = kShutdownStepId;
    plan.shutdown = true;
    if (State().liveness != nullptr) State().liveness->ExpectExits();
    if (auto s = sender_.Send(plan); !s.ok()) return Abort(s);
    // Every worker acknowledges: a missing one is dead or stuck.
    for (int i = 0; i < num_workers_; ++i) {
      absl::StatusOr<StepResult> ack = sender_.Receive();
      if (!ack.ok())
        return Abort(absl::Status(ack.status().code(),
                                  absl::StrCat("shutdown: ", i, " of ", num_workers_,
                                               " workers acknowledged; ", ack.status().message())));
    }
    shut_down_ = true;
    Log().info("all {} worker ranks stopped", num_workers_);
    return absl::OkStatus();
  }

  int64_t num_device_blocks() const override { return device_blocks_; }
  int64_t num_cpu_blocks() const override { return cpu_blocks_; }
  const MpiExecutorStats& stats() const { return stats_; }

  // Marks the executor and the process failed and tells every worker to exit
  // non-zero (best effort: a dead or stuck worker is stopped by mpirun once
  // FinalizeMpi aborts the job).
  absl::Status Abort(absl::Status error) {
    Fail(error).IgnoreError();
    SendAbortPlan();
    return error;
  }

  // A failed step: marks the executor and the process failed and returns the
  // error at once, so that the engine fails its requests before anything else
  // (mpirun may kill this process within a second of a rank's death). The
  // abort plan follows in the destructor.
  absl::Status Fail(absl::Status error) {
    failed_ = true;
    error_ = error;
    State().failed.store(true);
    Log().error("worker ranks failed: {}", error.ToString());
    if (State().liveness != nullptr) State().liveness->ExpectExits();
    return error;
  }

  // Best effort, after the clients were told (the engine failed its requests
  // and the front ends sent the replies before the executor is destroyed):
  // the liveness check is off here, since a known loss would stop the plan
  // from reaching the ranks that are still alive.
  void SendAbortPlan() {
    abort_sent_ = true;
    sender_.SetLivenessCheck({});
    StepPlan abort;
    abort.step_id = kAbortStepId;
    abort.shutdown = true;
    // Not to ranks known dead: MPI would try to reconnect to them, which can
    // block this process (seen: "failed to TCP connect to a peer", then the
    // coordinator stuck until mpirun's SIGKILL 6 s later) or abort it.
    std::vector<int> gone;
    if (State().liveness != nullptr) gone = State().liveness->Gone();
    for (const auto& [rank, pid] : local_workers_)
      if (ProcessGone(pid)) gone.push_back(rank);
    sender_.Send(abort, kAbortSendTimeout, gone).IgnoreError();
  }

 private:
  static constexpr uint64_t kShutdownStepId = kAbortStepId - 1;
  PlanSender sender_;
  int num_workers_;
  absl::Duration step_timeout_;
  int64_t device_blocks_;
  int64_t cpu_blocks_;
  bool shut_down_ = false;
  bool failed_ = false;
  bool abort_sent_ = false;
  absl::Status error_;
  MpiExecutorStats stats_;
  std::vector<std::pair<int, int64_t>> local_workers_;  // (world rank, pid) on this host
};

// Ends the process with `code` after `grace` unless it has exited (or the
// returned flag was set) by then: a detached plain thread (no MPI), so that no
// MPI call on an exit path can keep a rank alive. Exiting without
// MPI_Finalize makes mpirun tear the job down, which is what an exit path
// that hangs needs anyway.
std::shared_ptr<std::atomic<bool>> ExitAfter(absl::Duration grace, int code, const char* what) {
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  std::thread([grace, code, what, cancelled] {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(grace));
    if (cancelled->load()) return;
    std::fprintf(stderr, "pagedserve (pid %d): %s did not return within %s; exiting (code %d)\n",
                 static_cast<int>(getpid()), what, absl::FormatDuration(grace).c_str(), code);
    std::fflush(nullptr);
    _exit(code);
  }).detach();
  return cancelled;
}

}  // namespace

absl::StatusOr<LaunchInfo> InitMpi(int* argc, char*** argv) {
  MpiState& st = State();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return absl::InternalError("MPI_Init_thread failed");
    st.initialized_here = true;
    if (provided < MPI_THREAD_FUNNELED)
      return absl::FailedPreconditionError(
          absl::StrCat("MPI provides thread level ", provided, " below MPI_THREAD_FUNNELED"));
  }
  // Errors come back as return codes (turned into absl::Status), not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  LaunchInfo info;
  MPI_Comm_rank(MPI_COMM_WORLD, &info.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
  if (info.world_size > 1) {
    // Every rank learns where the coordinator runs (workers watch its pid).
    int len = 0;
    if (info.world_rank == 0) {
      MPI_Get_processor_name(st.coordinator_host, &len);
      st.coordinator_pid = getpid();
    }
    MPI_Bcast(st.coordinator_host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&st.coordinator_pid, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    // ... and where to open its liveness link.
    if (info.world_rank == 0) {
      absl::StatusOr<std::unique_ptr<LivenessMonitor>> m = LivenessMonitor::Start();
      if (m.ok()) {
        st.liveness = std::move(*m);
        std::snprintf(st.liveness_endpoint, sizeof(st.liveness_endpoint), "%s",
                      st.liveness->endpoint().c_str());
      } else {
        Log().warn(
            "no liveness links (workers on other hosts are watched only by the step "
            "timeout): {}",
            m.status().ToString());
      }
    }
    MPI_Bcast(st.liveness_endpoint, kLivenessEndpointBytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  return info;
}

void FinalizeMpi(bool abort, int exit_code) {
  MpiState& st = State();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || st.finalized) return;
  st.finalized = true;
  if (abort || st.failed.load()) {
    const int code = exit_code == 0 ? 1 : exit_code;
    std::fflush(nullptr);
    Log().flush();
    // The coordinator closes its liveness links first: every worker that was
    // not told to stop (e.g. blocked in an all-reduce with a lost rank) sees
    // them close and exits at once, whatever MPI_Abort and mpirun do next.
    st.liveness.reset();
    // MPI_Abort waits for the local mpirun daemon to acknowledge (PMIx_Abort);
    // after a lost host, or while mpirun is already tearing the job down
    // ("abort is already in progress"), that answer may never come.
    ExitAfter(kAbortExitGrace, code, "MPI_Abort");
    MPI_Abort(MPI_COMM_WORLD, code);
    return;
  }
  // Reached only when every rank was told to stop and acknowledged: a bound
  // for a peer that dies meanwhile, not a wait anybody should hit.
  std::shared_ptr<std::atomic<bool>> done = ExitAfter(kFinalizeExitGrace, 1, "MPI_Finalize");
  MPI_Finalize();
  done->store(true);
}

absl::Status CheckWorkerLiveness() {
  LivenessMonitor* links = State().liveness.get();
  return links != nullptr ? links->Probe() : absl::OkStatus();
}

absl::Status CheckWorldSize(const LaunchInfo& info, int tensor_parallel_size) {
  if (tensor_parallel_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size must be >= 1, got ", tensor_parallel_size));
  if (info.world_size == 1 && tensor_parallel_size == 1) return absl::OkStatus();
  if (info.world_size == 1 + tensor_parallel_size) return absl::OkStatus();
  if (info.world_size == 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size ", tensor_parallel_size, " needs one coordinator and ",
        tensor_parallel_size, " worker ranks: run under `mpirun -np ", tensor_parallel_size + 1,
        "` (started without mpirun, only TP = 1 runs in-process)"));
  return absl::InvalidArgumentError(
      absl::StrCat("mpirun started ", info.world_size, " ranks but --tensor-parallel-size ",
                   tensor_parallel_size, " needs ", tensor_parallel_size + 1,
                   " (rank 0 the coordinator, ranks 1..", tensor_parallel_size,
                   " the workers): use `mpirun -np ", tensor_parallel_size + 1,
                   "` or --tensor-parallel-size ", info.world_size - 1));
}

// NOLINTNEXTLINE(readability-function-size) issue 14: to be split into named phases
int RunWorkerRank(const LaunchInfo& info, const WorkerOptions& options) {
  if (info.coordinator() || info.world_size < 2) {
    Log().error("RunWorkerRank called on rank {} of {}", info.world_rank, info.world_size);
    return 2;
  }
  // The coordinator decides when ranks stop: Ctrl-C reaches it through mpirun.
  signal(SIGINT, SIG_IGN);
  struct sigaction sa = {};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);
  const bool same_host = std::strncmp(host, State().coordinator_host, MPI_MAX_PROCESSOR_NAME) == 0;
  Watchdog watchdog(kDefaultStepTimeout, same_host);

  PlanReceiver receiver(MPI_COMM_WORLD);
  WorkerHello hello;
  hello.world_rank = info.world_rank;
  hello.block_size = options.block_size;
  hello.pid = getpid();
  hello.host = host;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Worker> worker;
  absl::Status setup = [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(MPI_Comm tp_comm, MakeWorkerComm(info));
    std::string why;
    PS_ASSIGN_OR_RETURN(kernels::Device device, ChooseWorkerDevice(options, &why));
    // Every rank of the TP group must take the same path (the NCCL setup is
    // collective): CUDA only when all ranks chose it.
    const int want_cuda = device == kernels::Device::kCUDA ? 1 : 0;
    int all_cuda = 0;
    if (MPI_Allreduce(&want_cuda, &all_cuda, 1, MPI_INT, MPI_MIN, tp_comm) != MPI_SUCCESS)
      return absl::InternalError("MPI_Allreduce of the worker device choice failed");
    if (want_cuda && !all_cuda) {
      device = kernels::Device::kCPU;
      why = "another worker rank has no CUDA device";
    }
    WorkerOptions o = options;
    o.device = device;
    if (device == kernels::Device::kCUDA) {
      // Activations and KV pools in device memory: NCCL collectives.
      PS_ASSIGN_OR_RETURN(o.cuda_device, LocalCudaDevice(tp_comm));
      PS_ASSIGN_OR_RETURN(comm, MakeNcclCommunicator(tp_comm, o.cuda_device));
      Log().info("worker rank {}: CUDA device {} ({}), NCCL collectives", info.world_rank,
                 o.cuda_device, why);
    } else {
      // Host memory: MPI collectives.
      comm = MakeMpiCommunicator(tp_comm);
      Log().info("worker rank {}: CPU ({}), MPI collectives", info.world_rank, why);
    }
    PS_ASSIGN_OR_RETURN(worker, Worker::Create(o, comm.get()));
    return absl::OkStatus();
  }();
  // The liveness link to the coordinator (after the collective setup above,
  // which every worker must enter): without it a lost coordinator or a
  // partitioned host would leave this rank waiting forever.
  std::unique_ptr<LivenessBeacon> beacon;
  if (setup.ok() && State().liveness_endpoint[0] != '\0') {
    absl::StatusOr<std::unique_ptr<LivenessBeacon>> b =
        LivenessBeacon::Connect(State().liveness_endpoint, info.world_rank);
    if (b.ok()) {
      beacon = std::move(*b);
    } else {
      setup = b.status();
    }
  }
  const int tp_rank = comm ? comm->rank() : info.world_rank - 1;
  if (setup.ok()) {
    hello.ok = true;
    hello.num_device_blocks = worker->num_device_blocks();
    hello.num_cpu_blocks = worker->num_cpu_blocks();
    Log().info(
        "worker rank {} (TP rank {} of {}, pid {}): {} KV blocks, {} swap blocks, {} bytes/block",
        info.world_rank, tp_rank, info.world_size - 1, getpid(), hello.num_device_blocks,
        hello.num_cpu_blocks, worker->bytes_per_block());
  } else {
    hello.ok = false;
    hello.error = std::string(setup.message());
    Log().error("worker rank {}: setup failed: {}", info.world_rank, setup.ToString());
  }
  if (auto s = receiver.SendHello(hello); !s.ok()) {
    Log().error("worker rank {}: cannot report to the coordinator: {}", info.world_rank,
                s.ToString());
    State().failed.store(true);
    return 1;
  }
  watchdog.Progress();

  absl::Status broken = setup;  // once not OK, every step plan is refused
  while (true) {
    absl::StatusOr<StepPlan> plan = receiver.Receive();
    watchdog.Progress();
    if (!plan.ok()) {
      Log().error("worker rank {}: bad step plan: {}", info.world_rank, plan.status().ToString());
      if (broken.ok()) broken = plan.status();
      receiver.SendError(std::string(plan.status().message())).IgnoreError();
      continue;
    }
    if (plan->shutdown) {
      if (beacon) beacon->Stop();
      const bool aborted = plan->step_id == kAbortStepId;
      if (!aborted) {
        StepResult ack;
        ack.step_id = plan->step_id;
        receiver.SendResult(ack).IgnoreError();
      }
      if (aborted || !broken.ok()) {
        Log().info("worker rank {}: stopped by the coordinator after a failure", info.world_rank);
        State().failed.store(true);
        return 1;
      }
      return 0;
    }
    if (!broken.ok()) {
      receiver
          .SendError(absl::StrCat("step ", plan->step_id, " refused: rank ", info.world_rank,
                                  " failed earlier: ", broken.message()))
          .IgnoreError();
      continue;
    }
    absl::StatusOr<StepResult> result = worker->Execute(*plan);
    watchdog.Progress();
    if (!result.ok()) {
      Log().error("worker rank {}: step {} failed: {}", info.world_rank, plan->step_id,
                  result.status().ToString());
      broken = result.status();
      receiver
          .SendError(absl::StrCat("rank ", info.world_rank, " step ", plan->step_id, ": ",
                                  result.status().message()))
          .IgnoreError();
      continue;
    }
    if (tp_rank == 0) {
      if (auto s = receiver.SendResult(*result); !s.ok()) {
        Log().error("worker rank {}: cannot send the result: {}", info.world_rank, s.ToString());
        broken = s;
      }
    }
  }
}

absl::StatusOr<std::unique_ptr<Executor>> MakeMpiExecutor(const LaunchInfo& info,
                                                          int32_t block_size,
                                                          absl::Duration startup_timeout,
                                                          absl::Duration step_timeout) {
  if (!info.coordinator() || info.world_size < 2)
    return absl::FailedPreconditionError(
        absl::StrCat("MakeMpiExecutor needs world rank 0 of at least 2 ranks (rank ",
                     info.world_rank, " of ", info.world_size, ")"));
  const int num_workers = info.world_size - 1;
  PlanSender sender(MPI_COMM_WORLD, num_workers, step_timeout);
  absl::StatusOr<std::vector<WorkerHello>> hellos = sender.GatherHellos(startup_timeout);
  if (!hellos.ok()) {
    // Tell every worker (those that are set up wait for plans) to exit.
    MpiExecutor failed(num_workers, step_timeout, 0, 0);
    return failed.Abort(hellos.status());
  }
  int64_t device_blocks = std::numeric_limits<int64_t>::max();
  int64_t cpu_blocks = std::numeric_limits<int64_t>::max();
  for (const WorkerHello& h : *hellos) {
    Log().info("worker rank {} (pid {} on {}): {} KV blocks, {} swap blocks", h.world_rank, h.pid,
               h.host, h.num_device_blocks, h.num_cpu_blocks);
    device_blocks = std::min(device_blocks, h.num_device_blocks);
    cpu_blocks = std::min(cpu_blocks, h.num_cpu_blocks);
    if (h.block_size != block_size) {
      MpiExecutor failed(num_workers, step_timeout, 0, 0);
      return failed.Abort(absl::FailedPreconditionError(
          absl::StrCat("worker rank ", h.world_rank, " runs with --block-size ", h.block_size,
                       " but the coordinator with ", block_size,
                       ": step plans carry block tables whose slots depend on it")));
    }
  }
  Log().info(
      "KV capacity (minimum over {} worker ranks): {} blocks x {} tokens = {} tokens; swap {} "
      "blocks = {} tokens",
      num_workers, device_blocks, block_size, device_blocks * block_size, cpu_blocks,
      cpu_blocks * block_size);
  return std::unique_ptr<Executor>(
      new MpiExecutor(num_workers, step_timeout, device_blocks, cpu_blocks, *hellos));
}

absl::StatusOr<MpiExecutorStats> GetMpiExecutorStats(const Executor& executor) {
  const auto* mpi = dynamic_cast<const MpiExecutor*>(&executor);
  if (mpi == nullptr) return absl::NotFoundError("not an MPI executor");
  return mpi->stats();
}

}  // namespace pagedserve
