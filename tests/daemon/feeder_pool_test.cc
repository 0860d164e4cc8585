// SPDX-License-Identifier: Apache-2.0
// How much of each round a host leases to its feeders (FeederPool's Share), and how the rounds'
// leads steer it. No feeder answers here: the address is only dialled by a call, and none is
// started; the share is decided before any call.

#include "server/daemon/feeder_pool.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <memory>
#include <vector>

#include "server/daemon/memory_budget.h"
#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

using std::chrono::milliseconds;

struct Rig {
  // `feeder`: its one feeder's address; `lease_ms`: server.feeder_lease_ms.
  explicit Rig(bool local_decode, const std::string& feeder = "127.0.0.1:9",
               uint32_t lease_ms = 5'000) {
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
    config.server.feeder_lease_ms = lease_ms;
    config.feeders.push_back({feeder});  // an IP: present from the start
    auto started = FeederPool::Start(config, budget);
    REQUIRE(started.ok());
    pool = *std::move(started);
    view = Stream();
  }
  // Another stream of the dataset, of batches of `batch_size` at 224 px.
  std::unique_ptr<pipeline::RemoteDecode> Stream(uint32_t batch_size = 64) {
    v1::StreamSpec stream;
    stream.set_batch_size(batch_size);
    stream.set_image_size(224);
    return pool->ForStream("test", *dataset, stream, image::DecodeLimits{});
  }
  testing::TempDir dir;
  std::unique_ptr<pipeline::Dataset> dataset;
  DaemonConfig config;
  MemoryBudget budget{1ull << 30};
  std::unique_ptr<FeederPool> pool;
  std::unique_ptr<pipeline::RemoteDecode> view;
};

// Samples of rounds to come decoded on the host (batch_filler's DecodedAhead), held by a view.
class HostDecoded final : public pipeline::RemoteCall {
 public:
  explicit HostDecoded(uint64_t n) {
    for (uint64_t i = 0; i < n; ++i) indices_.push_back(i);
  }
  const std::vector<uint64_t>& indices() const override { return indices_; }
  std::optional<absl::Status> Wait(milliseconds) override { return absl::OkStatus(); }
  bool Answered() const override { return true; }
  bool DecodedHere() const override { return true; }
  uint32_t count() const override { return static_cast<uint32_t>(indices_.size()); }
  pipeline::AnswerView payload() const override { return {}; }
  void Accept(uint32_t) override {}
  void Reject(const absl::Status&) override {}

 private:
  std::vector<uint64_t> indices_;
};

TEST_CASE("FeederPool: a shared round's lease follows the host's lead: more when the host fell "
          "behind, less when it waited, within bounds",
          "[feeder]") {
  Rig rig(/*local_decode=*/true);
  pipeline::RemoteDecode& view = *rig.view;
  view.LocalDone(1000, std::chrono::seconds(1));  // this host: 1000 samples/s
  // Nothing measured of the feeder: taken as fast as this host, half the round.
  CHECK(view.Share(64) == 32);
  // 16 of the round decoded in it (none ahead): a lead of -1/4 round, 1/2 short of the 1/4 aimed
  // at. The dataset's fraction gains 1% of that (0.505), this stream's share 5% more (0.53).
  view.RoundEnded(64, 16, milliseconds(0));
  CHECK(view.Share(64) == 34);
  // 16 samples of rounds to come held, decoded here: the lead aimed at, nothing more to add.
  view.Keep(0, std::make_unique<HostDecoded>(16));
  view.RoundEnded(64, 0, milliseconds(0));
  CHECK(view.Share(64) == 32);  // 0.505
  // Then waited 32 ms, 32 samples this host could have decoded: a lead of 3/4 round.
  view.RoundEnded(64, 0, milliseconds(32));
  CHECK(view.Share(64) == 30);  // 0.50 - 0.025
  // Another stream of the dataset shares its fraction, not this stream's latest lead.
  auto second = rig.Stream();
  CHECK(second->Share(64) == 32);
  for (int i = 0; i < 200; ++i) view.RoundEnded(64, 64, milliseconds(0));
  CHECK(view.Share(64) == 63);  // at most 98%: this host's threads keep a part
  CHECK(view.Share(1000) == 980);
  for (int i = 0; i < 200; ++i) view.RoundEnded(64, 0, milliseconds(64));
  CHECK(view.Share(64) == 1);  // at least 2%: the feeders stay measured
  CHECK(view.Share(1000) == 20);
}

TEST_CASE("FeederPool: a dataset's streams together steer its fraction as fast as one stream "
          "does, however many they are",
          "[feeder]") {
  Rig rig(/*local_decode=*/true);
  rig.view->LocalDone(1000, std::chrono::seconds(1));
  std::vector<std::unique_ptr<pipeline::RemoteDecode>> streams;
  for (int i = 0; i < 3; ++i) streams.push_back(rig.Stream());
  CHECK(rig.view->Share(1000) == 500);
  // Each of the four streams ends a round a quarter of a round behind (lead error -1/2): the
  // fraction gains 1% of 1/2 for the rounds of all four, not four times that (0.52); each
  // stream's own share 5% of its latest error more.
  rig.view->RoundEnded(64, 16, milliseconds(0));
  for (auto& stream : streams) stream->RoundEnded(64, 16, milliseconds(0));
  CHECK(rig.view->Share(1000) == 530);  // 0.505 + 0.025
  CHECK(streams[2]->Share(1000) == 530);
  // Three streams gone: the one left steers alone, at the full step.
  streams.clear();
  rig.view->RoundEnded(64, 16, milliseconds(0));
  CHECK(rig.view->Share(1000) == 535);  // 0.51 + 0.025
}

