// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/crash_journal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "shm/base/atomic_file.h"

namespace ringloader::server {
namespace {

constexpr uint32_t kMagic = 0x46494c52;  // "RLIF"
constexpr uint32_t kVersion = 2;
// The header's state word.
constexpr uint32_t kExitedCleanly = 0;
constexpr uint32_t kCrashed = 1;  // what the fatal-signal handler stores
constexpr uint32_t kRunning = 2;
constexpr size_t kHeaderBytes = 16;
constexpr size_t kEntryBytes = 16;

// The journal the fatal-signal handler marks. One per process.
std::atomic<uint32_t*> g_crashed_word{nullptr};

void OnFatalSignal(int sig) {
  // Async-signal-safe: one store into the shared file mapping, then die the default way.
  uint32_t* word = g_crashed_word.load(std::memory_order_relaxed);
  if (word != nullptr) __atomic_store_n(word, kCrashed, __ATOMIC_RELEASE);
  signal(sig, SIG_DFL);
  raise(sig);
}

std::atomic<uint64_t>* SlotWord(uint8_t* base, uint32_t worker) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + kHeaderBytes + kEntryBytes * worker);
}
std::atomic<uint64_t>* IndexWord(uint8_t* base, uint32_t worker) {
  return reinterpret_cast<std::atomic<uint64_t>*>(base + kHeaderBytes + kEntryBytes * worker + 8);
}

// The pending list: one line per sample, "crashed|killed <TAB> dataset_hash <TAB> index".
// Written by the daemon only (base::WriteFileAtomically); a line that does not parse is dropped.
void ReadPending(const std::string& path, std::vector<InFlightSample>& crashed,
                 std::vector<InFlightSample>& killed) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<absl::string_view> f = absl::StrSplit(line, '\t');
    uint32_t hash = 0;
    uint64_t index = 0;
    if (f.size() != 3 || (f[0] != "crashed" && f[0] != "killed") ||
        !absl::SimpleAtoi(f[1], &hash) || hash == 0 || !absl::SimpleAtoi(f[2], &index)) {
      continue;
    }
    const InFlightSample s{hash, index};
    killed.push_back(s);
    if (f[0] == "crashed") crashed.push_back(s);
  }
}

void Dedupe(std::vector<InFlightSample>& samples) {
  const auto key = [](const InFlightSample& s) {
    return std::pair<uint32_t, uint64_t>(s.dataset_hash, s.sample_index);
  };
  std::sort(samples.begin(), samples.end(),
            [&](const InFlightSample& a, const InFlightSample& b) { return key(a) < key(b); });
  samples.erase(std::unique(samples.begin(), samples.end(),
                            [&](const InFlightSample& a, const InFlightSample& b) {
                              return key(a) == key(b);
                            }),
                samples.end());
}

absl::Status WritePending(const std::string& path, const std::vector<InFlightSample>& crashed,
                          const std::vector<InFlightSample>& killed) {
  std::string text;
  for (const InFlightSample& s : killed) {
    const bool was_crash = std::any_of(crashed.begin(), crashed.end(), [&](const InFlightSample& c) {
      return c.dataset_hash == s.dataset_hash && c.sample_index == s.sample_index;
    });
    absl::StrAppend(&text, was_crash ? "crashed" : "killed", "\t", s.dataset_hash, "\t",
                    s.sample_index, "\n");
  }
  return base::WriteFileAtomically(path, text);
}

}  // namespace

uint32_t DatasetHash(const std::string& name) {
  uint32_t h = 2166136261u;  // FNV-1a, stable across builds and restarts
  for (unsigned char c : name) {
    h ^= c;
    h *= 16777619u;
  }
  return h == 0 ? 1 : h;
}

