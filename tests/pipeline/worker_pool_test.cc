// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/worker_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "shm/base/cgroup.h"

namespace ringloader::pipeline {
namespace {

bool WaitUntil(const std::function<bool()>& pred) {
  for (int i = 0; i < 500 && !pred(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return pred();
}

TEST_CASE("WorkerPool: ParallelFor runs every index exactly once on a pool thread", "[pipeline]") {
  for (uint32_t threads : {1u, 2u, 4u}) {
    WorkerPool pool(threads);
    REQUIRE(pool.size() == threads);
    std::vector<std::atomic<int>> runs(1000);
    std::vector<std::atomic<uint32_t>> worker_of(1000);
    pool.ParallelFor(runs.size(), [&](uint64_t i, uint32_t worker_id) {
      runs[i].fetch_add(1);
      worker_of[i] = worker_id;
    });
    for (size_t i = 0; i < runs.size(); ++i) {
      CHECK(runs[i].load() == 1);
      CHECK(worker_of[i].load() < threads);
    }
  }
}

TEST_CASE("WorkerPool: zero threads means one per core this process may use, and n = 0 returns "
          "at once",
          "[pipeline]") {
  WorkerPool pool(0);
  CHECK(pool.size() == base::UsableCores());  // (under taskset or a CPU quota, fewer than here)
  bool ran = false;
  pool.ParallelFor(0, [&](uint64_t, uint32_t) { ran = true; });
  CHECK_FALSE(ran);
}

TEST_CASE("WorkerPool: a worker id is never used by two tasks at the same time", "[pipeline]") {
  WorkerPool pool(3);
  std::vector<std::atomic<int>> busy(pool.size());
  std::atomic<int> overlaps{0};
  pool.ParallelFor(300, [&](uint64_t, uint32_t worker_id) {
    if (busy[worker_id].fetch_add(1) != 0) overlaps++;
    std::this_thread::yield();
    busy[worker_id].fetch_sub(1);
  });
  CHECK(overlaps.load() == 0);
}

TEST_CASE("WorkerPool: many threads may call ParallelFor concurrently", "[pipeline]") {
  WorkerPool pool(2);
  constexpr int kCallers = 6;
  constexpr int kCalls = 50;
  std::vector<std::atomic<uint64_t>> sums(kCallers);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int call = 0; call < kCalls; ++call) {
        std::atomic<uint64_t> sum{0};
        pool.ParallelFor(20 + c, [&](uint64_t i, uint32_t) { sum += i + 1; });
        // Each call returns only after its own tasks are all done.
        const uint64_t n = 20 + c;
        if (sum.load() == n * (n + 1) / 2) sums[c]++;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) CHECK(sums[c].load() == kCalls);
}

TEST_CASE("WorkerPool: a task stuck before it commits is abandoned at the deadline, its worker "
          "id goes to a new thread, and it counts as stuck until it returns",
          "[pipeline]") {
  WorkerPool pool(2);
  // The stuck task blocks until released, as a read from a hung mount would; the others commit.
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> committed{0};
  std::atomic<int> stuck_commit_result{-1};
  std::vector<uint64_t> abandoned;
  const auto start = std::chrono::steady_clock::now();
  pool.ParallelForWithDeadline(
      6, std::chrono::milliseconds(300),
      [&](uint64_t i, uint32_t, TaskControl& control) {
        if (i == 0) {
          // Copied before blocking: once abandoned, this closure is gone (see worker_pool.h).
          std::mutex* m = &mu;
          std::condition_variable* c = &cv;
          bool* go = &release;
          std::atomic<int>* result = &stuck_commit_result;
          control.Checkpoint();
          std::unique_lock<std::mutex> lock(*m);
          c->wait(lock, [go] { return *go; });
          *result = control.Commit() ? 1 : 0;
          return;
        }
        if (control.Commit()) committed.fetch_add(1);
      },
      [&](uint64_t i, uint64_t, WorkerPool::Abandoned why) {
        abandoned.push_back(i);
        CHECK(why == WorkerPool::Abandoned::kPastDeadline);
      });
  const auto took = std::chrono::steady_clock::now() - start;
  CHECK(abandoned == std::vector<uint64_t>{0});
  CHECK(committed.load() == 5);
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < std::chrono::seconds(5));
  CHECK(pool.abandoned() == 1);
  CHECK(pool.stuck() == 1);
  // Both worker ids still run tasks (the stuck one's id has a new thread).
  std::vector<std::atomic<int>> by_worker(pool.size());
  pool.ParallelFor(200, [&](uint64_t, uint32_t worker) {
    by_worker[worker].fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  });
  for (auto& n : by_worker) CHECK(n.load() > 0);
  // When the stuck call returns, the task learns it was abandoned and must touch nothing.
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  CHECK(WaitUntil([&] { return stuck_commit_result.load() != -1; }));
  CHECK(stuck_commit_result.load() == 0);
  // Stuck is what is stuck now (the cap on stuck threads counts these), abandoned a counter.
  CHECK(WaitUntil([&] { return pool.stuck() == 0; }));
  CHECK(pool.abandoned() == 1);
}

TEST_CASE("WorkerPool: a task waiting for memory is not abandoned, and a committed one never is",
          "[pipeline]") {
  WorkerPool pool(1);
  std::vector<uint64_t> abandoned;
  std::atomic<bool> finished{false};
  pool.ParallelForWithDeadline(
      2, std::chrono::milliseconds(100),
      [&](uint64_t i, uint32_t, TaskControl& control) {
        if (i == 0) {
          REQUIRE(control.BeginWait());
          std::this_thread::sleep_for(std::chrono::milliseconds(400));  // backpressure
          control.EndWait();
          REQUIRE(control.Commit());
          std::this_thread::sleep_for(std::chrono::milliseconds(400));  // a long decode
        }
        if (i == 1) finished = true;
      },
      [&](uint64_t i, uint64_t, WorkerPool::Abandoned) { abandoned.push_back(i); });
  CHECK(abandoned.empty());
  CHECK(finished.load());
}

TEST_CASE("WorkerPool: AbandonUncommitted ends the wait for a stuck task at once (shutdown)",
          "[pipeline]") {
  WorkerPool pool(1);
  std::atomic<bool> stop{false};
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    pool.AbandonUncommitted();
  });
  std::vector<uint64_t> abandoned;
  const auto start = std::chrono::steady_clock::now();
  pool.ParallelForWithDeadline(
      1, std::chrono::milliseconds(0),  // no deadline: only shutdown ends it
      [&](uint64_t, uint32_t, TaskControl& control) {
        std::atomic<bool>* go = &stop;  // copied before blocking: see worker_pool.h
        control.Checkpoint();
        while (!go->load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      },
      [&](uint64_t i, uint64_t, WorkerPool::Abandoned why) {
        abandoned.push_back(i);
        CHECK(why == WorkerPool::Abandoned::kShuttingDown);  // not the sample's fault: no strike
      });
  CHECK(abandoned == std::vector<uint64_t>{0});
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  stop = true;
  stopper.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the stuck thread exits
}

}  // namespace
}  // namespace ringloader::pipeline
