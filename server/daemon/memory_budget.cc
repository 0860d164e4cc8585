// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/memory_budget.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "shm/base/text.h"

namespace ringloader::server {

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->GiveFixed(bytes_);
    budget_ = other.budget_;
    bytes_ = other.bytes_;
    other.budget_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->GiveFixed(bytes_);
}

bool MemoryBudget::WaitForRoom(std::unique_lock<std::mutex>& lock, uint64_t bytes,
                               std::chrono::steady_clock::time_point deadline) {
  const uint64_t ticket = next_ticket_++;
  queue_.push_back(ticket);
  // Also ends the wait when `bytes` can no longer fit at all (rings reserved meanwhile), so the
  // head of the queue never blocks everyone behind it for good.
  const auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return queue_.front() == ticket &&
           (fixed_ + decoding_ + bytes <= limit_ || fixed_ + bytes > limit_);
  };
  bool granted = false;
  bool spares_given = false;
  while (true) {
    if (ready()) {
      granted = true;
      break;
    }
    // At the head of the queue and short: read-ahead bytes go back first (none is granted while
    // anyone waits, so what is evicted stays free for this wait), and spares (once: none is kept
    // while anyone waits).
    if (queue_.front() == ticket && EvictOne(lock)) continue;
    if (queue_.front() == ticket && !spares_given) {
      spares_given = true;
      if (GiveBackSpares(lock)) continue;
    }
    if (room_.wait_until(lock, deadline) == std::cv_status::timeout) {
      granted = ready();
      break;
    }
  }
  queue_.erase(std::find(queue_.begin(), queue_.end(), ticket));
  room_.notify_all();  // the next in line may fit now (or be at the front now)
  return granted;
}

bool MemoryBudget::GiveBackSpares(std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  bool any = false;
  {
    std::lock_guard<std::mutex> holders(spare_holders_mu_);
    for (const auto& [id, give_back] : spare_holders_) {
      give_back();
      any = true;
    }
  }
  lock.lock();
  return any;
}

uint64_t MemoryBudget::AddSpareHolder(std::function<void()> give_back) {
  std::lock_guard<std::mutex> holders(spare_holders_mu_);
  spare_holders_.emplace(next_spare_holder_, std::move(give_back));
  return next_spare_holder_++;
}

void MemoryBudget::RemoveSpareHolder(uint64_t id) {
  std::lock_guard<std::mutex> holders(spare_holders_mu_);
  spare_holders_.erase(id);
}

absl::StatusOr<Reservation> MemoryBudget::Reserve(uint64_t bytes, const std::string& what,
                                                  std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(mu_);
  if (bytes <= limit_ && fixed_ > limit_ - bytes) GiveBackSpares(lock);
  if (bytes > limit_ || fixed_ > limit_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", base::FormatBytes(bytes), "; memory_limit ", base::FormatBytes(limit_), " has ",
        base::FormatBytes(limit_ - fixed_), " free (", base::FormatBytes(fixed_), " reserved)"));
  }
  if (!WaitForRoom(lock, bytes, std::chrono::steady_clock::now() + wait) ||
      fixed_ + bytes > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", base::FormatBytes(bytes), "; memory_limit ", base::FormatBytes(limit_), " has ",
        base::FormatBytes(limit_ - fixed_ - std::min(decoding_, limit_ - fixed_)),
        " free while decodes in flight hold ", base::FormatBytes(decoding_), ": try again"));
  }
  fixed_ += bytes;
  peak_ = std::max(peak_, fixed_ + decoding_);
  return Reservation(this, bytes);
}

absl::Status MemoryBudget::Acquire(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (bytes <= limit_ && fixed_ > limit_ - bytes) GiveBackSpares(lock);
  if (bytes > limit_ || fixed_ > limit_ - bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "decoding it needs ", base::FormatBytes(bytes), " (file and work space from its header), more "
        "than memory_limit ", base::FormatBytes(limit_), " leaves beside rings and indexes (",
        base::FormatBytes(fixed_), ")"));
  }
  WaitForRoom(lock, bytes, std::chrono::steady_clock::time_point::max());
  if (fixed_ + bytes > limit_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "decoding it needs ", base::FormatBytes(bytes), ", more than memory_limit ", base::FormatBytes(limit_),
        " leaves beside rings and indexes (", base::FormatBytes(fixed_), ")"));
  }
  decoding_ += bytes;
  peak_ = std::max(peak_, fixed_ + decoding_);
  return absl::OkStatus();
}

