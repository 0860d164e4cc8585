// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "shm/base/cgroup.h"
#include "shm/base/clock.h"

// std::mutex rather than absl::Mutex on purpose: Debian's prebuilt abseil is not compiled with
// -fsanitize=thread, so TSan cannot see absl::Mutex's happens-before edges and reports false
// races; pthread-based std::mutex is intercepted by every sanitizer.

namespace ringloader::pipeline {
namespace {

using Clock = std::chrono::steady_clock;

// A deadline task's life. Only the task moves kRunning <-> kWaiting and to kCommitted or kDone;
// only the caller moves kRunning -> kAbandoned. Both use compare-exchange on one word that also
// holds a generation (bumped by every EndWait), so exactly one of "the task finished" and "the
// caller gave up on it" happens, and a caller that read the start time of an earlier running
// phase cannot abandon a later one.
// kStarting: the task has not yet said (Checkpoint) that it copied what it needs from its caller;
// until then it is never abandoned, so that everything it read happens-before the caller moves on
// (the caller's compare-exchange acquires what the task's Checkpoint released).
enum Phase : uint64_t {
  kRunning = 0,
  kWaiting = 1,
  kCommitted = 2,
  kAbandoned = 3,
  kDone = 4,
  kStarting = 5,
};
constexpr uint64_t kPhaseMask = 0xff;
constexpr uint64_t kGeneration = 0x100;

uint64_t PhaseOf(uint64_t word) { return word & kPhaseMask; }
uint64_t WithPhase(uint64_t word, Phase phase) { return (word & ~kPhaseMask) | phase; }

// At most this many threads are left stuck at once; past it, late tasks are waited for instead.
constexpr uint64_t kMaxStuck = 1024;

// How often a caller with deadline tasks looks at them even when nothing finished.
constexpr std::chrono::milliseconds kCheckInterval{100};

}  // namespace

struct TaskControl::State {
  std::atomic<uint64_t> word{kStarting};  // phase | generation
  std::atomic<int64_t> start_ns{0};      // when the deadline started counting
  std::atomic<uint64_t> drawn{0};        // see TaskControl::SetDrawn
  uint64_t index = 0;
  uint32_t worker_id = 0;
  // The pool's count of abandoned threads still stuck: the thread of an abandoned task takes
  // itself off when its task returns (the pool may be gone by then; this count is not).
  std::shared_ptr<std::atomic<uint64_t>> stuck_now;

  // kStarting or kRunning -> `to` for the current generation; false in any other phase.
  bool FromActive(Phase to) {
    uint64_t w = word.load();
    while (PhaseOf(w) == kRunning || PhaseOf(w) == kStarting) {
      if (word.compare_exchange_weak(w, WithPhase(w, to))) return true;
    }
    return false;
  }
};

bool TaskControl::Commit() { return state_->FromActive(kCommitted); }

bool TaskControl::BeginWait() { return state_->FromActive(kWaiting); }

void TaskControl::Checkpoint() {
  uint64_t w = state_->word.load();
  while (PhaseOf(w) == kStarting &&
         !state_->word.compare_exchange_weak(w, WithPhase(w, kRunning))) {
  }
}

void TaskControl::EndWait() {
  state_->start_ns.store(base::SteadyNowNs());
  state_->word.store(WithPhase(state_->word.load() + kGeneration, kRunning));
}

bool TaskControl::Abandoned() const { return PhaseOf(state_->word.load()) == kAbandoned; }

void TaskControl::SetDrawn(uint64_t bytes) { state_->drawn.store(bytes); }

namespace {

// One ParallelFor call. Lives on the caller's stack; the pool only holds a pointer while the call
// is blocked waiting for it. All mutable fields are guarded by WorkerPool::Impl::mu.
struct Job {
  const std::function<void(uint64_t, uint32_t)>* fn = nullptr;
  const std::function<void(uint64_t, uint32_t, TaskControl&)>* fn_control = nullptr;
  uint64_t n = 0;
  uint64_t next = 0;             // next index to hand out
  uint64_t remaining = 0;        // tasks not yet finished or abandoned; the caller returns at 0
  std::condition_variable done;  // notified when a task finishes
  std::vector<std::shared_ptr<TaskControl::State>> running;  // deadline tasks in progress
};

}  // namespace

struct WorkerPool::Impl {
  std::mutex mu;
  // Jobs with indices left to hand out. A worker takes one index from the front job and moves the
  // job to the back, so concurrent calls (streams) share the pool round-robin.
  std::deque<Job*> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::condition_variable work_available;
  std::vector<std::thread> threads ABSL_GUARDED_BY(mu);  // index = worker id
  std::atomic<bool> abandon_uncommitted{false};
  std::atomic<uint64_t> abandoned{0};  // in the pool's life
  // Threads running a task now, stuck ones too (shared: a stuck thread outlives the pool).
  std::shared_ptr<std::atomic<uint32_t>> busy = std::make_shared<std::atomic<uint32_t>>(0);
  std::shared_ptr<std::atomic<uint64_t>> stuck_now = std::make_shared<std::atomic<uint64_t>>(0);

