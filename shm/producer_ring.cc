// SPDX-License-Identifier: Apache-2.0
// ProducerRing: the daemon's read-write side of a ring segment.
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <limits>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "shm/ring.h"
#include "shm/ring_layout.h"
#include "shm/base/clock.h"
#include "shm/segment_file.h"

namespace ringloader::shm {

struct ProducerRing::Impl {
  std::string name;
  std::string shm_dir;
  internal::MappedSegment segment;
  RingHeader* header = nullptr;
  SlotDescriptor* slots = nullptr;
  uint8_t* payload = nullptr;
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;
  uint64_t incarnation = 0;
  // Per slot: the smallest ring_sequence the next Publish may use (process-local, daemon only).
  // Keeps a slot's sequences strictly increasing, so a stale (slot, ring_sequence) handle can never
  // match a later batch in the same slot.
  std::unique_ptr<std::atomic<uint64_t>[]> min_next_sequence;
  std::atomic<bool> unlinked{false};

  std::atomic<uint32_t>& state(uint32_t slot) { return slots[slot].state; }

  absl::Status CheckIndex(uint32_t slot) const {
    if (slot < slot_count) return absl::OkStatus();
    return absl::OutOfRangeError(absl::StrCat("ring ", name, ": slot ", slot,
                                              " out of range (slot_count ", slot_count, ")"));
  }

  absl::Status WrongState(uint32_t slot, const char* op, SlotState need, uint32_t found,
                          const char* hint = "") const {
    return absl::FailedPreconditionError(absl::StrCat(
        "ring ", name, ": slot ", slot, ": ", op, " needs ", base::Sv(SlotStateName(need)),
        ", found ", base::Sv(SlotStateName(static_cast<SlotState>(found))), hint));
  }

  // from -> to with acq_rel, then wakes waiters. FailedPrecondition naming the state found.
  absl::Status Transition(uint32_t slot, const char* op, SlotState from, SlotState to,
                          const char* hint_if_free = "") {
    if (absl::Status s = CheckIndex(slot); !s.ok()) return s;
    uint32_t expected = static_cast<uint32_t>(from);
    if (!state(slot).compare_exchange_strong(expected, static_cast<uint32_t>(to),
                                             std::memory_order_acq_rel,
                                             std::memory_order_acquire)) {
      return WrongState(slot, op, from, expected,
                        expected == static_cast<uint32_t>(SlotState::kFree) ? hint_if_free : "");
    }
    return absl::OkStatus();
  }

  // Like Transition, but only if the slot holds `ring_sequence`.
  absl::Status SequencedTransition(uint32_t slot, uint64_t ring_sequence, const char* op,
                                   SlotState from, SlotState to, const char* hint_if_free) {
    if (absl::Status s = CheckIndex(slot); !s.ok()) return s;
    const uint32_t found = state(slot).load(std::memory_order_acquire);
    if (found != static_cast<uint32_t>(from)) {
      return WrongState(slot, op, from, found,
                        found == static_cast<uint32_t>(SlotState::kFree) ? hint_if_free : "");
    }
    const uint64_t held = slots[slot].ring_sequence.load(std::memory_order_relaxed);
    if (held != ring_sequence) {
      return absl::FailedPreconditionError(absl::StrCat(
          "ring ", name, ": slot ", slot, ": ", op, " of ring_sequence ", ring_sequence,
          " refused: the slot holds ring_sequence ", held, " (stale handle)"));
    }
    return Transition(slot, op, from, to);
  }
};

namespace {

// Free bytes an unprivileged process may allocate in `dir`.
absl::StatusOr<uint64_t> FreeBytes(const std::string& dir) {
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) != 0) {
    return internal::ErrnoStatus(errno, absl::StrCat("statvfs(", dir, ")"));
  }
  uint64_t free_bytes = 0;
  if (__builtin_mul_overflow(uint64_t{vfs.f_bavail}, uint64_t{vfs.f_frsize}, &free_bytes)) {
    return std::numeric_limits<uint64_t>::max();
  }
  return free_bytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProducerRing>> ProducerRing::Create(const RingOptions& options) {
  const std::string& name = options.name;
  if (absl::Status s = internal::ValidateSegmentName(name); !s.ok()) return s;
  if (options.slot_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring ", name, ": slot_count must be >= 1 (got 0)"));
  }
  if (options.slot_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name, ": slot_bytes must be > 0"));
  }
  const uint64_t page = internal::PageBytes();
  if (options.slot_bytes > std::numeric_limits<uint64_t>::max() - page) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring ", name, ": slot_bytes ", options.slot_bytes, " overflows"));
  }
  const uint64_t slot_bytes = (options.slot_bytes + page - 1) / page * page;
  const std::optional<internal::Geometry> geometry =
      internal::ComputeGeometry(options.slot_count, slot_bytes, page);
  if (!geometry.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", name, ": ", options.slot_count,
                                                   " slots x ", slot_bytes,
                                                   " bytes overflows a 63-bit file size"));
  }

  // Check the space before allocating anything, so the message is about sizes, not errno.
  absl::StatusOr<uint64_t> free_bytes = FreeBytes(options.shm_dir);
  if (!free_bytes.ok()) return free_bytes.status();
  if (geometry->segment_bytes > *free_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "ring ", name, " of ", base::FormatBytes(geometry->segment_bytes),
        " does not fit: ", options.shm_dir, " has ", base::FormatBytes(*free_bytes),
        " free; raise the size of ", options.shm_dir,
        " (e.g. docker --shm-size) or lower ring_slots / batch_size / image_size"));
  }

  absl::StatusOr<internal::MappedSegment> segment = internal::CreateSegment(
      options.shm_dir, name, options.mode, options.group, geometry->segment_bytes);
  if (!segment.ok()) return segment.status();

  auto impl = std::make_unique<Impl>();
  impl->name = name;
  impl->shm_dir = options.shm_dir;
  impl->segment = std::move(*segment);
  impl->slot_count = options.slot_count;
  impl->slot_bytes = slot_bytes;
  impl->incarnation = options.incarnation;
  impl->min_next_sequence = std::make_unique<std::atomic<uint64_t>[]>(options.slot_count);
  uint8_t* base = impl->segment.base();

  // The file is fresh from posix_fallocate, i.e. zero; value-initialising keeps it zero and
  // starts the objects' lifetimes. Nobody reads the header before magic is stored below.
  RingHeader* header = new (base) RingHeader();
  for (uint32_t i = 0; i < options.slot_count; ++i) {
    new (base + geometry->slots_offset + uint64_t{i} * sizeof(SlotDescriptor)) SlotDescriptor();
  }
  header->layout_version = kRingLayoutVersion;
  header->layout_hash = kRingLayoutHash;
  header->slot_count = options.slot_count;
  header->creator_pid = static_cast<int32_t>(::getpid());
  header->slot_bytes = slot_bytes;
  header->incarnation = options.incarnation;
  header->creation_time_ms = base::WallNowMs();
  header->slots_offset = geometry->slots_offset;
  header->payload_offset = geometry->payload_offset;
  // Publishes everything above to consumers that acquire-load a non-zero magic.
  header->magic.store(kRingMagic, std::memory_order_release);

  impl->header = header;
  impl->slots = reinterpret_cast<SlotDescriptor*>(base + geometry->slots_offset);
  impl->payload = base + geometry->payload_offset;

  std::unique_ptr<ProducerRing> ring(new ProducerRing());
  ring->impl_ = std::move(impl);
  return ring;
}

