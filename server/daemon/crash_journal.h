// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which sample each decode worker is on, kept in a small file mapped into memory
// (<state_dir>/inflight), so that after the daemon dies the next incarnation knows what was being
// decoded. A fatal signal (SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL) sets the header's `state`
// word to "crashed" before the process dies; SIGKILL cannot be caught, so a kill from outside (an
// operator, a chaos test, the OOM killer) leaves it "running" and strikes nobody, but the next
// incarnation still sees that its predecessor never exited cleanly. Stores into a shared file
// mapping survive the process, so no fsync is needed (only a machine crash loses them, and that
// is no poison).
//
// File layout (little-endian, version 2; version 1 files, whose `state` was 0 or 1, are read):
//   [0]  u32 magic 'RLIF'  [4] u32 version  [12] u32 worker_count
//   [8]  u32 state: 0 = exited cleanly, 1 = died of a fatal signal, 2 = running
//   [16 + 16*w] u64 slot word: 0 = idle, else (name_hash << 32 | 1); [24 + 16*w] u64 sample index
//
// Thread-safety: Begin/End for worker w only from the thread that owns worker id w.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringloader::server {

struct InFlightSample {
  uint32_t dataset_hash;  // DatasetHash(name)
  uint64_t sample_index;
};

uint32_t DatasetHash(const std::string& name);

class CrashJournal {
 public:
  // Opens (creating if needed) <state_dir>/inflight. If the previous incarnation died of a fatal
  // signal, the samples it had in flight are returned by crashed_in_flight(). Before the journal
  // is reset for this incarnation, what it held is added to <state_dir>/inflight.pending, which
  // stays until StrikesApplied(): an incarnation that stops or dies before it applies them
  // (SIGTERM during a long index, a failed start) hands them on instead of losing them.
  static absl::StatusOr<std::unique_ptr<CrashJournal>> Open(const std::string& state_dir,
                                                            uint32_t worker_count);
  ~CrashJournal();

  const std::vector<InFlightSample>& crashed_in_flight() const { return crashed_in_flight_; }
  // What the previous incarnation had in flight when it died without clearing the journal,
  // whatever killed it (a superset of crashed_in_flight(): also a SIGKILL, e.g. the OOM killer's;
  // see oom_kills.h for telling the OOM killer from anyone else).
  const std::vector<InFlightSample>& killed_in_flight() const { return killed_in_flight_; }
  // True if the previous incarnation did not exit cleanly (a fatal signal, a kill from outside,
  // the machine going down), whether or not it was decoding.
  bool previous_exit_was_abnormal() const { return previous_abnormal_; }

  // The strikes of crashed_in_flight() / killed_in_flight() are recorded (the quarantine
  // persisted them): forgets the pending list.
  absl::Status StrikesApplied();

  void Begin(uint32_t worker_id, uint32_t dataset_hash, uint64_t sample_index);
  void End(uint32_t worker_id);

  // Installs handlers for fatal signals that mark the journal crashed and then re-raise the signal
  // with its default action (so the exit status still says what happened).
  void InstallCrashHandlers();
  // A clean shutdown: clears every slot, so the next start strikes nobody.
  void MarkCleanExit();

 private:
  CrashJournal() = default;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0;
  uint32_t worker_count_ = 0;
  std::string pending_path_;
  std::vector<InFlightSample> crashed_in_flight_;
  std::vector<InFlightSample> killed_in_flight_;
  bool previous_abnormal_ = false;
};

}  // namespace ringloader::server
