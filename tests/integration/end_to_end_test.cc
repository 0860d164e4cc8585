// SPDX-License-Identifier: Apache-2.0
// Issue 4: a real ringloaderd on a temp socket, read through the C++ client and through
// `ringloaderctl consume`.
#include <catch2/catch.hpp>
#include <xxhash.h>

#include <algorithm>
#include <future>
#include <map>
#include <set>
#include <thread>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

struct Delivered {
  uint64_t epoch;
  int64_t index;
  int64_t label;
  uint64_t digest;
};

std::vector<Delivered> ReadAll(const std::string& endpoint, client::StreamOptions options) {
  client::Client c(endpoint);
  auto stream = c.Open(options);
  std::vector<Delivered> out;
  while (auto batch = stream->Next()) {
    const int64_t* labels = batch->labels().data<int64_t>();
    const int64_t* indices = batch->indices().data<int64_t>();
    for (uint32_t i = 0; i < batch->size(); ++i) {
      out.push_back({batch->position().epoch, indices[i], labels[i],
                     XXH64(batch->sample_image(i), batch->sample_image_bytes(), 0)});
    }
  }
  return out;
}

client::StreamOptions SmallStream(uint64_t seed) {
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 16;
  o.image_size = 48;
  o.seed = seed;
  o.end_epoch = 2;
  o.client_name = "end_to_end_test";
  return o;
}

}  // namespace

TEST_CASE("C++ client: 2 epochs deliver every sample exactly once per epoch, deterministically",
          "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  const std::vector<Delivered> run1 = ReadAll(daemon.endpoint(), SmallStream(11));
  const std::vector<Delivered> run2 = ReadAll(daemon.endpoint(), SmallStream(11));
  const std::vector<Delivered> other_seed = ReadAll(daemon.endpoint(), SmallStream(12));

  REQUIRE(run1.size() == 2 * 120);
  for (uint64_t epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    for (const Delivered& d : run1) {
      if (d.epoch == epoch) seen.insert(d.index);
    }
    CHECK(seen.size() == 120);
    CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == 120);
  }
  // Two epochs are shuffled differently.
  CHECK(!std::equal(run1.begin(), run1.begin() + 120, run1.begin() + 120,
                    [](const Delivered& a, const Delivered& b) { return a.index == b.index; }));
  // Same seed: the same samples in the same order with the same bytes.
  REQUIRE(run2.size() == run1.size());
  for (size_t i = 0; i < run1.size(); ++i) {
    CHECK(run1[i].index == run2[i].index);
    CHECK(run1[i].digest == run2[i].digest);
  }
  // Another seed: another order and other augmentation.
  REQUIRE(other_seed.size() == run1.size());
  size_t same_digest = 0;
  for (size_t i = 0; i < run1.size(); ++i) same_digest += run1[i].digest == other_seed[i].digest;
  CHECK(same_digest < run1.size() / 10);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("C++ client: labels match the class folders", "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  client::StreamOptions o = SmallStream(3);
  o.end_epoch = 1;
  auto stream = c.Open(o);
  size_t checked = 0;
  // Labels through the client; paths through the CLI's samples-out below. Here: label == the
  // index's class, known from the dataset's sorted order (120 images over 4 classes, 30 each).
  while (auto batch = stream->Next()) {
    CHECK(batch->images().shape() == std::vector<int64_t>{batch->size(), 48, 48, 3});
    for (uint32_t i = 0; i < batch->size(); ++i) {
      const int64_t index = batch->indices().data<int64_t>()[i];
      CHECK(batch->labels().data<int64_t>()[i] == index / 30);
      ++checked;
    }
  }
  CHECK(checked == 120);
}

