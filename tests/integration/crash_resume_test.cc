// SPDX-License-Identifier: Apache-2.0
// Issue 5: the daemon dies, the trainer does not notice. Real ringloaderd (supervised), real
// SIGKILLs, real crashes from failpoints; the consumer is the real `ringloaderctl consume`.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>
#include <thread>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

size_t LineCount(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  std::string line;
  while (std::getline(in, line)) ++n;
  return n;
}

std::vector<std::string> ConsumeArgs(const DaemonFixture& d, const std::string& samples_out,
                                     const std::string& epochs) {
  return {CtlPath(),      "--endpoint",    d.endpoint(), "consume",      "--dataset",
          "synth",        "--epochs",      epochs,       "--batch-size", "8",
          "--image-size", "40",            "--seed",     "99",           "--samples-out",
          samples_out};
}

}  // namespace

TEST_CASE("chaos: SIGKILLing the supervised daemon 10+ times changes nothing the trainer sees",
          "[integration][chaos]") {
  DaemonFixtureOptions options;
  options.images = 200;
  options.supervise = true;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());

  // 12 kills, each while the consumer is mid-stream and the daemon decoding for it, whatever the
  // machine's speed or load. The consumer's --samples-out is a pipe of one page that the test
  // reads: once the page is full the consumer blocks writing to it, so it is never more than a
  // page of lines ahead of the test. Before each kill the test reads 1-20 lines more, then a
  // whole page, so the consumer runs on past what its ring held; the kill comes 0-20 ms later.
  const std::string chaos_pipe = daemon.dir() + "/chaos.fifo";
  REQUIRE(mkfifo(chaos_pipe.c_str(), 0600) == 0);
  struct Fd {
    int fd;
    ~Fd() {
      if (fd >= 0) close(fd);
    }
  } pipe{open(chaos_pipe.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  REQUIRE(pipe.fd >= 0);
  const int pipe_bytes = fcntl(pipe.fd, F_SETPIPE_SZ, 4096);  // a page: 64 KiB on some CPUs
  REQUIRE(pipe_bytes > 0);
  // Enough epochs that the 12th kill still finds the consumer reading: by then the test has read
  // at most 12 * (20 lines, 2 more in a 64-byte read's overshoot, a page), and the consumer has
  // written at most a page more.
  constexpr size_t kShortestLine = 40;  // bytes; checked below
  const size_t page_lines = static_cast<size_t>(pipe_bytes) / kShortestLine + 1;
  const size_t at_last_kill = 12 * (20 + 2 + page_lines) + page_lines;
  const size_t epochs = at_last_kill / 200 + 2;
  const std::string reference = daemon.dir() + "/reference.tsv";
  REQUIRE(RunCommand(ConsumeArgs(daemon, reference, std::to_string(epochs))).exit_code == 0);
  REQUIRE(LineCount(reference) == 200 * epochs);
  const std::string expected = ReadFile(reference);
  for (size_t at = 0, end; (end = expected.find('\n', at)) != std::string::npos; at = end + 1) {
    REQUIRE(end + 1 - at >= kShortestLine);
  }

  std::mt19937 rng(20261122);
  std::string chaos;  // what the consumer wrote, as read so far
  const auto read_some = [&](size_t at_most) {
    char buffer[4096];
    const ssize_t n = read(pipe.fd, buffer, std::min(at_most, sizeof buffer));
    if (n > 0) chaos.append(buffer, static_cast<size_t>(n));
    return n;
  };
  const auto lines = [&] {
    return static_cast<size_t>(std::count(chaos.begin(), chaos.end(), '\n'));
  };
  Subprocess consumer(ConsumeArgs(daemon, chaos_pipe, std::to_string(epochs)), {},
                      daemon.dir() + "/consumer.log");
  int kills = 0;
  pid_t serving = daemon.ServingPid();
  for (int k = 0; k < 12; ++k) {
    const size_t until = lines() + 1 + rng() % 20;
    if (!WaitFor([&] { return (read_some(64), lines() >= until) || !consumer.Running(); },
                 std::chrono::seconds(60)) ||
        !consumer.Running()) {
      break;
    }
    read_some(static_cast<size_t>(pipe_bytes));  // the consumer goes on: the ring, then Next()
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 20));
    REQUIRE(serving > 0);
    REQUIRE(kill(serving, SIGKILL) == 0);
    ++kills;
    serving = daemon.WaitForNewServingPid(serving);
  }
  INFO("lines read at the last kill: " << lines() << " of " << 200 * epochs << " (pipe of "
                                       << pipe_bytes << " bytes)");
  // The rest, until the consumer has closed its end and exited.
  WaitFor([&] { return read_some(4096) == 0 && !consumer.Running(); },
          std::chrono::seconds(120));
  while (read_some(4096) > 0) {
  }
  const int exit_code = consumer.WaitExitCode(std::chrono::seconds(120));
  INFO("consumer log:\n" << ReadFile(daemon.dir() + "/consumer.log"));
  INFO("daemon log:\n" << daemon.Log());
  CHECK(kills >= 10);
  REQUIRE(exit_code == 0);
  // Line for line: the same samples, in the same order, with the same bytes and positions.
  CHECK(chaos == expected);
  // Kills from outside are not crashes: nobody was struck.
  CHECK(daemon.Ctl({"quarantine", "list"}).output.find("synth") == std::string::npos);
}

