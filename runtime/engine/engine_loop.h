// The engine loop: the Engine on one thread, front ends on others.
//
// Threads. Engine::Step runs on the thread that calls EngineLoop::Run - the
// main thread under mpirun, because MPI is initialized FUNNELED and the
// executor calls MPI. Front ends (the ZeroMQ server, the HTTP server) run on
// their own threads and talk to the engine only through this class:
//   - Submit / Abort put commands (add, abort) on a queue under a mutex; Run
//     applies them between two steps, in order, and wakes up for them when the
//     engine is idle (condition variable, no polling);
//   - every request has a RequestChannel: Run pushes the request's outputs
//     into it after each step; the front end pops them on its own thread;
//   - Snapshot() returns the scheduler figures published after the last step
//     (copied under the mutex): health, stats, models and metrics never wait
//     for a step in progress.
// Nothing else is shared: the Engine, Scheduler and Executor are touched only
// by Run's thread. The Tokenizer and the chat template are immutable and used
// by every thread.
//
// Request lifecycle (both front ends): the front end tokenizes, then Submit
// validates once with Engine::CheckRequest (parameters, vocabulary, prompt
// length, KV admission bound), Engine::CheckCacheSalt (--require-cache-salt,
// the salt's form) and the waiting-queue bound, and queues the add. Outputs
// arrive in the channel; the last one has finished = true (also for a request
// that the engine refused late, which carries `error`). A front
// end whose client went away calls Abort: the request's blocks are freed by
// the scheduler in the next step and its final output (finish reason kAbort)
// still arrives in the channel.
//
// Shutdown: once `stop` is set (Submit and healthy() read it directly, not
// only after Run noticed it), Submit answers Unavailable, healthy() turns
// false, requests in flight may run for `shutdown_grace`, then (or at once
// when `abort_now` is set) they are aborted; Run returns when none is left.
#ifndef PAGEDSERVE_RUNTIME_ENGINE_ENGINE_LOOP_H_
#define PAGEDSERVE_RUNTIME_ENGINE_ENGINE_LOOP_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/engine/engine.h"

namespace pagedserve {

// The outputs of one request, from the engine thread to a front end.
// Thread-safe: Push from the engine thread, TryPop / WaitPop from any one
// consumer thread.
class RequestChannel {
 public:
  // `on_push` (may be empty) runs on the engine thread after every Push,
  // without the channel's lock held (e.g. to wake up a polling front end). It
  // must not block.
  explicit RequestChannel(std::function<void()> on_push = {});
  RequestChannel(const RequestChannel&) = delete;
  RequestChannel& operator=(const RequestChannel&) = delete;

  void Push(EngineOutput output);
  // The oldest output not yet popped, or nullopt when none is queued.
  std::optional<EngineOutput> TryPop();
  // As TryPop, waiting up to `timeout` for an output.
  std::optional<EngineOutput> WaitPop(absl::Duration timeout);

 private:
  std::function<void()> on_push_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<EngineOutput> queue_;  // guarded by mu_
};

struct EngineLoopOptions {
  int64_t max_queue_len = 256;  // waiting + queued adds beyond which Submit refuses
  absl::Duration idle_wait = absl::Milliseconds(50);  // how often an idle loop looks at `stop`
  absl::Duration shutdown_grace = absl::Seconds(30);
};

// Figures published by the engine thread after every step. Capacity fields
// are fixed at construction.
struct EngineSnapshot {
  SchedulerStats scheduler;
  EngineTokenCounters tokens;   // prompt / generation tokens since start
  int64_t queued_adds = 0;      // Submit()ted, not yet applied by Run
  int64_t in_flight = 0;        // submitted requests whose final output is not out yet
  int64_t kv_blocks_total = 0;  // device KV blocks (minimum over ranks)
  int64_t kv_blocks_used = 0;
  int64_t max_num_seqs = 0;
  int64_t max_model_len = 0;
  int64_t max_queue_len = 0;
  bool draining = false;  // stop was requested
  bool failed = false;    // the engine hit a fatal error
};

// What a refusal of EngineLoop::Submit means for the client: the one mapping
// from a status to an error kind, which every front end then spells its own
// way (HTTP: 400 / 429 / 503 / 500; protocol v1: its error codes).
//   kInvalidRequest  InvalidArgument: a field is wrong (FieldOf names it), or
//                    the request can never fit the KV cache
//   kPromptTooLong   OutOfRange: the prompt is max_model_len tokens or more
//   kDuplicateId     AlreadyExists: the request id is in flight
//   kBusy            ResourceExhausted: the waiting queue is full; retry later
//   kUnavailable     Unavailable (draining, shutting down) or FailedPrecondition
//                    (the engine failed): this server admits nothing more, so
//                    another replica should take the request
//   kInternal        anything else
enum class SubmitErrorKind {
  kInvalidRequest,
  kPromptTooLong,
  kDuplicateId,
  kBusy,
  kUnavailable,
  kInternal
};
inline SubmitErrorKind SubmitErrorKindOf(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument: return SubmitErrorKind::kInvalidRequest;
    case absl::StatusCode::kOutOfRange: return SubmitErrorKind::kPromptTooLong;
    case absl::StatusCode::kAlreadyExists: return SubmitErrorKind::kDuplicateId;
    case absl::StatusCode::kResourceExhausted: return SubmitErrorKind::kBusy;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kFailedPrecondition: return SubmitErrorKind::kUnavailable;
    default: return SubmitErrorKind::kInternal;
  }
}

