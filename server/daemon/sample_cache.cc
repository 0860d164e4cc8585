// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/sample_cache.h"

#include <cstring>
#include <mutex>

namespace ringloader::server {
namespace {

// What one entry costs beyond its bytes (map node, key, vector header), counted with it.
constexpr uint64_t kEntryOverheadBytes = 128;

}  // namespace

bool MemorySampleCache::Contains(const std::string& key, uint64_t sample_index) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  const bool found = entries_.count({key, sample_index}) > 0;
  (found ? hits_ : misses_).fetch_add(1, std::memory_order_relaxed);
  return found;
}

bool MemorySampleCache::Holds(const std::string& key, uint64_t sample_index) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return entries_.count({key, sample_index}) > 0;
}

bool MemorySampleCache::Lookup(const std::string& key, uint64_t sample_index,
                               std::span<uint8_t> out) {
  std::shared_lock<std::shared_mutex> lock(mu_);
  auto it = entries_.find({key, sample_index});
  if (it == entries_.end() || it->second.bytes.size() != out.size()) return false;
  std::memcpy(out.data(), it->second.bytes.data(), out.size());
  return true;
}

void MemorySampleCache::Insert(const std::string& key, uint64_t sample_index,
                               std::span<const uint8_t> image) {
  const uint64_t cost = image.size() + key.size() + kEntryOverheadBytes;
  {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (full_ || entries_.count({key, sample_index}) > 0) return;
  }
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (full_ || entries_.count({key, sample_index}) > 0) return;
  if (bytes_ + cost > cap_bytes_) {
    full_ = true;
    return;
  }
  // No waiting: a cache entry never holds up a decode or a ring. Refused now, it may fit when
  // the sample comes again.
  absl::StatusOr<Reservation> r =
      budget_.Reserve(cost, "the eval cache", std::chrono::milliseconds(0));
  if (!r.ok()) {
    ++refused_;
    return;
  }
  Entry& e = entries_[{key, sample_index}];
  e.bytes.assign(image.begin(), image.end());
  e.reservation = std::move(*r);
  bytes_ += cost;
}

SampleCacheStats MemorySampleCache::stats() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  SampleCacheStats s;
  s.entries = entries_.size();
  s.bytes = bytes_;
  s.full = full_ || refused_ > 0;
  s.hits = hits_.load(std::memory_order_relaxed);
  s.misses = misses_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace ringloader::server
