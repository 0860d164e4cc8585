#pragma once
// Accounting of the daemon's memory against `memory_limit`: rings, decode work space and dataset
// indexes are reserved before they are allocated, so a stream that would exceed the budget is
// refused up front (ResourceExhausted, with the numbers) instead of growing the process.
//
// Thread-safety: thread-safe.

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"

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

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // ResourceExhausted "<what> needs X MiB; memory_limit Y MiB has Z MiB free (W MiB reserved)".
  absl::StatusOr<Reservation> Reserve(uint64_t bytes, const std::string& what);

  uint64_t limit() const { return limit_; }
  uint64_t reserved() const;

 private:
  friend class Reservation;
  void Give(uint64_t bytes);

  const uint64_t limit_;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

// "1.5 GiB", "640 KiB", "12 B": for messages.
std::string FormatBytes(uint64_t bytes);

}  // namespace ringloader::server
