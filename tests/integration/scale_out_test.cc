// SPDX-License-Identifier: Apache-2.0
// Issue 12 item 4: scale-out without a coordinator (and item 3: a health-only endpoint for
// Kubernetes probes; item 6: progress where people wait). One daemon per host serves its local ranks;
// sharding is a function of (seed, epoch, rank, world_size) only, so two daemons ("hosts") serving
// ranks 0-1 and 2-3 of world 4 deliver every sample exactly once per epoch between them.
#include <catch2/catch.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

TEST_CASE("12.4: two daemons serving ranks 0-1 and 2-3 of world 4 deliver every sample exactly "
          "once per epoch, with the bytes one daemon would give",
          "[integration][scale-out]") {
  DaemonFixtureOptions options;
  // A multiple of 4: with a remainder, ranks repeat a few samples to even their shards (as
  // torch's DistributedSampler does), or drop them with drop_last.
  options.images = 100;
  // Two hosts: each its own daemon over its own copy of the same dataset (same seed, same files).
  DaemonFixture host_a(options);
  DaemonFixture host_b(options);
  REQUIRE(host_a.Start());
  REQUIRE(host_b.Start());
  std::map<uint64_t, std::map<uint64_t, std::string>> seen;  // epoch -> sample -> digest
  std::map<uint64_t, std::map<uint64_t, std::string>> reference;
  for (int rank = 0; rank < 4; ++rank) {
    const DaemonFixture& host = rank < 2 ? host_a : host_b;
    const std::string out = host.dir() + "/rank" + std::to_string(rank) + ".tsv";
    const CommandResult r = host.Ctl({"consume", "--dataset", "synth", "--batch-size", "5",
                                      "--epochs", "2", "--seed", "3", "--rank",
                                      std::to_string(rank), "--world-size", "4", "--image-size",
                                      "32", "--samples-out", out});
    INFO("rank " << rank << ": " << r.output);
    REQUIRE(r.exit_code == 0);
    for (const SampleLine& l : ReadSamplesOut(out)) {
      INFO("rank " << rank << " epoch " << l.epoch << " sample " << l.sample_index);
      CHECK(seen[l.epoch].emplace(l.sample_index, l.digest).second);
    }
    // The same rank read from the other host gives the same samples and bytes.
    const DaemonFixture& other = rank < 2 ? host_b : host_a;
    const std::string again = other.dir() + "/again" + std::to_string(rank) + ".tsv";
    REQUIRE(other.Ctl({"consume", "--dataset", "synth", "--batch-size", "5", "--epochs", "2",
                       "--seed", "3", "--rank", std::to_string(rank), "--world-size", "4",
                       "--image-size", "32", "--samples-out", again})
                .exit_code == 0);
    for (const SampleLine& l : ReadSamplesOut(again)) reference[l.epoch][l.sample_index] = l.digest;
  }
  REQUIRE(seen.size() == 2);
  for (const auto& [epoch, samples] : seen) {
    INFO("epoch " << epoch);
    CHECK(samples.size() == 100);
    CHECK(samples == reference.at(epoch));
  }
}

TEST_CASE("12.6: stats --watch redraws every second, and consume stays plain when not a "
          "terminal", "[integration][progress]") {
  DaemonFixtureOptions options;
  options.images = 20;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const auto start = std::chrono::steady_clock::now();
  const CommandResult watched = daemon.Ctl({"stats", "--watch", "--count", "2"});
  CHECK(watched.exit_code == 0);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(900));
  size_t tables = 0;
  for (size_t at = watched.output.find("streams open"); at != std::string::npos;
       at = watched.output.find("streams open", at + 1)) {
    ++tables;
  }
  CHECK(tables == 2);
  CHECK(watched.output.find("\033[2J") == std::string::npos);  // not a terminal: no clearing
  const CommandResult consumed = daemon.Ctl({"consume", "--dataset", "synth", "--epochs", "1",
                                             "--batch-size", "4", "--image-size", "32"});
  CHECK(consumed.exit_code == 0);
  CHECK(consumed.output.find('\r') == std::string::npos);
  CHECK(consumed.output.find("ETA") == std::string::npos);
}

TEST_CASE("12.3: health_listen serves only grpc.health.v1 over TCP, with the daemon's status",
          "[integration][health]") {
  const std::string health = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 8;
  options.server_extra = "health_listen = \"" + health + "\"";
  options.config_extra = "[failpoints]\nindex_delay_ms = 2000\n";
  DaemonFixture daemon(options);
  daemon.Launch();
  const auto probe = [&] {
    return RunCommand({CtlPath(), "--endpoint", health, "health", "--timeout", "1"});
  };
  // While indexing: answering, not serving; then SERVING, like the main endpoint.
  REQUIRE(WaitFor([&] { return probe().exit_code != 2; }, std::chrono::seconds(10)));
  CHECK_THAT(probe().output, Catch::Contains("NOT_SERVING"));
  REQUIRE(WaitFor([&] { return probe().exit_code == 0; }, std::chrono::seconds(20)));
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  // Nothing but health there.
  const CommandResult consume = RunCommand({CtlPath(), "--endpoint", health, "consume",
                                            "--dataset", "synth", "--reconnect-deadline-s", "2"});
  CHECK(consume.exit_code != 0);
  CHECK(daemon.Stop() == 0);
  CHECK(probe().exit_code == 2);  // gone with the daemon
}

}  // namespace
}  // namespace ringloader::testing
