// SPDX-License-Identifier: Apache-2.0
#include "shm/segment_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/interprocess/exceptions.hpp>
#include <boost/interprocess/file_mapping.hpp>
#include <boost/interprocess/permissions.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shm/ring_layout.h"

namespace ringloader::shm::internal {
namespace {

namespace bip = boost::interprocess;

constexpr size_t kMaxNameChars = 250;  // NAME_MAX (255) minus room for the leading slash

bool IsDevShm(const std::string& shm_dir) {
  std::string_view dir = shm_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return dir == "/dev/shm";
}

absl::Status BoostStatus(const bip::interprocess_exception& e, absl::string_view what) {
  const int err = e.get_native_error();
  if (err > 0) return ErrnoStatus(err, what);
  return absl::InternalError(absl::StrCat(what, ": ", e.what()));
}

// Everything after the file exists: permissions, owner, reservation, mapping.
// `obj` is a bip::shared_memory_object or bip::file_mapping opened read-write.
template <typename Object>
absl::StatusOr<MappedSegment> PrepareAndMap(const Object& obj, const std::string& name, mode_t mode,
                                            std::optional<gid_t> group, uint64_t bytes) {
  const int fd = obj.get_mapping_handle().handle;
  if (::fchmod(fd, mode) != 0) {
    return ErrnoStatus(errno, absl::StrCat("segment ", name, ": fchmod(0", absl::Hex(mode), ")"));
  }
  if (group.has_value() && ::fchown(fd, static_cast<uid_t>(-1), *group) != 0) {
    return ErrnoStatus(errno, absl::StrCat("segment ", name, ": fchown(group ", *group, ")"));
  }
  // Reserve every page now: a full /dev/shm is an error here, never a SIGBUS at the first write.
  const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0) {
    absl::Status s = ErrnoStatus(
        err, absl::StrCat("segment ", name, ": posix_fallocate(", base::FormatBytes(bytes), ")"));
    if (err == ENOSPC) {
      return absl::ResourceExhaustedError(
          absl::StrCat(s.message(),
                       "; raise the size of the shm directory (e.g. docker "
                       "--shm-size) or lower ring_slots / batch_size / image_size"));
    }
    return s;
  }
  MappedSegment seg;
  try {
    // MAP_POPULATE: map every (already allocated) page now, so the first fill of a slot does not
    // pay a minor fault per 4 KiB page (measured ~20x slower than a warm write by
    // bench/ring_bench).
    seg.region = bip::mapped_region(obj, bip::read_write, 0, static_cast<size_t>(bytes), nullptr,
                                    MAP_POPULATE);
  } catch (const bip::interprocess_exception& e) {
    return BoostStatus(e, absl::StrCat("segment ", name, ": mmap read-write"));
  }
  seg.file_bytes = bytes;
  return seg;
}

template <typename Object>
absl::StatusOr<MappedSegment> MapReadOnly(const Object& obj, const std::string& name,
                                          uint64_t min_bytes) {
  struct stat st {};
  if (::fstat(obj.get_mapping_handle().handle, &st) != 0) {
    return ErrnoStatus(errno, absl::StrCat("segment ", name, ": fstat"));
  }
  MappedSegment seg;
  seg.file_bytes = static_cast<uint64_t>(st.st_size);
  if (seg.file_bytes < min_bytes) return seg;
  const int fd = ::fcntl(obj.get_mapping_handle().handle, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("segment ", name, ": dup descriptor"));
  seg.fd = OwnedFd(fd);
  try {
    // Not populated: trainers read payloads through per-slot mappings (shm/slot_mapping.h), so
    // populating this one would map every payload page twice.
    seg.region = bip::mapped_region(obj, bip::read_only, 0, static_cast<size_t>(seg.file_bytes));
  } catch (const bip::interprocess_exception& e) {
    return BoostStatus(e, absl::StrCat("segment ", name, ": mmap read-only"));
  }
  return seg;
}

}  // namespace

OwnedFd::~OwnedFd() {
  if (fd_ >= 0) ::close(fd_);
}