  void WorkerLoop(uint32_t worker_id);
  // Gives `worker_id` to a new thread; the stuck one is detached.
  void ReplaceWorker(uint32_t worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);
};

void WorkerPool::Impl::WorkerLoop(uint32_t worker_id) {
  const std::string name = "rl-decode-" + std::to_string(worker_id);
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
  std::unique_lock<std::mutex> lock(mu);
  while (true) {
    work_available.wait(lock, [&] { return !queue.empty() || stop; });
    if (queue.empty()) break;  // stop requested and nothing left to run
    Job* job = queue.front();
    queue.pop_front();
    const uint64_t i = job->next++;
    if (job->next < job->n) queue.push_back(job);
    if (job->fn_control != nullptr) {
      auto state = std::make_shared<TaskControl::State>();
      state->index = i;
      state->worker_id = worker_id;
      state->stuck_now = stuck_now;
      state->start_ns.store(base::SteadyNowNs());
      job->running.push_back(state);
      const auto* fn = job->fn_control;
      const std::shared_ptr<std::atomic<uint32_t>> busy_now = busy;
      lock.unlock();
      TaskControl control(state);
      busy_now->fetch_add(1);
      (*fn)(i, worker_id, control);
      busy_now->fetch_sub(1);
      // Abandoned: the caller has moved on and another thread has our worker id. Touch nothing.
      uint64_t w = state->word.load();
      while (PhaseOf(w) != kAbandoned && !state->word.compare_exchange_weak(w, WithPhase(w, kDone))) {
      }
      if (PhaseOf(w) == kAbandoned) {
        state->stuck_now->fetch_sub(1);
        return;
      }
      lock.lock();
      std::erase(job->running, state);
    } else {
      lock.unlock();
      busy->fetch_add(1);
      (*job->fn)(i, worker_id);
      busy->fetch_sub(1);
      lock.lock();
    }
    // Notify while holding mu: the caller cannot wake up and destroy `job` before we let go.
    if (--job->remaining == 0) job->done.notify_one();
  }
}

void WorkerPool::Impl::ReplaceWorker(uint32_t worker_id) {
  threads[worker_id].detach();
  abandoned.fetch_add(1);
  try {
    threads[worker_id] = std::thread([this, worker_id] { WorkerLoop(worker_id); });
  } catch (const std::system_error&) {
    // No thread to be had: the pool goes on one thread short (the queue needs no particular id).
  }
}

WorkerPool::WorkerPool(uint32_t threads) : impl_(std::make_shared<Impl>()) {
  if (threads == 0) threads = base::UsableCores();
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->threads.reserve(threads);
  for (uint32_t id = 0; id < threads; ++id) {
    impl_->threads.emplace_back([impl = impl_.get(), id] { impl->WorkerLoop(id); });
  }
}

WorkerPool::~WorkerPool() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    threads.swap(impl_->threads);
  }
  impl_->work_available.notify_all();
  for (std::thread& t : threads) {
    if (t.joinable()) t.join();
  }
}

