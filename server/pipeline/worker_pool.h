#pragma once
// A fixed pool of decode threads shared by all streams. Each thread has a stable worker id in
// [0, size()) so per-thread state (a SampleDecoder each) needs no locks.
//
// Thread-safety: ParallelFor may be called concurrently from many threads (one per stream); the
// tasks of concurrent calls interleave on the pool. Work in flight is bounded by the callers
// (a call blocks until its own n tasks are done).

#include <cstdint>
#include <functional>
#include <memory>

namespace ringloader::pipeline {

class WorkerPool {
 public:
  // threads == 0 means std::thread::hardware_concurrency().
  explicit WorkerPool(uint32_t threads);
  ~WorkerPool();  // joins
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  uint32_t size() const;
  // Runs fn(i, worker_id) for i in [0, n) on the pool and returns when all are done. The caller
  // only waits (it never runs tasks itself, so worker_id is always a pool thread's id); it sleeps
  // on its own condition variable, no busy-waiting. Tasks of one call may run in any order.
  // `fn` must not throw. REQUIRES: not called from inside a task (that could deadlock).
  void ParallelFor(uint64_t n, const std::function<void(uint64_t i, uint32_t worker_id)>& fn);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringloader::pipeline