TEST_CASE("ringloaderctl consume: samples-out lists each sample once per epoch, same seed same "
          "digests, labels match folders",
          "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  auto consume = [&](const std::string& out, const std::string& seed) {
    return daemon.Ctl({"consume", "--dataset", "synth", "--epochs", "2", "--batch-size", "16",
                       "--image-size", "48", "--seed", seed, "--samples-out", out});
  };
  CommandResult a = consume(daemon.dir() + "/a.tsv", "5");
  CommandResult b = consume(daemon.dir() + "/b.tsv", "5");
  CommandResult c = consume(daemon.dir() + "/c.tsv", "6");
  REQUIRE(a.exit_code == 0);
  REQUIRE(b.exit_code == 0);
  REQUIRE(c.exit_code == 0);
  CHECK_THAT(a.output, Catch::Contains("consumed 240 samples in 16 batches over 2 epochs:"));
  CHECK_THAT(a.output, Catch::Contains("images/s"));

  std::vector<SampleLine> la = ReadSamplesOut(daemon.dir() + "/a.tsv");
  std::vector<SampleLine> lb = ReadSamplesOut(daemon.dir() + "/b.tsv");
  std::vector<SampleLine> lc = ReadSamplesOut(daemon.dir() + "/c.tsv");
  REQUIRE(la.size() == 240);
  std::map<uint64_t, std::set<uint64_t>> per_epoch;
  for (const SampleLine& s : la) {
    CHECK(per_epoch[s.epoch].insert(s.sample_index).second);  // no repeat within an epoch
    CHECK(s.label == DaemonFixture::LabelOfPath(s.path));
    CHECK(s.digest.size() == 16);
  }
  CHECK(per_epoch[0].size() == 120);
  CHECK(per_epoch[1].size() == 120);
  CHECK(ReadFile(daemon.dir() + "/a.tsv") == ReadFile(daemon.dir() + "/b.tsv"));
  REQUIRE(lc.size() == la.size());
  size_t same = 0;
  for (size_t i = 0; i < la.size(); ++i) same += la[i].digest == lc[i].digest;
  CHECK(same < la.size() / 10);
}

TEST_CASE("4 clients as ranks 0..3 of world size 4 in parallel: disjoint and complete",
          "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  std::vector<std::future<std::vector<Delivered>>> ranks;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    ranks.push_back(std::async(std::launch::async, [&, rank] {
      client::StreamOptions o = SmallStream(21);
      o.rank = rank;
      o.world_size = 4;
      o.batch_size = 8;
      o.end_epoch = 1;
      return ReadAll(daemon.endpoint(), o);
    }));
  }
  std::map<int64_t, int> owner;
  for (uint32_t rank = 0; rank < 4; ++rank) {
    std::vector<Delivered> got = ranks[rank].get();
    CHECK(got.size() == 30);
    for (const Delivered& d : got) {
      auto [it, inserted] = owner.emplace(d.index, static_cast<int>(rank));
      CHECK(inserted);  // no sample reaches two ranks
    }
  }
  CHECK(owner.size() == 120);
}

TEST_CASE("health: SERVING while up (exit 0) and unreachable without a daemon (exit 2)",
          "[integration]") {
  DaemonFixture daemon;
  CommandResult down = daemon.Ctl({"health", "--timeout", "1"});
  CHECK(down.exit_code == 2);
  CHECK(std::count(down.output.begin(), down.output.end(), '\n') == 1);
  REQUIRE(daemon.Start());
  CommandResult up = daemon.Ctl({"health"});
  CHECK(up.exit_code == 0);
  CHECK_THAT(up.output, Catch::StartsWith("SERVING"));
  CHECK(daemon.Stop() == 0);
  CHECK(daemon.Ctl({"health", "--timeout", "1"}).exit_code == 2);
}

TEST_CASE("an unknown dataset is NOT_FOUND naming it, and the daemon keeps serving",
          "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  client::StreamOptions o = SmallStream(1);
  o.dataset = "nope";
  try {
    c.Open(o);
    FAIL("Open of an unknown dataset succeeded");
  } catch (const client::Error& e) {
    CHECK(e.code() == client::ErrorCode::kNotFound);
    CHECK_THAT(e.what(), Catch::Contains("unknown dataset \"nope\"") && Catch::Contains("synth"));
  }
  CommandResult ctl = daemon.Ctl({"consume", "--dataset", "nope", "--max-batches", "1"});
  CHECK(ctl.exit_code == 1);
  CHECK_THAT(ctl.output, Catch::Contains("unknown dataset \"nope\""));
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
}

TEST_CASE("stats report served batches, decoded images and the stream", "[integration]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  auto stream = c.Open(SmallStream(2));
  auto batch = stream->Next();
  REQUIRE(batch.has_value());
  CommandResult stats = daemon.Ctl({"stats", "--json"});
  REQUIRE(stats.exit_code == 0);
  CHECK_THAT(stats.output, Catch::Contains("\"streamsOpen\"") || Catch::Contains("\"streams_open\""));
  CHECK_THAT(stats.output, Catch::Contains("\"synth\""));
  CommandResult human = daemon.Ctl({"stats"});
  CHECK(human.exit_code == 0);
  CHECK_THAT(human.output, Catch::Contains("images decoded"));
}

}  // namespace ringloader::testing
