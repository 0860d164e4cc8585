// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/batch_schedule.h"

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

// How often a waiting Next() looks whether its call was cancelled.
constexpr std::chrono::milliseconds kCancelCheck{50};

// A ring transition or a producer transition that can only fail if this class (or its producer)
// broke an invariant: stop loudly; the supervisor restarts the daemon.
[[noreturn]] void Broken(uint64_t stream_id, const std::string& what) {
  SPDLOG_CRITICAL("stream {}: batch schedule invariant broken: {}", stream_id, what);
  std::abort();
}

void CheckRing(const absl::Status& status, uint64_t stream_id) {
  if (!status.ok()) Broken(stream_id, status.ToString());
}

}  // namespace

std::string_view ProducerStateName(ProducerState state) {
  switch (state) {
    case ProducerState::kAwaitingSlot:
      return "awaiting_slot";
    case ProducerState::kFilling:
      return "filling";
    case ProducerState::kAwaitingSlotBehindLookAhead:
      return "awaiting_slot_behind_look_ahead";
    case ProducerState::kFillingBehindLookAhead:
      return "filling_behind_look_ahead";
    case ProducerState::kReleasingLookAhead:
      return "releasing_look_ahead";
    case ProducerState::kEnded:
      return "ended";
    case ProducerState::kStopped:
      return "stopped";
  }
  return "unknown";
}

BatchSchedule::BatchSchedule(uint64_t stream_id, shm::ProducerRing& ring, const v1::Position& start)
    : stream_id_(stream_id), ring_(ring), slots_(ring.slot_count()) {
  std::lock_guard<std::mutex> lock(mu_);
  handles_.resize(slots_);
  published_next_ = start;
}

void BatchSchedule::Expect(std::initializer_list<ProducerState> allowed,
                           const char* transition) const {
  if (std::find(allowed.begin(), allowed.end(), state_) != allowed.end()) return;
  Broken(stream_id_,
         absl::StrCat(transition, " in state ", std::string(ProducerStateName(state_))));
}

void BatchSchedule::Enter(ProducerState state) {
  state_ = state;
  cv_.notify_all();
}

// ---- the producer's transitions ----

std::optional<BatchSchedule::Step> BatchSchedule::Decide() {
  if (stop_) {
    Enter(ProducerState::kStopped);
    return Step{Step::kStop};
  }
  if (state_ == ProducerState::kEnded) return std::nullopt;
  const bool behind = state_ == ProducerState::kAwaitingSlotBehindLookAhead;
  if (const std::optional<uint32_t> slot = FreeSlot()) {
    CheckRing(ring_.BeginFill(*slot), stream_id_);
    filling_slot_ = *slot;
    next_free_hint_ = (*slot + 1) % slots_;
    Enter(behind ? ProducerState::kFillingBehindLookAhead : ProducerState::kFilling);
    return Step{Step::kFill, *slot, fill_sequence_};
  }
  // No slot is FREE. If the client waits for the look-ahead itself, nothing else can free one.
  if (behind && client_waiting_ && lease_sequence_ == look_ahead_sequence_) {
    Enter(ProducerState::kReleasingLookAhead);
    return Step{Step::kReleaseLookAhead, look_ahead_slot_, look_ahead_sequence_};
  }
  return std::nullopt;
}

BatchSchedule::Step BatchSchedule::AwaitSlot(Clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  Expect({ProducerState::kAwaitingSlot, ProducerState::kAwaitingSlotBehindLookAhead,
          ProducerState::kEnded},
         "AwaitSlot");
  while (true) {
    if (std::optional<Step> step = Decide()) return *step;
    producer_waiting_ = true;
    cv_.notify_all();  // AwaitProducerWaiting()
    const bool timed_out = until == Clock::time_point::max()
                               ? (cv_.wait(lock), false)
                               : cv_.wait_until(lock, until) == std::cv_status::timeout;
    producer_waiting_ = false;
    if (timed_out) {
      if (std::optional<Step> step = Decide()) return *step;
      return Step{Step::kNotYet};
    }
  }
}

