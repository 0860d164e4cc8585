// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/read_pool.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "shm/base/clock.h"

namespace ringloader::pipeline {
namespace {

int64_t Ns(std::chrono::milliseconds ms) { return std::chrono::nanoseconds(ms).count(); }

}  // namespace

// Shared by the lane and its threads (detached: each holds the Impl alive while it runs).
struct ReadPool::Impl {
  Impl(uint32_t d, LaneOptions o) : depth(d), options(std::move(o)) {}
  const uint32_t depth;
  const LaneOptions options;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::mutex mu;
  std::condition_variable work;
  std::condition_variable idle_cv;  // notified when a read or a probe ends
  std::deque<std::pair<uint64_t, std::function<Answer()>>> queue ABSL_GUARDED_BY(mu);
  uint64_t next_id ABSL_GUARDED_BY(mu) = 1;
  bool stop ABSL_GUARDED_BY(mu) = false;
  uint32_t threads ABSL_GUARDED_BY(mu) = 0;  // alive (idle, running or stuck)
  uint32_t idle ABSL_GUARDED_BY(mu) = 0;
  std::unordered_map<uint64_t, bool> running ABSL_GUARDED_BY(mu);  // id -> written off
  uint64_t stuck ABSL_GUARDED_BY(mu) = 0;  // running and written off
  // The witness clock (see the header), in base::SteadyNowNs.
  int64_t answered_ns ABSL_GUARDED_BY(mu) = 0;  // latest start of an operation answered
  int64_t resumed_ns ABSL_GUARDED_BY(mu) = 0;   // the end of the last stall
  int64_t stalled_since_ns ABSL_GUARDED_BY(mu) = 0;  // 0 = not stalled
  uint64_t stalls ABSL_GUARDED_BY(mu) = 0;
  uint32_t probes_running ABSL_GUARDED_BY(mu) = 0;
  int64_t last_probe_ns ABSL_GUARDED_BY(mu) = 0;  // start of Judge's latest probe
  // Start of the latest probe a failing read asked for (Witness): apart from Judge's, whose
  // stall timing must not move with them.
  int64_t witness_probe_ns ABSL_GUARDED_BY(mu) = 0;
  uint64_t probe_attempts ABSL_GUARDED_BY(mu) = 0;

  // Threads allowed: depth, plus one for each written-off (maybe stuck) read.
  uint64_t Allowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return depth + stuck; }

  // Starts a thread if work waits, no thread is idle and the lane may have one more.
  void Grow(const std::shared_ptr<Impl>& self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stop || queue.size() <= idle || threads >= Allowed()) return;
    try {
      std::thread([self] { self->Loop(self); }).detach();
      ++threads;
    } catch (const std::system_error&) {
      // No thread to be had (a pids limit): the threads there are run the queue.
    }
  }

  // The storage answered an operation that started at `started_ns`. Returns how long the lane
  // was stalled when this answer ends a stall.
  std::optional<std::chrono::milliseconds> Answered(int64_t started_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    answered_ns = std::max(answered_ns, started_ns);
    if (stalled_since_ns == 0) return std::nullopt;
    const int64_t now = base::SteadyNowNs();
    const auto stalled_for = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::nanoseconds(now - stalled_since_ns));
    stalled_since_ns = 0;
    resumed_ns = now;  // reads in flight count their deadlines afresh from here
    last_stall_length = stalled_for;
    return stalled_for;
  }

  // Says the lane's state to on_stall_change when it differs from what was said last (a resume
  // and a stall seen by two threads are said in the order they hold now).
  std::mutex tell_mu;
  bool told_stalled = false;  // guarded by tell_mu
  std::chrono::milliseconds last_stall_length{0};  // guarded by mu: the stall that ended last
  void Tell() {
    if (!options.on_stall_change) return;
    std::lock_guard<std::mutex> told(tell_mu);
    bool stalled = false;
    std::chrono::milliseconds stalled_for{0};
    {
      std::lock_guard<std::mutex> lock(mu);
      stalled = stalled_since_ns != 0;
      stalled_for = last_stall_length;
    }
    if (stalled == told_stalled) return;
    told_stalled = stalled;
    options.on_stall_change(stalled, stalled ? std::chrono::milliseconds(0) : stalled_for);
  }

  void Loop(const std::shared_ptr<Impl>& self) {
    pthread_setname_np(pthread_self(), "rl-read");  // for top, perf and gdb
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      ++idle;
      work.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop || !queue.empty(); });
      --idle;
      if (stop) break;
      auto [id, read] = std::move(queue.front());
      queue.pop_front();
      running.emplace(id, false);
      const int64_t started = base::SteadyNowNs();
      lock.unlock();
      const Answer answer = read();
      read = nullptr;  // its captures go before the lock is taken again
      lock.lock();
      if (auto it = running.find(id); it != running.end()) {
        if (it->second) --stuck;
        running.erase(it);
      }
      std::optional<std::chrono::milliseconds> resumed;
      if (answer == Answer::kAnswered) {
        resumed = Answered(started);
      } else if (answer == Answer::kUnconfirmed && stalled_since_ns != 0) {
        ProbeUnlessAsking(self, base::SteadyNowNs());
      }
      idle_cv.notify_all();
      if (resumed) {
        lock.unlock();
        Tell();
        lock.lock();
      }
      if (threads > Allowed()) break;  // it ran in a stuck read's place, which has ended
    }
    --threads;
  }

  // On a stalled lane, a read that asked the storage nothing (Answer::kUnconfirmed) asks it: a
  // probe, unless one started in the last second is still running (an older one may be stuck on
  // a file that never answers, so another goes to another file, up to kMaxProbes).
  void ProbeUnlessAsking(const std::shared_ptr<Impl>& self, int64_t now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    const int64_t newest = std::max(last_probe_ns, witness_probe_ns);
    if (probes_running == 0 || now - newest >= Ns(std::chrono::seconds(1))) {
      StartProbe(self, now, /*for_judge=*/false);
    }
  }

  // `for_judge`: Judge's probe (its start is last_probe_ns); else a witness's.
  void StartProbe(const std::shared_ptr<Impl>& self, int64_t now, bool for_judge = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (!options.probe || probes_running >= kMaxProbes) return;
    const uint64_t attempt = probe_attempts++;
    try {
      std::thread([self, attempt, now] {
        pthread_setname_np(pthread_self(), "rl-probe");
        const bool answered = self->options.probe(attempt);
        std::optional<std::chrono::milliseconds> resumed;
        {
          std::lock_guard<std::mutex> lock(self->mu);
          --self->probes_running;
          if (answered) resumed = self->Answered(now);
          self->idle_cv.notify_all();
        }
        if (resumed) self->Tell();
      }).detach();
      ++probes_running;
      (for_judge ? last_probe_ns : witness_probe_ns) = now;
    } catch (const std::system_error&) {
      // No thread: the next Judge tries again.
    }
  }
};

