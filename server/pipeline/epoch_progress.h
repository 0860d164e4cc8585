// SPDX-License-Identifier: Apache-2.0
#pragma once
// How far a job has got through one epoch, in a form any world size can continue from (issue
// 30: resume at another world size, exactly once). The unit is a position in the epoch's global
// order (EpochShard::Order, before padding): a rank at world size W and shard cursor c has
// consumed positions r, r + W, ..., r + (c - 1) W of it. So in a lockstep job (every rank at the
// same cursor c) the job has consumed exactly the prefix [0, c W); ranks that skipped different
// numbers of bad samples leave a few positions consumed beyond the shortest rank's prefix.
//
// A resumed rank reads the positions not yet consumed ("the rest", in order), sharded as
// DistributedSampler shards an epoch: padded by wrapping to a multiple of the new world size (or
// truncated with drop_last) and strided. Checkpointed again mid-epoch, the new ranks' cursors
// advance the progress the same way, so a job can change size any number of times in an epoch.
// Everything here is a pure function of (dataset size, seed, epoch, progress, world, rank): each
// rank computes its slice alone, no coordinator.

#include <cstdint>
#include <span>
#include <vector>

#include "server/pipeline/sampler.h"

namespace ringloader::pipeline {

struct EpochProgress {
  uint64_t prefix = 0;           // positions [0, prefix) are consumed
  std::vector<uint64_t> beyond;  // consumed positions above prefix (sorted, unique)
  bool operator==(const EpochProgress&) const = default;

  // Positions consumed in all.
  uint64_t consumed() const { return prefix + beyond.size(); }

  // The progress after the ranks of a world of `cursors.size()` ranks, each reading its shard of
  // the rest of the epoch after `*this` (ResumedShard), got to cursors[r] (shard positions, as a
  // stream's state counts them). Padding positions count as nothing. REQUIRES: every cursor is
  // at most its shard's size.
  EpochProgress Advance(uint64_t dataset_size, bool drop_last,
                        std::span<const uint64_t> cursors) const;

  // How many positions Advance(dataset_size, drop_last, cursors) leaves in `beyond`, counted in
  // O(cursors.size() + beyond.size()) without building them: cursors far apart (a rank at 0,
  // another at its shard's end) make that list O(dataset), so a caller holding it to a bound
  // asks first. REQUIRES: as Advance's.
  uint64_t BeyondAfterAdvance(uint64_t dataset_size, bool drop_last,
                              std::span<const uint64_t> cursors) const;
};

// A rank's shard of the rest of an epoch: what EpochShard would be, over the positions
// `progress` has not consumed. With empty progress it is exactly EpochShard(dataset_size, spec).
// REQUIRES: as EpochShard's, and `progress` within [0, dataset_size).
EpochShard ResumedShard(uint64_t dataset_size, const ShardSpec& spec,
                        const EpochProgress& progress);

// ResumedShard's size without building the shard.
uint64_t ResumedShardSize(uint64_t dataset_size, const EpochProgress& progress,
                          uint32_t world_size, bool drop_last);

}  // namespace ringloader::pipeline