// Thread safety: every public method may be called from any thread, except
// Run (one thread, the one allowed to call the executor).
class EngineLoop {
 public:
  // `engine` (not owned) must outlive the loop; after construction it is used
  // only by Run's thread (and Engine::CheckRequest, which is thread-safe).
  EngineLoop(Engine* engine, EngineLoopOptions options);
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Validates `request` (Engine::CheckRequest) and queues it; its outputs go
  // to `channel`. Errors, nothing queued then: InvalidArgument (bad
  // parameters or token ids, KV admission bound), OutOfRange (prompt of
  // max_model_len tokens or more), AlreadyExists (request_id in flight),
  // ResourceExhausted (max_queue_len requests already waiting), Unavailable
  // (shutting down), FailedPrecondition (the engine failed).
  absl::Status Submit(EngineRequest request, std::shared_ptr<RequestChannel> channel);
  // Aborts a request in flight (applied before the next step); unknown or
  // finished ids are ignored.
  void Abort(const std::string& request_id);

  // Fails every request in flight without the engine, from any thread: each
  // channel gets a final output with `error` (finished, usage zero), the loop
  // counts as failed (Submit refuses, healthy() is false) and forgets the
  // requests, so that outputs Run may still produce for them are dropped.
  // For a coordinator whose engine thread is stuck in an MPI call after a
  // worker was lost (serve_command.cc). Returns how many requests it failed.
  int64_t FailAll(const absl::Status& error);

  EngineSnapshot Snapshot() const;
  // Accepting requests: not draining and not failed.
  bool healthy() const;
  const Engine& engine() const { return *engine_; }
  const Tokenizer& tokenizer() const { return engine_->tokenizer(); }

  // Runs the engine until `stop` is set and the drain is over (see the header
  // comment). Returns OK after a clean shutdown or the engine's fatal error
  // (every request in flight has then received a final output with `error`).
  absl::Status Run(const std::atomic<bool>& stop, const std::atomic<bool>& abort_now);

 private:
  struct Command {
    bool abort = false;
    EngineRequest request;  // add: the request; abort: request_id only
  };
  // Applies queued commands to the engine (engine thread).
  void ApplyCommands(std::vector<Command>& commands);
  // Pushes outputs to their channels, forgetting finished requests.
  void Deliver(std::vector<EngineOutput>& outputs);
  void Publish();
  void AbortAll();

  Engine* const engine_;
  const EngineLoopOptions options_;
  const SchedulerConfig config_;

  mutable std::mutex mu_;
  std::condition_variable wake_;   // commands queued, or stop
  std::vector<Command> commands_;  // guarded by mu_
  int64_t queued_adds_ = 0;        // guarded by mu_
  absl::flat_hash_map<std::string, std::shared_ptr<RequestChannel>> channels_;  // guarded by mu_
  SchedulerStats stats_;                                                        // guarded by mu_
  EngineTokenCounters tokens_;                                                  // guarded by mu_
  bool draining_ = false;                                                       // guarded by mu_
  // Run's `stop` (set by a signal handler): Submit and healthy() read it too,
  // so that a request submitted after the signal but before Run looked at it
  // (during a step, or an idle wait) is refused, not served.
  const std::atomic<bool>* stop_ = nullptr;  // guarded by mu_
  bool failed_ = false;                      // guarded by mu_
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_ENGINE_LOOP_H_
