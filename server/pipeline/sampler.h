// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which samples a rank reads in an epoch, in which order.
//
// The epoch's order is a permutation of [0, dataset_size) drawn from (seed, epoch) when shuffling,
// else the identity. Sharding follows PyTorch's DistributedSampler: the order is padded by wrapping
// to a multiple of world_size (or, with drop_last, truncated to one), and rank r takes positions
// r, r + world_size, r + 2*world_size, ... So every rank gets the same number of samples per epoch,
// and the shards are disjoint (padding repeats the first few samples of the order).
//
// The permutation is a Fisher-Yates shuffle driven by SplitMix64 seeded from (seed, epoch), with
// unbiased bounded draws: plain 64-bit integer arithmetic, so it is identical on every platform
// and compiler (a test pins it with literal numbers; changing it changes every stream's order).
//
// Memory: 4 bytes a sample for the shard of one epoch (construction briefly holds the whole
// epoch's order, 4 bytes a dataset sample, when world_size > 1). Construction is O(N); any
// position is O(1) after it, so a stream can start at any batch without replaying the epoch.

#include <cstdint>
#include <utility>
#include <vector>

namespace ringloader::pipeline {

struct ShardSpec {
  uint64_t seed = 0;
  uint64_t epoch = 0;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  bool shuffle = true;
  bool drop_last = false;
};

class EpochShard {
 public:
  // REQUIRES: dataset_size < 2^32, world_size >= 1, rank < world_size (aborts otherwise: callers
  // validate requests first). dataset_size 0, or drop_last with fewer samples than ranks, gives
  // an empty shard.
  EpochShard(uint64_t dataset_size, const ShardSpec& spec);
  // A shard whose positions are `indices` (a resumed epoch's: see epoch_progress.h).
  EpochShard(const ShardSpec& spec, std::vector<uint32_t> indices)
      : spec_(spec), indices_(std::move(indices)) {}

  const ShardSpec& spec() const { return spec_; }
  uint64_t size() const { return indices_.size(); }
  // Dataset sample index at shard position `pos`. REQUIRES: pos < size().
  uint32_t at(uint64_t pos) const { return indices_[pos]; }

  // Shard size without building the shard.
  static uint64_t ShardSize(uint64_t dataset_size, uint32_t world_size, bool drop_last);
  // The whole epoch's order before padding and striding (`spec`'s seed, epoch and shuffle; its
  // rank and world size do not matter): EpochShard's positions index into it.
  static std::vector<uint32_t> Order(uint64_t dataset_size, const ShardSpec& spec);

 private:
  ShardSpec spec_;
  std::vector<uint32_t> indices_;
};

}  // namespace ringloader::pipeline
