// SPDX-License-Identifier: Apache-2.0
// How much of each round a host leases to its feeders (FeederPool's Share), and how the rounds'
// waits steer it. No feeder answers here: the address is only dialled by a call, and none is
// started; the share is decided before any call.

#include "server/daemon/feeder_pool.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <memory>

#include "server/daemon/memory_budget.h"
#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

using std::chrono::milliseconds;

struct Rig {
  explicit Rig(bool local_decode) {
    std::filesystem::create_directories(dir.Join("a"));
    testing::WriteFile(dir.Join("a/0.jpg"), "not decoded here");
    pipeline::DatasetSpec spec;
    spec.name = "test";
    spec.root = dir.path();
    auto opened = pipeline::Dataset::Open(spec);
    REQUIRE(opened.ok());
    dataset = *std::move(opened);
    config.server.local_decode = local_decode;
    config.server.insecure_tcp = true;
    config.feeders.push_back({"127.0.0.1:9"});  // an IP: present from the start
    auto started = FeederPool::Start(config, budget);
    REQUIRE(started.ok());
    pool = *std::move(started);
    v1::StreamSpec stream;
    stream.set_batch_size(64);
    stream.set_image_size(224);
    view = pool->ForStream("test", *dataset, stream, image::DecodeLimits{});
  }
  testing::TempDir dir;
  std::unique_ptr<pipeline::Dataset> dataset;
  DaemonConfig config;
  MemoryBudget budget{1ull << 30};
  std::unique_ptr<FeederPool> pool;
  std::unique_ptr<pipeline::RemoteDecode> view;
};

TEST_CASE("FeederPool: a shared round's lease grows while the rounds do not wait for feeders, "
          "shrinks faster when they do, and stays within bounds",
          "[feeder]") {
  Rig rig(/*local_decode=*/true);
  pipeline::RemoteDecode& view = *rig.view;
  // Nothing measured: a feeder is taken as fast as this host, half the round.
  CHECK(view.Share(64) == 32);
  view.RoundWaited(milliseconds(0), milliseconds(40));  // answers were in: lease more
  CHECK(view.Share(64) == 33);
  view.RoundWaited(milliseconds(1), milliseconds(40));  // 2.4% of the round: still balanced
  CHECK(view.Share(64) == 33);
  view.RoundWaited(milliseconds(2), milliseconds(40));  // 4.8%: neither more nor less
  CHECK(view.Share(64) == 33);
  view.RoundWaited(milliseconds(20), milliseconds(40));  // a third of the round: 3 steps less
  CHECK(view.Share(64) == 31);
  for (int i = 0; i < 200; ++i) view.RoundWaited(milliseconds(0), milliseconds(40));
  CHECK(view.Share(64) == 63);  // at most 98%: this host's threads keep a part
  CHECK(view.Share(1000) == 980);
  for (int i = 0; i < 200; ++i) view.RoundWaited(milliseconds(40), milliseconds(40));
  CHECK(view.Share(64) == 1);  // at least 2%: the feeders stay measured
  CHECK(view.Share(1000) == 20);
}

TEST_CASE("FeederPool: with local_decode = false every round is leased whole, whatever it waited",
          "[feeder]") {
  Rig rig(/*local_decode=*/false);
  pipeline::RemoteDecode& view = *rig.view;
  CHECK(view.Share(64) == 64);
  for (int i = 0; i < 50; ++i) view.RoundWaited(milliseconds(40), milliseconds(1));
  CHECK(view.Share(64) == 64);
}

}  // namespace
}  // namespace ringloader::server
