#include "runtime/frontend/elastic_thread_pool.h"

#include <algorithm>
#include <system_error>
#include <utility>

namespace pagedserve {

ElasticThreadPool::ElasticThreadPool(size_t max_threads, size_t min_threads,
                                     std::chrono::milliseconds idle_timeout)
    : max_threads_(std::max<size_t>(1, max_threads)),
      min_threads_(std::min(min_threads, std::max<size_t>(1, max_threads))),
      idle_timeout_(idle_timeout) {}

ElasticThreadPool::~ElasticThreadPool() { Shutdown(); }

void ElasticThreadPool::Enqueue(std::function<void()> task) {
  std::vector<std::thread> to_join;
  std::function<void()> run_here;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return;
    ReapExitedLocked(&to_join);
    queue_.push_back(std::move(task));
    if (idle_ >= queue_.size()) {
      work_cv_.notify_one();  // enough waiting threads for every queued task
    } else if (alive_ < max_threads_) {
      try {
        threads_.emplace_back([this] { WorkerLoop(); });
        ++alive_;
      } catch (const std::system_error&) {
        // No thread to be had (EAGAIN). A running thread will take the task;
        // with none at all, run it here rather than never.
        if (alive_ == 0) {
          run_here = std::move(queue_.back());
          queue_.pop_back();
        }
      }
    }
  }
  for (std::thread& t : to_join) t.join();
  if (run_here) run_here();
}

void ElasticThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (queue_.empty()) {
      if (shutdown_) break;
      ++idle_;
      const bool woken =
          work_cv_.wait_for(lock, idle_timeout_, [this] { return !queue_.empty() || shutdown_; });
      --idle_;
      if (!woken && alive_ > min_threads_) break;  // idle for idle_timeout: retire
      continue;
    }
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // destroyed outside the lock
    lock.lock();
  }
  --alive_;
  exited_.push_back(std::this_thread::get_id());
}

void ElasticThreadPool::ReapExitedLocked(std::vector<std::thread>* to_join) {
  for (std::thread::id id : exited_) {
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [id](const std::thread& t) { return t.get_id() == id; });
    if (it != threads_.end()) {
      to_join->push_back(std::move(*it));
      threads_.erase(it);
    }
  }
  exited_.clear();
}

void ElasticThreadPool::Shutdown() {
  std::vector<std::thread> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    all.swap(threads_);
    exited_.clear();
  }
  work_cv_.notify_all();
  for (std::thread& t : all) t.join();  // each drains the queue before it exits
}

size_t ElasticThreadPool::num_threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return alive_;
}

size_t ElasticThreadPool::num_idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_;
}

size_t ElasticThreadPool::num_queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace pagedserve
