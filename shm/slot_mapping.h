// SPDX-License-Identifier: Apache-2.0
#pragma once
// A trainer's own mapping of one ring slot's payload, apart from the ring's mapping, so that a
// batch can leave the ring without moving: CopyOut() puts private memory holding the same bytes
// at the same addresses, and every pointer, numpy array or torch tensor into it stays valid.
//
//   kReadOnly     MAP_SHARED, PROT_READ: writing through it faults (SIGSEGV), as the ring does.
//   kCopyOnWrite  MAP_PRIVATE, PROT_READ|PROT_WRITE: writes land in pages private to this
//                 process and never reach the ring; DropPrivatePages() discards them so the
//                 mapping shows the ring's bytes again (for the slot's next batch).
//
// Thread-safety: none; the owner serialises calls. Reading the bytes from other threads during
// CopyOut() is safe (the swap is one mremap); writing them meanwhile may lose the write.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace ringloader::shm {

enum class SlotAccess { kReadOnly, kCopyOnWrite };

class SlotMapping {
 public:
  // Maps [offset, offset + bytes) of the file `fd` (both page multiples). `what` names the
  // mapping in errors ("segment /x slot 3").
  static absl::StatusOr<SlotMapping> Map(int fd, uint64_t offset, uint64_t bytes,
                                         SlotAccess access, std::string what);
  SlotMapping() = default;  // maps nothing
  ~SlotMapping();
  SlotMapping(SlotMapping&& other) noexcept;
  SlotMapping& operator=(SlotMapping&& other) noexcept;
  SlotMapping(const SlotMapping&) = delete;
  SlotMapping& operator=(const SlotMapping&) = delete;

  uint8_t* data() const { return data_; }  // writable only for kCopyOnWrite
  uint64_t size() const { return size_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  SlotAccess access() const { return access_; }
  bool copied_out() const { return copied_out_; }

  // Replaces the mapping, at the same addresses and with the same protection, by anonymous
  // memory holding its first `used_bytes` (the rest reads as zeros). Afterwards nothing of the
  // ring is mapped here: the slot may be refilled while this memory lives on. On error nothing
  // changed.
  absl::Status CopyOut(uint64_t used_bytes);
  // kCopyOnWrite and not copied out: drops every page this process wrote (MADV_DONTNEED), so
  // the next read shows the file's current bytes. A no-op otherwise.
  absl::Status DropPrivatePages();

 private:
  void Unmap();
  void Prefault();
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  SlotAccess access_ = SlotAccess::kReadOnly;
  bool copied_out_ = false;
  std::string what_;
};

}  // namespace ringloader::shm
