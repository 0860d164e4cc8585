// SPDX-License-Identifier: Apache-2.0
#pragma once
// Accounting of the daemon's memory against `memory_limit`. Two kinds of use share one limit:
//   - fixed: rings and dataset indexes, reserved before they are allocated and held while they
//     live. One that can never fit is refused at once (ResourceExhausted, with the numbers).
//   - decoding: each sample decode draws what it needs (its file bytes plus the work space its
//     header calls for: see image::DecodePlan) just before it reads the file, and gives it back
//     when done. When the budget is short the decode waits, so big images serialise instead of
//     overrunning the limit; a decode that could not fit even alone fails that sample.
// Waiters are served first come, first served, fixed and decode alike, so neither starves: a
// ring waits for decodes in flight to give their bytes back, and later decodes wait behind it.
// So fixed + decoding <= limit at every moment.
//
// Thread-safety: thread-safe.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <functional>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

class MemoryBudget;

// Gives its bytes back when destroyed. Move-only.
class Reservation {
 public:
  Reservation() = default;
  Reservation(MemoryBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept;
  ~Reservation();
  uint64_t bytes() const { return bytes_; }

 private:
  MemoryBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

class MemoryBudget final : public pipeline::DecodeMemory {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Fixed use. ResourceExhausted "<what> needs X; memory_limit Y has Z free (W reserved)" at once
  // when fixed use alone leaves no room; otherwise waits up to `wait` for decodes in flight.
  absl::StatusOr<Reservation> Reserve(uint64_t bytes, const std::string& what,
                                      std::chrono::milliseconds wait = std::chrono::seconds(10));

  // pipeline::DecodeMemory: a decode's draw, waiting while the budget is short.
  absl::Status Acquire(uint64_t bytes) override;
  bool TryAcquire(uint64_t bytes) override;
  void Release(uint64_t bytes) override;
  // Read-ahead bytes: only while no decode waits, and at most half the limit in all (the rest
  // of a decode's room comes from evicting them).
  uint64_t TryAcquireReadAhead(uint64_t bytes) override;
  uint64_t AcquireReadAhead(uint64_t bytes) override;
  void ArmEviction(uint64_t id, std::function<void()> evict) override;
  bool Pin(uint64_t id) override;
  void ReleaseReadAhead(uint64_t id) override;
  uint64_t read_ahead() const;       // read-ahead bytes held, now
  uint64_t peak_read_ahead() const;  // the most read_ahead() has been
  uint64_t waiting() const;     // Acquire and Reserve calls waiting for room, now
  // Memory held only to be reused (SpareBuffers: fixed reservations nobody needs now) is given
  // back by `give_back` whenever a reservation or a decode would not fit otherwise, before it
  // is refused or waits. `give_back` runs on the caller's thread without this budget's lock and
  // must not wait for one of its own held around a call into this budget. Returns an id for
  // RemoveSpareHolder, which REQUIRES: called before `give_back` can no longer run.
  uint64_t AddSpareHolder(std::function<void()> give_back);
  void RemoveSpareHolder(uint64_t id);

  uint64_t limit() const { return limit_; }
  uint64_t reserved() const;       // fixed + decoding, now
  uint64_t peak_reserved() const;  // the most reserved() has been
  uint64_t decoding() const;       // decode draws, now

 private:
  friend class Reservation;
  // Waits for its turn in the queue and for `bytes` to fit; false on timeout.
  bool WaitForRoom(std::unique_lock<std::mutex>& lock, uint64_t bytes,
                   std::chrono::steady_clock::time_point deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void GiveFixed(uint64_t bytes);
  // Has every spare holder give its memory back, `lock` released meanwhile; false when there is
  // no holder.
  bool GiveBackSpares(std::unique_lock<std::mutex>& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A new read-ahead hold of `bytes` (not armed); its id.
  uint64_t AddHold(uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Evicts the newest armed read-ahead hold; false when there is none. Unlocks meanwhile.
  bool EvictOne(std::unique_lock<std::mutex>& lock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const uint64_t limit_;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::mutex mu_;
  std::condition_variable room_;  // notified when bytes are given back or the queue moves
  uint64_t fixed_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t decoding_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t peak_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);  // tickets of waiters, in arrival order
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t read_ahead_ ABSL_GUARDED_BY(mu_) = 0;  // of decoding_: granted by TryAcquire
  uint64_t peak_read_ahead_ ABSL_GUARDED_BY(mu_) = 0;
  struct ReadAheadHold {
    uint64_t bytes;
    std::function<void()> evict;  // empty until armed: not evictable yet
  };
  std::map<uint64_t, ReadAheadHold> holds_ ABSL_GUARDED_BY(mu_);  // by id, newest last
  uint64_t next_hold_ ABSL_GUARDED_BY(mu_) = 1;
  // Taken without mu_ (give_back calls back into GiveFixed); never held by a caller of mu_.
  mutable std::mutex spare_holders_mu_;
  std::map<uint64_t, std::function<void()>> spare_holders_ ABSL_GUARDED_BY(spare_holders_mu_);
  uint64_t next_spare_holder_ ABSL_GUARDED_BY(spare_holders_mu_) = 1;
};

}  // namespace ringloader::server
