// SPDX-License-Identifier: Apache-2.0
// Free functions of shm/ring.h: names, stale-segment cleanup, checksums.
#include "shm/ring.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <charconv>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "shm/segment_file.h"

namespace ringloader::shm {
namespace {

constexpr std::string_view kNamePrefix = "ringloader.";
constexpr std::string_view kLockSuffix = ".lock";

// A name in the shm directory that belongs to one daemon incarnation:
//   "ringloader.<pid>.<incarnation hex>.<stream id>"  a ring segment
//   "ringloader.<pid>.<incarnation hex>.lock"         that incarnation's liveness lock
struct ParsedName {
  pid_t pid = 0;
  std::string owner;  // "ringloader.<pid>.<incarnation hex>": the incarnation's prefix
  bool is_lock = false;
};

std::optional<ParsedName> ParseName(std::string_view entry) {
  const std::string_view whole = entry;
  if (entry.substr(0, kNamePrefix.size()) != kNamePrefix) return std::nullopt;
  entry.remove_prefix(kNamePrefix.size());
  const char* p = entry.data();
  const char* end = entry.data() + entry.size();
  ParsedName parsed;
  auto r = std::from_chars(p, end, parsed.pid, 10);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != '.' || parsed.pid <= 0) return std::nullopt;
  uint64_t incarnation = 0;
  r = std::from_chars(r.ptr + 1, end, incarnation, 16);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != '.') return std::nullopt;
  parsed.owner = std::string(whole.substr(0, static_cast<size_t>(r.ptr - whole.data())));
  const std::string_view rest(r.ptr, static_cast<size_t>(end - r.ptr));
  if (rest == kLockSuffix) {
    parsed.is_lock = true;
    return parsed;
  }
  uint64_t stream = 0;
  r = std::from_chars(r.ptr + 1, end, stream, 10);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return parsed;
}

std::string DirJoin(const std::string& dir, std::string_view name) {
  return internal::SegmentPath(dir, absl::StrCat("/", base::Sv(name)));
}

enum class Liveness { kAlive, kDead, kUnknown };

// Whether the incarnation `owner` still runs, by its lock file: the daemon holds an exclusive
// flock on it for its whole life, and the kernel drops the lock when the process dies, however it
// dies and in whatever pid namespace it runs. kUnknown when there is no lock file.
// On kDead, `*held` is the open, locked file (so no other cleaner races us); the caller closes it.
Liveness LivenessOf(const std::string& shm_dir, const std::string& owner, int* held) {
  const std::string path = DirJoin(shm_dir, absl::StrCat(owner, base::Sv(kLockSuffix)));
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return errno == ENOENT ? Liveness::kUnknown : Liveness::kAlive;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd);
    return Liveness::kAlive;
  }
  *held = fd;
  return Liveness::kDead;
}

}  // namespace

struct IncarnationLock::Impl {
  std::string path;
  int fd = -1;
};

absl::StatusOr<std::unique_ptr<IncarnationLock>> IncarnationLock::Acquire(
    const std::string& shm_dir, pid_t daemon_pid, uint64_t incarnation) {
  auto impl = std::make_unique<Impl>();
  impl->path = DirJoin(shm_dir, absl::StrCat(base::Sv(kNamePrefix), daemon_pid, ".",
                                             absl::Hex(incarnation), base::Sv(kLockSuffix)));
  // Locked under a name no cleaner parses, then renamed into place: a cleaner never sees the
  // lock file unlocked, so it never takes a starting daemon for a dead one.
  const std::string temp = impl->path + ".new";
  impl->fd = ::open(temp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (impl->fd < 0) return internal::ErrnoStatus(errno, absl::StrCat("create ", temp));
  if (::flock(impl->fd, LOCK_EX | LOCK_NB) != 0 || ::rename(temp.c_str(), impl->path.c_str()) != 0) {
    absl::Status s = internal::ErrnoStatus(errno, absl::StrCat("lock ", impl->path));
    ::close(impl->fd);
    ::unlink(temp.c_str());
    return s;
  }
  auto lock = std::unique_ptr<IncarnationLock>(new IncarnationLock());
  lock->impl_ = std::move(impl);
  return lock;
}

IncarnationLock::~IncarnationLock() {
  if (impl_ == nullptr) return;
  ::unlink(impl_->path.c_str());
  ::close(impl_->fd);
}

const std::string& IncarnationLock::path() const { return impl_->path; }

std::string_view SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree:
      return "FREE";
    case SlotState::kFilling:
      return "FILLING";
    case SlotState::kReady:
      return "READY";
    case SlotState::kLeased:
      return "LEASED";
  }
  return "INVALID";
}

std::string SegmentName(pid_t daemon_pid, uint64_t incarnation, uint64_t stream_id) {
  return absl::StrCat("/", base::Sv(kNamePrefix), daemon_pid, ".", absl::Hex(incarnation), ".",
                      stream_id);
}

absl::StatusOr<int> RemoveStaleSegments(const std::string& shm_dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(shm_dir.c_str()), &::closedir);
  if (dir == nullptr) {
    return internal::ErrnoStatus(errno, absl::StrCat("RemoveStaleSegments: opendir ", shm_dir));
  }
  // Names grouped by incarnation, so each incarnation's liveness is decided once.
  std::map<std::string, std::vector<std::string>> segments_of;
  std::map<std::string, pid_t> pid_of;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) {
        return internal::ErrnoStatus(errno, absl::StrCat("RemoveStaleSegments: readdir ", shm_dir));
      }
      break;
    }
    std::optional<ParsedName> parsed = ParseName(entry->d_name);
    if (!parsed.has_value()) continue;
    std::vector<std::string>& names = segments_of[parsed->owner];
    pid_of[parsed->owner] = parsed->pid;
    if (!parsed->is_lock) names.push_back(absl::StrCat("/", entry->d_name));
  }
  int removed = 0;
  for (const auto& [owner, names] : segments_of) {
    int held = -1;
    Liveness liveness = LivenessOf(shm_dir, owner, &held);
    if (liveness == Liveness::kUnknown) {
      // No lock file: a daemon of a version before the lock. Only ESRCH proves its creator is
      // gone (EPERM means it lives under another user); our own pid is alive by definition.
      const pid_t pid = pid_of[owner];
      const bool dead = pid != ::getpid() && ::kill(pid, 0) != 0 && errno == ESRCH;
      liveness = dead ? Liveness::kDead : Liveness::kAlive;
    }
    if (liveness == Liveness::kAlive) continue;
    absl::Status failed;
    for (const std::string& name : names) {
      absl::Status s = internal::RemoveSegment(shm_dir, name);
      if (s.ok()) {
        ++removed;
      } else if (!absl::IsNotFound(s) && failed.ok()) {  // NotFound: another cleaner was faster
        failed = s;
      }
    }
    if (held >= 0) {
      // Unlinked while we hold it, so a cleaner that opened it before cannot mistake a new file.
      if (failed.ok()) ::unlink(DirJoin(shm_dir, absl::StrCat(owner, base::Sv(kLockSuffix))).c_str());
      ::close(held);
    }
    if (!failed.ok()) return failed;
  }
  return removed;
}

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace ringloader::shm