absl::StatusOr<std::unique_ptr<CrashJournal>> CrashJournal::Open(const std::string& state_dir,
                                                                 uint32_t worker_count) {
  static_assert(std::atomic<uint64_t>::is_always_lock_free, "shared file mapping");
  std::string path = state_dir + "/inflight";
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::PermissionDeniedError(
        absl::StrCat(path, ": cannot open crash journal: ", std::strerror(errno)));
  }
  auto journal = std::unique_ptr<CrashJournal>(new CrashJournal());
  // Read the previous incarnation's record before resizing.
  uint32_t header[4] = {0, 0, 0, 0};
  ssize_t n = ::pread(fd, header, sizeof(header), 0);
  if (n == static_cast<ssize_t>(sizeof(header)) && header[0] == kMagic &&
      (header[1] == kVersion || header[1] == 1)) {
    const bool crashed = header[2] == kCrashed;
    uint32_t old_workers = std::min<uint32_t>(header[3], 4096);
    std::vector<uint8_t> old(kHeaderBytes + kEntryBytes * old_workers);
    if (::pread(fd, old.data(), old.size(), 0) == static_cast<ssize_t>(old.size())) {
      for (uint32_t w = 0; w < old_workers; ++w) {
        uint64_t slot = 0, index = 0;
        std::memcpy(&slot, old.data() + kHeaderBytes + kEntryBytes * w, 8);
        std::memcpy(&index, old.data() + kHeaderBytes + kEntryBytes * w + 8, 8);
        if (slot != 0) {
          journal->previous_abnormal_ = true;
          const InFlightSample sample{static_cast<uint32_t>(slot >> 32), index};
          journal->killed_in_flight_.push_back(sample);
          if (crashed) journal->crashed_in_flight_.push_back(sample);
        }
      }
    }
    if (header[2] != kExitedCleanly) journal->previous_abnormal_ = true;
  }
  // Strikes an earlier incarnation found but did not apply, then this one's, kept on disk until
  // applied: the journal below is about to be reset.
  journal->pending_path_ = path + ".pending";
  ReadPending(journal->pending_path_, journal->crashed_in_flight_, journal->killed_in_flight_);
  Dedupe(journal->crashed_in_flight_);
  Dedupe(journal->killed_in_flight_);
  if (!journal->killed_in_flight_.empty()) {
    if (absl::Status s = WritePending(journal->pending_path_, journal->crashed_in_flight_,
                                      journal->killed_in_flight_);
        !s.ok()) {
      ::close(fd);
      return s;
    }
  }
  size_t bytes = kHeaderBytes + kEntryBytes * worker_count;
  if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return absl::InternalError(absl::StrCat(path, ": ftruncate: ", std::strerror(err)));
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    return absl::InternalError(absl::StrCat(path, ": mmap: ", std::strerror(err)));
  }
  journal->base_ = static_cast<uint8_t*>(base);
  journal->bytes_ = bytes;
  journal->worker_count_ = worker_count;
  uint32_t fresh[4] = {kMagic, kVersion, kRunning, worker_count};
  std::memcpy(base, fresh, sizeof(fresh));
  return journal;
}

CrashJournal::~CrashJournal() {
  uint32_t* expected = reinterpret_cast<uint32_t*>(base_ + 8);
  g_crashed_word.compare_exchange_strong(expected, nullptr);
  if (base_ != nullptr) ::munmap(base_, bytes_);
}

absl::Status CrashJournal::StrikesApplied() {
  if (::unlink(pending_path_.c_str()) != 0 && errno != ENOENT) {
    return absl::InternalError(absl::StrCat(pending_path_, ": unlink: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

void CrashJournal::Begin(uint32_t worker_id, uint32_t dataset_hash, uint64_t sample_index) {
  if (worker_id >= worker_count_) return;
  IndexWord(base_, worker_id)->store(sample_index, std::memory_order_relaxed);
  SlotWord(base_, worker_id)->store((uint64_t{dataset_hash} << 32) | 1, std::memory_order_release);
}

void CrashJournal::End(uint32_t worker_id) {
  if (worker_id >= worker_count_) return;
  SlotWord(base_, worker_id)->store(0, std::memory_order_release);
}

void CrashJournal::InstallCrashHandlers() {
  g_crashed_word.store(reinterpret_cast<uint32_t*>(base_ + 8));
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = OnFatalSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) sigaction(sig, &sa, nullptr);
}

void CrashJournal::MarkCleanExit() {
  for (uint32_t w = 0; w < worker_count_; ++w) End(w);
  __atomic_store_n(reinterpret_cast<uint32_t*>(base_ + 8), kExitedCleanly, __ATOMIC_RELEASE);
}

}  // namespace ringloader::server
