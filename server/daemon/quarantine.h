// SPDX-License-Identifier: Apache-2.0
#pragma once
// Samples suspected of crashing the daemon. Each sample that was being decoded when the daemon
// died of a fatal signal gets a strike; a sample with `kStrikesToQuarantine` strikes is skipped in
// every later epoch like a decode error (the same on every rank: they share this daemon).
//
// Persisted as <state_dir>/quarantine.tsv, one line per struck sample:
//   dataset <TAB> sample_index <TAB> strikes <TAB> relative_path (escaped: proto/wire_text.h)
// rewritten atomically (temp file + rename) on every change.
//
// Thread-safety: thread-safe; IsQuarantined takes a reader lock.

#include <cstdint>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

namespace ringloader::server {

struct QuarantineEntry {
  std::string dataset;
  uint64_t sample_index = 0;
  std::string path;
  uint32_t strikes = 0;
};

class Quarantine {
 public:
  static constexpr uint32_t kStrikesToQuarantine = 2;

  // Loads <state_dir>/quarantine.tsv if present. A damaged file (a malformed line) never stops
  // the daemon: it is renamed to quarantine.tsv.damaged and the list starts empty (its samples
  // earn their strikes again); load_warning() then says so, naming the line. Errors: only a file
  // that can be neither read nor moved aside.
  static absl::StatusOr<std::unique_ptr<Quarantine>> Load(const std::string& state_dir);
  // Empty, or what Load() had to do about a damaged file (for the log).
  const std::string& load_warning() const { return load_warning_; }

  // Adds a strike; returns the new strike count. Persists.
  absl::StatusOr<uint32_t> Strike(const std::string& dataset, uint64_t sample_index,
                                  const std::string& path);
  bool IsQuarantined(const std::string& dataset, uint64_t sample_index) const;
  // Strikes of a sample (0 when it has none). Cheap when nothing is struck.
  uint32_t StrikesOf(const std::string& dataset, uint64_t sample_index) const;
  // A struck (not yet quarantined) sample decoded without crashing: it was a bystander of
  // someone else's crash. Removes its entry. Persists.
  absl::Status Absolve(const std::string& dataset, uint64_t sample_index);
  // Entries with >= kStrikesToQuarantine strikes.
  std::vector<QuarantineEntry> Quarantined() const;
  // Removes every entry (of `dataset`, or all when empty). Returns how many quarantined samples
  // were cleared. Persists.
  absl::StatusOr<uint64_t> Clear(const std::string& dataset);

 private:
  explicit Quarantine(std::string path) : path_(std::move(path)) {}
  std::string load_warning_;
  absl::Status SaveLocked();  // REQUIRES: mu_ held exclusively.

  const std::string path_;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::shared_mutex mu_;
  std::map<std::pair<std::string, uint64_t>, QuarantineEntry> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
