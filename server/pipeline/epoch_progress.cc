// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/epoch_progress.h"

#include <algorithm>
#include <cstdlib>

namespace ringloader::pipeline {
namespace {

// The positions of [0, n) that a progress has not consumed ("the rest"), walked in order and
// never stored: memory stays O(beyond), whatever the dataset's size.
class RestWalk {
 public:
  explicit RestWalk(const EpochProgress& progress) : progress_(progress) {}
  // The position of rest index `i`. REQUIRES: calls with non-decreasing `i`, i < rest size.
  uint64_t PositionOf(uint64_t i) {
    uint64_t p = progress_.prefix + i + skipped_;
    while (skipped_ < progress_.beyond.size() && progress_.beyond[skipped_] <= p) {
      ++skipped_;
      ++p;
    }
    return p;
  }

 private:
  const EpochProgress& progress_;
  uint64_t skipped_ = 0;  // beyond entries below the last position returned
};

uint64_t RestSize(uint64_t n, const EpochProgress& progress) {
  return n - std::min(progress.consumed(), n);
}

// Rest index i was consumed by Advance's world iff i / W < cursors[i % W] (and i < rest: beyond
// it, padding). The first one not consumed becomes the new prefix.
uint64_t FirstNotConsumed(uint64_t rest, uint64_t shard_size, std::span<const uint64_t> cursors) {
  const uint64_t world = cursors.size();
  uint64_t first = rest;
  for (uint64_t r = 0; r < world; ++r) {
    if (cursors[r] > shard_size) std::abort();  // REQUIRES
    first = std::min(first, r + cursors[r] * world);
  }
  return first;
}

// Rank r's first shard index whose rest index lies past `first`.
uint64_t FirstAhead(uint64_t r, uint64_t first, uint64_t world) {
  return first < r ? 0 : (first - r) / world + 1;
}

}  // namespace

uint64_t ResumedShardSize(uint64_t dataset_size, const EpochProgress& progress,
                          uint32_t world_size, bool drop_last) {
  return EpochShard::ShardSize(RestSize(dataset_size, progress), world_size, drop_last);
}

EpochShard ResumedShard(uint64_t dataset_size, const ShardSpec& spec,
                        const EpochProgress& progress) {
  if (dataset_size >= (uint64_t{1} << 32) || spec.world_size == 0 ||
      spec.rank >= spec.world_size) {
    std::abort();  // the caller validates requests first
  }
  const uint64_t rest = RestSize(dataset_size, progress);
  const uint64_t shard_size = EpochShard::ShardSize(rest, spec.world_size, spec.drop_last);
  if (shard_size == 0) return EpochShard(spec, {});
  const std::vector<uint32_t> order = EpochShard::Order(dataset_size, spec);
  // DistributedSampler over the rest: rank r takes rest indices r, r + W, ...; past the rest's
  // end the indices wrap (padding), to the first fewer-than-W of it.
  std::vector<uint32_t> indices(shard_size);
  std::vector<uint32_t> head;  // the rest's first min(W, rest) samples, for the padding
  RestWalk walk(progress);
  for (uint64_t i = 0; i < rest; ++i) {
    const uint32_t sample = order[walk.PositionOf(i)];
    if (i < spec.world_size) head.push_back(sample);
    if (i % spec.world_size == spec.rank && i / spec.world_size < shard_size) {
      indices[i / spec.world_size] = sample;
    }
  }
  for (uint64_t k = 0; k < shard_size; ++k) {
    const uint64_t i = spec.rank + k * spec.world_size;
    if (i >= rest) indices[k] = head[(i % rest) % head.size()];
  }
  return EpochShard(spec, std::move(indices));
}

EpochProgress EpochProgress::Advance(uint64_t dataset_size, bool drop_last,
                                     std::span<const uint64_t> cursors) const {
  const uint64_t world = cursors.size();
  const uint64_t rest = RestSize(dataset_size, *this);
  if (world == 0 || rest == 0) return *this;
  const uint64_t shard_size =
      EpochShard::ShardSize(rest, static_cast<uint32_t>(world), drop_last);
  // The first rest index not consumed, `first`, becomes the new prefix; the consumed ones past
  // it (ranks ahead of the slowest: O(their lead)) join `beyond`.
  const uint64_t first = FirstNotConsumed(rest, shard_size, cursors);
  std::vector<uint64_t> ahead;  // rest indices > first that were consumed
  for (uint64_t r = 0; r < world; ++r) {
    for (uint64_t k = FirstAhead(r, first, world); k < cursors[r]; ++k) {
      if (r + k * world < rest) ahead.push_back(r + k * world);
    }
  }
  std::sort(ahead.begin(), ahead.end());
  EpochProgress next;
  RestWalk walk(*this);
  next.prefix = first < rest ? walk.PositionOf(first) : dataset_size;
  std::vector<uint64_t> consumed;
  consumed.reserve(ahead.size());
  for (uint64_t i : ahead) consumed.push_back(walk.PositionOf(i));
  for (uint64_t p : beyond) {
    if (p > next.prefix) consumed.push_back(p);
  }
  std::sort(consumed.begin(), consumed.end());
  next.beyond = std::move(consumed);
  return next;
}

uint64_t EpochProgress::BeyondAfterAdvance(uint64_t dataset_size, bool drop_last,
                                           std::span<const uint64_t> cursors) const {
  const uint64_t world = cursors.size();
  const uint64_t rest = RestSize(dataset_size, *this);
  if (world == 0 || rest == 0) return beyond.size();
  const uint64_t shard_size =
      EpochShard::ShardSize(rest, static_cast<uint32_t>(world), drop_last);
  const uint64_t first = FirstNotConsumed(rest, shard_size, cursors);
  // As Advance: rank r's shard indices k in [FirstAhead, cursors[r]) whose rest index r + k W
  // is below `rest`, i.e. k < ceil((rest - r) / W).
  uint64_t count = 0;
  for (uint64_t r = 0; r < world && r < rest; ++r) {
    const uint64_t end = std::min(cursors[r], (rest - r + world - 1) / world);
    const uint64_t begin = FirstAhead(r, first, world);
    if (end > begin) count += end - begin;
  }
  RestWalk walk(*this);
  const uint64_t prefix = first < rest ? walk.PositionOf(first) : dataset_size;
  for (uint64_t p : beyond) count += p > prefix;
  return count;
}

}  // namespace ringloader::pipeline