bool MemoryBudget::TryAcquire(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  while (queue_.empty()) {  // never ahead of a waiter
    if (fixed_ + decoding_ + bytes <= limit_) {
      decoding_ += bytes;
      peak_ = std::max(peak_, fixed_ + decoding_);
      return true;
    }
    if (!EvictOne(lock)) return false;
  }
  return false;
}

void MemoryBudget::Release(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  decoding_ -= bytes;
  room_.notify_all();
}

uint64_t MemoryBudget::TryAcquireReadAhead(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!queue_.empty() || fixed_ + decoding_ + bytes > limit_ ||
      read_ahead_ + bytes > limit_ / 2) {
    return 0;
  }
  return AddHold(bytes);
}

uint64_t MemoryBudget::AcquireReadAhead(uint64_t bytes) {
  std::unique_lock<std::mutex> lock(mu_);
  if (bytes > limit_ || fixed_ > limit_ - bytes) return 0;
  WaitForRoom(lock, bytes, std::chrono::steady_clock::time_point::max());
  if (fixed_ + bytes > limit_) return 0;
  return AddHold(bytes);
}

uint64_t MemoryBudget::AddHold(uint64_t bytes) {
  decoding_ += bytes;
  read_ahead_ += bytes;
  peak_ = std::max(peak_, fixed_ + decoding_);
  peak_read_ahead_ = std::max(peak_read_ahead_, read_ahead_);
  const uint64_t id = next_hold_++;
  holds_.emplace(id, ReadAheadHold{bytes, nullptr});
  return id;
}

void MemoryBudget::ArmEviction(uint64_t id, std::function<void()> evict) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(id);
  if (it == holds_.end()) return;
  it->second.evict = std::move(evict);
  room_.notify_all();  // a decode waiting at the head of the queue may take it back now
}

bool MemoryBudget::Pin(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(id);
  if (it == holds_.end()) return false;
  it->second.evict = nullptr;
  return true;
}

void MemoryBudget::ReleaseReadAhead(uint64_t id) {
  std::function<void()> evict;  // destroyed outside the lock
  std::lock_guard<std::mutex> lock(mu_);
  auto it = holds_.find(id);
  if (it == holds_.end()) return;  // evicted: the evictor gave the bytes back
  decoding_ -= it->second.bytes;
  read_ahead_ -= it->second.bytes;
  evict = std::move(it->second.evict);
  holds_.erase(it);
  room_.notify_all();
}

uint64_t MemoryBudget::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

uint64_t MemoryBudget::peak_read_ahead() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_read_ahead_;
}

uint64_t MemoryBudget::read_ahead() const {
  std::lock_guard<std::mutex> lock(mu_);
  return read_ahead_;
}

bool MemoryBudget::EvictOne(std::unique_lock<std::mutex>& lock) {
  // The newest armed hold (furthest ahead in its stream).
  auto victim = holds_.end();
  for (auto it = holds_.rbegin(); it != holds_.rend(); ++it) {
    if (it->second.evict) {
      victim = std::prev(it.base());
      break;
    }
  }
  if (victim == holds_.end()) return false;
  ReadAheadHold hold = std::move(victim->second);
  holds_.erase(victim);
  lock.unlock();
  hold.evict();  // frees the bytes (or their holder is gone already)
  hold.evict = nullptr;
  lock.lock();
  decoding_ -= hold.bytes;
  read_ahead_ -= hold.bytes;
  room_.notify_all();
  return true;
}

void MemoryBudget::GiveFixed(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  fixed_ -= bytes;
  room_.notify_all();
}

uint64_t MemoryBudget::reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fixed_ + decoding_;
}

uint64_t MemoryBudget::peak_reserved() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t MemoryBudget::decoding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return decoding_;
}

}  // namespace ringloader::server
