// SPDX-License-Identifier: Apache-2.0
// Issue 12 item 2: Prometheus metrics, scraped over HTTP by a real HTTP client (curl) from the
// real daemon while a trainer reads and the supervisor restarts it.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/scrape.h"

namespace ringloader::testing {
namespace {

TEST_CASE("12.2: GET /metrics serves every series from the start at 0, and the values move with "
          "batches, bad files and supervisor restarts",
          "[integration][metrics]") {
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 40;
  options.supervise = true;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  DaemonFixture daemon(options);
  // One file that is no JPEG at all: a decode error by reason.
  const std::string class_dir =
      std::filesystem::directory_iterator(daemon.dataset_root())->path().string();
  std::ofstream(class_dir + "/zz_not_an_image.jpg") << "this is not a JPEG";
  REQUIRE(daemon.Start());

  const CommandResult first = Scrape(address);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  CHECK_THAT(first.output, Catch::StartsWith("HTTP/1.1 200") &&
                               Catch::Contains("Content-Type: text/plain"));
  CHECK_THAT(first.output, Catch::Contains("# TYPE ringloader_batches_served_total counter"));
  for (const char* zero :
       {"ringloader_batches_served_total", "ringloader_images_decoded_total",
        "ringloader_bytes_served_total", "ringloader_decode_errors_total{reason=\"corrupt\"}",
        "ringloader_decode_errors_total{reason=\"not_image\"}",
        "ringloader_decode_errors_total{reason=\"deadline_exceeded\"}",
        "ringloader_quarantines_total", "ringloader_requests_rejected_total",
        "ringloader_daemon_restarts_total", "ringloader_streams_open",
        "ringloader_ring_slots{state=\"free\"}", "ringloader_ring_slots{state=\"leased\"}",
        "ringloader_quarantined_samples", "ringloader_decode_duration_seconds_count"}) {
    INFO(zero);
    CHECK(Value(first.output, zero) == 0.0);
  }
  CHECK(Value(first.output, "ringloader_serving") == 1.0);
  CHECK(Value(first.output, "ringloader_memory_limit_bytes") == double(1 << 30));
  CHECK(Value(first.output, "ringloader_resident_memory_bytes").value_or(0) > 0);

  const CommandResult consumed = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4",
                                             "--image-size", "32", "--epochs", "1"});
  REQUIRE(consumed.exit_code == 0);
  const CommandResult after = Scrape(address);
  INFO(after.output);
  CHECK(Value(after.output, "ringloader_batches_served_total") == 10.0);
  CHECK(Value(after.output, "ringloader_images_decoded_total") == 40.0);
  // Each batch: 4 uint8 images of 32 x 32 x 3 plus labels and indices, 256-byte aligned.
  CHECK(Value(after.output, "ringloader_bytes_served_total") == 10.0 * (12288 + 256 + 256));
  double errors = 0;
  for (std::string_view reason : {"not_image", "corrupt", "truncated", "read_error"}) {
    errors += Value(after.output, "ringloader_decode_errors_total{reason=\"" +
                                      std::string(reason) + "\"}")
                  .value_or(-100);
  }
  CHECK(errors == 1.0);
  const double decodes = Value(after.output, "ringloader_decode_duration_seconds_count").value_or(0);
  CHECK(decodes >= 40);
  CHECK(Value(after.output, "ringloader_decode_duration_seconds_bucket{le=\"+Inf\"}") == decodes);
  CHECK(Value(after.output, "ringloader_decode_duration_seconds_sum").value_or(0) > 0);

  // A stream held open shows its ring; a SIGKILL of the daemon counts as a restart.
  Subprocess trainer({CtlPath(), "--endpoint", daemon.endpoint(), "consume", "--dataset", "synth",
                      "--batch-size", "4", "--image-size", "32", "--epochs", "1000"},
                     {}, daemon.dir() + "/trainer.log");
  REQUIRE(WaitFor(
      [&] { return Value(Scrape(address).output, "ringloader_streams_open") == 1.0; },
      std::chrono::seconds(20)));
  const std::string open = Scrape(address).output;
  double slots = 0;
  for (const char* state : {"free", "filling", "ready", "leased"}) {
    slots += Value(open, std::string("ringloader_ring_slots{state=\"") + state + "\"}").value_or(0);
  }
  CHECK(slots == 4);  // ring_slots = 4, each in exactly one state
  trainer.Kill(SIGKILL);
  trainer.Wait();
  const pid_t child = daemon.ServingPid();
  REQUIRE(::kill(child, SIGKILL) == 0);
  REQUIRE(WaitFor(
      [&] { return Value(Scrape(address).output, "ringloader_daemon_restarts_total") == 1.0; },
      std::chrono::seconds(20)));
  CHECK(Value(Scrape(address).output, "ringloader_batches_served_total") == 0.0);  // a new one
  CHECK(daemon.Stop() == 0);
  CHECK(Scrape(address).exit_code != 0);  // gone with the daemon
}

