// SPDX-License-Identifier: Apache-2.0
#pragma once
// Feed answers' buffers kept for the next call, on both ends of a feed (the feeder fills one,
// the host receives into one). A buffer of megabytes allocated anew for every call is mapped,
// faulted in page by page and unmapped each time: 3% of a feeder's core in feeder_bench. A spare
// keeps its memory_limit reservation, so what it holds stays counted; a few small ones are kept
// at most, and none while anything waits for memory.
//
// Thread-safety: thread-safe.

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "server/daemon/memory_budget.h"

namespace ringloader::server {

class SpareBuffers {
 public:
  // A buffer and the memory_limit reservation that covers it (at least its size).
  struct Buffer {
    std::vector<uint8_t> bytes;
    Reservation held;
    bool reused = false;  // a spare, holding an earlier answer's bytes; else new, all zero
  };

  // Keeps at most `most` spares, each of at most `largest` bytes.
  SpareBuffers(MemoryBudget& budget, size_t most, uint64_t largest);

  // `size` bytes (a spare's old contents, or zeros when new: see Buffer::reused) and their
  // reservation: a spare that fits, else new ones reserved at once or not at all
  // (ResourceExhausted naming `what`). The spares that do not fit are freed first, so they
  // never stand in its way.
  absl::StatusOr<Buffer> Take(uint64_t size, const std::string& what);
  // Kept for a later Take, or freed with its reservation (too many, too big, or memory short).
  void Give(Buffer buffer);

  size_t spares() const;

 private:
  MemoryBudget& budget_;
  const size_t most_;
  const uint64_t largest_;
  mutable std::mutex mu_;
  std::vector<Buffer> spares_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
