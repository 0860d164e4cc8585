// Issue 16: a trainer's habits through the real client and daemon: pauses, deadlines and
// cancellation, mistaken sizes.
#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

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
  auto stub = v1::Loader::NewStub(client::MakeChannel(*client::GrpcTarget(daemon.endpoint())));
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
