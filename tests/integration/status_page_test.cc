// SPDX-License-Identifier: Apache-2.0
// Issue 39 item 3: the status page metrics_listen serves at "/", rendered by a real browser
// (Debian's chromium, headless): the table has the streams, the plots have points, nothing is
// fetched from elsewhere, a client's hostile name is text, not markup; a screenshot is kept as a
// test artifact (build/test-artifacts/status-page.png).
#include <catch2/catch.hpp>

#include <optional>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/integration/daemon_fixture.h"
#include "tests/integration/trainers.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

const char* const kChromium = "/usr/bin/chromium";

// Headless chromium, as a user's browser would load the page.
CommandResult Chromium(const std::string& profile, std::vector<std::string> args) {
  std::vector<std::string> argv = {kChromium,           "--headless",
                                   "--no-sandbox",      "--disable-gpu",
                                   "--no-first-run",    "--user-data-dir=" + profile,
                                   "--window-size=1280,1100"};
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv);
}

// How many "x,y" pairs the first polyline of the SVG with `id` has in `dom`.
size_t PointsIn(const std::string& dom, const std::string& id) {
  const size_t svg = dom.find("id=\"" + id + "\"");
  if (svg == std::string::npos) return 0;
  const size_t points = dom.find("points=\"", svg);
  if (points == std::string::npos) return 0;
  const size_t end = dom.find('"', points + 8);
  const std::string list = dom.substr(points + 8, end - points - 8);
  return static_cast<size_t>(std::count(list.begin(), list.end(), ',') );
}

TEST_CASE("39.3: the status page renders in headless Chromium with the streams' table and plots "
          "with points, self-contained, a hostile client name shown as text",
          "[integration][status_page]") {
  if (!fs::exists(kChromium)) RINGLOADER_SKIP(std::string("no ") + kChromium + " (apt install chromium)");
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 64;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string hostile = "<script>alert(1)</script>";
  std::optional<BackgroundTrainer> trainer;
  trainer.emplace(daemon.endpoint(), TrainerOptions("synth", hostile, 8, 32), milliseconds(20));
  // History has a point every 5 s (a stream's first has no images/s yet): loaded until both
  // plots have two points.
  TempDir profile;
  CommandResult dom;
  const auto plotted = [&] {
    dom = Chromium(profile.Join("p"), {"--dump-dom", "http://" + address + "/"});
    return dom.exit_code == 0 && PointsIn(dom.output, "images-per-second") >= 2 &&
           PointsIn(dom.output, "input-bound") >= 2;
  };
  CHECK(WaitFor(plotted, seconds(40)));
  INFO(dom.output);
  REQUIRE(dom.exit_code == 0);
  CHECK_THAT(dom.output, Catch::Contains("<table id=\"streams\">") &&
                             Catch::Contains("synth") && Catch::Contains("input-bound"));
  CHECK(PointsIn(dom.output, "images-per-second") >= 2);
  CHECK(PointsIn(dom.output, "input-bound") >= 2);
  // The client's name is text on the page, never an element.
  CHECK_THAT(dom.output, Catch::Contains("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>"));
  CHECK(dom.output.find("<script") == std::string::npos);
  // Self-contained: nothing to fetch (training hosts are often offline).
  const CommandResult page = RunCommand({"/usr/bin/curl", "--silent", "http://" + address + "/"});
  for (const char* fetch : {"src=", "href=", "@import", "url("}) {
    CHECK(page.output.find(fetch) == std::string::npos);
  }

  // The screenshot, kept for people to look at.
  const std::string artifacts = std::string(RINGLOADER_BINARY_DIR) + "/test-artifacts";
  fs::create_directories(artifacts);
  const std::string shot = artifacts + "/status-page.png";
  fs::remove(shot);
  const CommandResult screenshot =
      Chromium(profile.Join("p"), {"--screenshot=" + shot, "http://" + address + "/"});
  INFO(screenshot.output);
  CHECK(screenshot.exit_code == 0);
  REQUIRE(fs::exists(shot));
  CHECK(fs::file_size(shot) > 10'000);
  trainer.reset();
}

}  // namespace
}  // namespace ringloader::testing
