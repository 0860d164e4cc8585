// SPDX-License-Identifier: Apache-2.0
// Issue 28: a running daemon under an operator's hands (restarts, scrapes, signals, local
// clients), through the real daemon and real processes. Races are forced with failpoints.
#include <grp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/channel.h"
#include "proto/ringloader.grpc.pb.h"
#include "shm/base/cgroup.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

using std::chrono::seconds;

// Whether process `pid` has SIGHUP blocked (/proc/PID/status SigBlk), after its exec.
bool HoldsSigHup(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  bool exec_done = false, blocked = false;
  while (std::getline(status, line)) {
    if (line.rfind("Name:", 0) == 0) exec_done = line.find("ringloaderd") != std::string::npos;
    if (line.rfind("SigBlk:", 0) == 0) {
      blocked = (std::stoull(line.substr(7), nullptr, 16) & (1ull << (SIGHUP - 1))) != 0;
    }
  }
  return exec_done && blocked;
}

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_CASE("28.7: a trainer SIGKILLed and restarted at once from its state gets its stream under "
          "max_streams = 1 or a memory_limit that holds one ring, though the daemon acts on the "
          "death only later",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 200;
  std::string batch = "4", size = "32";
  SECTION("max_streams = 1") {
    options.server_extra = "max_streams = 1\nstream_idle_timeout_ms = 600000";
  }
  SECTION("memory_limit holds one ring (3 slots of 64 x 224 x 224 x 3 = 28 MiB of 48 MiB)") {
    options.server_extra = "stream_idle_timeout_ms = 600000";
    options.memory_limit = "48MiB";
    batch = "64";
    size = "224";
  }
  // The daemon acts on a session's end 800 ms after it: the restart always asks first.
  options.config_extra = "[failpoints]\nsession_end_delay_ms = 800\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string state = daemon.dir() + "/state.txt";
  const std::vector<std::string> run = {CtlPath(), "--endpoint", daemon.endpoint(), "consume",
                                        "--dataset", "synth", "--batch-size", batch,
                                        "--image-size", size, "--state", state, "--epochs", "2"};
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
  CHECK_THAT(daemon.Log(), !Catch::Contains("too many open streams") &&
                               !Catch::Contains("memory_limit 48 MiB has"));
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
  // Stuck on the read lane (never a decode thread): the two given up, and at most one read
  // ahead into the next epoch before the quarantine; not one per epoch.
  CHECK(stats.decode_threads_abandoned() == 0);
  REQUIRE(stats.datasets_size() == 1);
  CHECK(stats.datasets(0).reads_stuck() >= 2);
  CHECK(stats.datasets(0).reads_stuck() <= 3);
  CHECK(stats.datasets(0).storage_stalls() == 0);
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

// Runs ringloaderctl as nobody (uid 65534) in group `gid`, no supplementary groups.
CommandResult CtlAsNobody(const DaemonFixture& daemon, const std::string& gid,
                          std::vector<std::string> args) {
  std::vector<std::string> argv = {"/usr/bin/setpriv", "--reuid=65534", "--regid=" + gid,
                                   "--clear-groups", CtlPath(), "--endpoint", daemon.endpoint()};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, {}, seconds(120));
}

