// SPDX-License-Identifier: Apache-2.0
// Issue 16: a trainer's habits through the real client and daemon: batches it keeps, pauses,
// deadlines and cancellation, mistaken sizes.
#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "tests/integration/batch_hash.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

using client::Batch;
using client::Client;
using client::Error;
using client::ErrorCode;
using client::StreamOptions;
using Clock = std::chrono::steady_clock;

StreamOptions Small() {
  StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 8;
  o.image_size = 32;
  o.shuffle = false;
  return o;
}

uint64_t CopiedOut(const std::string& endpoint) {
  auto stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(endpoint)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::GetStatsResponse stats;
  REQUIRE(stub->GetStats(&context, v1::GetStatsRequest(), &stats).ok());
  return stats.batches_copied_out();
}

// Two epochs of 15 batches in a 4-slot ring, hashed in order; `each` sees every batch and may
// keep it (move it away).
std::vector<size_t> ReadTwoEpochs(Client& client, StreamOptions options,
                                  const std::function<void(std::optional<Batch>&)>& each,
                                  uint64_t* copies) {
  options.end_epoch = 2;
  auto stream = client.Open(options);
  std::vector<size_t> hashes;
  while (true) {
    // A stalled stream fails here instead of hanging the test.
    std::optional<Batch> batch = stream->Next(std::chrono::seconds(20));
    if (!batch) break;
    hashes.push_back(HashOf(*batch));
    each(batch);
  }
  *copies = stream->copies();
  return hashes;
}

TEST_CASE("16.1: holding any number of batches never stalls a stream, held batches keep their "
          "bytes and addresses, and holding nothing copies nothing",
          "[integration][habits]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  StreamOptions options = Small();
  options.ring_slots = 4;
  uint64_t copies = 0;

  // A trainer that lets each batch go: no copies, anywhere.
  const std::vector<size_t> reference =
      ReadTwoEpochs(client, options, [](std::optional<Batch>&) {}, &copies);
  REQUIRE(reference.size() == 30);
  CHECK(copies == 0);
  CHECK(CopiedOut(daemon.endpoint()) == 0);

  SECTION("keeping every batch: all 30 stay valid at their addresses in a 4-slot ring") {
    struct Kept {
      Batch batch;
      const void* images;
      size_t hash;
    };
    std::vector<Kept> kept;
    const std::vector<size_t> hashes = ReadTwoEpochs(
        client, options,
        [&](std::optional<Batch>& b) {
          const void* at = b->images().raw();
          const size_t hash = HashOf(*b);
          kept.push_back({*std::move(b), at, hash});
        },
        &copies);
    CHECK(hashes == reference);
    REQUIRE(kept.size() == 30);
    for (const Kept& k : kept) {
      CHECK(k.batch.images().raw() == k.images);  // the same addresses...
      CHECK(HashOf(k.batch) == k.hash);            // ...and the same bytes, after 28 copy-outs
    }
    CHECK(copies == 28);  // all but the 2 that may stay in the ring
    CHECK(CopiedOut(daemon.endpoint()) == 28);
  }

  SECTION("Batch::Detach moves a kept batch out at once: same bytes and address, slot given back") {
    std::vector<std::pair<Batch, size_t>> kept;
    const std::vector<size_t> hashes = ReadTwoEpochs(
        client, options,
        [&](std::optional<Batch>& b) {
          const void* at = b->images().raw();
          const size_t hash = HashOf(*b);
          b->Detach();
          b->Detach();  // a second time does nothing
          CHECK(b->images().raw() == at);
          kept.emplace_back(*std::move(b), hash);
        },
        &copies);
    CHECK(hashes == reference);
    REQUIRE(kept.size() == 30);
    for (const auto& [batch, hash] : kept) CHECK(HashOf(batch) == hash);
    CHECK(copies == 30);  // every one by Detach, none left for Next() to copy
    CHECK(CopiedOut(daemon.endpoint()) == 30);
  }

  SECTION("keeping each 2nd batch for 3 steps, and the previous one while asking for the next") {
    std::vector<std::pair<int, Batch>> recent;  // (step kept, batch)
    std::optional<Batch> previous;
    int step = 0;
    const std::vector<size_t> hashes = ReadTwoEpochs(
        client, options,
        [&](std::optional<Batch>& b) {
          ++step;
          std::erase_if(recent, [&](const auto& r) { return step - r.first > 3; });
          for (const auto& r : recent) CHECK(r.second.size() == 8);
          if (step % 2 == 0) {
            recent.emplace_back(step, std::move(*b));
          } else {
            previous = std::move(b);  // alive during the next Next(), like a Python loop variable
          }
        },
        &copies);
    CHECK(hashes == reference);
  }

  SECTION("a 2-slot ring with one batch kept for ever copies it once") {
    options.ring_slots = 2;
    const std::vector<size_t> reference2 =
        ReadTwoEpochs(client, options, [](std::optional<Batch>&) {}, &copies);
    CHECK(copies == 0);
    std::optional<Batch> first, previous;
    const std::vector<size_t> hashes = ReadTwoEpochs(
        client, options,
        [&](std::optional<Batch>& b) {
          if (!first) {
            first = std::move(b);
          } else {
            previous = std::move(b);
          }
        },
        &copies);
    CHECK(hashes == reference2);
    CHECK(copies == 1);
    CHECK(first->position().sequence == 0);
  }
}

