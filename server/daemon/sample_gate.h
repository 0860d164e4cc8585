// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the daemon does around every sample decode (a pipeline::SampleObserver):
//   1. a quarantined sample is refused (an error for that sample, reason "quarantined");
//   2. a sample with a strike is on probation: it is decoded alone (no other decode runs
//      meanwhile), so if it crashes the daemon again it is the only sample in flight and the
//      only one struck; if it decodes fine its strike is cleared (it was a bystander);
//   3. the sample is recorded in the crash journal and the progress watch while it is decoded;
//   4. failpoints, when configured, crash the daemon on matching samples, or hang their read
//      (tests only).
// Failpoints cost one predictable branch when off; probation costs a shared lock per sample.
//
// Thread-safety: thread-safe (per-worker journal slots; the quarantine locks itself).

#include <atomic>
#include <cstdint>
#include <shared_mutex>
#include <string>
#include <vector>

#include "server/daemon/config.h"
#include "server/daemon/crash_journal.h"
#include "server/daemon/progress_watch.h"
#include "server/daemon/quarantine.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

class Failpoints {
 public:
  explicit Failpoints(FailpointConfig config) : config_(std::move(config)) {}
  bool enabled() const { return config_.enabled(); }
  // Crash actions and hang_decode: act if `relative_path` matches crash_on_path. Does not return
  // when it acts.
  void OnSample(const std::string& relative_path) const;
  // action = "hang": blocks for good in a kernel read if `relative_path` matches crash_on_path,
  // like a read from a hung network mount.
  void OnRead(const std::string& relative_path) const;
  // Acts once `published` reaches after_batches. Does not return when it acts.
  void OnBatchPublished(uint64_t published) const;
  // io_fault_path set: makes the first io_fault_times reads of each matching sample file fail
  // with io_fault_errno (image::SetReadFaultInjector). Once per process, before any read.
  void InstallIoFaults() const;
  // session_end_delay_ms: waits that long before a session's end is acted on.
  void OnSessionEnd() const;
  // open_delay_ms: waits that long once an opening stream's ring exists.
  void OnStreamCreated() const;

 private:
  [[noreturn]] void Act(const std::string& why) const;
  FailpointConfig config_;
};

class SampleGate : public pipeline::SampleObserver {
 public:
  // `quarantines` counts the samples this gate puts into quarantine (DaemonStats).
  SampleGate(CrashJournal& journal, ProgressWatch& progress, Quarantine& quarantine,
             const Failpoints& failpoints, uint32_t worker_count,
             std::atomic<uint64_t>& quarantines)
      : journal_(journal),
        progress_(progress),
        quarantine_(quarantine),
        failpoints_(failpoints),
        quarantines_(quarantines),
        on_probation_(worker_count, 0) {}

  // Refuses a quarantined sample before its file is opened.
  absl::Status BeforeRead(const pipeline::Dataset& dataset, uint64_t sample_index) override;
  absl::Status BeforeDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                            uint32_t worker_id) override;
  void AfterDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                   uint32_t worker_id) override;
  // A sample the deadline abandoned is struck as a crash is: quarantined after its strikes, a
  // read that hangs every epoch costs two deadlines, not one per epoch, and no more threads.
  void OnAbandoned(const pipeline::Dataset& dataset, uint64_t sample_index) override;
  absl::Status Refused(const pipeline::Dataset& dataset, uint64_t sample_index) override;
  void AfterRead(const pipeline::Dataset& dataset, uint64_t sample_index,
                 std::chrono::nanoseconds waited) override;

 private:
  CrashJournal& journal_;
  ProgressWatch& progress_;
  Quarantine& quarantine_;
  const Failpoints& failpoints_;
  std::atomic<uint64_t>& quarantines_;
  // Held shared by every decode, exclusively by a decode on probation; taken in BeforeDecode
  // and released in AfterDecode, on the same worker thread.
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  std::shared_mutex decode_mu_;
  // Per worker id (touched only by that worker): which hold of decode_mu_ it has while decoding.
  enum Hold : uint8_t { kNoHold = 0, kShared = 1, kExclusive = 2 };
  std::vector<uint8_t> on_probation_;
};

}  // namespace ringloader::server