TEST_CASE("12.2: daemon_restarts counts every start after an unclean exit, whoever restarts the "
          "daemon (here a bare restart, as systemd's Restart=), and no clean restart",
          "[integration][metrics]") {
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 8;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  DaemonFixture daemon(options);
  const auto restarts = [&] {
    return Value(Scrape(address).output, "ringloader_daemon_restarts_total");
  };
  REQUIRE(daemon.Start());
  CHECK(restarts() == 0.0);
  CHECK(daemon.Stop() == 0);
  REQUIRE(daemon.Start());
  CHECK(restarts() == 0.0);  // a clean stop is not a failure
  daemon.process().Kill(SIGKILL);
  daemon.process().Wait();
  REQUIRE(daemon.Start());
  CHECK(restarts() == 1.0);
  daemon.process().Kill(SIGKILL);
  daemon.process().Wait();
  REQUIRE(daemon.Start());
  CHECK(restarts() == 2.0);
  const CommandResult stats = daemon.Ctl({"stats"});
  CHECK_THAT(stats.output, Catch::Contains("daemon restarts") &&
                               Catch::Contains("2 (after an unclean exit)"));
  CHECK(daemon.Stop() == 0);
}

// A TCP connection to 127.0.0.1:`port` that sends `bytes` and then stays open, saying nothing.
TEST_CASE("28.2: scrapes are answered under 256 idle and 32 trickling connections, "
          "gRPC and health unaffected, and health_listen registers its service once",
          "[integration][metrics]") {
  const int port = FreeTcpPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const std::string health = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 40;
  options.server_extra =
      "metrics_listen = \"" + address + "\"\nhealth_listen = \"" + health + "\"";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), !Catch::Contains("duplicate registration"));

  std::vector<int> held;
  for (int i = 0; i < 256; ++i) held.push_back(OpenIdleTcp(port, ""));
  // Slow clients: a request line sent one piece at a time (never finished).
  for (int i = 0; i < 32; ++i) held.push_back(OpenIdleTcp(port, "GET /metr"));
  CHECK(std::count(held.begin(), held.end(), -1) == 0);
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    // Not held up at all (it takes milliseconds; a server with a thread per connection waited
    // for its 30 s request timeout): curl's 5 s limit (exit 28) leaves a noisy machine room.
    const CommandResult scrape =
        RunCommand({"/usr/bin/curl", "--silent", "--show-error", "--max-time", "5",
                    "http://" + address + "/metrics"});
    INFO(scrape.output.substr(0, 300));
    CHECK(scrape.exit_code == 0);
    CHECK_THAT(scrape.output, Catch::Contains("ringloader_serving 1"));
    for (size_t i = 256; i < held.size(); ++i) (void)!::write(held[i], "r", 1);  // trickle on
  }
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  CHECK(RunCommand({CtlPath(), "--endpoint", health, "health"}).exit_code == 0);
  CHECK(daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8", "--image-size", "32",
                    "--epochs", "1"})
            .exit_code == 0);
  // Anything but GET /metrics gets a plain answer, never a hang.
  const CommandResult other = RunCommand(
      {"/usr/bin/curl", "--silent", "--max-time", "2", "--write-out", "%{http_code}", "--output",
       "/dev/null", "http://" + address + "/other"});
  CHECK(other.output == "404");
  const CommandResult post = RunCommand(
      {"/usr/bin/curl", "--silent", "--max-time", "2", "--write-out", "%{http_code}", "--output",
       "/dev/null", "--data", "x=1", "http://" + address + "/metrics"});
  CHECK(post.output == "405");
  for (int fd : held) ::close(fd);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("12.2: a metrics_listen address in use stops the start, naming the key",
          "[integration][metrics]") {
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 8;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  DaemonFixture first(options);
  REQUIRE(first.Start());
  DaemonFixture second(options);
  second.Launch();
  CHECK(second.process().WaitExitCode(std::chrono::seconds(30)) == 1);
  CHECK_THAT(second.Log(), Catch::Contains("server.metrics_listen: cannot listen on " + address));
  CHECK(first.Stop() == 0);
}

TEST_CASE("12.2: a TCP listen, health_listen or feeder_listen address another daemon listens on "
          "stops the start, naming it (gRPC would share the port through SO_REUSEPORT: half the "
          "connections to the other daemon)",
          "[integration][metrics]") {
  std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  std::string key;
  DaemonFixtureOptions options;
  options.images = 8;
  SECTION("listen") { options.tcp = true; }
  SECTION("health_listen") {
    key = "health_listen";
    options.server_extra = "health_listen = \"" + address + "\"";
  }
  SECTION("feeder_listen") {
    key = "feeder_listen";
    options.server_extra = "feeder_listen = \"" + address + "\"\ninsecure_tcp = true";
  }
  DaemonFixture first(options);
  REQUIRE(first.Start());
  DaemonFixture second(options);
  if (key.empty()) {  // the same listen as the first's
    const std::string config = ReadFile(second.config_path());
    const size_t at = config.find(second.endpoint());
    REQUIRE(at != std::string::npos);
    address = first.endpoint();
    WriteFile(second.config_path(),
              config.substr(0, at) + address + config.substr(at + second.endpoint().size()));
  }
  second.Launch();
  CHECK(second.process().WaitExitCode(std::chrono::seconds(30)) == 1);
  CHECK_THAT(second.Log(),
             Catch::Contains((key.empty() ? "" : "server." + key + ": ") + "cannot listen on " +
                             address));
  CHECK(first.Stop() == 0);
}

}  // namespace
}  // namespace ringloader::testing
