// Issue 28: a running daemon under an operator's hands (restarts, scrapes, signals, local
// clients), through the real daemon and real processes. Races are forced with failpoints.
#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <map>
#include <set>
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

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
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


TEST_CASE("28.4: the previous incarnation's strikes survive a start stopped during indexing",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.config_extra = "[failpoints]\naction = \"segfault\"\ncrash_on_path = \"class_01/*\"\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  // 1. It crashes decoding a class_01 sample (the journal names what was in flight).
  Subprocess trainer({CtlPath(), "--endpoint", daemon.endpoint(), "consume", "--dataset", "synth",
                      "--batch-size", "4", "--image-size", "32", "--epochs", "1"},
                     {}, daemon.dir() + "/trainer.log");
  CHECK(daemon.process().WaitExitCode(seconds(60)) != 0);
  trainer.Kill(SIGKILL);
  trainer.Wait(seconds(10));
  // 2. Restarted with a long index (a slow mount), and stopped before it has indexed.
  std::string config = ReadFile(daemon.config_path());
  const std::string base = config.substr(0, config.find("[failpoints]"));
  WriteFile(daemon.config_path(), base + "[failpoints]\nindex_delay_ms = 600000\n");
  daemon.Launch();
  REQUIRE(WaitFor([&] { return daemon.Log().find("indexing 1 datasets") != std::string::npos &&
                               Count(daemon.Log(), "listening on") == 2; },
                  seconds(30)));
  CHECK(daemon.Stop() == 0);
  CHECK_THAT(daemon.Log(), !Catch::Contains("strike 1/2"));
  // 3. The next start applies the crash's strikes all the same.
  WriteFile(daemon.config_path(), base);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(),
             Catch::Contains("was being decoded when ringloaderd crashed (strike 1/2)") &&
                 Catch::Contains("class_01/"));
  // ... once: a clean stop and start strike nobody again.
  const size_t struck = Count(daemon.Log(), "was being decoded when ringloaderd crashed");
  CHECK(struck >= 1);
  CHECK(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  CHECK(Count(daemon.Log(), "was being decoded when ringloaderd crashed") == struck);
}

TEST_CASE("28.5: a sample whose read hangs every epoch is struck when abandoned, quarantined "
          "after two, and never read again",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.server_extra = "decode_deadline_ms = 1000";
  options.env["RINGLOADER_FAILPOINTS"] = "action=hang;crash_on_path=class_02/img_000002.jpg";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string out = daemon.dir() + "/samples.tsv";
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4",
                                      "--image-size", "32", "--epochs", "4", "--samples-out",
                                      out});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::map<uint64_t, std::set<std::string>> by_epoch;
  for (const SampleLine& l : ReadSamplesOut(out)) by_epoch[l.epoch].insert(l.path);
  REQUIRE(by_epoch.size() == 4);
  for (const auto& [epoch, paths] : by_epoch) {
    INFO("epoch " << epoch);
    CHECK(paths.size() == 39);
    CHECK(paths.count("class_02/img_000002.jpg") == 0);
  }
  const v1::GetStatsResponse stats = Stats(daemon.endpoint());
  CHECK(stats.decode_threads_abandoned() == 2);  // not one per epoch
  CHECK(stats.decode_errors_by_reason().at("deadline_exceeded") == 2);
  CHECK(stats.decode_errors_by_reason().at("quarantined") == 2);
  CHECK(stats.quarantines() == 1);
  CHECK_THAT(daemon.Ctl({"quarantine", "list"}).output,
             Catch::Contains("class_02/img_000002.jpg"));
  CHECK_THAT(daemon.Log(),
             Catch::Contains("abandoned past decode_deadline_ms (strike 1/2)") &&
                 Catch::Contains("quarantined: abandoned past decode_deadline_ms 2 times"));
  // A restart keeps it quarantined: its read is never tried again.
  CHECK(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  CHECK(daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4", "--image-size", "32",
                    "--epochs", "1"}).exit_code == 0);
  CHECK(Stats(daemon.endpoint()).decode_threads_abandoned() == 0);
}

}  // namespace
}  // namespace ringloader::testing