OwnedFd& OwnedFd::operator=(OwnedFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

std::optional<Geometry> ComputeGeometry(uint32_t slot_count, uint64_t slot_bytes,
                                        uint64_t page_bytes) {
  constexpr uint64_t kMaxBytes = static_cast<uint64_t>(INT64_MAX);  // off_t
  Geometry g;
  g.slots_offset = sizeof(RingHeader);
  const uint64_t descriptors_end = g.slots_offset + uint64_t{slot_count} * sizeof(SlotDescriptor);
  g.payload_offset = (descriptors_end + page_bytes - 1) / page_bytes * page_bytes;
  uint64_t payload_total = 0;
  if (__builtin_mul_overflow(uint64_t{slot_count}, slot_bytes, &payload_total) ||
      __builtin_add_overflow(g.payload_offset, payload_total, &g.segment_bytes) ||
      g.segment_bytes > kMaxBytes) {
    return std::nullopt;
  }
  return g;
}

uint64_t PageBytes() {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  return page;
}

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EEXIST:
      return absl::AlreadyExistsError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOSPC:
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    case EINVAL:
    case ENAMETOOLONG:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

SlotInfo ReadSlotInfo(const SlotDescriptor& d) {
  SlotInfo info;
  info.state = static_cast<SlotState>(d.state.load(std::memory_order_acquire));
  info.ring_sequence = d.ring_sequence.load(std::memory_order_relaxed);
  info.payload_bytes = d.payload_bytes.load(std::memory_order_relaxed);
  info.checksum = d.checksum.load(std::memory_order_relaxed);
  return info;
}

absl::Status ValidateSegmentName(const std::string& name) {
  if (name.size() < 2 || name.front() != '/' || name.size() > kMaxNameChars + 1 ||
      name.find('/', 1) != std::string::npos || name == "/." || name == "/..") {
    return absl::InvalidArgumentError(absl::StrCat("segment name \"", name,
                                                   "\": must be \"/\" followed by 1-",
                                                   kMaxNameChars, " characters without \"/\""));
  }
  return absl::OkStatus();
}

std::string SegmentPath(const std::string& shm_dir, const std::string& name) {
  absl::string_view dir = shm_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  return absl::StrCat(dir, name);
}

absl::StatusOr<MappedSegment> CreateSegment(const std::string& shm_dir, const std::string& name,
                                            mode_t mode, std::optional<gid_t> group,
                                            uint64_t bytes) {
  if (absl::Status s = ValidateSegmentName(name); !s.ok()) return s;
  absl::StatusOr<MappedSegment> seg;
  if (IsDevShm(shm_dir)) {
    bip::shared_memory_object obj;
    try {
      obj = bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write,
                                      bip::permissions(mode));
    } catch (const bip::interprocess_exception& e) {
      return BoostStatus(e, absl::StrCat("segment ", name, ": create in ", shm_dir));
    }
    seg = PrepareAndMap(obj, name, mode, group, bytes);
  } else {
    const std::string path = SegmentPath(shm_dir, name);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, mode);
    if (fd < 0) return ErrnoStatus(errno, absl::StrCat("segment ", name, ": create ", path));
    ::close(fd);
    bip::file_mapping obj;
    try {
      obj = bip::file_mapping(path.c_str(), bip::read_write);
      seg = PrepareAndMap(obj, name, mode, group, bytes);
    } catch (const bip::interprocess_exception& e) {
      seg = BoostStatus(e, absl::StrCat("segment ", name, ": open ", path));
    }
  }
  if (!seg.ok()) RemoveSegment(shm_dir, name).IgnoreError();
  return seg;
}

absl::StatusOr<MappedSegment> OpenSegmentReadOnly(const std::string& shm_dir,
                                                  const std::string& name, uint64_t min_bytes) {
  if (absl::Status s = ValidateSegmentName(name); !s.ok()) return s;
  try {
    if (IsDevShm(shm_dir)) {
      bip::shared_memory_object obj(bip::open_only, name.c_str(), bip::read_only);
      return MapReadOnly(obj, name, min_bytes);
    }
    const std::string path = SegmentPath(shm_dir, name);
    bip::file_mapping obj(path.c_str(), bip::read_only);
    return MapReadOnly(obj, name, min_bytes);
  } catch (const bip::interprocess_exception& e) {
    return BoostStatus(e, absl::StrCat("segment ", name, ": open read-only in ", shm_dir));
  }
}

absl::Status RemoveSegment(const std::string& shm_dir, const std::string& name) {
  if (absl::Status s = ValidateSegmentName(name); !s.ok()) return s;
  // Boost's remove() only returns a bool; the calls themselves give errno for a useful message.
  const std::string path = SegmentPath(shm_dir, name);
  const int rc = IsDevShm(shm_dir) ? ::shm_unlink(name.c_str()) : ::unlink(path.c_str());
  if (rc != 0) {
    return ErrnoStatus(errno, absl::StrCat("segment ", name, ": unlink ", path));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::shm::internal
