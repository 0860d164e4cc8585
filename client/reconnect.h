// SPDX-License-Identifier: Apache-2.0
#pragma once
// Getting a stream open, and back open after the daemon's death: one explicit state machine for
// the first open and every reconnect. It does no I/O: it is told the time and how each open
// attempt ended, and says what to do next (Stream::Impl makes the calls). Internal to
// ringloader_client; tests include it directly.
//
//            Lost(why, since)              its backoff passed, Started()
//   kOpen ─────────────────────> kWaiting ──────────────────────────────> kOpening
//     ^                            ^   │                                     │
//     │                            │   └─ since + reconnect_deadline ──┐     │
//     │                            └───── Ended(kRetry) ─────────────────────┤
//     └──────────────────────────────────  Ended(kOpened) ───────────────────┤
//                                          kFailed <── Ended(kFatal) ───────┘
//                                                  <───────────────────┘
//   Ended(kRestartEpoch) (the dataset changed, restart_epoch_if_dataset_changed): kWaiting with
//   no backoff, once per Lost(): the restarted attempt checks no fingerprint, so it cannot say so
//   again, and a second one is kFatal.
//
// The rule that makes large rings work: an open in flight (kOpening) is never given up because
// a caller's wait ended. Next(timeout), and the Python loader's 200 ms slices, hear kGiveUp
// while the attempt goes on; the next call waits for the same attempt. An attempt's own deadline
// is what is left of reconnect_deadline, at most kMaxAttempt: a daemon making a 1.4 GB ring
// takes over a second to answer.
//
// Thread-safety: none (one Stream, one thread at a time).

#include <chrono>
#include <cstdint>
#include <string>

#include "client/retry.h"
#include "grpcpp/support/status.h"

namespace ringloader::client {

class Reconnect {
 public:
  using Clock = std::chrono::steady_clock;
  // One attempt waits at most this long for the daemon's answer.
  static constexpr std::chrono::milliseconds kMaxAttempt{30'000};
  // ... and at least this long, so that an attempt started just before the deadline can succeed.
  static constexpr std::chrono::milliseconds kMinAttempt{10};
  // gRPC ends a call at its deadline; an attempt still unanswered this long after it is given
  // up by the caller (Stream: cancelled, then Ended(kRetry)).
  static constexpr std::chrono::milliseconds kAttemptGrace{5'000};

  enum class State { kOpen, kWaiting, kOpening, kFailed };
  // How an open attempt ended (Stream::Impl classifies the call's status).
  enum class Outcome {
    kOpened,        // the stream is open and its ring mapped
    kRetry,         // the daemon is missing, restarting or refused for now: back off and retry
    kRestartEpoch,  // the dataset changed; the position was moved to the epoch's start
    kFatal,         // retrying cannot help; the caller throws the error
  };
  struct Step {
    enum Kind {
      kReady,      // the stream is open
      kWait,       // back off: sleep until `until`, then ask again
      kStartOpen,  // start an attempt whose call's deadline is `until`, then Started()
      kAwaitOpen,  // wait for the attempt in flight until `until`, then ask again; an attempt
                   // unanswered at attempt_deadline() + kAttemptGrace is to be given up
      kGiveUp,     // the caller's own deadline passed: it hears kDeadlineExceeded, nothing is lost
      kFail,       // reconnect_deadline passed since since(): unavailable, last() says why
      kFailed,     // an attempt failed for good (Ended(kFatal)); Lost() starts over
    };
    Kind kind;
    Clock::time_point until{};
  };

  // `seed` makes the backoff's jitter reproducible (tests).
  Reconnect(std::chrono::milliseconds reconnect_deadline, uint64_t seed);

  State state() const { return state_; }
  // When the stream was found missing, and the latest reason it is not open yet.
  Clock::time_point since() const { return since_; }
  const grpc::Status& last() const { return last_; }
  // Attempts started since the stream was last lost (or first opened).
  uint32_t attempts() const { return attempts_; }
  // kOpening: the attempt's call's deadline.
  Clock::time_point attempt_deadline() const { return attempt_deadline_; }

  // The stream is not open (never was, or was lost at `since` because of `why`): from kOpen or
  // kFailed, start reconnecting, the deadline counting from `since`. `at_once`: the first
  // attempt without a backoff (the first open). In kWaiting or kOpening it only notes `why`.
  void Lost(grpc::Status why, Clock::time_point since, bool at_once = false);
  // What to do at `now` for a caller that waits until `give_up`.
  Step Next(Clock::time_point now, Clock::time_point give_up) const;
  // REQUIRES: Next() said kStartOpen.
  void Started(Clock::time_point now);
  // REQUIRES: kOpening. `status` is why a kRetry or kFatal attempt failed.
  void Ended(Outcome outcome, grpc::Status status, Clock::time_point now);
  // REQUIRES: Next() said kFail. kFailed: the caller throws; a later Lost() starts over.
  void Expired() { state_ = State::kFailed; }

 private:
  // What is left of the reconnect deadline for an attempt starting at `now`, within
  // [kMinAttempt, kMaxAttempt].
  Clock::time_point AttemptDeadline(Clock::time_point now) const;

  const std::chrono::milliseconds reconnect_deadline_;
  Backoff backoff_;
  State state_ = State::kFailed;  // nothing opened yet: Lost() starts
  Clock::time_point since_{};
  Clock::time_point next_attempt_{};    // kWaiting: when the backoff ends
  Clock::time_point attempt_deadline_{};  // kOpening: the call's deadline
  grpc::Status last_{grpc::StatusCode::UNAVAILABLE, "not opened yet"};
  uint32_t attempts_ = 0;
  bool restarted_epoch_ = false;  // since the last Lost()
};

const char* StateName(Reconnect::State state);

}  // namespace ringloader::client
