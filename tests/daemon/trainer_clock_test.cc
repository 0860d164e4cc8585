// SPDX-License-Identifier: Apache-2.0
// server/daemon/trainer_clock: whether a trainer is input-bound, from its client's reports, on a
// clock the test drives (no sleeps): compute-bound, starved, paused, changing, lying.
#include "server/daemon/trainer_clock.h"

#include <catch2/catch.hpp>

#include <chrono>

namespace ringloader::server {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kS = 1'000 * kMs;

// A trainer as its client reports it: each Next() call waits `wait`, then the trainer computes
// `step` before the next call; the report sent with a call holds the totals so far.
struct Trainer {
  explicit Trainer(TrainerClock& c) : clock(c) {}
  TrainerClock& clock;
  int64_t now = 1 * kS;
  TrainerReport totals;

  void Steps(int count, int64_t wait, int64_t step) {
    for (int i = 0; i < count; ++i) {
      clock.CallStarted(&totals, now);
      now += wait;
      clock.CallEnded(now);
      totals.wait_ns += wait;
      ++totals.steps;
      now += step;
      totals.step_ns += step;
    }
  }
};

TEST_CASE("TrainerClock: a compute-bound trainer is not input-bound, a starved one highly",
          "[daemon][trainer]") {
  TrainerClock compute_clock;
  Trainer compute{compute_clock};
  compute.Steps(3000, 1 * kMs, 40 * kMs);  // 2 minutes of 40 ms steps, batches ready
  const TrainerFigure fast = compute_clock.Read(compute.now);
  REQUIRE(fast.known);
  CHECK(fast.input_bound < 0.05);
  CHECK(InputBoundWords(fast) == "not input-bound");
  CHECK(fast.window_seconds == Approx(60));
  CHECK(fast.steps == 2999);  // the first report is the baseline
  CHECK(fast.wait_seconds_total == Approx(2999 * 0.001).epsilon(0.01));

  TrainerClock starved_clock;
  Trainer starved{starved_clock};
  starved.Steps(200, 900 * kMs, 5 * kMs);
  const TrainerFigure slow = starved_clock.Read(starved.now);
  CHECK(slow.input_bound > 0.9);
  CHECK(InputBoundWords(slow) == "highly input-bound");

  TrainerClock between_clock;
  Trainer between{between_clock};
  between.Steps(1000, 10 * kMs, 90 * kMs);
  const TrainerFigure moderate = between_clock.Read(between.now);
  CHECK(moderate.input_bound == Approx(0.1).margin(0.01));
  CHECK(InputBoundWords(moderate) == "moderately input-bound");
}

TEST_CASE("TrainerClock: a paused trainer is in its step, one inside a call is waiting",
          "[daemon][trainer]") {
  TrainerClock clock;
  Trainer trainer{clock};
  trainer.Steps(100, 900 * kMs, 5 * kMs);
  REQUIRE(clock.Read(trainer.now).input_bound > 0.9);
  // It stops calling (evaluating, checkpointing, paused in a debugger): within the window the
  // figure falls, and once the window holds only the pause it is 0.
  CHECK(clock.Read(trainer.now + 30 * kS).input_bound < 0.6);
  CHECK(clock.Read(trainer.now + 61 * kS).input_bound == 0);
  CHECK(InputBoundWords(clock.Read(trainer.now + 61 * kS)) == "not input-bound");
  // A call that waits (and has not ended) is waiting, before its report says so.
  trainer.now += 61 * kS;
  trainer.totals.step_ns += 61 * kS;
  clock.CallStarted(&trainer.totals, trainer.now);
  CHECK(clock.Read(trainer.now + 30 * kS).input_bound == Approx(0.5).margin(0.02));
}

TEST_CASE("TrainerClock: a young stream's figure covers its whole life, not its last call",
          "[daemon][trainer]") {
  TrainerClock clock;
  Trainer trainer{clock};
  trainer.Steps(10, 1 * kMs, 40 * kMs);  // 410 ms, all within one second
  const TrainerFigure figure = clock.Read(trainer.now);
  CHECK(figure.window_seconds > 0.35);
  CHECK(figure.input_bound < 0.05);
}

TEST_CASE("TrainerClock: the figure covers the last minute: a trainer that changes is read anew",
          "[daemon][trainer]") {
  TrainerClock clock;
  Trainer trainer{clock};
  trainer.Steps(100, 900 * kMs, 5 * kMs);  // starved for 90 s
  trainer.Steps(2000, 1 * kMs, 40 * kMs);  // then compute-bound for 82 s
  CHECK(clock.Read(trainer.now).input_bound < 0.05);
}

TEST_CASE("TrainerClock: the trainer's wait is split as the producer's busy time was",
          "[daemon][trainer]") {
  TrainerClock clock;
  Trainer trainer{clock};
  trainer.Steps(1, 0, 1 * kS);
  clock.AddProducerTime(ProducerPhase::kRead, 3 * kS, trainer.now);
  clock.AddProducerTime(ProducerPhase::kDecode, 1 * kS, trainer.now);
  clock.AddReadAheadTime(5 * kS, trainer.now);  // reads done ahead: not part of the split
  trainer.Steps(10, 1 * kS, 0);
  const TrainerFigure figure = clock.Read(trainer.now);
  const auto on = [&](ProducerPhase p) { return figure.wait_on_seconds[static_cast<size_t>(p)]; };
  CHECK(on(ProducerPhase::kRead) == Approx(0.75 * figure.wait_seconds));
  CHECK(on(ProducerPhase::kDecode) == Approx(0.25 * figure.wait_seconds));
  CHECK(on(ProducerPhase::kMemory) == 0);
  CHECK(on(ProducerPhase::kDelivery) == 0);
  CHECK(figure.read_ahead_seconds == Approx(5));
}

TEST_CASE("TrainerClock: a client that does not report is unknown, and one that lies is bounded by "
          "the daemon's clock",
          "[daemon][trainer]") {
  TrainerClock silent;
  silent.CallStarted(nullptr, 1 * kS);
  silent.CallEnded(2 * kS);
  CHECK_FALSE(silent.Read(3 * kS).known);
  CHECK(InputBoundWords(silent.Read(3 * kS)) == "unknown");

  // Totals far beyond the time that passed: each report adds at most what the daemon saw pass.
  TrainerClock clock;
  TrainerReport lie;
  clock.CallStarted(&lie, 1 * kS);
  clock.CallEnded(1 * kS + kMs);
  lie.wait_ns = uint64_t{1} << 62;
  lie.step_ns = uint64_t{1} << 60;
  lie.steps = uint64_t{1} << 62;
  clock.CallStarted(&lie, 2 * kS);
  clock.CallEnded(2 * kS + kMs);
  TrainerFigure figure = clock.Read(2 * kS + kMs);
  CHECK(figure.wait_seconds_total + figure.step_seconds_total <= 1.02);
  CHECK(figure.steps <= 1);
  CHECK(figure.input_bound >= 0);
  CHECK(figure.input_bound <= 1);
  // Two halves that would wrap round to a small sum are no small sum.
  TrainerClock wrap;
  TrainerReport zero;
  wrap.CallStarted(&zero, 1 * kS);
  wrap.CallEnded(1 * kS);
  TrainerReport halves;
  halves.wait_ns = 3 * (uint64_t{1} << 62);
  halves.step_ns = (uint64_t{1} << 62) + 5;
  halves.steps = 1;
  wrap.CallStarted(&halves, 2 * kS);
  const TrainerFigure wrapped = wrap.Read(2 * kS);
  CHECK(wrapped.input_bound >= 0);
  CHECK(wrapped.input_bound <= 1);
  CHECK(wrapped.wait_seconds_total + wrapped.step_seconds_total <= 1.02);
  // Totals that go backwards (another process reporting) are a new baseline, not a wrap.
  TrainerReport fresh;
  clock.CallStarted(&fresh, 3 * kS);
  clock.CallEnded(3 * kS + kMs);
  figure = clock.Read(3 * kS + kMs);
  CHECK(figure.wait_seconds_total + figure.step_seconds_total <= 1.02);
  CHECK(figure.input_bound <= 1);
}

}  // namespace
}  // namespace ringloader::server
