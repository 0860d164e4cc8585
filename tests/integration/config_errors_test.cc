// SPDX-License-Identifier: Apache-2.0
// Issue 4: a bad config fails at start with the file, the key path and what is wrong.
#include <catch2/catch.hpp>
#include <csignal>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

CommandResult StartWith(const TempDir& dir, const std::string& toml) {
  WriteFile(dir.Join("bad.toml"), toml);
  return RunCommand({DaemonPath(), "--config", dir.Join("bad.toml")}, {},
                    std::chrono::seconds(30));
}

std::string Header(const TempDir& dir) {
  return "[server]\nlisten = \"unix:" + dir.Join("s.sock") + "\"\nstate_dir = \"" +
         dir.Join("state") + "\"\n";
}

}  // namespace

TEST_CASE("ringloaderd: an unknown key names the file and key path", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "decode_thread = 4\n[[datasets]]\nname = \"a\"\n"
                                   "format = \"imagefolder\"\npath = \"/tmp\"\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("bad.toml: server.decode_thread: unknown key"));
}

TEST_CASE("ringloaderd: a wrong type names the key and the value", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = "
                                   "\"imagefolder\"\npath = \"/tmp\"\nmax_pixels = \"big\"\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output,
             Catch::Contains("bad.toml: datasets[0].max_pixels: must be an integer (got \"big\")"));
}

TEST_CASE("ringloaderd: a missing or absent dataset path is an error", "[integration][config]") {
  TempDir dir;
  CommandResult missing_key = StartWith(
      dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = \"imagefolder\"\n");
  CHECK(missing_key.exit_code == 1);
  CHECK_THAT(missing_key.output, Catch::Contains("bad.toml: datasets[0].path: is required"));

  CommandResult absent = StartWith(dir, Header(dir) + "[[datasets]]\nname = \"a\"\nformat = "
                                        "\"imagefolder\"\npath = \"/nonexistent/images\"\n");
  CHECK(absent.exit_code == 1);
  CHECK_THAT(absent.output, Catch::Contains("datasets[0].path: \"/nonexistent/images\" is not a "
                                            "directory"));
}

TEST_CASE("ringloaderd: a TOML syntax error names the line", "[integration][config]") {
  TempDir dir;
  CommandResult r = StartWith(dir, Header(dir) + "ring_slots = = 3\n");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("bad.toml:4:"));
}

TEST_CASE("ringloaderd: a missing config file is named", "[integration][config]") {
  CommandResult r = RunCommand({DaemonPath(), "--config", "/nonexistent/ringloaderd.toml"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("/nonexistent/ringloaderd.toml: cannot open config file"));
}

TEST_CASE("the shipped config/ringloaderd.toml starts a daemon that serves, and its example "
          "dataset once uncommented and reloaded", "[integration][config]") {
  TempDir dir;
  std::string shipped = ReadFile(std::string(RINGLOADER_SOURCE_DIR) + "/config/ringloaderd.toml");
  REQUIRE(!shipped.empty());
  // Only the places are moved into the temp dir (socket, state, dataset, rings); every other
  // key is exactly as shipped.
  auto replace = [&](const std::string& from, const std::string& to) {
    size_t at = shipped.find(from);
    REQUIRE(at != std::string::npos);
    shipped.replace(at, from.size(), to);
  };
  const std::string endpoint = "unix:" + dir.Join("s.sock");
  replace("unix:/run/ringloader/ringloader.sock", endpoint);
  replace("\"/var/lib/ringloader\"", "\"" + dir.Join("state") + "\"");
  replace("\"/srv/datasets/demo\"", "\"" + dir.Join("demo") + "\"");
  CommandResult made = RunCommand({CtlPath(), "make-dataset", "--out", dir.Join("demo"),
                                   "--count", "40", "--classes", "2"});
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  // As shipped, no dataset: it serves, with nothing to open.
  WriteFile(dir.Join("shipped.toml"), shipped);
  Subprocess daemon({DaemonPath(), "--config", dir.Join("shipped.toml")}, {},
                    dir.Join("daemon.log"));
  const bool serving = WaitFor(
      [&] {
        return RunCommand({CtlPath(), "--endpoint", endpoint, "health", "--timeout", "1"})
                       .exit_code == 0 ||
               !daemon.Running();
      },
      std::chrono::seconds(60));
  INFO(ReadFile(dir.Join("daemon.log")));
  REQUIRE(serving);
  REQUIRE(daemon.Running());
  const std::vector<std::string> consume = {CtlPath(), "--endpoint", endpoint, "consume",
                                            "--dataset", "demo", "--batch-size", "8",
                                            "--image-size", "32", "--max-batches", "3"};
  CommandResult unknown = RunCommand(consume);
  INFO(unknown.output);
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.output, Catch::Contains("demo"));
  CHECK_THAT(ReadFile(dir.Join("daemon.log")), Catch::Contains("no [[datasets]] in the config"));

  // The example's keys are commented out with '#' right before them: without it, and SIGHUP.
  std::string uncommented;
  std::istringstream lines(shipped);
  int example_keys = 0;
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > 1 && line[0] == '#' && line[1] != ' ') {
      line.erase(0, 1);
      ++example_keys;
    }
    uncommented += line + "\n";
  }
  CHECK(example_keys >= 4);  // [[datasets]], name, format, path at least
  WriteFile(dir.Join("shipped.toml"), uncommented);
  daemon.Kill(SIGHUP);
  CommandResult consumed;
  WaitFor(
      [&] {
        consumed = RunCommand(consume);
        return consumed.exit_code == 0;
      },
      std::chrono::seconds(30));
  INFO(consumed.output);
  CHECK(consumed.exit_code == 0);
  CHECK_THAT(consumed.output, Catch::Contains("consumed 24 samples in 3 batches"));
  daemon.Kill(SIGTERM);
  CHECK(daemon.WaitExitCode() == 0);
}

}  // namespace ringloader::testing
