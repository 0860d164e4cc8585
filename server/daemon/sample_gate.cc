// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/sample_gate.h"

#include <fnmatch.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/image/sample_file.h"
#include "proto/wire_text.h"
#include "server/image/sample_decoder.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

// The io_fault failpoint's state: process-wide, because the injector is a plain function.
struct IoFaults {
  std::string pattern;
  int err = 0;
  uint32_t times = 0;
  std::mutex mu;
  std::map<std::string, uint32_t> failed;  // path -> reads failed so far
};
IoFaults* g_io_faults = nullptr;

int InjectIoFault(const std::string& path) {
  IoFaults& f = *g_io_faults;
  if (fnmatch(f.pattern.c_str(), path.c_str(), 0) != 0) return 0;
  std::lock_guard<std::mutex> lock(f.mu);
  uint32_t& failed = f.failed[path];
  if (failed >= f.times) return 0;
  ++failed;
  return f.err;
}

int ErrnoNamed(const std::string& name) {
  static const std::map<std::string, int> kErrnos = {
      {"EIO", EIO},       {"EMFILE", EMFILE}, {"ENFILE", ENFILE},      {"ENOMEM", ENOMEM},
      {"EAGAIN", EAGAIN}, {"ESTALE", ESTALE}, {"ETIMEDOUT", ETIMEDOUT}};
  auto it = kErrnos.find(name);
  return it == kErrnos.end() ? EIO : it->second;
}

}  // namespace

void Failpoints::OnStreamCreated() const {
  if (config_.open_delay_ms == 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(config_.open_delay_ms));
}

void Failpoints::OnSessionEnd() const {
  if (config_.session_end_delay_ms == 0) return;
  std::this_thread::sleep_for(std::chrono::milliseconds(config_.session_end_delay_ms));
}

void Failpoints::InstallIoFaults() const {
  if (config_.io_fault_path.empty() || g_io_faults != nullptr) return;
  g_io_faults = new IoFaults();  // lives for the process: the injector may run until exit
  g_io_faults->pattern = config_.io_fault_path;
  g_io_faults->err = ErrnoNamed(config_.io_fault_errno);
  g_io_faults->times = config_.io_fault_times;
  image::SetReadFaultInjector(&InjectIoFault);
}


namespace {

// A read from a pipe whose write end stays open and unused: blocked in the kernel, as a read from
// a dead NFS server would be.
[[noreturn]] void BlockForever() {
  int fds[2];
  if (pipe(fds) != 0) std::abort();
  char c;
  while (true) {
    if (read(fds[0], &c, 1) >= 0 || errno != EINTR) break;
  }
  std::abort();  // not reached
}

}  // namespace

void Failpoints::OnSample(const std::string& relative_path) const {
  if (!config_.enabled() || config_.crash_on_path.empty()) return;
  if (config_.action == FailpointConfig::Action::kHang) return;  // OnRead's
  if (fnmatch(config_.crash_on_path.c_str(), relative_path.c_str(), 0) != 0) return;
  if (config_.action == FailpointConfig::Action::kHangDecode) {
    SPDLOG_WARN("failpoint: hang_decode: the decode of {} blocks for good",
                wire::EscapeBytes(relative_path));
    BlockForever();
  }
  Act(absl::StrCat("sample ", relative_path, " matches crash_on_path"));
}

void Failpoints::OnRead(const std::string& relative_path) const {
  if (config_.action != FailpointConfig::Action::kHang || config_.crash_on_path.empty()) return;
  if (fnmatch(config_.crash_on_path.c_str(), relative_path.c_str(), 0) != 0) return;
  SPDLOG_WARN("failpoint: hang: the read of {} blocks for good",
              wire::EscapeBytes(relative_path));
  BlockForever();
}

void Failpoints::OnBatchPublished(uint64_t published) const {
  if (!config_.enabled() || config_.after_batches == 0) return;
  if (published >= config_.after_batches) {
    Act(absl::StrCat(published, " batches published (after_batches = ", config_.after_batches,
                     ")"));
  }
}

void Failpoints::Act(const std::string& why) const {
  using Action = FailpointConfig::Action;
  switch (config_.action) {
    case Action::kAbort:
      SPDLOG_CRITICAL("failpoint: abort: {}", why);
      spdlog::default_logger()->flush();
      std::abort();
    case Action::kSegfault:
      SPDLOG_CRITICAL("failpoint: segfault: {}", why);
      spdlog::default_logger()->flush();
      // A real SIGSEGV, as a wild pointer would give (a null store would be stopped by UBSan in
      // sanitizer builds before it faults).
      raise(SIGSEGV);
      std::abort();  // not reached
    case Action::kOom: {
      SPDLOG_CRITICAL("failpoint: allocating until out of memory: {}", why);
      spdlog::default_logger()->flush();
      std::vector<char*> hog;
      for (;;) {
        char* chunk = new char[64u << 20];  // throws bad_alloc under RLIMIT_AS -> terminate
        std::memset(chunk, 1, 64u << 20);   // touch it so the kernel must back it
        hog.push_back(chunk);
      }
    }
    case Action::kHang:  // OnRead's and OnSample's, never through here
    case Action::kHangDecode:
    case Action::kNone:
      break;
  }
  std::abort();
}

