// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/progress_watch.h"

#include <algorithm>

#include "shm/base/clock.h"

namespace ringloader::server {

ProgressWatch::ProgressWatch(uint32_t workers, std::chrono::milliseconds stuck_after)
    : stuck_after_(stuck_after),
      workers_(std::make_unique<Worker[]>(workers)),
      worker_count_(workers) {}

void ProgressWatch::Begin(uint32_t worker_id, const std::string& dataset, uint64_t sample_index) {
  if (worker_id >= worker_count_) return;
  Worker& w = workers_[worker_id];
  w.dataset.store(&dataset, std::memory_order_relaxed);
  w.sample_index.store(sample_index, std::memory_order_relaxed);
  // Published last: a reader that sees the start time sees which sample it belongs to.
  w.started_ns.store(base::SteadyNowNs(), std::memory_order_release);
}

void ProgressWatch::End(uint32_t worker_id) {
  if (worker_id >= worker_count_) return;
  Worker& w = workers_[worker_id];
  const int64_t started = w.started_ns.load(std::memory_order_relaxed);
  if (started == 0) return;
  w.started_ns.store(0, std::memory_order_release);
  latency_.Record(std::chrono::nanoseconds(std::max<int64_t>(0, base::SteadyNowNs() - started)));
}

void LatencyHistogram::Record(std::chrono::nanoseconds elapsed) {
  const int64_t elapsed_ns = std::max<int64_t>(0, elapsed.count());
  const double seconds = static_cast<double>(elapsed_ns) * 1e-9;
  const size_t bucket =
      std::lower_bound(kDecodeLatencyBounds.begin(), kDecodeLatencyBounds.end(), seconds) -
      kDecodeLatencyBounds.begin();
  buckets_[bucket].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(elapsed_ns), std::memory_order_relaxed);
}

std::optional<StuckSample> ProgressWatch::Stuck(std::chrono::steady_clock::time_point now) const {
  if (stuck_after_.count() <= 0) return std::nullopt;
  const int64_t now_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count();
  std::optional<StuckSample> worst;
  for (uint32_t i = 0; i < worker_count_; ++i) {
    const Worker& w = workers_[i];
    const int64_t started = w.started_ns.load(std::memory_order_acquire);
    if (started == 0) continue;
    const auto running =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::nanoseconds(now_ns - started));
    if (running < stuck_after_ || (worst && running <= worst->running)) continue;
    const std::string* dataset = w.dataset.load(std::memory_order_relaxed);
    const uint64_t index = w.sample_index.load(std::memory_order_relaxed);
    // The worker moved on meanwhile: not stuck after all.
    if (w.started_ns.load(std::memory_order_acquire) != started) continue;
    worst = StuckSample{dataset != nullptr ? *dataset : std::string(), index, running};
  }
  return worst;
}

LatencySnapshot LatencyHistogram::Snapshot() const {
  LatencySnapshot s;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    s.counts[i] = buckets_[i].load(std::memory_order_relaxed);
    s.count += s.counts[i];
  }
  s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) * 1e-9;
  return s;
}

}  // namespace ringloader::server
