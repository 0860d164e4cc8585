// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/sampler.h"

#include <catch2/catch.hpp>
#include <map>
#include <numeric>
#include <set>
#include <vector>

namespace ringloader::pipeline {
namespace {

std::vector<uint32_t> Positions(const EpochShard& shard, uint64_t begin, uint64_t end) {
  std::vector<uint32_t> out;
  for (uint64_t p = begin; p < end && p < shard.size(); ++p) out.push_back(shard.at(p));
  return out;
}

std::vector<uint32_t> All(const EpochShard& shard) { return Positions(shard, 0, shard.size()); }

ShardSpec Spec(uint64_t seed, uint64_t epoch, uint32_t rank, uint32_t world, bool drop_last) {
  ShardSpec s;
  s.seed = seed;
  s.epoch = epoch;
  s.rank = rank;
  s.world_size = world;
  s.drop_last = drop_last;
  return s;
}

TEST_CASE("EpochShard: without drop_last every sample appears, padding is the only duplicate",
          "[pipeline]") {
  constexpr uint64_t kN = 1001;  // not divisible by 3 or 8
  for (uint32_t world : {1u, 3u, 8u}) {
    for (uint64_t epoch : {0u, 1u}) {
      std::map<uint32_t, int> seen;
      uint64_t total = 0;
      for (uint32_t rank = 0; rank < world; ++rank) {
        EpochShard shard(kN, Spec(7, epoch, rank, world, false));
        CHECK(shard.size() == EpochShard::ShardSize(kN, world, false));
        CHECK(shard.size() == (kN + world - 1) / world);  // every rank the same count
        for (uint32_t idx : All(shard)) seen[idx]++;
        total += shard.size();
      }
      const uint64_t padding = total - kN;
      CHECK(padding < world);
      CHECK(seen.size() == kN);  // union covers every sample
      uint64_t duplicates = 0;
      for (auto& [idx, count] : seen) {
        CHECK(count >= 1);
        CHECK(count <= 2);
        duplicates += count - 1;
      }
      CHECK(duplicates == padding);
      // The padding repeats the first samples of the epoch order (rank 0's first, rank 1's ...).
      EpochShard whole(kN, Spec(7, epoch, 0, 1, false));
      for (uint64_t p = 0; p < padding; ++p) CHECK(seen[whole.at(p)] == 2);
    }
  }
}

TEST_CASE("EpochShard: with drop_last shards are disjoint and hold floor(N/W)*W samples",
          "[pipeline]") {
  constexpr uint64_t kN = 1001;
  for (uint32_t world : {1u, 3u, 8u}) {
    std::set<uint32_t> seen;
    uint64_t total = 0;
    for (uint32_t rank = 0; rank < world; ++rank) {
      EpochShard shard(kN, Spec(3, 0, rank, world, true));
      CHECK(shard.size() == kN / world);
      for (uint32_t idx : All(shard)) {
        CHECK(idx < kN);
        CHECK(seen.insert(idx).second);  // no sample twice, within or across ranks
      }
      total += shard.size();
    }
    CHECK(total == kN / world * world);
  }
}

TEST_CASE("EpochShard: shards are disjoint apart from the padding", "[pipeline]") {
  constexpr uint64_t kN = 50;
  constexpr uint32_t kWorld = 8;  // 56 positions: 6 of padding
  EpochShard whole(kN, Spec(9, 4, 0, 1, false));
  std::set<uint32_t> padding;
  for (uint64_t p = 0; p < 56 - kN; ++p) padding.insert(whole.at(p));
  std::map<uint32_t, uint32_t> owner;
  for (uint32_t rank = 0; rank < kWorld; ++rank) {
    EpochShard shard(kN, Spec(9, 4, rank, kWorld, false));
    for (uint32_t idx : All(shard)) {
      auto [it, inserted] = owner.emplace(idx, rank);
      if (!inserted) CHECK(padding.count(idx) == 1);
    }
  }
  CHECK(owner.size() == kN);
}

TEST_CASE("EpochShard: the order is a function of (seed, epoch) and changes with either",
          "[pipeline]") {
  constexpr uint64_t kN = 997;
  const auto e0 = All(EpochShard(kN, Spec(42, 0, 0, 1, false)));
  CHECK(e0 == All(EpochShard(kN, Spec(42, 0, 0, 1, false))));
  CHECK(e0 != All(EpochShard(kN, Spec(42, 1, 0, 1, false))));
  CHECK(e0 != All(EpochShard(kN, Spec(43, 0, 0, 1, false))));
  std::vector<uint32_t> sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<uint32_t> identity(kN);
  std::iota(identity.begin(), identity.end(), 0u);
  CHECK(sorted == identity);  // a permutation
  CHECK(e0 != identity);      // actually shuffled
}

TEST_CASE("EpochShard: the permutation is pinned (same on every platform and build)",
          "[pipeline]") {
  // Literal numbers on purpose: if this fails, every stream's order changed; that breaks
  // resumption across daemon versions, so it must be deliberate.
  EpochShard shard(10, Spec(1, 2, 0, 1, false));
  CHECK(All(shard) == std::vector<uint32_t>{8, 6, 0, 2, 5, 9, 3, 4, 1, 7});
}

TEST_CASE("EpochShard: starting at batch k equals replaying the epoch to batch k", "[pipeline]") {
  constexpr uint64_t kN = 1000;
  constexpr uint64_t kBatch = 32;
  EpochShard replay(kN, Spec(5, 3, 1, 3, false));
  std::vector<std::vector<uint32_t>> batches;
  for (uint64_t cursor = 0; cursor < replay.size(); cursor += kBatch) {
    batches.push_back(Positions(replay, cursor, cursor + kBatch));
  }
  for (uint64_t k : {0u, 1u, 7u, 10u}) {
    EpochShard fresh(kN, Spec(5, 3, 1, 3, false));  // a restarted stream
    CHECK(Positions(fresh, k * kBatch, (k + 1) * kBatch) == batches[k]);
  }
}

TEST_CASE("EpochShard: shuffle = false gives the identity order, strided by rank", "[pipeline]") {
  ShardSpec spec = Spec(5, 3, 0, 1, false);
  spec.shuffle = false;
  const auto order = All(EpochShard(10, spec));
  CHECK(order == std::vector<uint32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  spec.rank = 1;
  spec.world_size = 3;
  CHECK(All(EpochShard(10, spec)) == std::vector<uint32_t>{1, 4, 7, 0});  // 0 is the padding
}

TEST_CASE("EpochShard: more ranks than samples pads every rank to one sample", "[pipeline]") {
  CHECK(EpochShard(3, Spec(0, 0, 7, 8, false)).size() == 1);
  CHECK(EpochShard(3, Spec(0, 0, 7, 8, true)).size() == 0);
}

}  // namespace
}  // namespace ringloader::pipeline
