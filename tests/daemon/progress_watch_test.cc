// SPDX-License-Identifier: Apache-2.0
// ProgressWatch: which decode is stuck, and the decode-latency histogram.
#include "server/daemon/progress_watch.h"

#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

namespace ringloader::server {
namespace {

using std::chrono::milliseconds;

TEST_CASE("ProgressWatch: a decode running past stuck_after is stuck, the longest one is named, "
          "and one that ends is not",
          "[daemon][watchdog]") {
  ProgressWatch watch(3, milliseconds(50));
  const std::string train = "train";
  const std::string val = "val";
  const auto now = [] { return std::chrono::steady_clock::now(); };
  CHECK_FALSE(watch.Stuck(now()).has_value());  // idle
  watch.Begin(0, train, 17);
  CHECK_FALSE(watch.Stuck(now()).has_value());  // not yet
  std::this_thread::sleep_for(milliseconds(30));
  watch.Begin(2, val, 4);
  std::this_thread::sleep_for(milliseconds(30));
  // Worker 0 has run ~60 ms, worker 2 ~30 ms.
  std::optional<StuckSample> stuck = watch.Stuck(now());
  REQUIRE(stuck.has_value());
  CHECK(stuck->dataset == "train");
  CHECK(stuck->sample_index == 17);
  CHECK(stuck->running >= milliseconds(50));
  // Later both are stuck: still the longest first.
  stuck = watch.Stuck(now() + milliseconds(100));
  REQUIRE(stuck.has_value());
  CHECK(stuck->sample_index == 17);
  watch.End(0);
  stuck = watch.Stuck(now() + milliseconds(100));
  REQUIRE(stuck.has_value());
  CHECK(stuck->dataset == "val");
  watch.End(2);
  CHECK_FALSE(watch.Stuck(now() + milliseconds(100)).has_value());
  // Worker ids past the pool are ignored, not a crash.
  watch.Begin(7, train, 1);
  watch.End(7);
}

TEST_CASE("ProgressWatch: stuck_after 0 (no decode deadline) never calls anything stuck",
          "[daemon][watchdog]") {
  ProgressWatch watch(1, milliseconds(0));
  const std::string train = "train";
  watch.Begin(0, train, 1);
  CHECK_FALSE(watch.Stuck(std::chrono::steady_clock::now() + std::chrono::hours(24)).has_value());
}

TEST_CASE("ProgressWatch: each finished decode lands in exactly one latency bucket",
          "[daemon][watchdog][metrics]") {
  ProgressWatch watch(1, milliseconds(1000));
  const std::string train = "train";
  for (int i = 0; i < 3; ++i) {
    watch.Begin(0, train, i);
    watch.End(0);  // well under 1 ms
  }
  watch.Begin(0, train, 3);
  std::this_thread::sleep_for(milliseconds(30));  // in (25 ms, 50 ms] unless the machine stalls
  watch.End(0);
  watch.End(0);  // a second End without Begin records nothing
  const LatencySnapshot s = watch.latency();
  CHECK(s.count == 4);
  CHECK(s.counts[0] == 3);  // <= 1 ms
  uint64_t slower = 0;
  for (size_t i = 5; i < s.counts.size(); ++i) slower += s.counts[i];  // > 25 ms
  CHECK(slower == 1);
  CHECK(s.sum_seconds >= 0.030);
}

}  // namespace
}  // namespace ringloader::server
