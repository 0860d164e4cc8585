// SPDX-License-Identifier: Apache-2.0
// Issue 12 item 5: `ringloaderctl doctor` checks the host against a config before anything breaks.
#include <sys/resource.h>
#include <sys/stat.h>

#include <catch2/catch.hpp>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

std::vector<std::string> Lines(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) out.push_back(line);
  }
  return out;
}

TEST_CASE("12.5: doctor on a good config prints one ok line per check and exits 0, before and "
          "while the daemon runs",
          "[integration][doctor]") {
  DaemonFixture daemon;
  const CommandResult before = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  INFO(before.output);
  CHECK(before.exit_code == 0);
  CHECK(Lines(before.output, "problem:").empty());
  const std::vector<std::string> ok = Lines(before.output, "ok:");
  CHECK(ok.size() == 7);  // config, shm_dir, memory, open files, socket, state_dir, the dataset
  for (const char* what : {"ok: config ", "ok: shm_dir ", "ok: memory: memory_limit 1 GiB",
                           "ok: open files: ", "ok: socket ", "ok: state_dir ",
                           "ok: dataset synth (imagefolder "}) {
    CHECK_THAT(before.output, Catch::Contains(what));
  }
  CHECK_THAT(before.output, Catch::Contains("120 samples indexed, 4 classes") &&
                                Catch::Contains("not there (the daemon is not running)") &&
                                Catch::Contains("all checks passed"));
  REQUIRE(daemon.Start());
  const CommandResult running = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  CHECK(running.exit_code == 0);
  CHECK_THAT(running.output, Catch::Contains("may connect") &&
                                 Catch::Contains("ok: daemon: ringloaderd pid ") &&
                                 Catch::Contains(" answers: serving"));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("12.5: with a daemon serving, doctor checks that daemon's own open-file limit, not the "
          "shell's",
          "[integration][doctor]") {
  DaemonFixture daemon;
  // The daemon has a low limit (as from LimitNOFILE=400 in a unit: soft and hard, since the
  // daemon raises its soft limit to the hard one); doctor does not.
  REQUIRE(daemon.Start());
  const CommandResult lowered = RunCommand(
      {"/usr/bin/prlimit", "--pid", std::to_string(daemon.ServingPid()), "--nofile=400:400"});
  if (lowered.exit_code != 0) RINGLOADER_SKIP("prlimit cannot lower the daemon's limit: " + lowered.output);
  const CommandResult r = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::string daemon_name = "ringloaderd pid " + std::to_string(daemon.ServingPid()) + "'s";
  CHECK_THAT(r.output, Catch::Contains("problem: open files: limit 400 (" + daemon_name +
                                       " RLIMIT_NOFILE) vs about ") &&
                           Catch::Contains("fix: raise it to at least "));
  CHECK(Lines(r.output, "problem:").size() == 1);
  CHECK(daemon.Stop() == 0);
  // Without a daemon the shell's own limit is what doctor can check.
  const CommandResult after = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  CHECK_THAT(after.output, Catch::Contains("(this shell's RLIMIT_NOFILE)"));
}

TEST_CASE("12.5: doctor on a bad config names every problem with its fix and exits 1",
          "[integration][doctor]") {
  DaemonFixture daemon;  // for its temp dir and dataset
  const std::string config = daemon.dir() + "/bad.toml";
  std::ofstream(config) << "[server]\n"
                        << "listen = \"unix:" << daemon.dir() << "/bad.sock\"\n"
                        << "socket_group = \"rl-doctor-no-such-group\"\n"
                        << "state_dir = \"" << daemon.dir() << "/state\"\n"
                        << "memory_limit = \"100TiB\"\n"
                        << "[[datasets]]\nname = \"gone\"\nformat = \"imagefolder\"\n"
                        << "path = \"" << daemon.dir() << "/no-such-dataset\"\n";
  // A low open-file limit, as a unit without LimitNOFILE= might have.
  const CommandResult r = RunCommand({"/usr/bin/prlimit", "--nofile=100", CtlPath(), "doctor",
                                      "--config", config, "--batch-size", "4096",
                                      "--image-size", "1024"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  const std::vector<std::string> problems = Lines(r.output, "problem:");
  CHECK(problems.size() == 5);
  CHECK_THAT(r.output, Catch::Contains("problem: shm_dir /dev/shm: ") &&
                           Catch::Contains("fix: give the tmpfs at least"));
  CHECK_THAT(r.output, Catch::Contains("problem: memory: memory_limit 100 TiB") &&
                           Catch::Contains("(the host's memory); fix: lower server.memory_limit"));
  CHECK_THAT(r.output, Catch::Contains("problem: open files: limit 100") &&
                           Catch::Contains("fix: raise it to at least"));
  CHECK_THAT(r.output, Catch::Contains("socket_group \"rl-doctor-no-such-group\" does not exist; "
                                       "fix: create it"));
  CHECK_THAT(r.output, Catch::Contains("problem: dataset gone (imagefolder ") &&
                           Catch::Contains("no-such-dataset"));
  CHECK_THAT(r.output, Catch::Contains("5 problems found"));

  // The daemon's memory cgroup (given as a directory) is tighter than memory_limit.
  const std::string cgroup = daemon.dir() + "/cgroup";
  ::mkdir(cgroup.c_str(), 0755);
  std::ofstream(cgroup + "/memory.max") << "268435456\n";
  const CommandResult tight = RunCommand(
      {CtlPath(), "doctor", "--config", daemon.config_path(), "--cgroup", cgroup});
  INFO(tight.output);
  CHECK(tight.exit_code == 1);
  CHECK_THAT(tight.output, Catch::Contains("problem: memory: memory_limit 1 GiB") &&
                               Catch::Contains("vs 256 MiB (" + cgroup + "/memory.max)"));
  CHECK(Lines(tight.output, "problem:").size() == 1);

  const CommandResult unreadable = RunCommand({CtlPath(), "doctor", "--config", config + ".nope"});
  CHECK(unreadable.exit_code == 1);
  CHECK_THAT(unreadable.output, Catch::Contains("problem: config: "));
}

TEST_CASE("12.5: doctor tells a user outside the socket's group to join it",
          "[integration][doctor]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to run the doctor as another user");
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  ::chmod(daemon.dir().c_str(), 0755);  // traversable; the socket itself stays 0660
  ::chmod(daemon.config_path().c_str(), 0644);
  const CommandResult r =
      RunCommand({"/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                  CtlPath(), "doctor", "--config", daemon.config_path()});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("may not connect; fix: join the group: sudo usermod -aG "
                                       "root $USER"));
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace ringloader::testing
