// SPDX-License-Identifier: Apache-2.0
// EpochProgress and ResumedShard (issue 30's core): a job's place in an epoch, continued at any
// world size with every sample exactly once.
#include "server/pipeline/epoch_progress.h"

#include <catch2/catch.hpp>

#include <map>
#include <vector>

namespace ringloader::pipeline {
namespace {

ShardSpec Spec(uint32_t rank, uint32_t world, bool drop_last = false) {
  ShardSpec s;
  s.seed = 42;
  s.epoch = 3;
  s.rank = rank;
  s.world_size = world;
  s.drop_last = drop_last;
  return s;
}

// Sample -> how often the ranks of `world` read it in their first `cursor` shard positions (all
// of the shard when cursor is past it), resuming after `progress`.
void Read(std::map<uint32_t, int>& seen, uint64_t n, const EpochProgress& progress,
          uint32_t world, const std::vector<uint64_t>& cursors, bool drop_last = false) {
  for (uint32_t r = 0; r < world; ++r) {
    const EpochShard shard = ResumedShard(n, Spec(r, world, drop_last), progress);
    for (uint64_t k = 0; k < std::min<uint64_t>(cursors[r], shard.size()); ++k) {
      ++seen[shard.at(k)];
    }
  }
}

TEST_CASE("ResumedShard: with no progress it is exactly EpochShard", "[pipeline][elastic]") {
  for (uint32_t world : {1u, 2u, 3u, 7u}) {
    for (bool drop_last : {false, true}) {
      for (uint32_t rank = 0; rank < world; ++rank) {
        const EpochShard resumed = ResumedShard(103, Spec(rank, world, drop_last), EpochProgress{});
        EpochShard plain(103, Spec(rank, world, drop_last));
        REQUIRE(resumed.size() == plain.size());
        for (uint64_t k = 0; k < plain.size(); ++k) CHECK(resumed.at(k) == plain.at(k));
      }
    }
  }
}

TEST_CASE("EpochProgress: lockstep ranks consumed a prefix, ranks that skipped more leave a few "
          "positions beyond it",
          "[pipeline][elastic]") {
  const uint64_t n = 103;
  const std::vector<uint64_t> lockstep = {10, 10};
  EpochProgress p = EpochProgress{}.Advance(n, false, lockstep);
  CHECK(p.prefix == 20);
  CHECK(p.beyond.empty());
  const std::vector<uint64_t> uneven = {10, 12};  // rank 1 skipped two bad samples
  EpochProgress q = EpochProgress{}.Advance(n, false, uneven);
  // Rank 0 read positions 0, 2, ..., 18; rank 1 read 1, 3, ..., 23. Position 20 (rank 0's
  // 11th) is not read: the prefix ends there, and rank 1's 21 and 23 lie beyond it.
  CHECK(q.prefix == 20);
  CHECK(q.beyond == std::vector<uint64_t>{21, 23});
  CHECK(q.consumed() == 22);
}

TEST_CASE("Resuming at another world size: 2 -> 3 -> 1 within an epoch reads every sample "
          "exactly once, with the same samples as an undisturbed epoch",
          "[pipeline][elastic]") {
  const uint64_t n = 103;
  std::map<uint32_t, int> seen;
  EpochProgress p;
  const std::vector<uint64_t> two = {10, 10};
  Read(seen, n, p, 2, two);
  p = p.Advance(n, false, two);
  CHECK(p.prefix == 20);
  const std::vector<uint64_t> three = {7, 7, 7};
  Read(seen, n, p, 3, three);
  p = p.Advance(n, false, three);
  CHECK(p.prefix == 41);
  const std::vector<uint64_t> rest = {UINT64_MAX};
  Read(seen, n, p, 1, rest);
  REQUIRE(seen.size() == n);
  for (const auto& [sample, times] : seen) {
    INFO("sample " << sample);
    CHECK(times == 1);
  }
}

TEST_CASE("Resuming from all ranks' cursors where they skipped different numbers of samples "
          "reads each remaining sample exactly once",
          "[pipeline][elastic]") {
  const uint64_t n = 97;
  std::map<uint32_t, int> seen;
  const std::vector<uint64_t> uneven = {10, 12, 11};
  Read(seen, n, EpochProgress{}, 3, uneven);
  const EpochProgress p = EpochProgress{}.Advance(n, false, uneven);
  CHECK(p.consumed() == 33);
  const std::vector<uint64_t> all = {UINT64_MAX, UINT64_MAX};
  Read(seen, n, p, 2, all);
  REQUIRE(seen.size() == n);
  uint64_t twice = 0;
  for (const auto& [sample, times] : seen) twice += times == 2;
  CHECK(twice <= 1);  // the new world's padding (64 left over 2 ranks: none here)
  CHECK(twice == 0);
}

TEST_CASE("Resuming 4 -> 2 (a doubled per-rank batch), right before and right after an epoch's "
          "end, with drop_last on and off",
          "[pipeline][elastic]") {
  const uint64_t n = 1001;
  for (bool drop_last : {false, true}) {
    for (uint64_t cursor : {uint64_t{0}, uint64_t{100}, uint64_t{249}, uint64_t{250}}) {
      INFO("drop_last " << drop_last << " cursor " << cursor);
      std::map<uint32_t, int> seen;
      const std::vector<uint64_t> four(4, cursor);
      Read(seen, n, EpochProgress{}, 4, four, drop_last);
      const EpochProgress p = EpochProgress{}.Advance(n, drop_last, four);
      const std::vector<uint64_t> all(2, UINT64_MAX);
      Read(seen, n, p, 2, all, drop_last);
      uint64_t once = 0, twice = 0;
      for (const auto& [sample, times] : seen) (times == 1 ? once : twice) += 1;
      // No sample is read twice but by the padding of the last shard (at most world - 1
      // repeats); with drop_last none, and at most world - 1 are left out of the epoch.
      if (drop_last) {
        CHECK(twice == 0);
        CHECK(n - seen.size() <= 3);
      } else {
        CHECK(seen.size() == n);
        CHECK(twice <= 1);
      }
    }
  }
}

TEST_CASE("ResumedShard: a finished epoch leaves nothing, and sizes agree with ShardSize",
          "[pipeline][elastic]") {
  const uint64_t n = 50;
  const std::vector<uint64_t> done = {25, 25};
  const EpochProgress p = EpochProgress{}.Advance(n, false, done);
  CHECK(p.prefix == 50);
  CHECK(ResumedShard(n, Spec(0, 3), p).size() == 0);
  CHECK(ResumedShardSize(n, p, 3, false) == 0);
  const std::vector<uint64_t> part = {5, 6};
  const EpochProgress q = EpochProgress{}.Advance(n, false, part);
  for (uint32_t world : {1u, 3u, 4u}) {
    for (bool drop_last : {false, true}) {
      CHECK(ResumedShard(n, Spec(0, world, drop_last), q).size() ==
            ResumedShardSize(n, q, world, drop_last));
    }
  }
}

}  // namespace
}  // namespace ringloader::pipeline