ProducerRing::~ProducerRing() {
  if (unlink_on_destroy_ && impl_ != nullptr) Unlink().IgnoreError();
}

const std::string& ProducerRing::name() const { return impl_->name; }
uint32_t ProducerRing::slot_count() const { return impl_->slot_count; }
uint64_t ProducerRing::slot_bytes() const { return impl_->slot_bytes; }
uint64_t ProducerRing::segment_bytes() const { return impl_->segment.mapped_bytes(); }
uint64_t ProducerRing::incarnation() const { return impl_->incarnation; }

std::span<uint8_t> ProducerRing::Payload(uint32_t slot) {
  return {impl_->payload + uint64_t{slot} * impl_->slot_bytes, impl_->slot_bytes};
}

absl::Status ProducerRing::BeginFill(uint32_t slot) {
  return impl_->Transition(slot, "BeginFill", SlotState::kFree, SlotState::kFilling);
}

absl::Status ProducerRing::Publish(uint32_t slot, uint64_t ring_sequence, uint64_t payload_bytes) {
  Impl& r = *impl_;
  if (absl::Status s = r.CheckIndex(slot); !s.ok()) return s;
  if (payload_bytes > r.slot_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("ring ", r.name, ": slot ", slot,
                                                   ": payload_bytes ", payload_bytes,
                                                   " exceeds slot_bytes ", r.slot_bytes));
  }
  if (ring_sequence == std::numeric_limits<uint64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("ring ", r.name, ": ring_sequence 2^64-1 is reserved"));
  }
  const uint32_t found = r.state(slot).load(std::memory_order_acquire);
  if (found != static_cast<uint32_t>(SlotState::kFilling)) {
    return r.WrongState(slot, "Publish", SlotState::kFilling, found);
  }
  const uint64_t min_next = r.min_next_sequence[slot].load(std::memory_order_relaxed);
  if (ring_sequence < min_next) {
    return absl::FailedPreconditionError(absl::StrCat(
        "ring ", r.name, ": slot ", slot, ": Publish of ring_sequence ", ring_sequence,
        " refused: not after ", min_next - 1, ", the slot's previous (sequences only grow)"));
  }
  SlotDescriptor& d = r.slots[slot];
  d.ring_sequence.store(ring_sequence, std::memory_order_relaxed);
  d.payload_bytes.store(payload_bytes, std::memory_order_relaxed);
  d.checksum.store(Checksum({r.payload + uint64_t{slot} * r.slot_bytes, payload_bytes}),
                   std::memory_order_relaxed);
  r.min_next_sequence[slot].store(ring_sequence + 1, std::memory_order_relaxed);
  // The publication: the release store of READY (see shm/ring_layout.h).
  return r.Transition(slot, "Publish", SlotState::kFilling, SlotState::kReady);
}

absl::Status ProducerRing::Abandon(uint32_t slot) {
  return impl_->Transition(slot, "Abandon", SlotState::kFilling, SlotState::kFree);
}

absl::Status ProducerRing::Lease(uint32_t slot, uint64_t ring_sequence) {
  return impl_->SequencedTransition(slot, ring_sequence, "Lease", SlotState::kReady,
                                    SlotState::kLeased, "");
}

absl::Status ProducerRing::Release(uint32_t slot, uint64_t ring_sequence) {
  return impl_->SequencedTransition(slot, ring_sequence, "Release", SlotState::kLeased,
                                    SlotState::kFree, " (double release?)");
}

SlotInfo ProducerRing::Slot(uint32_t slot) const {
  return internal::ReadSlotInfo(impl_->slots[slot]);
}

absl::Status ProducerRing::Unlink() {
  if (impl_->unlinked.exchange(true)) return absl::OkStatus();
  absl::Status s = internal::RemoveSegment(impl_->shm_dir, impl_->name);
  if (!s.ok()) impl_->unlinked.store(false);
  return s;
}

}  // namespace ringloader::shm
