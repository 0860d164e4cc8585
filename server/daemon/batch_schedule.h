// SPDX-License-Identifier: Apache-2.0
#pragma once
// BatchSchedule: the hand-over between one stream's producer thread and its NextBatch calls.
//
// The producer fills batches ring_sequence = 0, 1, 2, ... each into whichever slot is FREE (round
// robin among them) and publishes them; NextBatch leases them in sequence order, and Release
// gives their slots back. A batch filled near its epoch's end may be kept unpublished, as the
// look-ahead, until the batch after it is filled: only then is it known whether it is the
// epoch's last (see stream.h).
//
// The producer is always in one ProducerState. Every transition is one method: it takes the lock,
// checks the state it expects (a wrong one is a bug: the process stops loudly), changes it and
// wakes whoever waits.
//
//   from                    transition                                 to
//   AwaitingSlot            AwaitSlot: a FREE slot                     Filling
//   Filling                 Publish                                    AwaitingSlot
//   Filling                 Abandon (the fill yielded nothing)         AwaitingSlot
//   Filling                 KeepAsLookAhead                            AwaitingSlotBehindLookAhead
//   AwaitingSlotBehind...   AwaitSlot: a FREE slot                     FillingBehindLookAhead
//   AwaitingSlotBehind...   AwaitSlot: the client waits for the        ReleasingLookAhead
//                           look-ahead and holds every other slot
//   FillingBehindLookAhead  PublishLookAhead (then the new batch)      Filling
//   ReleasingLookAhead      PublishLookAhead (unmarked)                AwaitingSlot
//   AwaitingSlot, Filling   End (end_epoch, or an error)               Ended
//   AwaitingSlot*, Ended    AwaitSlot after Stop()                     Stopped
//
// The one rule that keeps a short ring from deadlocking: a client waiting in Next() for the
// look-ahead while it holds every other slot (a Python loop keeps its previous batch) can only
// be answered by publishing the look-ahead unmarked; so Next() wakes the producer when it starts
// waiting, and AwaitSlot() answers kReleaseLookAhead. The epoch's end then shows only as the next
// epoch's first batch.
//
// Thread-safety: thread-safe. The producer transitions are called by one producer thread; Next
// by one caller at a time (a second concurrent call is FailedPrecondition); Release and Stop by
// anyone.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "proto/ringloader.pb.h"
#include "shm/ring.h"

namespace ringloader::server {

enum class ProducerState {
  kAwaitingSlot,                 // waits for a FREE slot
  kFilling,                      // fills the slot AwaitSlot gave (without the lock)
  kAwaitingSlotBehindLookAhead,  // keeps the look-ahead; waits for a slot for the batch after it
  kFillingBehindLookAhead,       // keeps the look-ahead; fills the batch after it
  kReleasingLookAhead,           // publishes the look-ahead unmarked (its client waits for it)
  kEnded,                        // fills nothing more; waits for Stop()
  kStopped,
};
std::string_view ProducerStateName(ProducerState state);

class BatchSchedule {
 public:
  using Clock = std::chrono::steady_clock;

  // REQUIRES: `ring` outlives the schedule; nothing else changes its slots' states. `start`:
  // where the stream begins (published_next() until a batch is published).
  BatchSchedule(uint64_t stream_id, shm::ProducerRing& ring, const v1::Position& start);
  BatchSchedule(const BatchSchedule&) = delete;
  BatchSchedule& operator=(const BatchSchedule&) = delete;

  // ---- the producer's transitions ----

  // What AwaitSlot decided.
  struct Step {
    enum Kind {
      kStop,              // Stop() was called: the producer returns
      kFill,              // fill `slot` (now FILLING) with the batch of `sequence`
      kReleaseLookAhead,  // publish the look-ahead now, unmarked (PublishLookAhead)
      kNotYet,            // `until` passed first (tests poll with until = now)
    };
    Kind kind = kNotYet;
    uint32_t slot = 0;
    uint64_t sequence = 0;
  };
  // Waits (until `until`) for one of the Steps. REQUIRES: kAwaitingSlot,
  // kAwaitingSlotBehindLookAhead or kEnded (which only ever gives kStop).
  Step AwaitSlot(Clock::time_point until = Clock::time_point::max());