TEST_CASE("Stream says its epoch's size, and HealthStatus says SERVING or why nothing answers",
          "[integration][habits]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  CHECK(client::HealthStatus(daemon.endpoint(), std::chrono::seconds(5)) == "SERVING");
  const std::string nowhere = "unix:" + daemon.dir() + "/nobody.sock";
  CHECK_THROWS_MATCHES(client::HealthStatus(nowhere, std::chrono::milliseconds(300)), Error,
                       Catch::Predicate<Error>([&](const Error& e) {
                         return e.code() == ErrorCode::kUnavailable &&
                                std::string(e.what()).find("nobody.sock") != std::string::npos;
                       }));
  Client client(daemon.endpoint());
  StreamOptions options = Small();
  options.world_size = 2;
  options.rank = 1;
  auto stream = client.Open(options);
  CHECK(stream->dataset_size() == 120);
  CHECK(stream->samples_per_epoch() == 60);
  CHECK(stream->batches_per_epoch() == 8);  // 7 full batches and one of 4
}

TEST_CASE("16.1: writable batches can be written in place, and the writes never reach the ring "
          "or a later batch",
          "[integration][habits]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  StreamOptions options = Small();
  options.ring_slots = 4;
  uint64_t copies = 0;
  const std::vector<size_t> reference =
      ReadTwoEpochs(client, options, [](std::optional<Batch>&) {}, &copies);
  options.writable_batches = true;
  std::optional<Batch> kept;
  const std::vector<size_t> hashes = ReadTwoEpochs(
      client, options,
      [&](std::optional<Batch>& b) {
        auto* images = static_cast<uint8_t*>(const_cast<void*>(b->images().raw()));
        std::memset(images, 0xff, b->images().bytes());  // what x.mul_(0).add_(255) would do
        CHECK(images[b->images().bytes() - 1] == 0xff);
        if (b->position().sequence == 3) kept = std::move(b);  // written, then copied out
      },
      &copies);
  // Hashed before the write: every batch, in every reused slot, is the daemon's bytes.
  CHECK(hashes == reference);
  REQUIRE(kept);
  const auto* images = kept->images().data<uint8_t>();
  CHECK(images[0] == 0xff);  // the kept batch keeps the trainer's writes
  CHECK(images[kept->images().bytes() - 1] == 0xff);
}

TEST_CASE("16.2: a paused trainer keeps its stream past the idle timeout and resumes from the "
          "full ring",
          "[integration][habits]") {
  DaemonFixtureOptions fixture;
  fixture.server_extra = "stream_idle_timeout_ms = 300";
  DaemonFixture daemon(fixture);
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  auto stream = client.Open(Small());
  REQUIRE(stream->Next());
  std::this_thread::sleep_for(std::chrono::milliseconds(2000));  // > 6 idle timeouts
  CHECK_THAT(daemon.Log(), !Catch::Contains("closed: no request"));
  const auto start = Clock::now();
  REQUIRE(stream->Next());
  CHECK(Clock::now() - start < std::chrono::milliseconds(200));  // ready in the ring
  CHECK(stream->reconnects() == 0);
}

