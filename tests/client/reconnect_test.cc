// SPDX-License-Identifier: Apache-2.0
// The reconnect state machine on its own (client/reconnect.h): time is given, not read, so each
// interleaving of a caller's deadline, an attempt in flight and the reconnect deadline is forced.
// Through the real daemon: tests/integration/reconnect_test.cc.
#include "client/reconnect.h"

#include <catch2/catch.hpp>

namespace ringloader::client {
namespace {

using Clock = Reconnect::Clock;
using Step = Reconnect::Step;
using Outcome = Reconnect::Outcome;
using std::chrono::milliseconds;

const Clock::time_point kT0 = Clock::time_point() + std::chrono::hours(1);
const Clock::time_point kNever = Clock::time_point::max();
const grpc::Status kDown(grpc::StatusCode::UNAVAILABLE, "connection refused");

// Drives `r` from kWaiting to kOpening at `now` (past any backoff). Returns the time it started.
Clock::time_point StartAttempt(Reconnect& r, Clock::time_point now) {
  Step step = r.Next(now, kNever);
  if (step.kind == Step::kWait) {
    now = step.until;
    step = r.Next(now, kNever);
  }
  REQUIRE(step.kind == Step::kStartOpen);
  r.Started(now);
  REQUIRE(r.state() == Reconnect::State::kOpening);
  return now;
}

}  // namespace

TEST_CASE("Reconnect: the first open is attempted at once and opens", "[client][reconnect]") {
  Reconnect r(milliseconds(60'000), 1);
  CHECK(r.state() == Reconnect::State::kFailed);
  r.Lost(kDown, kT0, /*at_once=*/true);
  const Step step = r.Next(kT0, kNever);
  REQUIRE(step.kind == Step::kStartOpen);
  CHECK(step.until == kT0 + Reconnect::kMaxAttempt);
  r.Started(kT0);
  CHECK(r.Next(kT0, kNever).kind == Step::kAwaitOpen);
  r.Ended(Outcome::kOpened, grpc::Status::OK, kT0 + milliseconds(5));
  CHECK(r.state() == Reconnect::State::kOpen);
  CHECK(r.Next(kT0, kNever).kind == Step::kReady);
}

TEST_CASE("Reconnect: a caller's deadline never ends an open in flight", "[client][reconnect]") {
  // The Python loader waits in 200 ms slices; a daemon making a 1.4 GB ring answers after 1.3 s.
  Reconnect r(milliseconds(60'000), 2);
  r.Lost(kDown, kT0);
  const Clock::time_point started = StartAttempt(r, kT0);
  Clock::time_point now = started;
  for (int slice = 0; slice < 7; ++slice) {
    const Clock::time_point give_up = now + milliseconds(200);
    const Step wait = r.Next(now, give_up);
    REQUIRE(wait.kind == Step::kAwaitOpen);
    CHECK(wait.until == give_up);  // wait for the same attempt, as long as the caller waits
    now = give_up;
    CHECK(r.Next(now, give_up).kind == Step::kGiveUp);
    CHECK(r.state() == Reconnect::State::kOpening);  // still in flight, not sent again
  }
  CHECK(r.attempts() == 1);
  r.Ended(Outcome::kOpened, grpc::Status::OK, now);
  CHECK(r.Next(now, now + milliseconds(200)).kind == Step::kReady);
}

TEST_CASE("Reconnect: an attempt's deadline is the reconnect deadline's, at most kMaxAttempt",
          "[client][reconnect]") {
  Reconnect r(milliseconds(120'000), 3);
  r.Lost(kDown, kT0);
  const Clock::time_point started = StartAttempt(r, kT0);
  CHECK(r.attempt_deadline() == started + Reconnect::kMaxAttempt);
  // Waited for until gRPC's answer to the deadline is overdue, not a moment less.
  CHECK(r.Next(started, kNever).until ==
        started + Reconnect::kMaxAttempt + Reconnect::kAttemptGrace);

  Reconnect near(milliseconds(1'000), 4);
  near.Lost(kDown, kT0);
  StartAttempt(near, kT0 + milliseconds(990));
  // What is left of the deadline, but never less than kMinAttempt.
  CHECK(near.attempt_deadline() == kT0 + milliseconds(990) + Reconnect::kMinAttempt);
}

TEST_CASE("Reconnect: failures back off, then the deadline ends it with the last reason",
          "[client][reconnect]") {
  Reconnect r(milliseconds(1'000), 5);
  r.Lost(kDown, kT0);
  // The first attempt after a loss waits a backoff step (the daemon is restarting).
  const Step first = r.Next(kT0, kNever);
  REQUIRE(first.kind == Step::kWait);
  CHECK(first.until > kT0);
  CHECK(first.until <= kT0 + Backoff::kInitial);
  Clock::time_point now = kT0;
  for (int i = 0; i < 3; ++i) {
    now = StartAttempt(r, now);
    r.Ended(Outcome::kRetry, grpc::Status(grpc::StatusCode::UNAVAILABLE, "try " + std::to_string(i)),
            now + milliseconds(1));
    CHECK(r.state() == Reconnect::State::kWaiting);
    now += milliseconds(1);
  }
  CHECK(r.attempts() == 3);
  CHECK(r.last().error_message() == "try 2");
  // A backoff never runs past the deadline.
  const Step wait = r.Next(kT0 + milliseconds(999), kNever);
  if (wait.kind == Step::kWait) CHECK(wait.until <= kT0 + milliseconds(1'000));
  CHECK(r.Next(kT0 + milliseconds(1'000), kNever).kind == Step::kFail);
  r.Expired();
  CHECK(r.state() == Reconnect::State::kFailed);
  // A later call starts over, its deadline counted from then.
  r.Lost(kDown, kT0 + milliseconds(5'000));
  CHECK(r.state() == Reconnect::State::kWaiting);
  CHECK(r.attempts() == 0);
  CHECK(r.Next(kT0 + milliseconds(5'500), kNever).kind == Step::kStartOpen);
}

TEST_CASE("Reconnect: a caller's deadline while backing off gives up for now, losing nothing",
          "[client][reconnect]") {
  Reconnect r(milliseconds(60'000), 6);
  r.Lost(kDown, kT0);
  const Clock::time_point now = StartAttempt(r, kT0);
  r.Ended(Outcome::kRetry, kDown, now);
  const Clock::time_point give_up = now + milliseconds(1);
  const Step wait = r.Next(now, give_up);
  REQUIRE(wait.kind == Step::kWait);
  CHECK(wait.until <= give_up);
  CHECK(r.Next(give_up, give_up).kind == Step::kGiveUp);
  CHECK(r.state() == Reconnect::State::kWaiting);
  CHECK(r.since() == kT0);  // the next call's deadline still counts from the loss
}

TEST_CASE("Reconnect: a changed dataset restarts the epoch once, at once", "[client][reconnect]") {
  Reconnect r(milliseconds(60'000), 7);
  r.Lost(kDown, kT0, true);
  Clock::time_point now = StartAttempt(r, kT0);
  const grpc::Status changed(grpc::StatusCode::FAILED_PRECONDITION, "changed since the position");
  r.Ended(Outcome::kRestartEpoch, changed, now);
  // No backoff: the restarted attempt goes now.
  REQUIRE(r.Next(now, kNever).kind == Step::kStartOpen);
  r.Started(now);
  // It cannot be told "changed" again (it checks no fingerprint): if it is, that is an error,
  // not a loop.
  r.Ended(Outcome::kRestartEpoch, changed, now);
  CHECK(r.state() == Reconnect::State::kFailed);
  CHECK(r.Next(now, kNever).kind == Step::kFailed);
  CHECK(r.last().error_code() == grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_CASE("Reconnect: a fatal answer fails at once, and a loss while reconnecting changes nothing",
          "[client][reconnect]") {
  Reconnect r(milliseconds(60'000), 8);
  r.Lost(kDown, kT0);
  const Clock::time_point now = StartAttempt(r, kT0);
  // Lost() while an attempt is in flight only notes the reason: the attempt goes on.
  r.Lost(grpc::Status(grpc::StatusCode::CANCELLED, "again"), now + milliseconds(3));
  CHECK(r.state() == Reconnect::State::kOpening);
  CHECK(r.since() == kT0);
  r.Ended(Outcome::kFatal, grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown dataset"), now);
  CHECK(r.state() == Reconnect::State::kFailed);
  CHECK(r.Next(now, kNever).kind == Step::kFailed);
  CHECK(r.last().error_message() == "unknown dataset");
}

}  // namespace ringloader::client
