// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/spare_buffers.h"

#include <chrono>
#include <utility>

namespace ringloader::server {

SpareBuffers::SpareBuffers(MemoryBudget& budget, size_t most, uint64_t largest)
    : budget_(budget), most_(most), largest_(largest) {
  holder_id_ = budget_.AddSpareHolder([this] { FreeAll(); });
}

SpareBuffers::~SpareBuffers() { budget_.RemoveSpareHolder(holder_id_); }

void SpareBuffers::FreeAll() {
  std::vector<Buffer> freed;  // outside the lock: their reservations go back to the budget
  {
    std::lock_guard<std::mutex> lock(mu_);
    freed.swap(spares_);
  }
}

absl::StatusOr<SpareBuffers::Buffer> SpareBuffers::Take(uint64_t size, const std::string& what) {
  std::vector<Buffer> unfit;  // freed outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < spares_.size(); ++i) {
      if (spares_[i].held.bytes() >= size && spares_[i].bytes.capacity() >= size) {
        Buffer buffer = std::move(spares_[i]);
        spares_.erase(spares_.begin() + static_cast<std::ptrdiff_t>(i));
        buffer.bytes.resize(size);  // within its capacity: no allocation
        return buffer;
      }
    }
    unfit.swap(spares_);
  }
  unfit.clear();
  absl::StatusOr<Reservation> held = budget_.Reserve(size, what, std::chrono::milliseconds(0));
  if (!held.ok()) return held.status();
  Buffer buffer;
  buffer.held = *std::move(held);
  buffer.bytes.resize(size);  // not zeroed (AnswerBytes)
  return buffer;
}

void SpareBuffers::Give(Buffer buffer) {
  if (buffer.bytes.capacity() > largest_ || buffer.held.bytes() < buffer.bytes.capacity() ||
      budget_.waiting() > 0) {
    return;  // freed, its reservation with it
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (spares_.size() < most_) spares_.push_back(std::move(buffer));
  }
  // A wait that began since it was checked above may have asked for the spares already (it asks
  // once): given back now rather than kept in its way.
  if (budget_.waiting() > 0) FreeAll();
}

size_t SpareBuffers::spares() const {
  std::lock_guard<std::mutex> lock(mu_);
  return spares_.size();
}

}  // namespace ringloader::server