TEST_CASE("16.3: Next(timeout) gives up in time while reconnecting to a dead daemon, the next call "
          "goes on reconnecting, and reconnect_deadline still counts from the outage",
          "[integration][habits]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  StreamOptions options = Small();
  // Far past the outage this test makes, however slowly a loaded machine restarts the daemon:
  // that the deadline counts from the outage is checked below with a short one.
  options.reconnect_deadline = std::chrono::minutes(10);
  auto stream = client.Open(options);
  REQUIRE(stream->Next(std::chrono::seconds(20)));
  daemon.process().Kill(SIGKILL);
  daemon.process().Wait();
  const auto first_outage = Clock::now();
  // Dead: each call gives up after its own timeout (not after reconnect_deadline) and says why.
  int gave_up = 0;
  for (int i = 0; i < 3; ++i) {
    const auto start = Clock::now();
    try {
      (void)stream->Next(std::chrono::milliseconds(300));
      FAIL("a batch from a dead daemon");
    } catch (const Error& e) {
      CHECK(e.code() == ErrorCode::kDeadlineExceeded);
      if (i > 0) CHECK_THAT(std::string(e.what()), Catch::Contains("reconnecting to ringloaderd"));
      ++gave_up;
    }
    CHECK(Clock::now() - start < std::chrono::seconds(5));
  }
  CHECK(gave_up == 3);
  // Back: the next call reconnects and returns exactly the next batch.
  REQUIRE(daemon.Start());
  const auto restarted = Clock::now();
  std::optional<Batch> next;
  while (!next && Clock::now() - restarted < std::chrono::seconds(60)) {
    try {
      next = stream->Next(std::chrono::milliseconds(300));
    } catch (const Error& e) {
      using Seconds = std::chrono::duration<double>;
      INFO("outage " << Seconds(Clock::now() - first_outage).count() << " s, restarted "
                     << Seconds(restarted - first_outage).count() << " s after it: " << e.what());
      REQUIRE(e.code() == ErrorCode::kDeadlineExceeded);
    }
  }
  REQUIRE(next);
  CHECK(next->position().sequence == 1);
  CHECK(stream->reconnects() >= 1);

  // Gone for good: sliced waits still end in kUnavailable once reconnect_deadline has passed.
  StreamOptions short_deadline = Small();
  short_deadline.reconnect_deadline = std::chrono::seconds(2);
  auto doomed = client.Open(short_deadline);
  REQUIRE(doomed->Next(std::chrono::seconds(20)));
  daemon.process().Kill(SIGKILL);
  daemon.process().Wait();
  const auto outage = Clock::now();
  ErrorCode last = ErrorCode::kDeadlineExceeded;
  while (last == ErrorCode::kDeadlineExceeded && Clock::now() - outage < std::chrono::seconds(30)) {
    try {
      (void)doomed->Next(std::chrono::milliseconds(200));
    } catch (const Error& e) {
      last = e.code();
    }
  }
  CHECK(last == ErrorCode::kUnavailable);
  CHECK(Clock::now() - outage < std::chrono::seconds(10));
  // The stream is not lost (and never touches the unmapped ring): once the daemon is back, the
  // next call reconnects and returns exactly the next batch.
  REQUIRE(daemon.Start());
  std::optional<Batch> after = doomed->Next(std::chrono::seconds(20));
  REQUIRE(after);
  CHECK(after->position().sequence == 1);
}

