// SPDX-License-Identifier: Apache-2.0
#pragma once
// The shared-memory batch ring: one POSIX shm segment per stream, created by the daemon
// (ProducerRing, read-write) and mapped read-only by trainers (ConsumerRing).
//
// Segment: [RingHeader][SlotDescriptor x slot_count][payload x slot_count], payloads page-aligned.
// (Layout and its version live in shm/ring_layout.h.)
//
// Slot life: FREE -> FILLING -> READY -> LEASED -> FREE, every transition made by the producer
// process. Consumers never write: a consumer asks the daemon (over gRPC) to release a slot.
// Publication rule: a slot's payload and descriptor fields are published by the release store of
// its state to READY; a reader that acquire-loads READY (and the same ring_sequence) sees them.
//
// No mutex, condition variable or allocator lives in the segment: no process can ever block on a
// lock that a dead process holds. Trainers never wait on the ring itself: they wait in the
// daemon's NextBatch call, which hands them a published slot.
//
// Thread-safety: ProducerRing state transitions are lock-free atomics and may be called from any
// thread of the producer process, but each slot has one filler at a time (the daemon's design),
// and Lease/Release of one slot are serialised by the caller (the daemon's lease table): Lease
// checks ring_sequence and then swaps the state, so two racing Leases of the same slot could
// otherwise pass the check for different batches. ConsumerRing is read-only and thread-safe.
//
// Slot indexes: the status-returning methods answer OutOfRange for slot >= slot_count(); the
// others (Payload, Slot) REQUIRE a valid index.
// The producer maps with MAP_POPULATE, so no page faults happen on the first write of a slot;
// trainers read payloads through per-slot mappings (MapSlot), populated once and reused.

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "shm/slot_mapping.h"

namespace ringloader::shm {

enum class SlotState : uint32_t { kFree = 0, kFilling = 1, kReady = 2, kLeased = 3 };
std::string_view SlotStateName(SlotState state);

struct RingOptions {
  // POSIX shm name with leading slash, e.g. "/ringloader.<pid>.<incarnation>.<stream>".
  std::string name;
  uint32_t slot_count = 4;     // >= 1
  uint64_t slot_bytes = 0;     // payload capacity of each slot; rounded up to the page size
  uint64_t incarnation = 0;    // daemon incarnation id, stored in the header
  mode_t mode = 0600;          // segment file mode
  std::optional<gid_t> group;  // chown the segment to this group (mode should then be 0640)
  // Directory backing POSIX shm, used for the free-space check and fallocate. Injectable so tests
  // can point at a small tmpfs; the segment is then created as a file in this directory.
  std::string shm_dir = "/dev/shm";
};

// A snapshot of one slot descriptor (acquire-loaded).
struct SlotInfo {
  SlotState state;
  uint64_t ring_sequence;  // the sequence of the batch last published in this slot
  uint64_t payload_bytes;  // bytes of payload in use
  uint64_t checksum;       // XXH3-64 of payload[0, payload_bytes)
};

// Daemon side. Owns the mapping; the segment name is unlinked by Unlink() or by the destructor
// when `unlink_on_destroy` is true (clean shutdown).
class ProducerRing {
 public:
  // Creates (O_EXCL) the segment, reserves its memory with posix_fallocate after checking free
  // space in options.shm_dir (ResourceExhausted with the sizes on shortfall), writes the header
  // (magic last, with release). Errors name the segment and the failing call.
  static absl::StatusOr<std::unique_ptr<ProducerRing>> Create(const RingOptions& options);
  ~ProducerRing();
  ProducerRing(const ProducerRing&) = delete;
  ProducerRing& operator=(const ProducerRing&) = delete;

  const std::string& name() const;
  uint32_t slot_count() const;
  uint64_t slot_bytes() const;     // payload capacity per slot
  uint64_t segment_bytes() const;  // whole mapping
  uint64_t incarnation() const;

  // Payload of `slot` for writing: the whole capacity, slot_bytes() bytes, page-aligned.
  // REQUIRES: slot < slot_count() and the slot is FILLING.
  std::span<uint8_t> Payload(uint32_t slot);

  // FREE -> FILLING. FailedPrecondition (naming the state found) otherwise.
  absl::Status BeginFill(uint32_t slot);
  // FILLING -> READY: stores ring_sequence, payload_bytes, the payload checksum, then the state
  // with release. InvalidArgument if payload_bytes > slot_bytes() or
  // ring_sequence is UINT64_MAX (reserved). FailedPrecondition if ring_sequence is not greater
  // than the one this slot held before: per slot, sequences only grow, so a stale handle
  // (slot, ring_sequence) can never match a later batch. The daemon should therefore take the
  // next ring_sequence after BeginFill, not before.
  absl::Status Publish(uint32_t slot, uint64_t ring_sequence, uint64_t payload_bytes);
  // FILLING -> FREE (a fill that was abandoned).
  absl::Status Abandon(uint32_t slot);
  // READY -> LEASED, only if the slot holds `ring_sequence`.
  absl::Status Lease(uint32_t slot, uint64_t ring_sequence);
  // LEASED -> FREE, only if the slot holds `ring_sequence` (a double release or a stale handle is
  // FailedPrecondition and changes nothing).
  absl::Status Release(uint32_t slot, uint64_t ring_sequence);