namespace ringloader::pipeline {
namespace {

TEST_CASE("EpochProgress: BeyondAfterAdvance counts what Advance builds, without building it",
          "[pipeline][elastic]") {
  // Every world up to 5 with every cursor combination (ranks ahead, behind, finished), over
  // datasets with and without a progress already, drop_last on and off.
  for (const uint64_t n : {uint64_t{1}, uint64_t{7}, uint64_t{23}}) {
    for (const EpochProgress& before : {EpochProgress{}, EpochProgress{n / 3, {}},
                                        EpochProgress{1, {3, n - 1}}}) {
      if (before.consumed() > n || (!before.beyond.empty() && before.beyond.back() >= n)) continue;
      for (uint32_t world = 1; world <= 5; ++world) {
        for (const bool drop_last : {false, true}) {
          const uint64_t shard = ResumedShardSize(n, before, world, drop_last);
          std::vector<uint64_t> cursors(world, 0);
          while (true) {
            INFO("n " << n << " prefix " << before.prefix << " world " << world << " drop_last "
                      << drop_last << " cursors[0] " << cursors[0]);
            CHECK(before.BeyondAfterAdvance(n, drop_last, cursors) ==
                  before.Advance(n, drop_last, cursors).beyond.size());
            size_t r = 0;  // the next combination, as an odometer
            while (r < world && cursors[r] == shard) cursors[r++] = 0;
            if (r == world) break;
            ++cursors[r];
          }
        }
      }
    }
  }
  // One rank at its shard's end and one at 0: half the dataset lies past the new prefix.
  const std::vector<uint64_t> apart = {0, 500'000};
  CHECK(EpochProgress{}.BeyondAfterAdvance(1'000'000, false, apart) == 500'000);
}

}  // namespace
}  // namespace ringloader::pipeline
