// SPDX-License-Identifier: Apache-2.0
// Issue 39 item 2: `ringloaderctl top` in a real terminal (tmux): it draws the daemon's line and
// a row per stream, redraws, sorts on a key, quits on q and gives the terminal back; with its
// output not a terminal it prints plain frames.
#include <catch2/catch.hpp>

#include <optional>
#include <chrono>
#include <string>
#include <thread>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/trainers.h"

namespace ringloader::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

CommandResult Tmux(std::vector<std::string> args) {
  args.insert(args.begin(), "/usr/bin/tmux");
  return RunCommand(args);
}

std::string Screen(const std::string& session) {
  return Tmux({"capture-pane", "-p", "-t", session}).output;
}

// A tmux session that ends with the test.
struct TmuxSession {
  std::string name;
  ~TmuxSession() { Tmux({"kill-session", "-t", name}); }
};

TEST_CASE("39.2: ringloaderctl top draws the streams live in a terminal, sorts on a key, quits "
          "on q, and prints plain frames when its output is not a terminal",
          "[integration][top]") {
  DaemonFixtureOptions options;
  options.images = 64;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  // Two trainers: one computing 30 ms a step, one taking batches as fast as they come.
  std::optional<BackgroundTrainer> slow, fast;
  slow.emplace(daemon.endpoint(), TrainerOptions("synth", "trainer-slow", 8, 32),
               milliseconds(30));
  fast.emplace(daemon.endpoint(), TrainerOptions("synth", "trainer-fast", 8, 32),
               milliseconds(0));

  REQUIRE(WaitFor([&] { return Stats(daemon.endpoint()).streams_size() == 2; }, seconds(10)));
  // Plain: not a terminal, two frames, no escape sequences.
  const CommandResult plain = daemon.Ctl({"top", "--count", "2", "--delay", "0.5"});
  CHECK(plain.exit_code == 0);
  CHECK_THAT(plain.output, Catch::Contains("trainer-slow") && Catch::Contains("trainer-fast") &&
                               Catch::Contains("IMAGES/S") && Catch::Contains("INPUT-BOUND") &&
                               Catch::Contains("decode threads") &&
                               !Catch::Contains("\033["));

  // In a terminal of 120 x 30.
  TmuxSession tmux{"rltop" + std::to_string(getpid())};
  const std::string command =
      CtlPath() + " --endpoint " + daemon.endpoint() + " top --sort client; echo top-exited-$?; sleep 60";
  REQUIRE(Tmux({"new-session", "-d", "-s", tmux.name, "-x", "120", "-y", "30", command})
              .exit_code == 0);
  std::string screen;
  CHECK(WaitFor(
      [&] {
        screen = Screen(tmux.name);
        return screen.find("trainer-slow") != std::string::npos &&
               screen.find("sort: client") != std::string::npos;
      },
      seconds(10)));
  INFO(screen);
  // Sorted by client: the fast one's row comes first.
  CHECK(screen.find("trainer-fast") < screen.find("trainer-slow"));
  // It redraws: the uptime moves.
  const std::string first = screen.substr(0, screen.find('\n'));
  CHECK(WaitFor([&] { return Screen(tmux.name).substr(0, first.size()) != first; }, seconds(5)));
  // 'r' sorts by images/s: the fast trainer first too, and the header says so.
  REQUIRE(Tmux({"send-keys", "-t", tmux.name, "r"}).exit_code == 0);
  CHECK(WaitFor([&] { return Screen(tmux.name).find("sort: images/s") != std::string::npos; },
                seconds(5)));
  REQUIRE(Tmux({"send-keys", "-t", tmux.name, "n"}).exit_code == 0);
  CHECK(WaitFor([&] { return Screen(tmux.name).find("sort: id") != std::string::npos; },
                seconds(5)));
  // 'q' quits with 0 and the terminal's own screen comes back (the alternate screen is left).
  REQUIRE(Tmux({"send-keys", "-t", tmux.name, "q"}).exit_code == 0);
  CHECK(WaitFor([&] { return Screen(tmux.name).find("top-exited-0") != std::string::npos; },
                seconds(5)));
  CHECK(Screen(tmux.name).find("INPUT-BOUND") == std::string::npos);
}

}  // namespace
}  // namespace ringloader::testing
