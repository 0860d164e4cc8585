// Free functions of shm/ring.h: names, stale-segment cleanup, checksums.
#include "shm/ring.h"

#include <dirent.h>
#include <signal.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <charconv>
#include <memory>

#include "absl/strings/str_cat.h"
#include "shm/segment_file.h"

namespace ringloader::shm {
namespace {

constexpr std::string_view kNamePrefix = "ringloader.";

// Parses "ringloader.<pid>.<incarnation hex>.<stream id>" (no leading slash); nullopt otherwise.
std::optional<pid_t> ParseSegmentPid(std::string_view entry) {
  if (entry.substr(0, kNamePrefix.size()) != kNamePrefix) return std::nullopt;
  entry.remove_prefix(kNamePrefix.size());
  const char* p = entry.data();
  const char* end = entry.data() + entry.size();
  pid_t pid = 0;
  auto r = std::from_chars(p, end, pid, 10);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != '.' || pid <= 0) return std::nullopt;
  uint64_t incarnation = 0;
  r = std::from_chars(r.ptr + 1, end, incarnation, 16);
  if (r.ec != std::errc() || r.ptr == end || *r.ptr != '.') return std::nullopt;
  uint64_t stream = 0;
  r = std::from_chars(r.ptr + 1, end, stream, 10);
  if (r.ec != std::errc() || r.ptr != end) return std::nullopt;
  return pid;
}

}  // namespace

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
  return absl::StrCat("/", internal::Sv(kNamePrefix), daemon_pid, ".", absl::Hex(incarnation), ".",
                      stream_id);
}

absl::StatusOr<int> RemoveStaleSegments(const std::string& shm_dir) {
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(shm_dir.c_str()), &::closedir);
  if (dir == nullptr) {
    return internal::ErrnoStatus(errno, absl::StrCat("RemoveStaleSegments: opendir ", shm_dir));
  }
  const pid_t self = ::getpid();
  int removed = 0;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(dir.get());
    if (entry == nullptr) {
      if (errno != 0) {
        return internal::ErrnoStatus(errno, absl::StrCat("RemoveStaleSegments: readdir ", shm_dir));
      }
      break;
    }
    const std::optional<pid_t> pid = ParseSegmentPid(entry->d_name);
    if (!pid.has_value() || *pid == self) continue;
    // Only ESRCH proves the creator is gone; EPERM means it lives under another user.
    if (::kill(*pid, 0) == 0 || errno != ESRCH) continue;
    absl::Status s = internal::RemoveSegment(shm_dir, absl::StrCat("/", entry->d_name));
    if (s.ok()) {
      ++removed;
    } else if (!absl::IsNotFound(s)) {  // NotFound: another cleaner was faster
      return s;
    }
  }
  return removed;
}

uint64_t Checksum(std::span<const uint8_t> bytes) {
  return XXH3_64bits(bytes.data(), bytes.size());
}

}  // namespace ringloader::shm
