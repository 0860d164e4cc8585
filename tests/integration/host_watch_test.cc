// SPDX-License-Identifier: Apache-2.0
// Issue 12 item 1: systemd notify + watchdog, and --supervise watching its child the same way.
// The "systemd" here is a real AF_UNIX datagram socket named by NOTIFY_SOCKET, as systemd
// passes it; the hang is the hang_decode failpoint (a decode blocked for good after its read,
// where no deadline reaches).
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

using Clock = std::chrono::steady_clock;

// A stand-in for systemd's notification socket: collects every datagram with its arrival time.
class FakeNotifySocket {
 public:
  explicit FakeNotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    REQUIRE(path_.size() < sizeof(addr.sun_path));
    std::memcpy(addr.sun_path, path_.c_str(), path_.size() + 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    timeval tv{0, 100'000};  // the reader checks for stop every 100 ms
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    reader_ = std::thread([this] { Read(); });
  }
  ~FakeNotifySocket() {
    stop_ = true;
    reader_.join();
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  const std::string& path() const { return path_; }

  struct Message {
    Clock::time_point at;
    std::string text;
  };
  std::vector<Message> Messages() {
    std::lock_guard<std::mutex> lock(mu_);
    return messages_;
  }
  // Messages that are exactly `text` (or start with it, for "STATUS="), received after `since`.
  size_t Count(const std::string& text, Clock::time_point since = {}) {
    size_t n = 0;
    for (const Message& m : Messages()) {
      if (m.at >= since && m.text.rfind(text, 0) == 0) ++n;
    }
    return n;
  }
  std::string LastStatus() {
    std::string last;
    for (const Message& m : Messages()) {
      if (m.text.rfind("STATUS=", 0) == 0) last = m.text.substr(7);
    }
    return last;
  }

 private:
  void Read() {
    char buf[4096];
    while (!stop_) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      // sd_notify may send several newline-separated assignments in one datagram.
      std::string text(buf, static_cast<size_t>(n));
      std::lock_guard<std::mutex> lock(mu_);
      size_t start = 0;
      while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        if (end > start) messages_.push_back({Clock::now(), text.substr(start, end - start)});
        start = end + 1;
      }
    }
  }

  std::string path_;
  int fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread reader_;
  std::mutex mu_;
  std::vector<Message> messages_;
};

constexpr char kHungSample[] = "*/img_000005.jpg";

std::string HangConfig() {
  return std::string("[failpoints]\naction = \"hang_decode\"\ncrash_on_path = \"") + kHungSample +
         "\"\n";
}

TEST_CASE("12.1: under systemd the daemon says READY=1 and STATUS=, pings WATCHDOG=1 while it "
          "makes progress, and stops pinging while a decode is stuck past its deadline",
          "[integration][systemd][watchdog]") {
  DaemonFixtureOptions options;
  options.images = 24;
  options.server_extra = "decode_deadline_ms = 400";  // stuck after 2 x 400 ms
  options.config_extra = HangConfig();
  DaemonFixture daemon(options);
  FakeNotifySocket systemd(daemon.dir() + "/notify.sock");
  // What systemd sets for a Type=notify unit with WatchdogSec=1s.
  daemon.SetEnv("NOTIFY_SOCKET", systemd.path());
  daemon.SetEnv("WATCHDOG_USEC", "1000000");
  REQUIRE(daemon.Start());
  REQUIRE(WaitFor([&] { return systemd.Count("READY=1") == 1; }, std::chrono::seconds(10)));
  // Idle and healthy: pings about every 500 ms, and a status naming streams and images/s.
  const Clock::time_point idle_from = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2200));
  CHECK(systemd.Count("WATCHDOG=1", idle_from) >= 3);
  CHECK_THAT(systemd.LastStatus(), Catch::StartsWith("serving: 0 streams") &&
                                       Catch::Contains("images/s"));

  // A trainer reaches the sample whose decode hangs: within 2 x decode_deadline_ms the status
  // says so, naming it, and the pings stop for as long as it hangs.
  Subprocess trainer({CtlPath(), "--endpoint", daemon.endpoint(), "consume", "--dataset", "synth",
                      "--batch-size", "4", "--image-size", "32", "--no-shuffle"},
                     {}, daemon.dir() + "/trainer.log");
  REQUIRE(WaitFor([&] { return systemd.LastStatus().rfind("stalled:", 0) == 0; },
                  std::chrono::seconds(10)));
  const std::string stalled = systemd.LastStatus();
  CHECK_THAT(stalled, Catch::Contains("img_000005.jpg") && Catch::Contains("decode_deadline_ms"));
  const Clock::time_point stuck_from = Clock::now();
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  CHECK(systemd.Count("WATCHDOG=1", stuck_from) == 0);
  CHECK_THAT(daemon.Log(), Catch::Contains("no progress: stalled"));

  // systemd's WatchdogSignal (SIGABRT) ends it; the crash journal strikes the stuck sample.
  daemon.process().Kill(SIGABRT);
  const int status = daemon.process().Wait(std::chrono::seconds(10));
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGABRT);
  trainer.Kill(SIGKILL);
  trainer.Wait();
  daemon.SetEnv("RINGLOADER_FAILPOINTS", "action=none");
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), Catch::Contains("img_000005.jpg) was being decoded when ringloaderd "
                                           "crashed (strike 1/2)"));
  CHECK(daemon.Stop() == 0);
  CHECK(systemd.Count("STOPPING=1") >= 1);
}

TEST_CASE("12.1: --supervise kills a child that stops making progress, restarts it, and a "
          "sample that hangs twice is quarantined while the epoch completes",
          "[integration][supervise][watchdog]") {
  DaemonFixtureOptions options;
  options.images = 24;
  options.supervise = true;
  options.server_extra = "decode_deadline_ms = 400\nwatchdog_ms = 1500";
  options.config_extra = HangConfig();
  DaemonFixture daemon(options);
  // The supervisor itself under systemd: it passes READY=1 on, once.
  FakeNotifySocket systemd(daemon.dir() + "/notify.sock");
  daemon.SetEnv("NOTIFY_SOCKET", systemd.path());
  REQUIRE(daemon.Start());
  const pid_t first = daemon.ServingPid();
  const std::string out = daemon.dir() + "/samples.tsv";
  const CommandResult r =
      daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4", "--image-size", "32",
                  "--epochs", "1", "--samples-out", out, "--reconnect-deadline-s", "60"});
  INFO(r.output << "\n--- daemon log ---\n" << daemon.Log());
  REQUIRE(r.exit_code == 0);
  // Every sample but the one that hangs, exactly once.
  const std::vector<SampleLine> lines = ReadSamplesOut(out);
  CHECK(lines.size() == 23);
  std::set<uint64_t> seen;
  for (const SampleLine& l : lines) {
    CHECK(seen.insert(l.sample_index).second);
    CHECK(l.path.find("img_000005.jpg") == std::string::npos);
  }
  const std::string log = daemon.Log();
  size_t kills = 0;
  for (size_t at = log.find("sent no progress ping"); at != std::string::npos;
       at = log.find("sent no progress ping", at + 1)) {
    ++kills;
  }
  CHECK(kills == 2);
  CHECK_THAT(log, Catch::Contains("quarantined"));
  CHECK(daemon.ServingPid() != first);
  const CommandResult quarantine = daemon.Ctl({"quarantine", "list"});
  CHECK_THAT(quarantine.output, Catch::Contains("img_000005.jpg"));
  CHECK(systemd.Count("READY=1") == 1);
  CHECK(systemd.Count("WATCHDOG=1") >= 1);
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace ringloader::testing