TEST_CASE("16.3: Next(timeout) gives up in time and the stream goes on, and cancelled waits free "
          "their server handler at once",
          "[integration][habits]") {
  DaemonFixtureOptions fixture;
  // The first sample's read hangs until the decode deadline: nothing is ready for ~3 s.
  fixture.server_extra = "decode_deadline_ms = 3000\nmax_streams = 2";
  fixture.env["RINGLOADER_FAILPOINTS"] = "action=hang;crash_on_path=class_00/img_000000.jpg";
  DaemonFixture daemon(fixture);
  REQUIRE(daemon.Start());
  Client client(daemon.endpoint());
  auto stream = client.Open(Small());
  const auto start = Clock::now();
  try {
    stream->Next(std::chrono::milliseconds(300));
    FAIL("a batch came although none could be ready");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDeadlineExceeded);
    CHECK_THAT(e.what(), Catch::Contains("no batch within 300 ms"));
  }
  const auto took = Clock::now() - start;
  CHECK(took >= std::chrono::milliseconds(300));
  CHECK(took < std::chrono::milliseconds(1000));

  // Many raw waits cancelled by their client's deadline, one after the other on the same stream:
  // each handler is gone at once (a waiting one would refuse the next "already waiting"), and
  // the daemon keeps answering.
  auto stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(daemon.endpoint())));
  v1::OpenStreamRequest open;
  open.mutable_spec()->set_dataset("synth");
  open.mutable_spec()->set_batch_size(8);
  open.mutable_spec()->set_image_size(32);
  v1::OpenStreamResponse opened;
  {
    grpc::ClientContext context;
    REQUIRE(stub->OpenStream(&context, open, &opened).ok());
  }
  for (int i = 0; i < 40; ++i) {
    v1::NextBatchRequest next;
    next.set_stream_id(opened.stream_id());
    next.set_incarnation(opened.incarnation());
    next.set_stream_token(opened.stream_token());
    next.set_wait_ms(2000);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    v1::NextBatchResponse response;
    grpc::Status s = stub->NextBatch(&context, next, &response);
    INFO("call " << i << ": " << s.error_message());
    if (s.ok()) break;  // the hung read was abandoned and batches flow: enough
    CHECK(s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED);
    std::this_thread::sleep_for(std::chrono::milliseconds(60));  // > one cancellation check
  }
  CHECK_THAT(daemon.Log(), !Catch::Contains("already waiting"));
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  // The timed-out client stream still delivers, from where it was.
  auto batch = stream->Next(std::chrono::seconds(20));
  REQUIRE(batch);
  CHECK(batch->position().sequence == 0);
}

TEST_CASE("a refused open whose gRPC callback is the last to finish, its Client already gone, "
          "leaves the process running (the channel is never freed on gRPC's callback thread)",
          "[integration][habits]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  // The seam holds gRPC's callback thread in each open's callback until this thread has let go
  // of the stream, its Client and the channel: whatever the callback still owned would be
  // destroyed on that thread (which once freed the completion queue it polls, an abort).
  // Nothing else in the process may use gRPC's callback API meanwhile (it would keep the queue).
  REQUIRE(::setenv("RINGLOADER_TEST_OPEN_CALLBACK_LINGER_MS", "200", 1) == 0);
  int refused = 0;
  for (int i = 0; i < 2; ++i) {
    {
      Client client(daemon.endpoint());
      StreamOptions options = Small();
      options.dataset = "no-such-dataset";
      try {
        (void)client.Open(options);
      } catch (const Error& e) {
        CHECK(e.code() == ErrorCode::kNotFound);
        ++refused;
      }
    }
    // Past the linger: an abort on the callback thread would have happened by now.
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
  }
  ::unsetenv("RINGLOADER_TEST_OPEN_CALLBACK_LINGER_MS");
  CHECK(refused == 2);
  // The library still works in this process.
  Client client(daemon.endpoint());
  auto stream = client.Open(Small());
  CHECK(stream->Next(std::chrono::seconds(20)));
}

TEST_CASE("16.4: a stream that can never yield a batch is refused naming rank, shard size, "
          "batch_size and drop_last",
          "[integration][habits]") {
  DaemonFixtureOptions fixture;
  fixture.images = 20;
  DaemonFixture daemon(fixture);
  REQUIRE(daemon.Start());
  CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--world-size", "4", "--rank",
                                "1", "--batch-size", "8", "--drop-last"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1 of world_size 4 gets 5 of the 20 samples") &&
                           Catch::Contains("no full batch of batch_size 8") &&
                           Catch::Contains("drop_last"));
  // Without drop_last the same stream yields a short batch per epoch: allowed.
  CHECK(daemon.Ctl({"consume", "--dataset", "synth", "--world-size", "4", "--rank", "1",
                    "--batch-size", "8"})
            .exit_code == 0);
  CommandResult empty = daemon.Ctl({"consume", "--dataset", "synth", "--world-size", "64",
                                    "--rank", "30", "--batch-size", "8", "--drop-last"});
  CHECK(empty.exit_code == 1);
  CHECK_THAT(empty.output, Catch::Contains("gets 0 of the 20 samples"));
}

}  // namespace
}  // namespace ringloader::testing