TEST_CASE("28.6: administrative calls need the daemon's user or admin_group, a client the "
          "socket keeps out is told at once, and client text is bounded",
          "[integration][operator]") {
  if (!RunningAsRoot() || ::access("/usr/bin/setpriv", X_OK) != 0) {
    RINGLOADER_SKIP("needs root and setpriv to act as another user");
  }
  DaemonFixtureOptions options;
  options.images = 40;
  // Anyone may use the main socket here; the admin socket stays the daemon's (and nogroup's).
  options.server_extra = "socket_mode = \"0666\"\nadmin_group = \"nogroup\"";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  REQUIRE(::chmod(daemon.dir().c_str(), 0711) == 0);  // traversable, as /run/ringloader is
  const std::string admin = daemon.endpoint().substr(0, daemon.endpoint().size() - 5);

  // The main socket serves everything but administration, to anyone it lets in.
  auto stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(daemon.endpoint())));
  {
    grpc::ClientContext context;
    v1::ClearQuarantineResponse response;
    const grpc::Status s =
        stub->ClearQuarantine(&context, v1::ClearQuarantineRequest(), &response);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(), Catch::Contains("served only on the admin socket") &&
                                      Catch::Contains("-admin"));
  }
  CHECK(CtlAsNobody(daemon, "65534", {"stats"}).exit_code == 0);
  // nobody:nobody-group is kept out of the admin socket (0660 root:nogroup) ...
  const std::string nogroup = std::to_string(::getgrnam("nogroup")->gr_gid);
  const CommandResult outsider = CtlAsNobody(daemon, "0", {"quarantine", "clear"});
  CHECK(outsider.exit_code != 0);
  CHECK_THAT(outsider.output, Catch::Contains("permission denied connecting to") &&
                                  Catch::Contains("admin"));
  // ... a member of admin_group and the daemon's user are let in.
  const CommandResult member = CtlAsNobody(daemon, nogroup, {"quarantine", "clear"});
  INFO(member.output);
  CHECK(member.exit_code == 0);
  CHECK(daemon.Ctl({"quarantine", "clear"}).exit_code == 0);

  // A client the main socket keeps out is told at once, not after reconnect_deadline.
  REQUIRE(daemon.Stop() == 0);
  std::string config = ReadFile(daemon.config_path());
  config.replace(config.find("socket_mode = \"0666\""), 20, "socket_mode = \"0660\"");
  WriteFile(daemon.config_path(), config);
  REQUIRE(daemon.Start());
  const auto start = std::chrono::steady_clock::now();
  const CommandResult refused = CtlAsNobody(
      daemon, "65534", {"consume", "--dataset", "synth", "--batch-size", "4", "--epochs", "1"});
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.output, Catch::Contains("permission denied connecting to"));
  CHECK(std::chrono::steady_clock::now() - start < seconds(10));

  // A 900 kB client_name and dataset name: bounded in stats, logs and errors.
  const std::string huge(900'000, 'n');
  stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(daemon.endpoint())));
  {
    grpc::ClientContext context;
    v1::AttachRequest attach;
    attach.set_client_name(huge);
    auto call = stub->Attach(&context, attach);
    v1::AttachEvent event;
    if (!call->Read(&event)) FAIL(call->Finish().error_message());
    grpc::ClientContext open_context;
    v1::OpenStreamRequest open;
    open.mutable_spec()->set_dataset("synth");
    open.mutable_spec()->set_batch_size(4);
    open.mutable_spec()->set_image_size(32);
    open.set_client_name(huge);
    open.set_session_id(event.session_id());
    v1::OpenStreamResponse opened;
    REQUIRE(stub->OpenStream(&open_context, open, &opened).ok());
    const v1::GetStatsResponse stats = Stats(daemon.endpoint());
    REQUIRE(stats.streams_size() == 1);
    CHECK(stats.streams(0).client_name().size() <= 128);
    grpc::ClientContext bad_context;
    open.mutable_spec()->set_dataset(huge);
    open.set_client_name("x");
    const grpc::Status unknown = stub->OpenStream(&bad_context, open, &opened);
    INFO(unknown.error_message().substr(0, 400));
    CHECK(unknown.error_code() == grpc::StatusCode::NOT_FOUND);
    CHECK(unknown.error_message().size() < 400);
    context.TryCancel();
  }
  CHECK(daemon.Log().find(std::string(200, 'n')) == std::string::npos);
}

