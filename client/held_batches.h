// SPDX-License-Identifier: Apache-2.0
#pragma once
// How a Stream lends ring slots to the batches it delivers, and gets them back. Internal.
//
// Each slot is viewed through a mapping of its own (shm::SlotMapping), kept and reused batch after
// batch: a trainer that lets its batches go maps each slot once and copies nothing. A trainer that
// keeps batches (a reference for logging, tensors in a list) would leave the daemon no slot to
// fill, so before each request the Stream copies its oldest held batches out of the ring, in place
// (same addresses, same bytes: every pointer, array and tensor stays valid) and releases their
// slots, keeping at most MaxHeldInRing(slot_count) batches in the ring.
//
// Thread-safety: thread-safe (a Batch may be destroyed on any thread).

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "shm/ring.h"
#include "shm/slot_mapping.h"

namespace ringloader::client {

// A handle a released Batch gives back. Names the lease exactly (stream, incarnation, slot,
// ring_sequence), so releases of an old stream or incarnation are recognised and dropped.
struct PendingRelease {
  uint64_t stream_id = 0;
  uint64_t incarnation = 0;
  uint32_t slot = 0;
  uint64_t ring_sequence = 0;
  bool copied_out = false;  // the batch lives on in private memory
};

// Releases queued by Batch destructors and copy-outs (any thread), drained by Stream::Next().
class ReleaseQueue {
 public:
  void Push(const PendingRelease& release);
  std::vector<PendingRelease> Drain();
  // Batches copied out of the ring so far (by the Stream or by Batch::Detach).
  uint64_t copied_out() const { return copied_out_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> copied_out_{0};
  std::mutex mu_;  // std::, not absl::: TSan cannot see into Debian's uninstrumented abseil
  std::vector<PendingRelease> pending_ ABSL_GUARDED_BY(mu_);
};

// How many delivered batches may keep their slots: the rest of the ring stays free for the daemon
// to fill ahead (two slots; one in a ring of two).
uint32_t MaxHeldInRing(uint32_t slot_count);

// The slot mappings of one stream's ring: one idle mapping per slot at most.
class SlotViews {
 public:
  SlotViews(std::shared_ptr<const shm::ConsumerRing> ring, shm::SlotAccess access);
  const shm::ConsumerRing& ring() const { return *ring_; }
  // The slot's idle mapping, or a new one.
  absl::StatusOr<shm::SlotMapping> Take(uint32_t slot);
  // A mapping whose batch released its slot: written pages dropped, kept for the slot's next batch.
  void Give(uint32_t slot, shm::SlotMapping view);

 private:
  const std::shared_ptr<const shm::ConsumerRing> ring_;
  const shm::SlotAccess access_;
  std::mutex mu_;
  std::vector<std::optional<shm::SlotMapping>> idle_ ABSL_GUARDED_BY(mu_);
};

// One delivered batch's claim on its slot, shared by the Batch (which ends it) and its Stream
// (which may copy it out).
class HeldBatch {
 public:
  // `used_bytes`: the part of the slot the batch's tensors cover (what a copy-out copies).
  HeldBatch(shm::SlotMapping view, std::shared_ptr<SlotViews> views,
            std::shared_ptr<ReleaseQueue> releases, PendingRelease lease, uint64_t used_bytes);
  HeldBatch(const HeldBatch&) = delete;
  HeldBatch& operator=(const HeldBatch&) = delete;

  const PendingRelease& lease() const { return lease_; }
  bool in_ring() const;
  // The Batch is gone: its slot is released (and its mapping reused), or its copy unmapped.
  void BatchDestroyed();
  // Moves the batch out of the ring in place and queues its slot's release. False when it no
  // longer holds a slot (copied already, or destroyed).
  absl::StatusOr<bool> CopyOut();

 private:
  enum class State { kInRing, kCopiedOut, kGone };
  const std::shared_ptr<SlotViews> views_;
  const std::shared_ptr<ReleaseQueue> releases_;
  const PendingRelease lease_;
  const uint64_t used_bytes_;
  mutable std::mutex mu_;
  shm::SlotMapping view_ ABSL_GUARDED_BY(mu_);
  State state_ ABSL_GUARDED_BY(mu_) = State::kInRing;
};

}  // namespace ringloader::client
