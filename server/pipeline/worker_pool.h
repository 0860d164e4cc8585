// SPDX-License-Identifier: Apache-2.0
#pragma once
// A fixed pool of decode threads shared by all streams. Each thread has a stable worker id in
// [0, size()) so per-thread state (a SampleDecoder each) needs no locks.
//
// Deadlines (ParallelForWithDeadline): a task that spends longer than the deadline before it
// commits (reading a file on a hung network mount, a FIFO, ...) is *abandoned*: the caller stops
// waiting for it, `on_abandoned(i)` reports it, and a new thread takes over its worker id. The
// stuck thread is left to the kernel; when (if ever) its call returns, TaskControl::Commit()
// tells it that it was abandoned and it must return without touching the caller's data, after
// which it exits. Committed tasks (decoding into the caller's buffer) are never abandoned: they
// bound their own time (the decoder checks its deadline).
//
// Thread-safety: ParallelFor may be called concurrently from many threads (one per stream); the
// tasks of concurrent calls interleave on the pool. Work in flight is bounded by the callers
// (a call blocks until its own n tasks are done or abandoned).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace ringloader::pipeline {

// A running task's handle on its deadline (see the top of this file). An interface, so that a
// task's own state machine (pipeline::SampleTask) can be driven through every outcome in tests.
class TaskGate {
 public:
  virtual ~TaskGate() = default;
  // The task has copied everything it needs from its caller (its captures) into its own locals:
  // only from here on may it be abandoned. A task that never calls it is waited for like a
  // committed one.
  virtual void Checkpoint() = 0;
  // The task is about to write the caller's data. False when it was abandoned: it must then
  // return at once, touching nothing of the caller's (its captures may be gone).
  virtual bool Commit() = 0;
  // Around a wait that is not the task's fault (memory backpressure): the deadline does not run
  // while waiting and counts afresh afterwards. BeginWait is false when already abandoned.
  virtual bool BeginWait() = 0;
  virtual void EndWait() = 0;
  // True once the caller gave up on the task (then it must return at once, touching nothing).
  virtual bool Abandoned() const = 0;
  // Hands `bytes` the task holds (a memory draw) to whoever abandons it: on_abandoned gets them
  // and gives them back, since the stuck task never will. Call before EndWait.
  virtual void SetDrawn(uint64_t bytes) = 0;
};

// The pool's TaskGate.
class TaskControl final : public TaskGate {
 public:
  struct State;
  explicit TaskControl(std::shared_ptr<State> state) : state_(std::move(state)) {}
  void Checkpoint() override;
  bool Commit() override;
  bool BeginWait() override;
  void EndWait() override;
  bool Abandoned() const override;
  void SetDrawn(uint64_t bytes) override;

 private:
  std::shared_ptr<State> state_;
};

class WorkerPool {
 public:
  // threads == 0 means base::UsableCores(): one per core this process may use ([server]
  // decode_threads = 0).
  explicit WorkerPool(uint32_t threads);
  ~WorkerPool();  // joins (threads stuck in an abandoned task are left detached)
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  uint32_t size() const;
  // Of size(), the threads running a task now.
  uint32_t busy() const;
  // Runs fn(i, worker_id) for i in [0, n) on the pool and returns when all are done. The caller
  // only waits (it never runs tasks itself, so worker_id is always a pool thread's id); it sleeps
  // on its own condition variable, no busy-waiting. Tasks of one call may run in any order.
  // `fn` must not throw. REQUIRES: not called from inside a task (that could deadlock).
  void ParallelFor(uint64_t n, const std::function<void(uint64_t i, uint32_t worker_id)>& fn);

  // Why a task was abandoned: its own deadline, or the pool's shutdown (AbandonUncommitted).
  enum class Abandoned { kPastDeadline, kShuttingDown };
  // As ParallelFor, with a deadline per task (0 = none) counted from the task's start until it
  // calls TaskControl::Commit(). An abandoned task's index, the bytes it had drawn
  // (TaskControl::SetDrawn) and why are passed to on_abandoned (on the caller's thread, without
  // the pool's lock), and the call does not wait for it. At most 1024 threads are left stuck at
  // once (an abandoned thread counts until its task returns): past that, late tasks are waited
  // for like committed ones.
  void ParallelForWithDeadline(
      uint64_t n, std::chrono::milliseconds deadline,
      const std::function<void(uint64_t i, uint32_t worker_id, TaskControl& control)>& fn,
      const std::function<void(uint64_t i, uint64_t drawn, Abandoned why)>& on_abandoned);

  // From now on every uncommitted task is abandoned at once (shutdown: a stuck read must not
  // hold up the exit). Irreversible.
  void AbandonUncommitted();
  // Tasks abandoned so far (each left one thread stuck), and those threads still stuck now.
  uint64_t abandoned() const;
  uint64_t stuck() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ringloader::pipeline