TEST_CASE("28.1: a SIGHUP during start-up indexing is remembered and applied once serving",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.config_extra = "[failpoints]\nindex_delay_ms = 1500\n";
  DaemonFixture daemon(options);
  daemon.Launch();
  REQUIRE(WaitFor([&] { return daemon.Log().find("indexing 1 datasets") != std::string::npos; },
                  seconds(30)));
  // Config management adds a dataset and sends SIGHUP while the first is still being indexed.
  std::string config = ReadFile(daemon.config_path());
  const size_t failpoints = config.find("[failpoints]");
  config.insert(failpoints, "[[datasets]]\nname = \"added\"\nformat = \"imagefolder\"\npath = \"" +
                                daemon.dataset_root() + "\"\n");
  WriteFile(daemon.config_path(), config);
  daemon.process().Kill(SIGHUP);
  REQUIRE(WaitFor([&] { return daemon.Log().find("reload: applied") != std::string::npos; },
                  seconds(30)));
  CHECK(daemon.Log().find("the reload follows once serving") <
        daemon.Log().find("ringloaderd serving on"));
  const CommandResult added = daemon.Ctl({"consume", "--dataset", "added", "--batch-size", "8",
                                          "--image-size", "32", "--epochs", "1"});
  INFO(added.output);
  CHECK(added.exit_code == 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("28.1: SIGHUPs from the first instant and through restarts never kill the supervisor "
          "or an unready child, and one held for an unready child reaches it once ready",
          "[integration][operator]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.supervise = true;
  DaemonFixture daemon(options);
  daemon.Launch();
  const pid_t supervisor = daemon.process().pid();
  // 100 SIGHUPs the instant the process holds its signals (its first constructor, before
  // main()), long before it has a handler or a child.
  REQUIRE(WaitFor([&] { return HoldsSigHup(supervisor); }, seconds(10)));
  for (int i = 0; i < 100; ++i) ::kill(supervisor, SIGHUP);
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  seconds(30)));
  REQUIRE(daemon.process().Running());
  for (int round = 0; round < 3; ++round) {
    INFO("round " << round);
    const pid_t child = daemon.ServingPid();
    REQUIRE(child > 0);
    ::kill(child, SIGKILL);
    // SIGHUPs while the supervisor restarts it: held, never sent to a child that cannot take them.
    for (int i = 0; i < 100; ++i) ::kill(supervisor, SIGHUP);
    REQUIRE(WaitFor(
        [&] {
          const pid_t now = daemon.ServingPid();
          return now > 0 && now != child &&
                 daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0;
        },
        seconds(30)));
  }
  REQUIRE(daemon.process().Running());
  const std::string log = daemon.Log();
  CHECK_THAT(log, !Catch::Contains("before it was ready") && !Catch::Contains("signal Hangup"));
  CHECK_THAT(log, Catch::Contains("SIGHUP: forwarded to ringloaderd") &&
                      Catch::Contains("reload: applied"));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("28.3: the daemon and doctor read the daemon's own memory cgroup, nested below the "
          "root (a systemd unit's MemoryMax=, a container's limit)",
          "[integration][operator]") {
  // A real child cgroup of this test's own, with a 256 MiB limit, made the way systemd makes a
  // unit's: only possible as root on a writable cgroupfs.
  const std::optional<base::MemoryCgroup> mine = base::MemoryCgroupOf();
  if (!RunningAsRoot() || !mine) RINGLOADER_SKIP("needs root and a mounted memory cgroup");
  const std::string dir = mine->dir + "/rl-test-" + std::to_string(::getpid());
  if (::mkdir(dir.c_str(), 0755) != 0) {
    RINGLOADER_SKIP("cannot create a child memory cgroup here (read-only cgroupfs?)");
  }
  struct Remove {
    std::string dir;
    ~Remove() { ::rmdir(dir.c_str()); }
  } remove{dir};
  const char* limit_file = mine->version == 2 ? "/memory.max" : "/memory.limit_in_bytes";
  WriteFile(dir + limit_file, "268435456\n");
  if (mine->version == 2 && ReadFile(dir + "/memory.max").find("268435456") != 0) {
    RINGLOADER_SKIP("memory.max cannot be set here");
  }
  DaemonFixtureOptions options;
  options.images = 20;
  options.memory_limit = "1GiB";
  DaemonFixture daemon(options);
  // The daemon starts inside the child cgroup, as systemd starts a unit's process in its own.
  Subprocess process({"/bin/sh", "-c",
                      "echo $$ > '" + dir + "/cgroup.procs' && exec '" + DaemonPath() +
                          "' --config '" + daemon.config_path() + "'"},
                     {}, daemon.log_path());
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  seconds(30)));
  CHECK_THAT(daemon.Log(), Catch::Contains("server.memory_limit 1 GiB is more than the memory "
                                           "cgroup's limit (" + dir + limit_file + ") (256 MiB)"));
  // doctor, from outside that cgroup, checks the serving daemon's.
  const CommandResult doctor = RunCommand({CtlPath(), "doctor", "--config", daemon.config_path()});
  INFO(doctor.output);
  CHECK_THAT(doctor.output, Catch::Contains("problem: memory: memory_limit 1 GiB") &&
                                Catch::Contains("vs 256 MiB (ringloaderd pid") &&
                                Catch::Contains(dir + limit_file));
  process.Kill(SIGTERM);
  CHECK(process.WaitExitCode(seconds(30)) == 0);
}

}  // namespace
}  // namespace ringloader::testing
