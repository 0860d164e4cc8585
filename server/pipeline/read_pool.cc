// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/read_pool.h"

#include <pthread.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"

namespace ringloader::pipeline {

// Shared by the pool and its threads (detached: each holds the Impl alive while it runs).
struct ReadPool::Impl {
  explicit Impl(uint32_t d) : depth(d) {}
  const uint32_t depth;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::mutex mu;
  std::condition_variable work;
  std::condition_variable idle_cv;  // notified when a read ends
  std::deque<std::function<void()>> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  uint32_t threads ABSL_GUARDED_BY(mu) = 0;  // alive (idle, running or stuck)
  uint32_t idle ABSL_GUARDED_BY(mu) = 0;
  uint32_t running ABSL_GUARDED_BY(mu) = 0;
  uint64_t written_off ABSL_GUARDED_BY(mu) = 0;

  // Threads allowed: depth, plus one for each written-off (maybe stuck) read.
  uint64_t Allowed() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return depth + written_off; }

  // Starts a thread if work waits, no thread is idle and the pool may have one more.
  void Grow(const std::shared_ptr<Impl>& self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (stop || queue.size() <= idle || threads >= Allowed()) return;
    try {
      std::thread([self] { self->Loop(); }).detach();
      ++threads;
    } catch (const std::system_error&) {
      // No thread to be had (a pids limit): the threads there are run the queue; a task never
      // waits for a read that has not started (it reads itself).
    }
  }

  void Loop() {
    pthread_setname_np(pthread_self(), "rl-read");  // for top, perf and gdb
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      ++idle;
      work.wait(lock, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return stop || !queue.empty(); });
      --idle;
      if (stop) break;
      std::function<void()> read = std::move(queue.front());
      queue.pop_front();
      ++running;
      lock.unlock();
      read();
      read = nullptr;  // its captures go before the lock is taken again
      lock.lock();
      --running;
      idle_cv.notify_all();
    }
    --threads;
  }
};

ReadPool::ReadPool(uint32_t depth) : impl_(std::make_shared<Impl>(std::max<uint32_t>(depth, 1))) {}

ReadPool::~ReadPool() { Shutdown(); }

uint32_t ReadPool::depth() const { return impl_->depth; }

bool ReadPool::Submit(std::function<void()> read) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->stop) return false;
  impl_->queue.push_back(std::move(read));
  impl_->Grow(impl_);
  impl_->work.notify_one();
  return true;
}

void ReadPool::WriteOff() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  if (impl_->written_off >= kMaxWrittenOff) return;
  ++impl_->written_off;
  impl_->Grow(impl_);
}

uint64_t ReadPool::written_off() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->written_off;
}

uint64_t ReadPool::running() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->running;
}

uint64_t ReadPool::queued() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->queue.size();
}

bool ReadPool::WaitIdle(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(impl_->mu);
  return impl_->idle_cv.wait_for(lock, timeout, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(impl_->mu) {
    return impl_->running == 0;
  });
}

void ReadPool::Shutdown() {
  std::deque<std::function<void()>> dropped;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
    dropped.swap(impl_->queue);
  }
  impl_->work.notify_all();
  // `dropped` goes here, outside the lock: its captures may release memory.
}

}  // namespace ringloader::pipeline
