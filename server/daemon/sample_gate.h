#pragma once
// What the daemon does around every sample decode (a pipeline::SampleObserver):
//   1. a quarantined sample is refused (an error for that sample, reason "quarantined");
//   2. the sample is recorded in the crash journal while it is decoded;
//   3. failpoints, when configured, crash the daemon on matching samples (tests only).
// Failpoints cost one predictable branch when off.
//
// Thread-safety: thread-safe (per-worker journal slots; the quarantine locks itself).

#include <cstdint>
#include <string>

#include "server/daemon/config.h"
#include "server/daemon/crash_journal.h"
#include "server/daemon/quarantine.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

class Failpoints {
 public:
  explicit Failpoints(FailpointConfig config) : config_(std::move(config)) {}
  bool enabled() const { return config_.enabled(); }
  // Acts if `relative_path` matches crash_on_path. Does not return when it acts.
  void OnSample(const std::string& relative_path) const;
  // Acts once `published` reaches after_batches. Does not return when it acts.
  void OnBatchPublished(uint64_t published) const;

 private:
  [[noreturn]] void Act(const std::string& why) const;
  FailpointConfig config_;
};

class SampleGate : public pipeline::SampleObserver {
 public:
  SampleGate(CrashJournal& journal, const Quarantine& quarantine, const Failpoints& failpoints)
      : journal_(journal), quarantine_(quarantine), failpoints_(failpoints) {}

  absl::Status BeforeDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                            uint32_t worker_id) override;
  void AfterDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                   uint32_t worker_id) override;

 private:
  CrashJournal& journal_;
  const Quarantine& quarantine_;
  const Failpoints& failpoints_;
};

}  // namespace ringloader::server