TEST_CASE("FeederPool: a stream of the dataset that does not steer (idle, paused) stops counting "
          "once twice the streams' steers passed without it, and the one reading steers at the "
          "full step",
          "[feeder]") {
  Rig rig(/*local_decode=*/true);
  rig.view->LocalDone(1000, std::chrono::seconds(1));
  const std::unique_ptr<pipeline::RemoteDecode> idle = rig.Stream();
  CHECK(rig.view->Share(1000) == 500);
  // Each round a quarter of a round behind (lead error -1/2: the fraction gains 1% of 1/2 a
  // round, and the stream's share 2.5% more). Two streams: the idle one counts for the first
  // three (it came within the last four steers), then not: 0.5 + 3 x 0.0025 + 7 x 0.005.
  const auto near = [](uint64_t share, uint64_t expected) {  // (of 10,000: rounding aside)
    return share + 1 >= expected && share <= expected + 1;
  };
  for (int i = 0; i < 10; ++i) rig.view->RoundEnded(64, 16, milliseconds(0));
  CHECK(near(rig.view->Share(10'000), 5'675));  // counted all along, 0.525 + 0.025: 5,500
  CHECK(near(idle->Share(10'000), 5'425));      // (its own lead error is none yet)
  // It reads again: both steer, each at half the step.
  idle->RoundEnded(64, 16, milliseconds(0));
  rig.view->RoundEnded(64, 16, milliseconds(0));
  CHECK(near(rig.view->Share(10'000), 5'725));  // 0.5425 + 2 x 0.0025 + 0.025
}

TEST_CASE("FeederPool: a stream steering at a quarter of another's pace still counts between its "
          "rounds",
          "[feeder]") {
  // Batches of 256 beside batches of 64: four rounds of one to each of the other's. Counted by
  // the streams' number alone (twice two steers), the slow one dropped out before each of its
  // rounds, and the fast one's fourth steer moved the fraction at the full step.
  Rig rig(/*local_decode=*/true);
  rig.view->LocalDone(1000, std::chrono::seconds(1));
  const std::unique_ptr<pipeline::RemoteDecode> slow = rig.Stream(/*batch_size=*/256);
  const auto cycle = [&] {  // each round a quarter of a round behind: lead error -1/2
    slow->RoundEnded(256, 64, milliseconds(0));
    for (int i = 0; i < 4; ++i) rig.view->RoundEnded(64, 16, milliseconds(0));
  };
  cycle();  // (the slow stream's pace is known from its second round on)
  const int64_t before = static_cast<int64_t>(rig.view->Share(10'000));
  cycle();
  cycle();
  // Ten steers, each by half of 1% of 1/2: 0.025 of the fraction (0.03 when the slow stream
  // dropped out of the count before each of its rounds).
  const int64_t moved = static_cast<int64_t>(rig.view->Share(10'000)) - before;
  CHECK(moved >= 248);
  CHECK(moved <= 252);
}

TEST_CASE("FeederPool: a call past its lease reads as answered (the filler stops decoding ahead "
          "for it), and Wait gives it up at once",
          "[feeder]") {
  // A feeder that takes the connection and never says a word (not even HTTP/2's preface).
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(listener >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  REQUIRE(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(::listen(listener, 8) == 0);
  REQUIRE(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
  const std::string silent = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  {
    Rig rig(/*local_decode=*/true, silent, /*lease_ms=*/2'000);
    rig.view->LocalDone(1000, std::chrono::seconds(1));
    const uint64_t index = 0;
    std::vector<std::unique_ptr<pipeline::RemoteCall>> calls =
        rig.view->Start(0, std::span<const uint64_t>(&index, 1));
    REQUIRE(calls.size() == 1);
    CHECK_FALSE(calls[0]->Answered());  // within its lease, nothing came
    CHECK(testing::WaitFor([&] { return calls[0]->Answered(); }, std::chrono::seconds(30)));
    const auto asked = std::chrono::steady_clock::now();
    const std::optional<absl::Status> status = calls[0]->Wait(std::chrono::seconds(10));
    REQUIRE(status);
    CHECK(status->code() == absl::StatusCode::kDeadlineExceeded);
    // Given up at its lease, not when the RPC's own deadline (a second later) ended it.
    CHECK_THAT(std::string(status->message()), Catch::Contains("server.feeder_lease_ms"));
    CHECK(std::chrono::steady_clock::now() - asked < std::chrono::seconds(5));  // not waited out
  }
  ::close(listener);
}

TEST_CASE("FeederPool: with local_decode = false every round is leased whole, whatever it waited",
          "[feeder]") {
  Rig rig(/*local_decode=*/false);
  pipeline::RemoteDecode& view = *rig.view;
  CHECK(view.Share(64) == 64);
  for (int i = 0; i < 50; ++i) view.RoundEnded(64, 0, milliseconds(40));
  CHECK(view.Share(64) == 64);
}

}  // namespace
}  // namespace ringloader::server
