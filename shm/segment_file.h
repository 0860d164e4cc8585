// SPDX-License-Identifier: Apache-2.0
#pragma once
// Internal to shm/: the file behind a ring segment and its mapping. Not part of the contract.
//
// For shm_dir "/dev/shm" (the default) the segment is a POSIX shm object made with
// Boost.Interprocess (shared_memory_object + mapped_region). For any other directory (tests inject
// a small tmpfs or a temp dir) it is a regular file "<shm_dir><name>" mapped through
// boost::interprocess::file_mapping + mapped_region. Everything else is the same code.
// The producer's file descriptor is closed once the mapping exists; a consumer keeps its
// (read-only) descriptor to map single slots later (shm/slot_mapping.h).

#include <sys/types.h>

#include <boost/interprocess/mapped_region.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "shm/base/text.h"
#include "shm/ring.h"
#include "shm/ring_layout.h"

namespace ringloader::shm::internal {

// A file descriptor closed on destruction. Movable.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd();
  OwnedFd(OwnedFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  OwnedFd& operator=(OwnedFd&& other) noexcept;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// A mapped segment; unmapped on destruction. Movable.
struct MappedSegment {
  boost::interprocess::mapped_region region;
  OwnedFd fd;  // read-only opens only: a descriptor of the file, to map slots with
  uint64_t file_bytes = 0;  // size of the file when it was mapped (>= mapped bytes)

  uint8_t* base() const { return static_cast<uint8_t*>(region.get_address()); }
  uint64_t mapped_bytes() const { return region.get_size(); }
};

// InvalidArgument unless `name` is "/<1..250 chars without '/'>".
absl::Status ValidateSegmentName(const std::string& name);

// "<shm_dir><name>", e.g. "/dev/shm/ringloader.1.2.3".
std::string SegmentPath(const std::string& shm_dir, const std::string& name);

// Creates (O_EXCL) the segment file with `mode` (fchmod'ed, so the umask does not apply),
// optionally chowns it to `group`, reserves `bytes` with posix_fallocate and maps it read-write.
// On any failure after creation the name is removed again. Does NOT check free space.
absl::StatusOr<MappedSegment> CreateSegment(const std::string& shm_dir, const std::string& name,
                                            mode_t mode, std::optional<gid_t> group,
                                            uint64_t bytes);

// Opens an existing segment, maps the whole file PROT_READ (not populated: pages are mapped as
// they are read) and keeps a read-only descriptor (close-on-exec). A file shorter than
// `min_bytes` is not mapped: `file_bytes` is set and the region is empty.
absl::StatusOr<MappedSegment> OpenSegmentReadOnly(const std::string& shm_dir,
                                                  const std::string& name, uint64_t min_bytes);

// Removes the name. NotFound if it does not exist.
absl::Status RemoveSegment(const std::string& shm_dir, const std::string& name);

// Where things are in a segment of `slot_count` slots of `slot_bytes` (a page multiple) each.
struct Geometry {
  uint64_t slots_offset = 0;
  uint64_t payload_offset = 0;  // page-aligned
  uint64_t segment_bytes = 0;   // payload_offset + slot_count * slot_bytes
};
// nullopt if any size overflows 63 bits (off_t).
std::optional<Geometry> ComputeGeometry(uint32_t slot_count, uint64_t slot_bytes,
                                        uint64_t page_bytes);
// The system page size (sysconf), cached.
uint64_t PageBytes();

// A status for a failed call: code from errno, message "<what>: <strerror>".
absl::Status ErrnoStatus(int err, absl::string_view what);

// An acquire-load snapshot of one slot descriptor (shared by producer and consumer views).
SlotInfo ReadSlotInfo(const SlotDescriptor& descriptor);

}  // namespace ringloader::shm::internal
