// SPDX-License-Identifier: Apache-2.0
// Issue 13 item 2: eval epochs from cache (a dataset with cache = "memory").
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

struct CacheLine {
  uint64_t entries = 0, hits = 0, misses = 0;
  bool full = false;
};

// The "eval cache" line of `ringloaderctl stats`:
//   eval cache           60 samples, 1.2 MiB of 512 MiB, 120 hits, 60 misses[; full: ...]
CacheLine ParseCache(const std::string& stats) {
  CacheLine c;
  const size_t at = stats.find("eval cache");
  if (at == std::string::npos) return c;
  const std::string line = stats.substr(at, stats.find('\n', at) - at);
  unsigned long long entries = 0, hits = 0, misses = 0;
  std::sscanf(line.c_str(), "eval cache %llu samples", &entries);
  const size_t counts = line.find(" hits, ");
  if (counts != std::string::npos) {
    const size_t start = line.rfind(", ", counts) + 2;
    std::sscanf(line.c_str() + start, "%llu hits, %llu misses", &hits, &misses);
  }
  c.entries = entries;
  c.hits = hits;
  c.misses = misses;
  c.full = line.find("; full") != std::string::npos;
  return c;
}

std::vector<std::string> Consume(const DaemonFixture& daemon, const std::string& out,
                                 const std::vector<std::string>& extra) {
  std::vector<std::string> args = {"consume", "--dataset", "synth", "--batch-size", "8",
                                   "--samples-out", out};
  args.insert(args.end(), extra.begin(), extra.end());
  const CommandResult r = daemon.Ctl(args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<std::string> lines;
  for (const SampleLine& l : ReadSamplesOut(out)) {
    lines.push_back(std::to_string(l.epoch) + " " + std::to_string(l.sample_index) + " " +
                    l.path + " " + l.digest);
  }
  return lines;
}

// Two daemons over the same dataset, one with cache = "memory": the uncached one is the
// reference for what decoding gives.
struct CachedAndPlain {
  explicit CachedAndPlain(DaemonFixtureOptions plain)
      : uncached(plain), cached([&] {
          plain.config_extra = "cache = \"memory\"\n";
          return plain;
        }()) {
    REQUIRE(uncached.Start());
    REQUIRE(cached.Start());
  }
  // Reads `eval` from both; the cached daemon's lines, checked equal to the uncached one's.
  std::vector<std::string> ConsumeBoth(const std::vector<std::string>& eval) {
    const std::vector<std::string> reference = Consume(uncached, uncached.dir() + "/ref.tsv", eval);
    const std::vector<std::string> got = Consume(cached, cached.dir() + "/got.tsv", eval);
    CHECK(got == reference);
    return got;
  }
  DaemonFixture uncached;
  DaemonFixture cached;
};

TEST_CASE("13.2: with cache = \"memory\", later eval epochs and other eval streams come from "
          "memory, byte for byte what decoding gives",
          "[integration][cache]") {
  DaemonFixtureOptions plain;
  plain.images = 60;
  CachedAndPlain pair(plain);
  DaemonFixture& daemon = pair.cached;
  const std::vector<std::string> got = pair.ConsumeBoth(
      {"--augment", "eval", "--image-size", "32", "--epochs", "3", "--seed", "1"});
  CHECK(got.size() == 180);
  CacheLine c = ParseCache(daemon.Ctl({"stats"}).output);
  CHECK(c.entries == 60);
  CHECK(c.misses == 60);  // epoch 0 decoded them
  CHECK(c.hits == 120);   // epochs 1 and 2 copied them
  CHECK_FALSE(c.full);

  // Another stream with the same eval options (another seed: eval does not draw from it) is
  // served from the cache too; a train stream never touches it.
  const std::vector<std::string> again =
      Consume(daemon, daemon.dir() + "/again.tsv",
              {"--augment", "eval", "--image-size", "32", "--epochs", "1", "--seed", "9"});
  CHECK(again.size() == 60);
  Consume(daemon, daemon.dir() + "/train.tsv", {"--image-size", "32", "--epochs", "1"});
  c = ParseCache(daemon.Ctl({"stats"}).output);
  CHECK(c.hits == 180);
  CHECK(c.misses == 60);
  // Other eval options are other samples: a new key, decoded once.
  Consume(daemon, daemon.dir() + "/other.tsv",
          {"--augment", "eval", "--image-size", "24", "--epochs", "2"});
  c = ParseCache(daemon.Ctl({"stats"}).output);
  CHECK(c.entries == 120);
  CHECK(c.misses == 120);
  CHECK(c.hits == 240);
  // The uncached daemon keeps nothing.
  CHECK(ParseCache(pair.uncached.Ctl({"stats"}).output).entries == 0);
}

TEST_CASE("13.2: a cache that cannot hold the dataset keeps what fits within half of "
          "memory_limit, says so, and the bytes stay the same",
          "[integration][cache]") {
  DaemonFixtureOptions plain;
  plain.images = 60;
  plain.memory_limit = "64MiB";  // the cache may hold 32 MiB: ~53 float32 224-px samples
  CachedAndPlain pair(plain);
  const std::vector<std::string> got = pair.ConsumeBoth(
      {"--augment", "eval", "--image-size", "224", "--dtype", "float32", "--epochs", "2"});
  CHECK(got.size() == 120);
  const CommandResult stats = pair.cached.Ctl({"stats"});
  INFO(stats.output);
  const CacheLine c = ParseCache(stats.output);
  CHECK(c.full);
  CHECK(c.entries > 0);
  CHECK(c.entries < 60);
  CHECK(c.hits == c.entries);  // epoch 1: what it holds came from it, the rest was decoded
  CHECK_THAT(stats.output, Catch::Contains("full: it holds what fits"));
}

}  // namespace
}  // namespace ringloader::testing
