// A thread pool whose threads are created on demand and retire when idle: the
// task queue of the HTTP server's connections (http_server.cc adapts it to
// cpp-httplib's TaskQueue).
//
// Why not a fixed pool: cpp-httplib runs each connection, from accept to close,
// as one task. A connection that is idle (keep-alive) or slow (a request sent
// byte by byte) occupies its thread until the keep-alive or read timeout, so a
// fixed pool of N threads lets N idle or slow clients queue every later
// connection, /health included, behind them for up to --http-timeout. Here a
// task that finds no idle thread gets a new one, up to `max_threads`; the
// cost of an idle connection is then one sleeping thread (its stack is virtual
// memory, touched only as used) instead of everyone else's latency. Beyond
// `max_threads` tasks wait in FIFO order, as in a fixed pool.
//
// Thread safety: Enqueue and Shutdown may be called from any thread; the
// counters are snapshots. Tasks run on pool threads and must not call
// Shutdown. Errors: when the system refuses a new thread (EAGAIN) the task
// waits for a running one; with no thread at all it runs on the caller.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_ELASTIC_THREAD_POOL_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_ELASTIC_THREAD_POOL_H_

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagedserve {

class ElasticThreadPool {
 public:
  // max_threads >= 1: threads alive at once. Threads beyond min_threads exit
  // after idle_timeout without work; min_threads are created lazily and kept.
  ElasticThreadPool(size_t max_threads, size_t min_threads, std::chrono::milliseconds idle_timeout);
  ElasticThreadPool(const ElasticThreadPool&) = delete;
  ElasticThreadPool& operator=(const ElasticThreadPool&) = delete;
  // Shuts down (runs the queued tasks first) and joins every thread.
  ~ElasticThreadPool();

  // Runs `task` on an idle thread, else on a new one (below max_threads),
  // else after the tasks queued before it. Ignored after Shutdown.
  void Enqueue(std::function<void()> task);

  // Stops accepting tasks, lets the threads run every queued task, and joins
  // them. Idempotent.
  void Shutdown();

  size_t num_threads() const;  // alive now
  size_t num_idle() const;     // alive and waiting for work
  size_t num_queued() const;   // tasks not yet taken by a thread

 private:
  void WorkerLoop();
  void ReapExitedLocked(std::vector<std::thread>* to_join);

  const size_t max_threads_;
  const size_t min_threads_;
  const std::chrono::milliseconds idle_timeout_;
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  std::deque<std::function<void()>> queue_;
  std::vector<std::thread> threads_;     // every thread not yet joined
  std::vector<std::thread::id> exited_;  // returned from WorkerLoop, to join
  size_t alive_ = 0;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_ELASTIC_THREAD_POOL_H_