uint32_t WorkerPool::size() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return static_cast<uint32_t>(impl_->threads.size());
}

void WorkerPool::ParallelFor(uint64_t n,
                             const std::function<void(uint64_t i, uint32_t worker_id)>& fn) {
  if (n == 0) return;
  Job job;
  job.fn = &fn;
  job.n = n;
  job.remaining = n;
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->queue.push_back(&job);
  if (n == 1) {
    impl_->work_available.notify_one();
  } else {
    impl_->work_available.notify_all();
  }
  job.done.wait(lock, [&] { return job.remaining == 0; });
}

void WorkerPool::ParallelForWithDeadline(
    uint64_t n, std::chrono::milliseconds deadline,
    const std::function<void(uint64_t i, uint32_t worker_id, TaskControl& control)>& fn,
    const std::function<void(uint64_t i, uint64_t drawn, Abandoned why)>& on_abandoned) {
  if (n == 0) return;
  Job job;
  job.fn_control = &fn;
  job.n = n;
  job.remaining = n;
  const int64_t deadline_ns = std::chrono::nanoseconds(deadline).count();
  std::vector<std::pair<uint64_t, uint64_t>> abandoned;  // (index, drawn)
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->queue.push_back(&job);
  impl_->work_available.notify_all();
  while (job.remaining > 0) {
    const bool abandon_all = impl_->abandon_uncommitted.load();
    const int64_t now = base::SteadyNowNs();
    for (auto it = job.running.begin(); it != job.running.end();) {
      TaskControl::State& task = **it;
      // The word first, then the start time: a later EndWait changes the word's generation, so
      // the compare-exchange below fails if this start time is not the current phase's.
      uint64_t w = task.word.load();
      const bool late =
          PhaseOf(w) == kRunning &&
          (abandon_all || (deadline_ns > 0 && now - task.start_ns.load() >= deadline_ns));
      // Counted stuck before the task can see itself abandoned (and take itself off).
      bool abandon = late && impl_->stuck_now->fetch_add(1) < kMaxStuck;
      if (abandon && !task.word.compare_exchange_strong(w, WithPhase(w, kAbandoned))) {
        abandon = false;
      }
      if (late && !abandon) impl_->stuck_now->fetch_sub(1);
      if (abandon) {
        impl_->ReplaceWorker(task.worker_id);
        abandoned.emplace_back(task.index, task.drawn.load());
        --job.remaining;
        it = job.running.erase(it);
      } else {
        ++it;
      }
    }
    if (!abandoned.empty()) {
      // Without the lock: the callback may be slow (it writes the quarantine file), and the
      // workers must not wait for it.
      const Abandoned why = abandon_all ? Abandoned::kShuttingDown : Abandoned::kPastDeadline;
      lock.unlock();
      for (const auto& [i, drawn] : abandoned) on_abandoned(i, drawn, why);
      lock.lock();
      abandoned.clear();
    }
    if (job.remaining == 0) break;
    if (deadline_ns == 0 && !abandon_all) {
      // No deadline: only shutdown (AbandonUncommitted) can end a task early; look now and then.
      job.done.wait_for(lock, kCheckInterval * 5);
    } else {
      job.done.wait_for(lock, kCheckInterval);
    }
  }
  // Tasks not yet started were handed out (remaining counts them), so the job has left the queue.
}

uint32_t WorkerPool::busy() const {
  // Stuck threads (abandoned in a task) are busy but no longer the pool's.
  const uint64_t running = impl_->busy->load();
  const uint64_t stuck = impl_->stuck_now->load();
  return static_cast<uint32_t>(std::min<uint64_t>(running > stuck ? running - stuck : 0, size()));
}

void WorkerPool::AbandonUncommitted() { impl_->abandon_uncommitted.store(true); }

uint64_t WorkerPool::abandoned() const { return impl_->abandoned.load(); }

uint64_t WorkerPool::stuck() const { return impl_->stuck_now->load(); }

}  // namespace ringloader::pipeline
