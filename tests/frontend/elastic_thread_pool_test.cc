// ElasticThreadPool (runtime/frontend/elastic_thread_pool.h): threads grow with
// blocked tasks up to the cap, idle threads are reused, tasks beyond the cap
// wait in FIFO order, idle threads retire down to the minimum, and Shutdown
// runs every queued task and joins. No wall-clock asserts: every wait is for
// a condition (with a generous deadline that only turns a hang into a failure).
#include "runtime/frontend/elastic_thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

using std::chrono::milliseconds;

// Blocks tasks until Open(); counts how many are blocked.
class Gate {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [this] { return open_; });
    --waiting_;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // True once `n` tasks are blocked (false after a 60 s deadline: a hang).
  bool AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  bool open_ = false;
};

bool Eventually(const std::function<bool()>& pred) {
  for (int i = 0; i < 60000; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return pred();
}

TEST(ElasticThreadPoolTest, BlockedTasksGetTheirOwnThreadsUpToTheCap) {
  ElasticThreadPool pool(/*max_threads=*/64, /*min_threads=*/2, milliseconds(60000));
  Gate gate;
  // 50 tasks that hold their thread (as idle keep-alive connections do) ...
  for (int i = 0; i < 50; ++i) pool.Enqueue([&] { gate.Wait(); });
  ASSERT_TRUE(gate.AwaitWaiting(50));
  EXPECT_EQ(pool.num_threads(), 50u);
  EXPECT_EQ(pool.num_queued(), 0u);
  // ... do not delay the next one (a fixed pool of 50 would queue it).
  std::atomic<bool> ran{false};
  pool.Enqueue([&] { ran = true; });
  EXPECT_TRUE(Eventually([&] { return ran.load(); }));
  gate.Open();
  pool.Shutdown();
  EXPECT_EQ(pool.num_threads(), 0u);
}

TEST(ElasticThreadPoolTest, BeyondTheCapTasksWaitInOrder) {
  ElasticThreadPool pool(/*max_threads=*/2, /*min_threads=*/0, milliseconds(60000));
  Gate first, second;
  pool.Enqueue([&] { first.Wait(); });
  ASSERT_TRUE(first.AwaitWaiting(1));
  pool.Enqueue([&] { second.Wait(); });
  ASSERT_TRUE(second.AwaitWaiting(1));
  std::mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) {
    pool.Enqueue([&, i] {
      std::lock_guard<std::mutex> lock(mu);
      order.push_back(i);
    });
  }
  EXPECT_EQ(pool.num_threads(), 2u);
  EXPECT_EQ(pool.num_queued(), 5u);
  // Only one thread is freed: it alone drains the queue, so the tasks run in
  // exactly the order they were queued (with both freed, the two threads may
  // interleave arbitrarily once they have taken their tasks).
  first.Open();
  EXPECT_TRUE(Eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return order.size() == 5;
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  }
  second.Open();
  pool.Shutdown();
  EXPECT_EQ(pool.num_threads(), 0u);
}

TEST(ElasticThreadPoolTest, IdleThreadsAreReusedNotMultiplied) {
  ElasticThreadPool pool(/*max_threads=*/64, /*min_threads=*/1, milliseconds(60000));
  for (int i = 0; i < 200; ++i) {
    std::atomic<bool> done{false};
    pool.Enqueue([&] { done = true; });
    ASSERT_TRUE(Eventually([&] { return done.load(); }));
    ASSERT_TRUE(Eventually([&] { return pool.num_idle() == pool.num_threads(); }));
  }
  // One task at a time never needs a second thread.
  EXPECT_EQ(pool.num_threads(), 1u);
}

TEST(ElasticThreadPoolTest, IdleThreadsRetireDownToTheMinimum) {
  ElasticThreadPool pool(/*max_threads=*/16, /*min_threads=*/3, milliseconds(20));
  Gate gate;
  for (int i = 0; i < 10; ++i) pool.Enqueue([&] { gate.Wait(); });
  ASSERT_TRUE(gate.AwaitWaiting(10));
  EXPECT_EQ(pool.num_threads(), 10u);
  gate.Open();
  EXPECT_TRUE(Eventually([&] { return pool.num_threads() == 3u; }));
  // Still serves after retiring (and reaps the exited threads on the way).
  std::atomic<int> ran{0};
  for (int i = 0; i < 20; ++i) pool.Enqueue([&] { ++ran; });
  EXPECT_TRUE(Eventually([&] { return ran.load() == 20; }));
}

TEST(ElasticThreadPoolTest, ShutdownIsIdempotentAndLaterTasksAreIgnored) {
  ElasticThreadPool pool(4, 0, milliseconds(1000));
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) pool.Enqueue([&] { ++ran; });
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 100);
  pool.Enqueue([&] { ++ran; });
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 100);
  EXPECT_EQ(pool.num_threads(), 0u);
}

TEST(ElasticThreadPoolTest, ManyProducersLoseNothing) {
  ElasticThreadPool pool(8, 0, milliseconds(5));  // short idle: retire/spawn races
  std::atomic<int> ran{0};
  std::vector<std::thread> producers;
  producers.reserve(4);
  for (int p = 0; p < 4; ++p) {
    producers.emplace_back([&] {
      for (int i = 0; i < 500; ++i) {
        pool.Enqueue([&] { ++ran; });
        if (i % 50 == 0) std::this_thread::sleep_for(milliseconds(10));
      }
    });
  }
  for (std::thread& t : producers) t.join();
  EXPECT_TRUE(Eventually([&] { return ran.load() == 2000; }));
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 2000);
}

}  // namespace
}  // namespace pagedserve
