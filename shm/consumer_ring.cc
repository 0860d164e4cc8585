// SPDX-License-Identifier: Apache-2.0
// ConsumerRing: a trainer's read-only view of a ring segment.
#include <atomic>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "shm/ring.h"
#include "shm/ring_layout.h"
#include "shm/segment_file.h"

namespace ringloader::shm {

struct ConsumerRing::Impl {
  std::string name;
  internal::MappedSegment segment;
  const RingHeader* header = nullptr;
  const SlotDescriptor* slots = nullptr;
  const uint8_t* payload = nullptr;
  uint64_t payload_offset = 0;
  // Copied from the header once validated; the creator never changes them.
  uint32_t slot_count = 0;
  uint64_t slot_bytes = 0;
  uint64_t incarnation = 0;
};

namespace {

std::string Hex(uint64_t v) { return absl::StrCat("0x", absl::Hex(v)); }

bool HoldsBatch(uint32_t state) {
  return state == static_cast<uint32_t>(SlotState::kReady) ||
         state == static_cast<uint32_t>(SlotState::kLeased);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ConsumerRing>> ConsumerRing::Open(
    std::string_view name, std::optional<uint64_t> expected_incarnation,
    const std::string& shm_dir) {
  absl::StatusOr<internal::MappedSegment> segment =
      internal::OpenSegmentReadOnly(shm_dir, std::string(name), sizeof(RingHeader));
  if (!segment.ok()) return segment.status();
  const std::string where = absl::StrCat("segment ", base::Sv(name), ": ");
  const uint64_t file_bytes = segment->file_bytes;
  if (file_bytes == 0) {
    return absl::UnavailableError(absl::StrCat(
        where, "not initialised yet (file size 0; its creator is still setting it up)"));
  }
  if (file_bytes < sizeof(RingHeader)) {
    return absl::DataLossError(absl::StrCat(where, "file size ", file_bytes,
                                            " bytes, expected at least ", sizeof(RingHeader),
                                            " (the header)"));
  }
  // The mapping is PROT_READ: these objects were constructed by the creating process.
  const auto* header = reinterpret_cast<const RingHeader*>(segment->base());
  const uint32_t magic = header->magic.load(std::memory_order_acquire);
  if (magic == 0) {
    return absl::UnavailableError(
        absl::StrCat(where, "not initialised yet (magic 0; its creator is still setting it up)"));
  }
  if (magic != kRingMagic) {
    return absl::DataLossError(absl::StrCat(where, "magic ", Hex(magic), ", expected ",
                                            Hex(kRingMagic), " (not a ringloader ring)"));
  }
  if (header->layout_version != kRingLayoutVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        where, "layout version ", header->layout_version, ", expected ", kRingLayoutVersion));
  }
  if (header->layout_hash != kRingLayoutHash) {
    return absl::FailedPreconditionError(
        absl::StrCat(where, "layout hash ", Hex(header->layout_hash), ", expected ",
                     Hex(kRingLayoutHash), " (daemon and client built from different layouts)"));
  }
  const uint64_t page = internal::PageBytes();
  if (header->slot_count == 0) {
    return absl::DataLossError(absl::StrCat(where, "slot count 0, expected >= 1"));
  }
  if (header->slot_bytes == 0 || header->slot_bytes % page != 0) {
    return absl::DataLossError(absl::StrCat(where, "slot bytes ", header->slot_bytes,
                                            ", expected a positive multiple of ", page));
  }
  const std::optional<internal::Geometry> g =
      internal::ComputeGeometry(header->slot_count, header->slot_bytes, page);
  if (!g.has_value()) {
    return absl::DataLossError(absl::StrCat(where, header->slot_count, " slots x ",
                                            header->slot_bytes, " bytes overflows"));
  }
  if (header->slots_offset != g->slots_offset || header->payload_offset != g->payload_offset) {
    return absl::DataLossError(absl::StrCat(where, "slots/payload offsets ", header->slots_offset,
                                            "/", header->payload_offset, ", expected ",
                                            g->slots_offset, "/", g->payload_offset));
  }
  if (file_bytes < g->segment_bytes) {
    return absl::DataLossError(
        absl::StrCat(where, "file size ", file_bytes, " bytes, expected at least ",
                     g->segment_bytes, " (", header->slot_count, " slots x ", header->slot_bytes,
                     " bytes + ", g->payload_offset, " bytes of header and descriptors)"));
  }
  if (expected_incarnation.has_value() && header->incarnation != *expected_incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(where, "incarnation ",
                                                      Hex(header->incarnation), ", expected ",
                                                      Hex(*expected_incarnation)));
  }

