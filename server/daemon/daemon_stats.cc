// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/daemon_stats.h"

#include <unistd.h>

#include <cstdio>

namespace ringloader::server {

DaemonStats::BadFileNews DaemonStats::RecordBadFile(uint64_t sample_index,
                                                    BadFileRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  ++errors_;
  ++by_reason_[record.reason];
  auto key = std::make_pair(record.dataset, sample_index);
  if (seen_.count(key)) return BadFileNews::kSeenBefore;
  recent_.push_back(std::move(record));
  if (recent_.size() > kRecentBadFiles) recent_.pop_front();
  if (seen_.size() >= kMaxRememberedBadFiles) return BadFileNews::kNotRemembered;
  seen_.insert(std::move(key));
  return BadFileNews::kFirstTime;
}

void DaemonStats::CountBadFiles(const std::string& reason, uint64_t n) {
  if (n == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  errors_ += n;
  by_reason_[reason] += n;
}

uint64_t DaemonStats::decode_errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

std::map<std::string, uint64_t> DaemonStats::errors_by_reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return by_reason_;
}

std::vector<BadFileRecord> DaemonStats::recent_bad_files() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {recent_.begin(), recent_.end()};
}

void DaemonStats::Sample(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  rate_samples_.emplace_back(now, images_decoded.load(std::memory_order_relaxed));
  while (rate_samples_.size() > 6) rate_samples_.pop_front();
}

double DaemonStats::images_per_second() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (rate_samples_.size() < 2) return 0.0;
  const auto& [t0, n0] = rate_samples_.front();
  const auto& [t1, n1] = rate_samples_.back();
  double seconds = std::chrono::duration<double>(t1 - t0).count();
  return seconds > 0 ? static_cast<double>(n1 - n0) / seconds : 0.0;
}

uint64_t CurrentRssBytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  unsigned long size = 0, resident = 0;
  int n = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  if (n != 2) return 0;
  return static_cast<uint64_t>(resident) * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t PeakRssBytes() {
  FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long v = 0;
    if (std::sscanf(line, "VmHWM: %llu kB", &v) == 1) {
      kib = v;
      break;
    }
  }
  std::fclose(f);
  return kib * 1024;
}

}  // namespace ringloader::server