namespace {

absl::Status Quarantined(const pipeline::Dataset& dataset, uint64_t sample_index) {
  return image::WithReason(
      absl::FailedPreconditionError(absl::StrCat(
          std::string(dataset.relative_path(sample_index)),
          ": quarantined: the daemon crashed while decoding it, or its read or decode was "
          "abandoned past decode_deadline_ms, ",
          Quarantine::kStrikesToQuarantine, " times")),
      "quarantined");
}

}  // namespace

absl::Status SampleGate::Refused(const pipeline::Dataset& dataset, uint64_t sample_index) {
  if (quarantine_.IsQuarantined(dataset.name(), sample_index)) {
    return Quarantined(dataset, sample_index);
  }
  return absl::OkStatus();
}

absl::Status SampleGate::BeforeRead(const pipeline::Dataset& dataset, uint64_t sample_index) {
  if (absl::Status refused = Refused(dataset, sample_index); !refused.ok()) return refused;
  if (failpoints_.enabled()) failpoints_.OnRead(std::string(dataset.relative_path(sample_index)));
  return absl::OkStatus();
}

void SampleGate::OnAbandoned(const pipeline::Dataset& dataset, uint64_t sample_index) {
  const std::string path = wire::EscapeBytes(dataset.relative_path(sample_index));
  absl::StatusOr<uint32_t> strikes = quarantine_.Strike(dataset.name(), sample_index, path);
  if (!strikes.ok()) {
    SPDLOG_WARN("quarantine: {}", strikes.status().ToString());
    return;
  }
  if (*strikes >= Quarantine::kStrikesToQuarantine) {
    quarantines_.fetch_add(1, std::memory_order_relaxed);
    SPDLOG_WARN("dataset {}: sample {} ({}) quarantined: abandoned past decode_deadline_ms {} "
                "times; it will be skipped (`ringloaderctl quarantine clear` to retry it)",
                dataset.name(), sample_index, path, *strikes);
  } else {
    SPDLOG_WARN("dataset {}: sample {} ({}) abandoned past decode_deadline_ms (strike {}/{})",
                dataset.name(), sample_index, path, *strikes, Quarantine::kStrikesToQuarantine);
  }
}

absl::Status SampleGate::BeforeDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                                      uint32_t worker_id) {
  if (quarantine_.IsQuarantined(dataset.name(), sample_index)) {
    return Quarantined(dataset, sample_index);
  }
  const bool probation = quarantine_.StrikesOf(dataset.name(), sample_index) > 0;
  if (probation) {
    decode_mu_.lock();
  } else {
    decode_mu_.lock_shared();
  }
  if (worker_id < on_probation_.size()) on_probation_[worker_id] = probation ? kExclusive : kShared;
  journal_.Begin(worker_id, DatasetHash(dataset.name()), sample_index);
  progress_.Begin(worker_id, dataset.name(), sample_index);
  if (failpoints_.enabled()) failpoints_.OnSample(std::string(dataset.relative_path(sample_index)));
  return absl::OkStatus();
}

void SampleGate::AfterRead(const pipeline::Dataset&, uint64_t, std::chrono::nanoseconds waited) {
  progress_.RecordReadWait(waited);
}

void SampleGate::AfterDecode(const pipeline::Dataset& dataset, uint64_t sample_index,
                             uint32_t worker_id) {
  progress_.End(worker_id);
  journal_.End(worker_id);
  // A refused (quarantined) sample never took the lock.
  const uint8_t hold =
      worker_id < on_probation_.size() ? on_probation_[worker_id] : uint8_t{kNoHold};
  if (hold == kNoHold) return;
  on_probation_[worker_id] = kNoHold;
  if (hold == kExclusive) {
    // Decoded alone without crashing (good or bad file alike): not a poison sample.
    if (absl::Status s = quarantine_.Absolve(dataset.name(), sample_index); !s.ok()) {
      SPDLOG_WARN("quarantine: {}", s.ToString());
    } else {
      SPDLOG_INFO("dataset {}: sample {} ({}) decoded alone without crashing: strike cleared",
                  dataset.name(), sample_index, wire::EscapeBytes(dataset.relative_path(sample_index)));
    }
    decode_mu_.unlock();
  } else {
    decode_mu_.unlock_shared();
  }
}

}  // namespace ringloader::server
