// Issue 28: a running daemon under an operator's hands (restarts, scrapes, signals, local
// clients), through the real daemon and real processes. Races are forced with failpoints.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <string>
#include <vector>

#include "client/channel.h"
#include "proto/ringloader.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

using std::chrono::seconds;

v1::GetStatsResponse Stats(const std::string& endpoint) {
  auto stub = v1::Loader::NewStub(client::MakeChannel(*client::GrpcTarget(endpoint)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + seconds(10));
  v1::GetStatsResponse response;
  grpc::Status s = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  INFO(s.error_message());
  REQUIRE(s.ok());
  return response;
}

TEST_CASE("28.7: a trainer SIGKILLed and restarted at once from its state gets its stream under "
          "max_streams = 1, though the daemon acts on the death only later",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 200;
  options.server_extra = "max_streams = 1\nstream_idle_timeout_ms = 600000";
  // The daemon acts on a session's end 800 ms after it: the restart always asks first.
  options.config_extra = "[failpoints]\nsession_end_delay_ms = 800\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string state = daemon.dir() + "/state.txt";
  const std::vector<std::string> run = {CtlPath(), "--endpoint", daemon.endpoint(), "consume",
                                        "--dataset", "synth", "--batch-size", "4",
                                        "--image-size", "32", "--state", state, "--epochs", "2"};
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    Subprocess trainer(run, {}, daemon.dir() + "/trainer.log");
    REQUIRE(WaitFor([&] { return Stats(daemon.endpoint()).streams_open() == 1; }, seconds(30)));
    trainer.Kill(SIGKILL);
    trainer.Wait(seconds(10));
    // Not yet acted on: the dead trainer's stream still counts.
    const v1::GetStatsResponse before = Stats(daemon.endpoint());
    REQUIRE(before.streams_size() == 1);
    const uint64_t dead_stream = before.streams(0).stream_id();
    const auto restarted = std::chrono::steady_clock::now();
    Subprocess again(run, {}, daemon.dir() + "/again.log");
    // The restart's own stream serves batches (refused, it would have exited).
    REQUIRE(WaitFor(
        [&] {
          const v1::GetStatsResponse s = Stats(daemon.endpoint());
          return s.streams_size() == 1 && s.streams(0).stream_id() != dead_stream &&
                 s.streams(0).batches_served() > 0;
        },
        seconds(10)));
    CHECK(std::chrono::steady_clock::now() - restarted < seconds(3));
    CHECK(again.Running());
    again.Kill(SIGKILL);
    again.Wait(seconds(10));
    REQUIRE(WaitFor([&] { return Stats(daemon.endpoint()).streams_open() == 0; }, seconds(10)));
  }
  const CommandResult finished = RunCommand(run);
  INFO(finished.output);
  CHECK(finished.exit_code == 0);
  CHECK_THAT(daemon.Log(), !Catch::Contains("too many open streams"));
}

}  // namespace
}  // namespace ringloader::testing
