// SPDX-License-Identifier: Apache-2.0
#pragma once
// The eval cache of datasets with cache = "memory" (pipeline::SampleCache): decoded eval samples
// kept in the daemon's memory and copied into later epochs' and other streams' batches. Its bytes
// are reserved from memory_limit (MemoryBudget) entry by entry, never more than `cap_bytes` in
// all (the daemon gives it half of memory_limit) and never by waiting: an entry that does not fit
// is not kept, and the cache keeps what it holds (stats say so). Nothing is evicted.
//
// Thread-safety: thread-safe (lookups share a lock; inserts take it alone).

#include <atomic>
#include <cstdint>
#include <map>
#include <shared_mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "server/daemon/memory_budget.h"
#include "server/pipeline/batch_filler.h"

namespace ringloader::server {

struct SampleCacheStats {
  uint64_t entries = 0;
  uint64_t bytes = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;  // Contains() answered no
  // Not every sample offered fits: the cap was reached, or memory_limit had no room when one came
  // (those are decoded every time).
  bool full = false;
};

class MemorySampleCache final : public pipeline::SampleCache {
 public:
  MemorySampleCache(MemoryBudget& budget, uint64_t cap_bytes)
      : budget_(budget), cap_bytes_(cap_bytes) {}

  bool Contains(const std::string& key, uint64_t sample_index) override;
  bool Holds(const std::string& key, uint64_t sample_index) const override;
  bool Lookup(const std::string& key, uint64_t sample_index, std::span<uint8_t> out) override;
  void Insert(const std::string& key, uint64_t sample_index,
              std::span<const uint8_t> image) override;

  SampleCacheStats stats() const;
  uint64_t cap_bytes() const { return cap_bytes_; }

 private:
  struct Entry {
    std::vector<uint8_t> bytes;
    Reservation reservation;
  };
  MemoryBudget& budget_;
  const uint64_t cap_bytes_;
  // std::, not absl::, on purpose: TSan cannot see into Debian's uninstrumented abseil.
  mutable std::shared_mutex mu_;
  std::map<std::pair<std::string, uint64_t>, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool full_ ABSL_GUARDED_BY(mu_) = false;  // cap_bytes reached: no more inserts
  uint64_t refused_ ABSL_GUARDED_BY(mu_) = 0;  // inserts memory_limit had no room for
  std::atomic<uint64_t> hits_{0};
  std::atomic<uint64_t> misses_{0};
};

}  // namespace ringloader::server
