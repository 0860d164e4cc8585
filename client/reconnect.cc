// SPDX-License-Identifier: Apache-2.0
#include "client/reconnect.h"

#include <algorithm>
#include <utility>

namespace ringloader::client {

Reconnect::Reconnect(std::chrono::milliseconds reconnect_deadline, uint64_t seed)
    : reconnect_deadline_(reconnect_deadline), backoff_(seed) {}

void Reconnect::Lost(grpc::Status why, Clock::time_point since, bool at_once) {
  last_ = std::move(why);
  if (state_ == State::kWaiting || state_ == State::kOpening) return;
  state_ = State::kWaiting;
  since_ = since;
  attempts_ = 0;
  restarted_epoch_ = false;
  backoff_.Reset();
  next_attempt_ = at_once ? since : since + backoff_.NextDelay();
}

Reconnect::Step Reconnect::Next(Clock::time_point now, Clock::time_point give_up) const {
  const Clock::time_point deadline = since_ + reconnect_deadline_;
  switch (state_) {
    case State::kOpen:
      return {Step::kReady};
    case State::kFailed:
      return {Step::kFailed};
    case State::kOpening:
      // The attempt ends by its own deadline (gRPC's answer comes right after it); only the
      // caller's wait may end first.
      if (now >= give_up) return {Step::kGiveUp};
      return {Step::kAwaitOpen, std::min(give_up, attempt_deadline_ + kAttemptGrace)};
    case State::kWaiting:
      break;
  }
  // An attempt may start until the deadline itself (the first always may).
  if (now >= deadline && attempts_ > 0) return {Step::kFail};
  if (now >= give_up) return {Step::kGiveUp};
  if (now < next_attempt_) {
    // Until the backoff ends; no later than the deadline once an attempt has been made (the
    // first may start past it).
    const Clock::time_point until = std::min(next_attempt_, give_up);
    return {Step::kWait, attempts_ > 0 ? std::min(until, deadline) : until};
  }
  return {Step::kStartOpen, AttemptDeadline(now)};
}

void Reconnect::Started(Clock::time_point now) {
  state_ = State::kOpening;
  ++attempts_;
  attempt_deadline_ = AttemptDeadline(now);
}

Reconnect::Clock::time_point Reconnect::AttemptDeadline(Clock::time_point now) const {
  return std::min(std::max(since_ + reconnect_deadline_, now + kMinAttempt), now + kMaxAttempt);
}

void Reconnect::Ended(Outcome outcome, grpc::Status status, Clock::time_point now) {
  switch (outcome) {
    case Outcome::kOpened:
      state_ = State::kOpen;
      last_ = grpc::Status::OK;
      return;
    case Outcome::kRestartEpoch:
      if (!restarted_epoch_) {
        restarted_epoch_ = true;
        state_ = State::kWaiting;
        next_attempt_ = now;
        last_ = std::move(status);
        return;
      }
      [[fallthrough]];  // the restarted attempt cannot say "changed" again: something is wrong
    case Outcome::kFatal:
      state_ = State::kFailed;
      last_ = std::move(status);
      return;
    case Outcome::kRetry:
      state_ = State::kWaiting;
      next_attempt_ = now + backoff_.NextDelay();
      last_ = std::move(status);
      return;
  }
}

const char* StateName(Reconnect::State state) {
  switch (state) {
    case Reconnect::State::kOpen:
      return "open";
    case Reconnect::State::kWaiting:
      return "waiting";
    case Reconnect::State::kOpening:
      return "opening";
    case Reconnect::State::kFailed:
      return "failed";
  }
  return "?";
}

}  // namespace ringloader::client
