// SPDX-License-Identifier: Apache-2.0
#pragma once
// Daemon-wide counters and the record of bad files, read by GetStats.
// Per-sample events are counted here; a bad file is *logged* once (by the caller, when
// RecordBadFile says it is new), counted by reason, and kept in a short "recent" list.
//
// Thread-safety: thread-safe; counters are relaxed atomics, the bad-file record has a mutex.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace ringloader::server {

struct BadFileRecord {
  std::string dataset;
  std::string path;
  std::string reason;
  std::string message;
};

class DaemonStats {
 public:
  static constexpr size_t kRecentBadFiles = 32;
  // Bound on remembered (dataset, sample) pairs used to log each bad file once; past it, new bad
  // files are counted and not logged one by one (streams say how many, once per epoch): memory
  // stays bounded whatever the dataset, and no file is logged twice.
  static constexpr size_t kMaxRememberedBadFiles = 100'000;

  std::atomic<uint64_t> images_decoded{0};
  std::atomic<uint64_t> batches_served{0};
  std::atomic<uint64_t> bytes_served{0};  // payload bytes of the batches served (a slot's layout)
  std::atomic<uint64_t> quarantines{0};   // samples this incarnation put into quarantine
  // Starts after an unclean exit, over state_dir's life (any service manager; daemon.cc).
  std::atomic<uint64_t> daemon_restarts{0};
  std::atomic<uint64_t> batches_published{0};
  std::atomic<uint64_t> requests_rejected{0};
  // Opens dropped, or streams closed at once, because their client stopped waiting for them.
  std::atomic<uint64_t> opens_abandoned{0};
  std::atomic<uint64_t> batches_copied_out{0};  // held batches clients copied out of their rings

  // Counts a bad file. kFirstTime: not seen before (the caller logs it); kSeenBefore: logged
  // already; kNotRemembered: past kMaxRememberedBadFiles (the caller counts it for a summary).
  enum class BadFileNews { kFirstTime, kSeenBefore, kNotRemembered };
  BadFileNews RecordBadFile(uint64_t sample_index, BadFileRecord record);
  // Counts `n` bad files of `reason` known only by their number (FilledBatch::skipped_by_reason
  // beyond its errors).
  void CountBadFiles(const std::string& reason, uint64_t n);

  uint64_t decode_errors() const;
  std::map<std::string, uint64_t> errors_by_reason() const;
  std::vector<BadFileRecord> recent_bad_files() const;

  // Called about once a second; images_per_second() averages over the last ~5 s.
  void Sample(std::chrono::steady_clock::time_point now);
  double images_per_second() const;

 private:
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> by_reason_ ABSL_GUARDED_BY(mu_);
  std::deque<BadFileRecord> recent_ ABSL_GUARDED_BY(mu_);
  std::set<std::pair<std::string, uint64_t>> seen_ ABSL_GUARDED_BY(mu_);
  uint64_t errors_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::pair<std::chrono::steady_clock::time_point, uint64_t>> rate_samples_
      ABSL_GUARDED_BY(mu_);
};

// Resident set size of this process, from /proc/self/statm (0 if unreadable).
uint64_t CurrentRssBytes();
// The process's highest resident set size so far (VmHWM), in bytes; 0 if unknown.
uint64_t PeakRssBytes();

}  // namespace ringloader::server