  auto impl = std::make_unique<Impl>();
  impl->name = std::string(name);
  impl->header = header;
  impl->slots = reinterpret_cast<const SlotDescriptor*>(segment->base() + g->slots_offset);
  impl->payload = segment->base() + g->payload_offset;
  impl->payload_offset = g->payload_offset;
  impl->slot_count = header->slot_count;
  impl->slot_bytes = header->slot_bytes;
  impl->incarnation = header->incarnation;
  impl->segment = std::move(*segment);
  std::unique_ptr<ConsumerRing> ring(new ConsumerRing());
  ring->impl_ = std::move(impl);
  return ring;
}

ConsumerRing::~ConsumerRing() = default;

const std::string& ConsumerRing::name() const { return impl_->name; }
uint32_t ConsumerRing::slot_count() const { return impl_->slot_count; }
uint64_t ConsumerRing::slot_bytes() const { return impl_->slot_bytes; }
uint64_t ConsumerRing::incarnation() const { return impl_->incarnation; }
std::span<const uint8_t> ConsumerRing::Payload(uint32_t slot) const {
  return {impl_->payload + uint64_t{slot} * impl_->slot_bytes, impl_->slot_bytes};
}

SlotInfo ConsumerRing::Slot(uint32_t slot) const {
  return internal::ReadSlotInfo(impl_->slots[slot]);
}

absl::StatusOr<SlotMapping> ConsumerRing::MapSlot(uint32_t slot, SlotAccess access) const {
  const Impl& r = *impl_;
  if (slot >= r.slot_count) {
    return absl::OutOfRangeError(absl::StrCat("segment ", r.name, ": slot ", slot,
                                              " out of range (slot_count ", r.slot_count, ")"));
  }
  return SlotMapping::Map(r.segment.fd.get(), r.payload_offset + uint64_t{slot} * r.slot_bytes,
                          r.slot_bytes, access, absl::StrCat("segment ", r.name, " slot ", slot));
}

absl::Status ConsumerRing::Verify(uint32_t slot, uint64_t ring_sequence) const {
  if (slot >= impl_->slot_count) return Verify(slot, ring_sequence, {});
  return Verify(slot, ring_sequence, Payload(slot));
}

absl::Status ConsumerRing::Verify(uint32_t slot, uint64_t ring_sequence,
                                  std::span<const uint8_t> payload) const {
  const Impl& r = *impl_;
  if (slot >= r.slot_count) {
    return absl::OutOfRangeError(absl::StrCat("segment ", r.name, ": slot ", slot,
                                              " out of range (slot_count ", r.slot_count, ")"));
  }
  const std::string where = absl::StrCat("segment ", r.name, ": slot ", slot, ": ");
  const SlotDescriptor& d = r.slots[slot];
  const uint32_t state = d.state.load(std::memory_order_acquire);
  const uint64_t held = d.ring_sequence.load(std::memory_order_relaxed);
  if (!HoldsBatch(state) || held != ring_sequence) {
    return absl::DataLossError(absl::StrCat(
        where, "holds ", base::Sv(SlotStateName(static_cast<SlotState>(state))),
        " ring_sequence ", held, ", expected READY or LEASED ring_sequence ", ring_sequence));
  }
  const uint64_t bytes = d.payload_bytes.load(std::memory_order_relaxed);
  const uint64_t expected = d.checksum.load(std::memory_order_relaxed);
  if (bytes > r.slot_bytes) {
    return absl::DataLossError(
        absl::StrCat(where, "payload bytes ", bytes, " exceed slot bytes ", r.slot_bytes));
  }
  if (bytes > payload.size()) {
    return absl::DataLossError(absl::StrCat(where, "payload bytes ", bytes, " exceed the ",
                                            payload.size(), " bytes mapped"));
  }
  const uint64_t actual = Checksum(payload.first(bytes));
  // Seqlock-style re-check: if the daemon reclaimed and refilled the slot while we hashed, the
  // checksum would be meaningless. Sequences only grow per slot, so an equal one means no reuse.
#if defined(__SANITIZE_THREAD__)
  // GCC's TSan rejects atomic_thread_fence; acquire loads are the closest it can check (within
  // one process the payload is never rewritten while a test verifies it).
  const uint32_t state_after = d.state.load(std::memory_order_acquire);
  const uint64_t held_after = d.ring_sequence.load(std::memory_order_acquire);
#else
  std::atomic_thread_fence(std::memory_order_acquire);  // keeps the payload reads above
  const uint32_t state_after = d.state.load(std::memory_order_relaxed);
  const uint64_t held_after = d.ring_sequence.load(std::memory_order_relaxed);
#endif
  if (!HoldsBatch(state_after) || held_after != ring_sequence) {
    return absl::DataLossError(absl::StrCat(where, "reused while verifying ring_sequence ",
                                            ring_sequence, " (now ring_sequence ", held_after,
                                            ")"));
  }
  if (actual != expected) {
    return absl::DataLossError(absl::StrCat(where, "checksum ", Hex(actual), ", expected ",
                                            Hex(expected), " for ring_sequence ", ring_sequence,
                                            " (", bytes, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace ringloader::shm
