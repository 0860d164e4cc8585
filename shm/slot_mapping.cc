// SPDX-License-Identifier: Apache-2.0
#include "shm/slot_mapping.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shm/segment_file.h"

namespace ringloader::shm {

absl::StatusOr<SlotMapping> SlotMapping::Map(int fd, uint64_t offset, uint64_t bytes,
                                             SlotAccess access, std::string what) {
  const bool cow = access == SlotAccess::kCopyOnWrite;
  // Read-only views are populated at once (they are reused batch after batch); a copy-on-write
  // view must not be: populating a writable private mapping write-faults, copying every page.
  void* p = ::mmap(nullptr, bytes, cow ? PROT_READ | PROT_WRITE : PROT_READ,
                   cow ? MAP_PRIVATE : MAP_SHARED | MAP_POPULATE, fd, static_cast<off_t>(offset));
  if (p == MAP_FAILED) {
    return internal::ErrnoStatus(errno, absl::StrCat(what, ": mmap ", bytes, " bytes at ", offset));
  }
  SlotMapping m;
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = bytes;
  m.access_ = access;
  m.what_ = std::move(what);
  if (cow) m.Prefault();
  return m;
}

SlotMapping::~SlotMapping() { Unmap(); }

SlotMapping::SlotMapping(SlotMapping&& other) noexcept { *this = std::move(other); }

SlotMapping& SlotMapping::operator=(SlotMapping&& other) noexcept {
  if (this != &other) {
    Unmap();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    access_ = other.access_;
    copied_out_ = other.copied_out_;
    what_ = std::move(other.what_);
  }
  return *this;
}

void SlotMapping::Prefault() {
  // Maps the ring's pages readable in one call (Linux >= 5.14), instead of a fault per page on
  // the batch's first read; writes still copy. Best effort: older kernels fault as they read.
#ifdef MADV_POPULATE_READ
  (void)::madvise(data_, size_, MADV_POPULATE_READ);
#endif
}

void SlotMapping::Unmap() {
  if (data_ != nullptr) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

absl::Status SlotMapping::CopyOut(uint64_t used_bytes) {
  if (data_ == nullptr || copied_out_) return absl::OkStatus();
  used_bytes = std::min(used_bytes, size_);
  // Populated in one call: much cheaper than a page fault per page during the copy.
  void* copy = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (copy == MAP_FAILED) {
    return internal::ErrnoStatus(errno, absl::StrCat(what_, ": copy out: mmap ", size_,
                                                     " private bytes"));
  }
  std::memcpy(copy, data_, used_bytes);
  const bool read_only = access_ == SlotAccess::kReadOnly;
  // mremap onto the old addresses replaces the old mapping in one step: a reader on another
  // thread sees either the ring's pages or the copy, never a hole.
  if ((read_only && ::mprotect(copy, size_, PROT_READ) != 0) ||
      ::mremap(copy, size_, size_, MREMAP_MAYMOVE | MREMAP_FIXED, data_) == MAP_FAILED) {
    const int err = errno;
    ::munmap(copy, size_);
    return internal::ErrnoStatus(err, absl::StrCat(what_, ": copy out: mremap"));
  }
  copied_out_ = true;
  return absl::OkStatus();
}

absl::Status SlotMapping::DropPrivatePages() {
  if (data_ == nullptr || copied_out_ || access_ != SlotAccess::kCopyOnWrite) {
    return absl::OkStatus();
  }
  if (::madvise(data_, size_, MADV_DONTNEED) != 0) {
    return internal::ErrnoStatus(errno, absl::StrCat(what_, ": madvise(MADV_DONTNEED)"));
  }
  Prefault();
  return absl::OkStatus();
}

}  // namespace ringloader::shm
