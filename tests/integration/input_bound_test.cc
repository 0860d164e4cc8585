// SPDX-License-Identifier: Apache-2.0
// Issue 39 item 1: is the trainer input-bound? Through the real daemon and its clients: a trainer
// that computes 40 ms a step on easy batches reads under 0.2, one that does nothing on 12-MP
// JPEGs behind one decode thread over 0.8; paused, or holding every batch it gets, a trainer
// does not read as input-bound. Each is seen where users look: `ringloaderctl stats` (a column,
// and --json), /metrics (scraped by curl) and the C++ Stream.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "shm/base/cgroup.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/scrape.h"
#include "tests/integration/trainers.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Takes batches for `run`, computing `step` after each (0: none); keeps them all when `hold`.
void Train(client::Stream& stream, Clock::duration run, milliseconds step, bool hold = false) {
  std::vector<client::Batch> held;
  const auto end = Clock::now() + run;
  while (Clock::now() < end) {
    std::optional<client::Batch> batch = stream.Next();
    REQUIRE(batch);
    if (hold) held.push_back(*std::move(batch));
    if (step.count() > 0) std::this_thread::sleep_for(step);
  }
}

v1::StreamStats StatsOf(const std::string& endpoint, const std::string& client_name) {
  const v1::GetStatsResponse stats = Stats(endpoint);
  for (const v1::StreamStats& s : stats.streams()) {
    if (s.client_name() == client_name) return s;
  }
  FAIL("no stream of client " << client_name);
  return {};
}

TEST_CASE("39.1: a compute-bound trainer is not input-bound and a starved one highly, in stats, "
          "--json, /metrics and the Stream, and a paused trainer or one holding its batches is not",
          "[integration][input_bound]") {
  TempDir data;
  WriteLargePhotos(data.Join("photos"), 6);
  const std::string address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 64;  // "synth": easy 32 px batches
  options.decode_threads = 1;
  options.server_extra = "metrics_listen = \"" + address + "\"";
  options.config_extra = "[[datasets]]\nname = \"photos\"\nformat = \"imagefolder\"\npath = \"" + data.Join("photos") +
                         "\"\nmax_pixels = 20000000\n";
  DaemonFixture daemon(options);
  const bool started = daemon.Start();
  INFO(daemon.Log());
  REQUIRE(started);
  client::Client c(daemon.endpoint());

  // Computes 40 ms a step on easy batches: the ring is ahead, its waits are a call's.
  std::unique_ptr<client::Stream> compute = c.Open(TrainerOptions("synth", "compute", 8, 32));
  Train(*compute, seconds(4), milliseconds(40));
  const v1::StreamStats computing = StatsOf(daemon.endpoint(), "compute");
  CHECK(computing.input_bound() >= 0);
  CHECK(computing.input_bound() < 0.2);
  CHECK(computing.trainer_step_seconds() > 3);
  CHECK(computing.trainer_steps() > 50);
  CHECK(compute->trainer_step() > seconds(3));
  CHECK(compute->input_bound() >= 0);
  CHECK(compute->input_bound() < 0.2);

  // Does nothing on 12-MP photos behind one decode thread: it waits for nearly all of its time.
  std::unique_ptr<client::Stream> starved = c.Open(TrainerOptions("photos", "starved", 2, 224));
  Train(*starved, seconds(5), milliseconds(0));
  const v1::StreamStats starving = StatsOf(daemon.endpoint(), "starved");
  CHECK(starving.input_bound() > 0.8);
  CHECK(starving.input_bound_words() == "highly input-bound");
  CHECK(starved->input_bound() > 0.8);
  CHECK(starved->trainer_wait() > 4 * starved->trainer_step());
  // Its wait went on decoding (reads of a local disk are done ahead, and say how long they took).
  CHECK(starving.read_ahead_seconds() > 0);
  CHECK(starving.wait_on_decode_seconds() > starving.wait_on_read_seconds());
  CHECK(starving.wait_on_decode_seconds() > 0.5 * starving.input_bound() *
                                                  starving.input_window_seconds());
  // doctor --live says what limits it (decode, one thread of this host's cores) and what to try.
  const CommandResult doctor = daemon.Ctl({"doctor", "--live"});
  CHECK(doctor.exit_code == 1);
  CHECK_THAT(doctor.output, Catch::Contains("problem: stream") &&
                                Catch::Contains("client \"starved\"") &&
                                Catch::Contains("limited by decode and augmentation") &&
                                Catch::Contains("decode threads") &&
                                Catch::Contains("client \"compute\""));
  if (base::UsableCores() > 1) {  // (the daemon, started from here, may use as many)
    CHECK_THAT(doctor.output, Catch::Contains("raise [server] decode_threads (now 1"));
  }
  // The compute-bound trainer, paused all this time, did not become input-bound.
  CHECK(StatsOf(daemon.endpoint(), "compute").input_bound() < 0.2);

  // Where users look: the stats table, its JSON, /metrics.
  const CommandResult table = daemon.Ctl({"stats"});
  CHECK_THAT(table.output, Catch::Contains("INPUT-BOUND") && Catch::Contains("% highly") &&
                               Catch::Contains("% not") &&
                               Catch::Contains("waited") && Catch::Contains("decode"));
  const CommandResult json = daemon.Ctl({"stats", "--json"});
  CHECK_THAT(json.output, Catch::Contains("\"input_bound\"") &&
                              Catch::Contains("\"trainer_wait_seconds\"") &&
                              Catch::Contains("\"trainer_step_seconds\""));
  const CommandResult scraped = Scrape(address);
  REQUIRE(scraped.exit_code == 0);
  const std::string labels = "{stream=\"" + std::to_string(starving.stream_id()) +
                             "\",client=\"starved\",dataset=\"photos\"}";
  const std::optional<double> wait = Value(scraped.output, "ringloader_trainer_wait_seconds_total" + labels);
  const std::optional<double> bound = Value(scraped.output, "ringloader_trainer_input_bound" + labels);
  INFO(scraped.output);
  REQUIRE(wait);
  REQUIRE(bound);
  CHECK(*wait > 3);
  CHECK(*bound > 0.8);

  // Paused: the starved trainer stops calling; as long as it waited, its figure halves.
  std::this_thread::sleep_for(seconds(5));
  CHECK(StatsOf(daemon.endpoint(), "starved").input_bound() < 0.7);

  // Holding every batch it gets, with a ring of 4 slots: the client copies held batches out of
  // the ring (the trainer's own cost, counted as its step), and it does not read as input-bound.
  client::StreamOptions holding_options = TrainerOptions("synth", "holding", 8, 32);
  holding_options.ring_slots = 4;
  std::unique_ptr<client::Stream> holding = c.Open(holding_options);
  Train(*holding, seconds(3), milliseconds(40), /*hold=*/true);
  CHECK(holding->copies() > 10);
  CHECK(StatsOf(daemon.endpoint(), "holding").input_bound() < 0.2);
}

}  // namespace
}  // namespace ringloader::testing
