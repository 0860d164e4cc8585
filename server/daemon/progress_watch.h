// SPDX-License-Identifier: Apache-2.0
#pragma once
// Is the decode pipeline making progress? Each decode worker says when it starts a sample (after
// the sample's read committed: from then on no deadline can abandon it) and when it is done. A
// sample that has run longer than `stuck_after` is *stuck*: something past the decoder's own
// deadline holds it (a decoder caught in a loop, a label read from a dead mount). While one is
// stuck the daemon stops its watchdog pings (systemd's WATCHDOG=1, the supervisor's), so it is
// killed with SIGABRT and restarted, and the crash journal strikes the sample (host_notify.h).
//
// Also keeps the decode-latency and read-wait histograms the metrics endpoint serves (metrics.h).
//
// Thread-safety: Begin/End for worker w only from the thread that runs worker id w; Stuck(),
// latency() from any thread. Lock-free: one atomic store per call on the decode path.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ringloader::server {

// Upper bounds (seconds) of the decode-latency buckets; a last bucket holds everything slower.
inline constexpr std::array<double, 12> kDecodeLatencyBounds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10};

struct LatencySnapshot {
  std::array<uint64_t, kDecodeLatencyBounds.size() + 1> counts{};  // per bucket, not cumulative
  uint64_t count = 0;
  double sum_seconds = 0;
};

// A latency histogram of kDecodeLatencyBounds' buckets. Lock-free; Record from any thread.
class LatencyHistogram {
 public:
  void Record(std::chrono::nanoseconds elapsed);
  LatencySnapshot Snapshot() const;

 private:
  std::array<std::atomic<uint64_t>, kDecodeLatencyBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

struct StuckSample {
  std::string dataset;
  uint64_t sample_index = 0;
  std::chrono::milliseconds running{0};
};

class ProgressWatch {
 public:
  // stuck_after 0: nothing is ever stuck (server.decode_deadline_ms = 0 means no deadline).
  ProgressWatch(uint32_t workers, std::chrono::milliseconds stuck_after);

  // `dataset` must outlive the sample's End (the registry keeps every dataset for the daemon's
  // life). Worker ids past `workers` are ignored.
  void Begin(uint32_t worker_id, const std::string& dataset, uint64_t sample_index);
  void End(uint32_t worker_id);

  // The longest-running stuck sample at `now`, if any.
  std::optional<StuckSample> Stuck(std::chrono::steady_clock::time_point now) const;
  std::chrono::milliseconds stuck_after() const { return stuck_after_; }
  LatencySnapshot latency() const { return latency_.Snapshot(); }
  // How long decode threads waited for samples' reads (their files' opens and bytes): near 0
  // while the read-ahead keeps up (pipeline::SampleObserver::AfterRead). From any thread.
  void RecordReadWait(std::chrono::nanoseconds waited) { read_wait_.Record(waited); }
  LatencySnapshot read_wait() const { return read_wait_.Snapshot(); }

 private:
  struct alignas(64) Worker {
    std::atomic<int64_t> started_ns{0};  // steady clock; 0 = idle. Written by the worker only.
    std::atomic<const std::string*> dataset{nullptr};
    std::atomic<uint64_t> sample_index{0};
  };
  const std::chrono::milliseconds stuck_after_;
  std::unique_ptr<Worker[]> workers_;
  const uint32_t worker_count_;
  LatencyHistogram latency_;
  LatencyHistogram read_wait_;
};

}  // namespace ringloader::server
