// SPDX-License-Identifier: Apache-2.0
// Issue 17: a trainer's correctness through the real client and daemon: end of epoch, fork,
// checkpoints (tests/client/state_test.cc), deadlines, misuse, exact resize.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
using client::Batch;
using client::Client;
using client::Error;
using client::ErrorCode;
using client::Position;
using client::StreamOptions;
using Clock = std::chrono::steady_clock;

StreamOptions Small(uint32_t batch_size) {
  StreamOptions o;
  o.dataset = "synth";
  o.batch_size = batch_size;
  o.image_size = 32;
  o.shuffle = false;
  o.reconnect_deadline = std::chrono::seconds(20);
  return o;
}

// Reads the whole stream; checks that exactly one batch per epoch is marked last, that it is the
// epoch's final batch, and that its next() is where the following batch starts. Every epoch has
// `batches_per_epoch` batches, which is what the stream announced (its batches_per_epoch())
// when no sample is skipped, and at most that when some are (`skips`).
void ExpectOneLastPerEpoch(Client& client, const StreamOptions& options, uint64_t epochs,
                           uint64_t batches_per_epoch, bool skips = false) {
  auto stream = client.Open(options);
  if (skips) {
    CHECK(stream->batches_per_epoch() >= batches_per_epoch);
  } else {
    CHECK(stream->batches_per_epoch() == batches_per_epoch);
  }
  std::map<uint64_t, int> marked;
  std::map<uint64_t, uint64_t> batches;
  std::optional<Position> expected_next;
  bool previous_was_last = false;
  while (auto batch = stream->Next()) {
    const Position at = batch->position();
    if (expected_next) CHECK(at == *expected_next);
    if (previous_was_last) CHECK((at.sequence == 0 && at.cursor == 0));
    ++batches[at.epoch];
    if (batch->last_in_epoch()) {
      ++marked[at.epoch];
      CHECK(at.sequence + 1 == batches_per_epoch);
      CHECK(batch->next() == Position{at.epoch + 1, 0, 0});
    }
    previous_was_last = batch->last_in_epoch();
    expected_next = batch->next();
  }
  for (uint64_t e = 0; e < epochs; ++e) {
    INFO("epoch " << e);
    CHECK(batches[e] == batches_per_epoch);
    CHECK(marked[e] == 1);
  }
}

TEST_CASE("17.1: with drop_last, exactly one batch per epoch is marked last and points at the "
          "next epoch",
          "[integration][correctness]") {
  DaemonFixtureOptions fixture;
  fixture.images = 320;
  DaemonFixture daemon(fixture);
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  for (uint32_t rank = 0; rank < 3; ++rank) {
    INFO("rank " << rank);
    StreamOptions o = Small(10);
    o.world_size = 3;
    o.rank = rank;
    o.drop_last = true;
    o.shuffle = true;
    o.end_epoch = 2;
    // 320 samples over 3 ranks with drop_last: 106 each, 10 full batches, 6 dropped.
    ExpectOneLastPerEpoch(client, o, 2, 10);
  }
}

TEST_CASE("17.1: when the last files of the shard are bad, the last good batch is marked",
          "[integration][correctness]") {
  DaemonFixture daemon;
  for (int i = 0; i < 3; ++i) {
    WriteFile(daemon.dataset_root() + "/class_03/zz_bad_" + std::to_string(i) + ".jpg", "bad");
  }
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  for (bool drop_last : {false, true}) {
    INFO("drop_last " << drop_last);
    StreamOptions o = Small(10);
    o.drop_last = drop_last;
    o.end_epoch = 2;
    // 123 files in dataset order, the last 3 bad: 12 batches of 10, then nothing.
    ExpectOneLastPerEpoch(client, o, 2, 12, /*skips=*/true);
  }
}

TEST_CASE("17.2: whatever a forked child does with inherited objects, the parent keeps working "
          "and the child exits promptly",
          "[integration][correctness]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  for (const char* mode : {"destroy", "use", "use-late"}) {
    INFO(mode);
    // Under AddressSanitizer the child's exit would report what the parent's vanished threads
    // (gRPC's, the session's) had allocated: not leaks of the child's own.
    CommandResult r = RunCommand(
        {BuiltBinary("tests/integration/fork_client"), daemon.endpoint(), "synth", mode},
        {{"ASAN_OPTIONS", "detect_leaks=0"}}, std::chrono::seconds(60));
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK_THAT(r.output, Catch::Contains("parent: consumed 120 samples, second stream ok"));
    CHECK_THAT(r.output, Catch::Contains("child: destroyed the inherited objects"));
    if (std::string(mode) == "use") {
      CHECK_THAT(r.output, Catch::Contains("cannot be used after fork(): open a new Client"));
    }
  }
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
}

