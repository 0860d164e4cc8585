// SPDX-License-Identifier: Apache-2.0
// Issue 39 item 3: deploy/prometheus/ as people run it. promtool checks the rules; every series
// the rules and the Grafana dashboard name is one a real daemon exports; and a real Prometheus
// (Debian's) scraping a real daemon fires the input-bound alert for a starved trainer and not
// for a compute-bound one (the rule's "for: 10m" shortened to seconds, nothing else changed).
#include <catch2/catch.hpp>

#include <optional>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <cctype>
#include <cstring>
#include <set>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/strings/str_replace.h"
#include "client/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/scrape.h"
#include "tests/integration/trainers.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

const std::string kRules = std::string(RINGLOADER_SOURCE_DIR) + "/deploy/prometheus/ringloader-rules.yml";
const std::string kDashboard =
    std::string(RINGLOADER_SOURCE_DIR) + "/deploy/prometheus/ringloader-dashboard.json";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every ringloader_* series name in `text` (a histogram's _bucket/_sum/_count as its family).
std::set<std::string> SeriesNames(const std::string& text) {
  std::set<std::string> names;
  const std::string prefix = "ringloader_";
  for (size_t at = text.find(prefix); at != std::string::npos; at = text.find(prefix, at + 1)) {
    size_t end = at + prefix.size();
    while (end < text.size() && (std::islower(static_cast<unsigned char>(text[end])) != 0 ||
                                 text[end] == '_')) {
      ++end;
    }
    names.insert(text.substr(at, end - at));
  }
  return names;
}

TEST_CASE("39.3: promtool passes the alerting rules, and every series the rules and the Grafana "
          "dashboard use is one the daemon exports",
          "[integration][monitoring]") {
  if (!fs::exists("/usr/bin/promtool")) RINGLOADER_SKIP("no promtool (apt install prometheus)");
  const CommandResult checked = RunCommand({"/usr/bin/promtool", "check", "rules", kRules});
  INFO(checked.output);
  CHECK(checked.exit_code == 0);
  CHECK_THAT(checked.output, Catch::Contains("SUCCESS"));

  const nlohmann::json dashboard = nlohmann::json::parse(ReadAll(kDashboard));
  std::string exprs;
  for (const nlohmann::json& panel : dashboard.at("panels")) {
    for (const nlohmann::json& target : panel.at("targets")) {
      exprs += target.at("expr").get<std::string>() + "\n";
    }
  }
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 8;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  {
    // A stream, so that the per-stream series exist.
    client::Client c(daemon.endpoint());
    client::StreamOptions o;
    o.dataset = "synth";
    o.batch_size = 4;
    o.image_size = 32;
    o.end_epoch = 1;
    std::unique_ptr<client::Stream> stream = c.Open(o);
    REQUIRE(stream->Next());
    const CommandResult scraped = Scrape(address);
    const std::set<std::string> exported = SeriesNames(scraped.output);
    for (const std::string& used : SeriesNames(ReadAll(kRules) + exprs)) {
      std::string family = used;
      for (const char* suffix : {"_bucket", "_sum", "_count"}) {
        if (family.size() > std::strlen(suffix) &&
            family.compare(family.size() - std::strlen(suffix), std::string::npos, suffix) == 0 &&
            exported.count(family) == 0) {
          family.resize(family.size() - std::strlen(suffix));
        }
      }
      // A daemon with [tls] exports those (tls_test checks them there).
      if (used.rfind("ringloader_tls_", 0) == 0) continue;
      INFO("used by the rules or the dashboard: " << used);
      CHECK((exported.count(used) != 0 || exported.count(family) != 0));
    }
  }
}

// The Prometheus API's alerts, as JSON.
nlohmann::json Alerts(const std::string& prometheus) {
  const CommandResult got = RunCommand(
      {"/usr/bin/curl", "--silent", "--max-time", "5", "http://" + prometheus + "/api/v1/alerts"});
  if (got.exit_code != 0) return nlohmann::json::object();
  return nlohmann::json::parse(got.output, nullptr, /*allow_exceptions=*/false);
}

// The state ("pending", "firing") of alert `name` for client `client`, or "" when none.
std::string AlertState(const nlohmann::json& alerts, const std::string& name,
                       const std::string& client) {
  if (!alerts.is_object() || !alerts.contains("data")) return "";
  for (const nlohmann::json& a : alerts["data"]["alerts"]) {
    if (a["labels"].value("alertname", "") == name && a["labels"].value("client", "") == client) {
      return a.value("state", "");
    }
  }
  return "";
}

TEST_CASE("39.3: a real Prometheus scraping a real daemon fires the input-bound alert for a "
          "starved trainer and not for a compute-bound one",
          "[integration][monitoring]") {
  if (!fs::exists("/usr/bin/prometheus")) RINGLOADER_SKIP("no prometheus (apt install prometheus)");
  TempDir data;
  WriteLargePhotos(data.Join("photos"), 6);
  const std::string metrics = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 64;
  options.server_extra = "metrics_listen = \"" + metrics + "\"";
  options.config_extra = "[[datasets]]\nname = \"photos\"\nformat = \"imagefolder\"\npath = \"" +
                         data.Join("photos") + "\"\nmax_pixels = 20000000\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());

  // The shipped rules, their "for" shortened so that the test need not wait 10 minutes.
  std::string rules = absl::StrReplaceAll(ReadAll(kRules), {{"for: 10m", "for: 5s"}});
  std::ofstream(data.Join("rules.yml")) << rules;
  const std::string prometheus = "127.0.0.1:" + std::to_string(FreeTcpPort());
  std::ofstream(data.Join("prometheus.yml"))
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " << data.Join("rules.yml") << "\n"
      << "scrape_configs:\n  - job_name: ringloader\n    static_configs:\n      - targets: ['"
      << metrics << "']\n";
  Subprocess server({"/usr/bin/prometheus", "--config.file=" + data.Join("prometheus.yml"),
                     "--storage.tsdb.path=" + data.Join("tsdb"),
                     "--web.listen-address=" + prometheus},
                    {}, data.Join("prometheus.log"));

  std::optional<BackgroundTrainer> compute, starved;
  // Its ring of 8 slots is filled ahead while the other's 12-MP photos take the decode threads.
  client::StreamOptions compute_options = TrainerOptions("synth", "compute", 8, 32);
  compute_options.ring_slots = 8;
  compute.emplace(daemon.endpoint(), compute_options, milliseconds(40));
  starved.emplace(daemon.endpoint(), TrainerOptions("photos", "starved", 2, 224),
                  milliseconds(0));

  std::string starved_state, compute_state;
  const bool fired = WaitFor(
      [&] {
        const nlohmann::json alerts = Alerts(prometheus);
        starved_state = AlertState(alerts, "RingloaderTrainerInputBound", "starved");
        compute_state = AlertState(alerts, "RingloaderTrainerInputBound", "compute");
        return starved_state == "firing";
      },
      seconds(60));
  // Still quiet for the compute-bound one, a while after.
  std::this_thread::sleep_for(seconds(3));
  const std::string compute_later =
      AlertState(Alerts(prometheus), "RingloaderTrainerInputBound", "compute");
  compute.reset();
  starved.reset();
  INFO(daemon.Ctl({"stats"}).output);
  INFO(ReadAll(data.Join("prometheus.log")).substr(0, 4000));
  CHECK(fired);
  CHECK(compute_state == "");
  CHECK(compute_later == "");
}

}  // namespace
}  // namespace ringloader::testing