  // Publishes the slot being filled with `handle` (slot, ring_sequence, positions set by the
  // caller; the checksum is set here). REQUIRES: kFilling. -> kAwaitingSlot.
  void Publish(v1::BatchHandle handle, uint64_t payload_bytes);
  // Keeps the slot being filled, unpublished, as the look-ahead. REQUIRES: kFilling.
  // -> kAwaitingSlotBehindLookAhead.
  void KeepAsLookAhead();
  // Publishes the look-ahead with `handle`. REQUIRES: kFillingBehindLookAhead (-> kFilling) or
  // kReleasingLookAhead (-> kAwaitingSlot).
  void PublishLookAhead(v1::BatchHandle handle, uint64_t payload_bytes);
  // The slot being filled goes back FREE with nothing published (the rest of the epoch yielded no
  // batch). REQUIRES: kFilling. -> kAwaitingSlot.
  void Abandon();
  // Nothing more will be filled: Next() answers end of stream (`status` OK) or `status`, once
  // every published batch was leased. REQUIRES: kAwaitingSlot or kFilling (whose slot goes
  // back FREE). -> kEnded.
  void End(absl::Status status);

  // ---- the client's side ----

  // Leases the next published batch into out->batch, or sets out->pending (nothing by
  // `deadline`) or out->end_of_stream. The End() status once every published batch went out.
  // ResourceExhausted when the client holds every slot. `cancelled` (may be empty) is polled
  // while waiting; once true the call ends (Cancelled).
  absl::Status Next(Clock::time_point deadline, v1::NextBatchResponse* out,
                    const std::function<bool()>& cancelled = {});
  // LEASED -> FREE for (slot, ring_sequence); FailedPrecondition for a double or stale release.
  absl::Status Release(uint32_t slot, uint64_t ring_sequence, bool copied_out);
  // Wakes every waiter; AwaitSlot answers kStop, Next() Unavailable. Idempotent.
  void Stop();
  // Stop() was called (the producer polls it while a batch waits for a stalled storage).
  bool stopped() const;

  // ---- observation (stats and tests) ----

  ProducerState state() const;
  // Waits up to `timeout` for the producer to be in `state`; true if it is. Tests use it to force
  // an interleaving (e.g. a Next() that begins while the producer already waits).
  bool AwaitState(ProducerState state, std::chrono::milliseconds timeout) const;
  // Waits up to `timeout` for the producer to be asleep inside AwaitSlot(); true if it is.
  bool AwaitProducerWaiting(std::chrono::milliseconds timeout) const;
  // Waits up to `timeout` for a Next() call to be waiting; true if one is.
  bool AwaitClientWaiting(std::chrono::milliseconds timeout) const;
  // The position after the last batch published (the stream's start before any).
  v1::Position published_next() const;
  uint64_t batches_served() const;
  uint64_t batches_copied_out() const;

 private:
  void Expect(std::initializer_list<ProducerState> allowed, const char* transition) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Enter(ProducerState state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<Step> Decide() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint32_t> FreeSlot() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllSlotsLeased() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // READY: stores the handle (with the ring's checksum) and queues the slot for Next().
  void MakeReady(v1::BatchHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t stream_id_;
  shm::ProducerRing& ring_;
  const uint32_t slots_;

  // std:: rather than absl:: synchronisation on purpose: Debian's prebuilt abseil is not built
  // with -fsanitize=thread, so TSan would not see absl::Mutex's happens-before edges.
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;  // any change of the fields below
  ProducerState state_ ABSL_GUARDED_BY(mu_) = ProducerState::kAwaitingSlot;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status end_status_ ABSL_GUARDED_BY(mu_);        // of End()
  bool client_waiting_ ABSL_GUARDED_BY(mu_) = false;    // a Next() call is in progress
  bool producer_waiting_ ABSL_GUARDED_BY(mu_) = false;  // asleep in AwaitSlot()
  uint64_t fill_sequence_ ABSL_GUARDED_BY(mu_) = 0;     // ring sequence of the next batch filled
  uint32_t filling_slot_ ABSL_GUARDED_BY(mu_) = 0;      // in kFilling*
  uint32_t look_ahead_slot_ ABSL_GUARDED_BY(mu_) = 0;   // in the *LookAhead states
  uint64_t look_ahead_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t lease_sequence_ ABSL_GUARDED_BY(mu_) = 0;  // ring sequence of the next batch to lease
  uint32_t next_free_hint_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<v1::BatchHandle> handles_ ABSL_GUARDED_BY(mu_);  // per slot, once published
  std::deque<uint32_t> ready_slots_ ABSL_GUARDED_BY(mu_);      // published, not leased, in order
  v1::Position published_next_ ABSL_GUARDED_BY(mu_);
  uint64_t batches_served_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t batches_copied_out_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringloader::server