TEST_CASE("17.4: Open and Next give up within reconnect_deadline plus one backoff step and say "
          "how long they waited",
          "[integration][correctness]") {
  DaemonFixture daemon;
  StreamOptions o = Small(8);
  o.reconnect_deadline = std::chrono::seconds(2);
  {
    Client nobody("unix:" + daemon.dir() + "/none.sock");
    const auto start = Clock::now();
    try {
      nobody.Open(o);
      FAIL("opened without a daemon");
    } catch (const Error& e) {
      const auto took = Clock::now() - start;
      INFO(e.what());
      CHECK(e.code() == ErrorCode::kUnavailable);
      CHECK_THAT(e.what(), Catch::Contains("unreachable for 2"));
      CHECK(took >= std::chrono::seconds(2));
      CHECK(took < std::chrono::milliseconds(2800));
    }
  }
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  auto stream = client.Open(o);
  REQUIRE(stream->Next());
  CHECK(daemon.Stop() == 0);
  const auto start = Clock::now();
  try {
    while (stream->Next()) {
    }
    FAIL("the stream ended without its daemon");
  } catch (const Error& e) {
    const auto took = Clock::now() - start;
    INFO(e.what());
    CHECK(e.code() == ErrorCode::kUnavailable);
    CHECK_THAT(e.what(), Catch::Contains("unreachable for 2") &&
                             Catch::Contains("reconnect_deadline 2 s"));
    CHECK(took < std::chrono::milliseconds(2800));
  }
}

TEST_CASE("17.5: misuse gets a clear error: two threads on one Stream, a moved-from Batch, a huge "
          "dataset name, a memory_limit beyond the host",
          "[integration][correctness]") {
  DaemonFixtureOptions fixture;
  // The first sample's read hangs (for 3 s, the deadline): the first Next() waits meanwhile.
  fixture.server_extra = "decode_deadline_ms = 3000";
  fixture.memory_limit = "64TiB";  // more than any host here has
  fixture.env["RINGLOADER_FAILPOINTS"] = "action=hang;crash_on_path=class_00/img_000000.jpg";
  DaemonFixture daemon(fixture);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), Catch::Contains("server.memory_limit 64 TiB is more than"));

  Client client(daemon.endpoint());
  auto stream = client.Open(Small(8));
  std::optional<Batch> first;
  std::thread a([&] { first = stream->Next(); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // a is waiting for the hung batch
  try {
    stream->Next();
    FAIL("two threads in Next() at once");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kFailedPrecondition);
    CHECK_THAT(e.what(), Catch::Contains("a Stream is used by one thread at a time"));
  }
  a.join();
  REQUIRE(first.has_value());
  CHECK(first->size() == 8);

  Batch moved = std::move(*first);
  CHECK(moved.size() == 8);
  CHECK(first->size() == 0);  // NOLINT: use after move is the point
  CHECK(first->images().raw() == nullptr);
  CHECK(first->images().shape().empty());
  CHECK(first->sample_image(0) == nullptr);
  CHECK(first->relative_path(0).empty());
  CHECK_FALSE(first->last_in_epoch());

  StreamOptions huge = Small(8);
  huge.dataset = std::string(8192, 'x');
  try {
    client.Open(huge);
    FAIL("an unknown dataset opened");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
    CHECK(std::string(e.what()).size() < 400);
    CHECK_THAT(e.what(), Catch::Contains("(8192 bytes)"));
  }
}

TEST_CASE("17.6: resize exact is a per-stream option of the client and the CLI, deterministic "
          "and different from the fast path",
          "[integration][correctness]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  auto digests = [&](const std::string& resize) {
    const std::string out = daemon.dir() + "/" + resize + UniqueName("r") + ".tsv";
    CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8",
                                  "--image-size", "24", "--augment", "eval", "--no-shuffle",
                                  "--resize", resize, "--samples-out", out});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    std::vector<std::string> d;
    for (const SampleLine& l : ReadSamplesOut(out)) d.push_back(l.digest);
    return d;
  };
  const auto exact = digests("exact");
  CHECK(exact.size() == 120);
  CHECK(digests("exact") == exact);
  CHECK(digests("fast") != exact);

  Client client(daemon.endpoint());
  StreamOptions o = Small(8);
  o.resize = client::Resize::kExact;
  auto stream = client.Open(o);
  REQUIRE(stream->Next());
  CHECK_THAT(stream->State(), Catch::Contains(" resize=exact"));
  CHECK(client::ParseState(stream->State()).options.resize == client::Resize::kExact);
}

}  // namespace
}  // namespace ringloader::testing
