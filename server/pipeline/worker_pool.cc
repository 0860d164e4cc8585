#include "server/pipeline/worker_pool.h"

#include <pthread.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"

// std::mutex rather than absl::Mutex on purpose: Debian's prebuilt abseil is not compiled with
// -fsanitize=thread, so TSan cannot see absl::Mutex's happens-before edges and reports false
// races; pthread-based std::mutex is intercepted by every sanitizer.

namespace ringloader::pipeline {
namespace {

// One ParallelFor call. Lives on the caller's stack; the pool only holds a pointer while the call
// is blocked waiting for it. All mutable fields are guarded by WorkerPool::Impl::mu.
struct Job {
  const std::function<void(uint64_t, uint32_t)>* fn = nullptr;
  uint64_t n = 0;
  uint64_t next = 0;             // next index to hand out
  uint64_t remaining = 0;        // tasks not yet finished; the caller returns at 0
  std::condition_variable done;  // notified when remaining reaches 0
};

}  // namespace

struct WorkerPool::Impl {
  std::mutex mu;
  // Jobs with indices left to hand out. A worker takes one index from the front job and moves the
  // job to the back, so concurrent calls (streams) share the pool round-robin.
  std::deque<Job*> queue ABSL_GUARDED_BY(mu);
  bool stop ABSL_GUARDED_BY(mu) = false;
  std::condition_variable work_available;
  std::vector<std::thread> threads;

  void WorkerLoop(uint32_t worker_id);
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
    lock.unlock();
    (*job->fn)(i, worker_id);
    lock.lock();
    // Notify while holding mu: the caller cannot wake up and destroy `job` before we let go.
    if (--job->remaining == 0) job->done.notify_one();
  }
}

WorkerPool::WorkerPool(uint32_t threads) : impl_(std::make_unique<Impl>()) {
  if (threads == 0) threads = std::thread::hardware_concurrency();
  if (threads == 0) threads = 1;
  impl_->threads.reserve(threads);
  for (uint32_t id = 0; id < threads; ++id) {
    impl_->threads.emplace_back([impl = impl_.get(), id] { impl->WorkerLoop(id); });
  }
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->work_available.notify_all();
  for (std::thread& t : impl_->threads) t.join();
}

uint32_t WorkerPool::size() const { return static_cast<uint32_t>(impl_->threads.size()); }

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

}  // namespace ringloader::pipeline