void BatchSchedule::MakeReady(v1::BatchHandle handle) {
  const uint32_t slot = handle.slot();
  handle.set_payload_checksum(ring_.Slot(slot).checksum);
  published_next_ = handle.next();
  handles_[slot] = std::move(handle);
  ready_slots_.push_back(slot);
}

void BatchSchedule::Publish(v1::BatchHandle handle, uint64_t payload_bytes) {
  // The checksum pass runs outside the lock; only the producer touches a FILLING slot.
  CheckRing(ring_.Publish(handle.slot(), handle.ring_sequence(), payload_bytes), stream_id_);
  std::lock_guard<std::mutex> lock(mu_);
  Expect({ProducerState::kFilling}, "Publish");
  if (handle.slot() != filling_slot_ || handle.ring_sequence() != fill_sequence_) {
    Broken(stream_id_,
           absl::StrCat("Publish of slot ", handle.slot(), " sequence ", handle.ring_sequence(),
                        ", filling slot ", filling_slot_, " sequence ", fill_sequence_));
  }
  ++fill_sequence_;
  MakeReady(std::move(handle));
  Enter(ProducerState::kAwaitingSlot);
}

void BatchSchedule::KeepAsLookAhead() {
  std::lock_guard<std::mutex> lock(mu_);
  Expect({ProducerState::kFilling}, "KeepAsLookAhead");
  look_ahead_slot_ = filling_slot_;
  look_ahead_sequence_ = fill_sequence_++;
  Enter(ProducerState::kAwaitingSlotBehindLookAhead);
}

void BatchSchedule::PublishLookAhead(v1::BatchHandle handle, uint64_t payload_bytes) {
  CheckRing(ring_.Publish(handle.slot(), handle.ring_sequence(), payload_bytes), stream_id_);
  std::lock_guard<std::mutex> lock(mu_);
  Expect({ProducerState::kFillingBehindLookAhead, ProducerState::kReleasingLookAhead},
         "PublishLookAhead");
  if (handle.slot() != look_ahead_slot_ || handle.ring_sequence() != look_ahead_sequence_) {
    Broken(stream_id_, absl::StrCat("PublishLookAhead of slot ", handle.slot(), " sequence ",
                                    handle.ring_sequence(), ", look-ahead slot ", look_ahead_slot_,
                                    " sequence ", look_ahead_sequence_));
  }
  MakeReady(std::move(handle));
  Enter(state_ == ProducerState::kFillingBehindLookAhead ? ProducerState::kFilling
                                                         : ProducerState::kAwaitingSlot);
}

void BatchSchedule::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  Expect({ProducerState::kFilling}, "Abandon");
  CheckRing(ring_.Abandon(filling_slot_), stream_id_);
  Enter(ProducerState::kAwaitingSlot);
}

void BatchSchedule::End(absl::Status status) {
  std::lock_guard<std::mutex> lock(mu_);
  Expect({ProducerState::kAwaitingSlot, ProducerState::kFilling}, "End");
  if (state_ == ProducerState::kFilling) CheckRing(ring_.Abandon(filling_slot_), stream_id_);
  end_status_ = std::move(status);
  Enter(ProducerState::kEnded);
}

// ---- the client's side ----

