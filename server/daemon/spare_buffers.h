// SPDX-License-Identifier: Apache-2.0
#pragma once
// A feeder's answer buffers kept for its next feeds (the host reads answers in the slices they
// came in, and keeps none). A buffer of megabytes allocated anew for every call is mapped,
// faulted in page by page and unmapped each time: 3% of a feeder's core in feeder_bench. A spare
// keeps its memory_limit reservation, so what it holds stays counted; a few small ones are kept
// at most, and none while anything waits for memory.
//
// Thread-safety: thread-safe.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/daemon/memory_budget.h"

namespace ringloader::server {

// An allocator that leaves new elements uninitialised: an answer's buffer is written whole
// before it is read (received into, or zeroed and filled), and zeroing tens of megabytes as it
// is made cost a round's lease (under the feeder pool's lock) for nothing.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  explicit UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-initialised: left as it is
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// An answer's bytes. Not zeroed when grown: see UninitializedAllocator.
using AnswerBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

class SpareBuffers {
 public:
  // A buffer and the memory_limit reservation that covers it (at least its size).
  struct Buffer {
    AnswerBytes bytes;  // uninitialised when new; an earlier answer's bytes when reused
    Reservation held;
  };

  // Keeps at most `most` spares, each of at most `largest` bytes, and gives them all back when
  // `budget` is short (MemoryBudget::AddSpareHolder). `budget` outlives it.
  SpareBuffers(MemoryBudget& budget, size_t most, uint64_t largest);
  ~SpareBuffers();
  SpareBuffers(const SpareBuffers&) = delete;
  SpareBuffers& operator=(const SpareBuffers&) = delete;

  // `size` bytes (a spare's old contents, or uninitialised when new) and their reservation: a
  // spare that fits, else new ones reserved at once or not at all (ResourceExhausted naming
  // `what`). The spares that do not fit are freed first, so they never stand in its way.
  absl::StatusOr<Buffer> Take(uint64_t size, const std::string& what);
  // Kept for a later Take, or freed with its reservation (too many, too big, or memory short).
  void Give(Buffer buffer);

  size_t spares() const;

 private:
  void FreeAll();

  MemoryBudget& budget_;
  const size_t most_;
  const uint64_t largest_;
  uint64_t holder_id_ = 0;
  mutable std::mutex mu_;
  std::vector<Buffer> spares_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
