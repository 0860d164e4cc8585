#include "server/pipeline/worker_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

namespace ringloader::pipeline {
namespace {

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

TEST_CASE("WorkerPool: zero threads means one per core, and n = 0 returns at once", "[pipeline]") {
  WorkerPool pool(0);
  const uint32_t cores = std::max(1u, std::thread::hardware_concurrency());
  CHECK(pool.size() == cores);
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

}  // namespace
}  // namespace ringloader::pipeline
