// SPDX-License-Identifier: Apache-2.0
// Issue 15 item 1: the service runs unprivileged, as user and group "ringloader" (made by the
// installed sysusers.d file), with the unit's umask and directory modes; trainers in its group
// connect and map rings read-only, anyone else is told which group to join. systemd is not pid 1
// here, so the unit's settings are applied by hand: setpriv for User=/Group=, a shell for UMask=.
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <filesystem>
#include <string>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;

constexpr char kTrainer[] = "rl-test-trainer";    // a member of group ringloader
constexpr char kOutsider[] = "rl-test-outsider";  // not a member

bool UserExists(const char* name) { return getpwnam(name) != nullptr; }

// Runs argv as `user` (its own groups), like a login of that user.
std::vector<std::string> As(const std::string& user, std::vector<std::string> argv) {
  std::vector<std::string> all = {"/usr/bin/setpriv", "--reuid", user, "--regid", user,
                                  "--init-groups", "--"};
  all.insert(all.end(), argv.begin(), argv.end());
  return all;
}

TEST_CASE("15.1: as the unprivileged service user, the daemon serves trainers of its group and "
          "refuses everyone else naming the group",
          "[integration][service]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to create users and switch to them");
  for (const char* tool : {"/usr/bin/systemd-sysusers", "/usr/bin/setpriv", "/usr/sbin/useradd"}) {
    if (::access(tool, X_OK) != 0) RINGLOADER_SKIP(std::string(tool) + " not installed");
  }
  // The installed sysusers.d file makes the user and group, as at package install.
  const CommandResult sysusers = RunCommand(
      {"/usr/bin/systemd-sysusers", std::string(RINGLOADER_SOURCE_DIR) +
                                        "/systemd/ringloader.sysusers.conf"});
  INFO(sysusers.output);
  REQUIRE(sysusers.exit_code == 0);
  REQUIRE(UserExists("ringloader"));
  if (!UserExists(kTrainer)) {
    REQUIRE(RunCommand({"/usr/sbin/useradd", "--system", "--no-create-home", "--groups",
                        "ringloader", kTrainer}).exit_code == 0);
  }
  if (!UserExists(kOutsider)) {
    REQUIRE(RunCommand({"/usr/sbin/useradd", "--system", "--no-create-home", kOutsider})
                .exit_code == 0);
  }

  // What systemd makes of RuntimeDirectory= and StateDirectory= (0750, owned by the service).
  DaemonFixtureOptions options;
  options.images = 16;
  DaemonFixture fixture(options);  // writes the dataset; its own daemon is not started
  const struct passwd* pw = getpwnam("ringloader");
  REQUIRE(pw != nullptr);
  fs::permissions(fixture.dir(), fs::perms(0755));
  for (const auto& e : fs::recursive_directory_iterator(fixture.dataset_root())) {
    fs::permissions(e.path(), e.is_directory() ? fs::perms(0755) : fs::perms(0644));
  }
  fs::permissions(fixture.dataset_root(), fs::perms(0755));
  const std::string run = fixture.dir() + "/run";
  const std::string state = fixture.dir() + "/lib";
  for (const std::string& dir : {run, state}) {
    fs::create_directories(dir);
    REQUIRE(::chown(dir.c_str(), pw->pw_uid, pw->pw_gid) == 0);
    fs::permissions(dir, fs::perms(0750));
  }
  // The shipped config's server settings (socket 0660, segments 0640, groups = the daemon's).
  const std::string config = fixture.dir() + "/service.toml";
  WriteFile(config, "[server]\nlisten = \"unix:" + run + "/ringloader.sock\"\nstate_dir = \"" +
                        state + "\"\ndecode_threads = 2\nmemory_limit = \"512MiB\"\n"
                        "[[datasets]]\nname = \"synth\"\nformat = \"imagefolder\"\npath = \"" +
                        fixture.dataset_root() + "\"\n");
  fs::permissions(config, fs::perms(0644));
  // User=ringloader, Group=ringloader, UMask=0007.
  Subprocess daemon(As("ringloader", {"/bin/sh", "-c", "umask 0007 && exec \"$0\" --config \"$1\"",
                                      DaemonPath(), config}),
                    {}, fixture.dir() + "/service.log");
  const std::string endpoint = "unix:" + run + "/ringloader.sock";
  const auto ctl = [&](const std::string& user, std::vector<std::string> args) {
    std::vector<std::string> argv = {CtlPath(), "--endpoint", endpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(As(user, argv));
  };
  REQUIRE(WaitFor([&] { return ctl(kTrainer, {"health", "--timeout", "1"}).exit_code == 0; },
                  std::chrono::seconds(30)));
  INFO(ReadFile(fixture.dir() + "/service.log"));

  // Runs as ringloader, not root.
  const std::string status = ReadFile("/proc/" + std::to_string(daemon.pid()) + "/status");
  CHECK_THAT(status, Catch::Contains("Uid:\t" + std::to_string(pw->pw_uid) + "\t"));
  struct stat st {};
  REQUIRE(::stat((run + "/ringloader.sock").c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0660);
  CHECK(st.st_gid == pw->pw_gid);

  // A trainer in the group reads an epoch (its rings are 0640, group ringloader).
  const CommandResult trained = ctl(kTrainer, {"consume", "--dataset", "synth", "--batch-size",
                                               "4", "--epochs", "1", "--image-size", "32"});
  INFO(trained.output);
  CHECK(trained.exit_code == 0);
  CHECK_THAT(trained.output, Catch::Contains("consumed 16 samples"));

  // Anyone else is told which group to join.
  const CommandResult outsider = ctl(kOutsider, {"consume", "--dataset", "synth", "--epochs", "1",
                                                 "--reconnect-deadline-s", "2"});
  INFO(outsider.output);
  CHECK(outsider.exit_code != 0);
  CHECK_THAT(outsider.output, Catch::Contains("permission denied") &&
                                  Catch::Contains("group 'ringloader'"));
  daemon.Kill(SIGTERM);
  CHECK(daemon.WaitExitCode(std::chrono::seconds(20)) == 0);
}

TEST_CASE("15.1: a ring mode that lets others write, and a group that does not exist, stop the "
          "start", "[integration][service]") {
  DaemonFixtureOptions options;
  options.images = 4;
  options.server_extra = "segment_mode = \"0660\"";
  DaemonFixture writable(options);
  CHECK_FALSE(writable.Start());
  CHECK_THAT(writable.Log(), Catch::Contains("server.segment_mode: must not let group or others "
                                             "write"));
  options.server_extra = "segment_group = \"no-such-group-rl\"";
  DaemonFixture missing(options);
  CHECK_FALSE(missing.Start());
  CHECK_THAT(missing.Log(), Catch::Contains("server.segment_group: group \"no-such-group-rl\" "
                                            "does not exist"));
}

}  // namespace
}  // namespace ringloader::testing