TEST_CASE("trainer restart: a consumer killed mid-epoch resumes from --state exactly",
          "[integration][resume]") {
  DaemonFixtureOptions options;
  options.images = 160;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string reference = daemon.dir() + "/reference.tsv";
  REQUIRE(RunCommand(ConsumeArgs(daemon, reference, "1")).exit_code == 0);
  REQUIRE(LineCount(reference) == 160);

  // --max-batches stops a run cleanly with its state saved; a second run finishes the epoch.
  const std::string stepped = daemon.dir() + "/stepped.tsv";
  std::vector<std::string> args = ConsumeArgs(daemon, stepped, "1");
  args.insert(args.end(), {"--state", daemon.dir() + "/stepped.state"});
  std::vector<std::string> first = args;
  first.insert(first.end(), {"--max-batches", "7"});
  REQUIRE(RunCommand(first).exit_code == 0);
  CHECK(LineCount(stepped) == 56);
  REQUIRE(RunCommand(args).exit_code == 0);
  CHECK(ReadFile(stepped) == ReadFile(reference));

  // SIGKILL the consumer half-way through, then run the same command again.
  const std::string killed = daemon.dir() + "/killed.tsv";
  std::vector<std::string> kargs = ConsumeArgs(daemon, killed, "1");
  kargs.insert(kargs.end(), {"--state", daemon.dir() + "/killed.state"});
  {
    Subprocess consumer(kargs, {}, daemon.dir() + "/consumer.log");
    REQUIRE(WaitFor([&] { return LineCount(killed) >= 80 || !consumer.Running(); },
                    std::chrono::seconds(60)));
    consumer.Kill(SIGKILL);
    consumer.Wait();
  }
  CommandResult rest = RunCommand(kargs);
  INFO(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(ReadFile(killed) == ReadFile(reference));
}

TEST_CASE("poison: a sample that crashes the daemon is quarantined after 2 crashes and the "
          "epoch completes without it",
          "[integration][poison]") {
  DaemonFixtureOptions options;
  options.images = 80;
  options.supervise = true;
  options.config_extra =
      "[failpoints]\naction = \"segfault\"\ncrash_on_path = \"class_01/img_000033.jpg\"\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string out = daemon.dir() + "/poison.tsv";
  std::vector<std::string> args = ConsumeArgs(daemon, out, "1");
  CommandResult r = RunCommand(args, {}, std::chrono::seconds(120));
  INFO(r.output);
  INFO(daemon.Log());
  REQUIRE(r.exit_code == 0);
  std::vector<SampleLine> lines = ReadSamplesOut(out);
  std::set<std::string> paths;
  for (const SampleLine& s : lines) CHECK(paths.insert(s.path).second);
  CHECK(lines.size() == 79);
  CHECK(paths.count("class_01/img_000033.jpg") == 0);

  CommandResult list = daemon.Ctl({"quarantine", "list"});
  CHECK_THAT(list.output, Catch::Contains("class_01/img_000033.jpg"));
  // Only the poison sample: its neighbours in flight were cleared by decoding alone.
  CHECK(std::count(list.output.begin(), list.output.end(), '\n') <= 2);
  CommandResult stats = daemon.Ctl({"stats"});
  CHECK_THAT(stats.output, Catch::Contains("class_01/img_000033.jpg"));
  // The supervisor restarted the daemon twice for it.
  CHECK_THAT(daemon.Log(), Catch::Contains("quarantined"));

  CommandResult cleared = daemon.Ctl({"quarantine", "clear"});
  CHECK(cleared.exit_code == 0);
  CHECK(daemon.Ctl({"quarantine", "list"}).output.find("img_000033") == std::string::npos);
}

#ifndef RINGLOADER_SANITIZER_BUILD  // sanitizers need far more address space than the limit
TEST_CASE("OOM: under a hard address-space limit, a sample that allocates without bound costs "
          "only the daemon, and the client completes the epoch",
          "[integration][oom]") {
  if (::access("/usr/bin/prlimit", X_OK) != 0) {
    RINGLOADER_SKIP("prlimit not installed (util-linux)");
  }
  DaemonFixtureOptions options;
  options.images = 60;
  options.supervise = true;
  options.env["RINGLOADER_FAILPOINTS"] = "action=oom;crash_on_path=class_02/img_000042.jpg";
  DaemonFixture daemon(options);
  // The supervisor and its children run under a 3 GB address-space limit.
  std::vector<std::string> argv = {"/usr/bin/prlimit", "--as=3000000000", "--",
                                   DaemonPath(),       "--config",          daemon.config_path(),
                                   "--supervise"};
  Subprocess supervised(argv, options.env, daemon.log_path());
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  std::chrono::seconds(30)));
  const std::string out = daemon.dir() + "/oom.tsv";
  CommandResult r = RunCommand(ConsumeArgs(daemon, out, "1"), {}, std::chrono::seconds(120));
  INFO(r.output);
  INFO(daemon.Log());
  REQUIRE(r.exit_code == 0);
  CHECK(ReadSamplesOut(out).size() == 59);
  CHECK_THAT(daemon.Log(), Catch::Contains("allocating until out of memory"));
  CHECK_THAT(daemon.Ctl({"quarantine", "list"}).output, Catch::Contains("class_02/img_000042.jpg"));
  supervised.Kill(SIGTERM);
  CHECK(supervised.WaitExitCode(std::chrono::seconds(30)) == 0);
}
#endif

TEST_CASE("supervise: ringloaderd --supervise runs the daemon as its direct child and forwards SIGTERM",
          "[integration][supervise]") {
  DaemonFixtureOptions options;
  options.images = 16;
  options.supervise = true;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  pid_t child = daemon.ServingPid();
  REQUIRE(child > 0);
  CHECK(child != daemon.process().pid());
  CHECK(daemon.Stop() == 0);
  CHECK(::kill(child, 0) != 0);  // the child is gone too
}

}  // namespace ringloader::testing