absl::Status BatchSchedule::Next(Clock::time_point deadline, v1::NextBatchResponse* out,
                                 const std::function<bool()>& cancelled) {
  std::unique_lock<std::mutex> lock(mu_);
  if (client_waiting_) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream ", stream_id_, ": another NextBatch call is already waiting"));
  }
  // The producer may be waiting for exactly this (a client waiting for the look-ahead): wake it.
  client_waiting_ = true;
  cv_.notify_all();
  struct Done {
    BatchSchedule& self;
    ~Done() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // runs before `lock` is released
      self.client_waiting_ = false;
      self.cv_.notify_all();
    }
  } done{*this};
  while (true) {
    if (stop_) return absl::UnavailableError(absl::StrCat("stream ", stream_id_, " is closing"));
    if (!ready_slots_.empty()) {
      const uint32_t slot = ready_slots_.front();
      if (absl::Status s = ring_.Lease(slot, lease_sequence_); !s.ok()) {
        return absl::InternalError(absl::StrCat("stream ", stream_id_, ": ", s.message()));
      }
      ready_slots_.pop_front();
      *out->mutable_batch() = handles_[slot];
      ++lease_sequence_;
      ++batches_served_;
      cv_.notify_all();  // a lease can be what the producer's look-ahead rule waits on
      return absl::OkStatus();
    }
    if (state_ == ProducerState::kEnded) {
      if (!end_status_.ok()) return end_status_;
      out->set_end_of_stream(true);
      return absl::OkStatus();
    }
    if (AllSlotsLeased()) {
      // Only a client that does not copy held batches out (an old one, or a hand-written one)
      // gets here: ours never holds every slot.
      return absl::ResourceExhaustedError(absl::StrCat(
          "stream ", stream_id_, ": the client holds all ", slots_,
          " ring slots; release batches before asking for more, or open the stream with more "
          "ring_slots"));
    }
    // In short steps, so a call its client cancelled (or whose deadline passed) frees its
    // handler at once instead of holding a server thread for the whole wait.
    const auto step = std::min(deadline, Clock::now() + kCancelCheck);
    if (cv_.wait_until(lock, step) == std::cv_status::timeout) {
      if (cancelled && cancelled()) {
        return absl::CancelledError(
            absl::StrCat("stream ", stream_id_, ": the call was cancelled"));
      }
      if (Clock::now() >= deadline) {
        out->set_pending(true);
        return absl::OkStatus();
      }
    }
  }
}

absl::Status BatchSchedule::Release(uint32_t slot, uint64_t ring_sequence, bool copied_out) {
  if (slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("stream ", stream_id_, ": slot ", slot,
                                                   " out of range (ring has ", slots_, ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status s = ring_.Release(slot, ring_sequence); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("stream ", stream_id_, ": release of slot ",
                                                      slot, " sequence ", ring_sequence, ": ",
                                                      s.message()));
  }
  if (copied_out) ++batches_copied_out_;
  cv_.notify_all();
  return absl::OkStatus();
}

void BatchSchedule::Stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_ = true;
  cv_.notify_all();
}

bool BatchSchedule::stopped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stop_;
}

// ---- observation ----

ProducerState BatchSchedule::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

bool BatchSchedule::AwaitState(ProducerState state, std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_ == state; });
}

bool BatchSchedule::AwaitProducerWaiting(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return producer_waiting_; });
}

bool BatchSchedule::AwaitClientWaiting(std::chrono::milliseconds timeout) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout,
                      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return client_waiting_; });
}

v1::Position BatchSchedule::published_next() const {
  std::lock_guard<std::mutex> lock(mu_);
  return published_next_;
}

uint64_t BatchSchedule::batches_served() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_served_;
}

uint64_t BatchSchedule::batches_copied_out() const {
  std::lock_guard<std::mutex> lock(mu_);
  return batches_copied_out_;
}

std::optional<uint32_t> BatchSchedule::FreeSlot() const {
  // Round robin from the slot after the last one filled, so every slot gets used.
  for (uint32_t i = 0; i < slots_; ++i) {
    const uint32_t slot = (next_free_hint_ + i) % slots_;
    if (ring_.Slot(slot).state == shm::SlotState::kFree) return slot;
  }
  return std::nullopt;
}

bool BatchSchedule::AllSlotsLeased() const {
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    if (ring_.Slot(slot).state != shm::SlotState::kLeased) return false;
  }
  return true;
}

}  // namespace ringloader::server