  SlotInfo Slot(uint32_t slot) const;

  // Removes the name; existing mappings (the daemon's and consumers') stay valid. Idempotent:
  // OK if this ring already removed it.
  absl::Status Unlink();
  void set_unlink_on_destroy(bool unlink) { unlink_on_destroy_ = unlink; }

 private:
  ProducerRing() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool unlink_on_destroy_ = true;
};

// Trainer side: maps an existing segment read-only (PROT_READ), so a buggy trainer cannot corrupt
// batches. The mapping stays valid after the daemon dies or unlinks the name.
class ConsumerRing {
 public:
  // Opens `name` and validates the header: magic, layout version, layout hash, and that the file
  // is large enough for slot_count x slot_bytes. Each failure says which check failed and the
  // values found vs expected. If `expected_incarnation` is set it must match too.
  // Codes: NotFound (no such segment); Unavailable (its creator has not finished initialising it:
  // empty file or magic 0; retry shortly); DataLoss (not a ring, or corrupt/truncated);
  // FailedPrecondition (layout version/hash or incarnation differ: a different build or daemon).
  static absl::StatusOr<std::unique_ptr<ConsumerRing>> Open(
      std::string_view name, std::optional<uint64_t> expected_incarnation = std::nullopt,
      const std::string& shm_dir = "/dev/shm");
  ~ConsumerRing();
  ConsumerRing(const ConsumerRing&) = delete;
  ConsumerRing& operator=(const ConsumerRing&) = delete;

  const std::string& name() const;
  uint32_t slot_count() const;
  uint64_t slot_bytes() const;
  uint64_t incarnation() const;

  // The whole capacity of `slot` (slot_bytes() bytes); the batch is the first
  // Slot(slot).payload_bytes of it. Writing through it faults (SIGSEGV). Pages are mapped as
  // they are first read.
  // REQUIRES: slot < slot_count().
  std::span<const uint8_t> Payload(uint32_t slot) const;
  // A mapping of `slot`'s payload of its own (slot_bytes() bytes), independent of this object's
  // lifetime: what a trainer's batch views, so that it can be copied out of the ring in place.
  // OutOfRange for a bad slot; the mmap error otherwise.
  absl::StatusOr<SlotMapping> MapSlot(uint32_t slot, SlotAccess access) const;
  SlotInfo Slot(uint32_t slot) const;
  // DataLoss if the slot does not hold `ring_sequence` or its payload's checksum does not match.
  absl::Status Verify(uint32_t slot, uint64_t ring_sequence) const;
  // The same, hashing `payload` (a MapSlot() view of `slot`) instead of this object's mapping.
  absl::Status Verify(uint32_t slot, uint64_t ring_sequence,
                      std::span<const uint8_t> payload) const;

 private:
  ConsumerRing() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Segment names: "/ringloader.<pid>.<incarnation hex>.<stream id>". Every name of one daemon
// incarnation starts with "ringloader.<pid>.<incarnation hex>".
std::string SegmentName(pid_t daemon_pid, uint64_t incarnation, uint64_t stream_id);

// The liveness of a daemon incarnation, as seen by every process sharing its shm directory: a
// file "<shm_dir>/ringloader.<pid>.<incarnation hex>.lock" on which the daemon holds an exclusive
// flock for its whole life. The kernel releases the lock when the process dies, however it dies,
// so liveness never depends on pids, which lie across pid namespaces (containers) and repeat
// across restarts (a container's daemon is pid 1 every time). Removed on destruction.
class IncarnationLock {
 public:
  // Creates the file (O_EXCL) and locks it. Errors name the file and the failing call.
  static absl::StatusOr<std::unique_ptr<IncarnationLock>> Acquire(const std::string& shm_dir,
                                                                 pid_t daemon_pid,
                                                                 uint64_t incarnation);
  ~IncarnationLock();
  IncarnationLock(const IncarnationLock&) = delete;
  IncarnationLock& operator=(const IncarnationLock&) = delete;
  const std::string& path() const;

 private:
  IncarnationLock() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Removes the segments in `shm_dir` of every incarnation whose lock nobody holds (its daemon is
// dead), and their lock files. Returns how many segments it removed. Never touches an incarnation
// whose lock is held (in any pid namespace), nor names it cannot parse. Segments without a lock
// file (daemons older than the lock) count as dead only when their pid is gone (kill(pid, 0)
// fails with ESRCH) and is not ours.
absl::StatusOr<int> RemoveStaleSegments(const std::string& shm_dir = "/dev/shm");

// XXH3-64 of `bytes`: the checksum stored in slot descriptors.
uint64_t Checksum(std::span<const uint8_t> bytes);

}  // namespace ringloader::shm
