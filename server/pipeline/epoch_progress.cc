#include "server/pipeline/epoch_progress.h"

#include <algorithm>
#include <cstdlib>

namespace ringloader::pipeline {
namespace {

// The positions of [0, n) that `progress` has not consumed, in order.
std::vector<uint64_t> Rest(uint64_t n, const EpochProgress& progress) {
  std::vector<uint64_t> rest;
  if (progress.prefix >= n) return rest;
  rest.reserve(n - progress.prefix - std::min<uint64_t>(progress.beyond.size(), n));
  auto skip = progress.beyond.begin();
  for (uint64_t p = progress.prefix; p < n; ++p) {
    while (skip != progress.beyond.end() && *skip < p) ++skip;
    if (skip != progress.beyond.end() && *skip == p) continue;
    rest.push_back(p);
  }
  return rest;
}

}  // namespace

uint64_t ResumedShardSize(uint64_t dataset_size, const EpochProgress& progress,
                          uint32_t world_size, bool drop_last) {
  const uint64_t consumed = std::min(progress.consumed(), dataset_size);
  return EpochShard::ShardSize(dataset_size - consumed, world_size, drop_last);
}

EpochShard ResumedShard(uint64_t dataset_size, const ShardSpec& spec,
                        const EpochProgress& progress) {
  if (dataset_size >= (uint64_t{1} << 32) || spec.world_size == 0 ||
      spec.rank >= spec.world_size) {
    std::abort();  // the caller validates requests first
  }
  const std::vector<uint64_t> rest = Rest(dataset_size, progress);
  const uint64_t shard_size =
      EpochShard::ShardSize(rest.size(), spec.world_size, spec.drop_last);
  if (shard_size == 0) return EpochShard(spec, {});
  const std::vector<uint32_t> order = EpochShard::Order(dataset_size, spec);
  // DistributedSampler over the rest: pad by wrapping (or truncate), rank r every W-th.
  std::vector<uint32_t> indices(shard_size);
  for (uint64_t k = 0; k < shard_size; ++k) {
    indices[k] = order[rest[(spec.rank + k * spec.world_size) % rest.size()]];
  }
  return EpochShard(spec, std::move(indices));
}

EpochProgress EpochProgress::Advance(uint64_t dataset_size, bool drop_last,
                                     std::span<const uint64_t> cursors) const {
  const uint64_t world = cursors.size();
  const std::vector<uint64_t> rest = Rest(dataset_size, *this);
  if (world == 0 || rest.empty()) return *this;
  const uint64_t shard_size = EpochShard::ShardSize(rest.size(), static_cast<uint32_t>(world),
                                                    drop_last);
  std::vector<uint64_t> consumed(beyond);
  for (uint64_t r = 0; r < world; ++r) {
    if (cursors[r] > shard_size) std::abort();  // REQUIRES
    for (uint64_t k = 0; k < cursors[r]; ++k) {
      const uint64_t i = r + k * world;
      if (i < rest.size()) consumed.push_back(rest[i]);  // past it: padding, a repeat
    }
  }
  std::sort(consumed.begin(), consumed.end());
  consumed.erase(std::unique(consumed.begin(), consumed.end()), consumed.end());
  EpochProgress next;
  next.prefix = prefix;
  size_t i = 0;
  while (i < consumed.size() && consumed[i] == next.prefix) {
    ++next.prefix;
    ++i;
  }
  next.beyond.assign(consumed.begin() + static_cast<ptrdiff_t>(i), consumed.end());
  return next;
}

}  // namespace ringloader::pipeline