ReadPool::ReadPool(uint32_t depth, LaneOptions options)
    : impl_(std::make_shared<Impl>(std::max<uint32_t>(depth, 1), std::move(options))) {}

ReadPool::~ReadPool() { Shutdown(); }

uint32_t ReadPool::depth() const { return impl_->depth; }

uint64_t ReadPool::Submit(std::function<Answer()> read) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stop) return 0;
  const uint64_t id = impl_->next_id++;
  impl_->queue.emplace_back(id, std::move(read));
  impl_->Grow(impl_);
  impl_->work.notify_one();
  return id;
}

void ReadPool::WriteOff(uint64_t id) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  auto it = impl_->running.find(id);
  if (it == impl_->running.end() || it->second || impl_->stuck >= kMaxStuck) return;
  it->second = true;
  ++impl_->stuck;
  impl_->Grow(impl_);
}

uint64_t ReadPool::written_off() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->stuck;
}

uint64_t ReadPool::running() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->running.size();
}

uint64_t ReadPool::queued() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->queue.size();
}

bool ReadPool::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->idle_cv.wait_for(lock, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
    return impl_->running.empty() && impl_->probes_running == 0;
  });
}

void ReadPool::Shutdown() {
  std::deque<std::pair<uint64_t, std::function<Answer()>>> dropped;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    dropped.swap(impl_->queue);
  }
  impl_->work.notify_all();
  // `dropped` goes here, outside the lock: its captures may release memory.
}

std::chrono::milliseconds ReadPool::ProbeTimeout(std::chrono::milliseconds deadline) {
  return std::min<std::chrono::milliseconds>(deadline, std::chrono::seconds(2));
}

std::function<bool(int64_t since_ns)> ReadPool::Witness() const {
  return [weak = std::weak_ptr<Impl>(impl_)](int64_t since_ns) {
    const std::shared_ptr<Impl> lane = weak.lock();
    if (lane == nullptr) return true;
    std::lock_guard<std::mutex> lock(lane->mu);
    if (lane->answered_ns >= since_ns) return true;
    // Ask the storage, unless a probe asks it now (a probe that met an error is over).
    if (lane->probes_running == 0 || lane->witness_probe_ns < since_ns) {
      lane->StartProbe(lane, base::SteadyNowNs(), /*for_judge=*/false);
    }
    return false;
  };
}

ReadPool::Verdict ReadPool::Judge(int64_t started_ns, std::chrono::milliseconds deadline) {
  Impl& lane = *impl_;
  bool became_stalled = false;
  {
    std::lock_guard<std::mutex> lock(lane.mu);
    const int64_t now = base::SteadyNowNs();
    const int64_t overdue_at = std::max(started_ns, lane.resumed_ns) + Ns(deadline);
    if (now < overdue_at) return Verdict::kWait;
    if (lane.answered_ns > overdue_at) return Verdict::kPoison;
    // No witness yet: ask the storage (again, on another file, when a probe goes unanswered).
    const int64_t probe_timeout = Ns(ProbeTimeout(deadline));
    if (lane.last_probe_ns <= overdue_at || now - lane.last_probe_ns >= 4 * probe_timeout) {
      lane.StartProbe(impl_, now);
    }
    // Stalled once the storage was asked after the deadline (by the latest probe; without
    // probes, by the read itself) and has not answered for the probe timeout.
    const bool probing = lane.options.probe && lane.probes_running > 0 &&
                         lane.last_probe_ns > overdue_at;
    const int64_t asked_at = probing ? lane.last_probe_ns : overdue_at;
    if (lane.stalled_since_ns == 0 && now - asked_at >= probe_timeout) {
      lane.stalled_since_ns = now;
      ++lane.stalls;
      became_stalled = true;
    }
  }
  if (became_stalled) lane.Tell();
  return Verdict::kWait;
}

ReadPool::Health ReadPool::health() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Health h;
  h.stalled = impl_->stalled_since_ns != 0;
  if (h.stalled) {
    h.stalled_for = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::nanoseconds(base::SteadyNowNs() - impl_->stalled_since_ns));
  }
  h.stalls = impl_->stalls;
  h.running = impl_->running.size();
  h.stuck = impl_->stuck;
  return h;
}

}  // namespace ringloader::pipeline
