// SPDX-License-Identifier: Apache-2.0
#pragma once
// One budget of retries for transient I/O errors (image::IsTransient: EIO, EMFILE, ENOMEM,
// ESTALE, ...), shared by every read of one sample, or of one file while indexing: a flaky mount
// gets `budget` in all, never `budget` per call. What counts is the time spent failing (failed
// attempts and the backoff after them, 10 ms doubling to 1 s), not the time between: a sample
// that waited for memory, or a long scan that failed near its end, still gets its retries.
// With a witness (the read lane's: ReadPool::Witness), a failure counts only when the storage
// answered another operation since the previous attempt began: while it answers nothing (a soft
// mount's server gone: every request EIO), the failures are an outage's, and the sample retries
// (every second at most) until the storage answers, without spending its budget.
// Not thread-safe; one per sample or file.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {

class IoRetryBudget {
 public:
  // `give_up` (optional) is asked before each retry: true ends the retries with the last error
  // (a daemon told to stop while indexing a flaky mount).
  // `witness` (optional): given when an attempt began (base::SteadyNowNs), whether the storage
  // answered another operation since.
  explicit IoRetryBudget(std::chrono::milliseconds budget, std::function<bool()> give_up = {},
                         std::function<bool(int64_t since_ns)> witness = {})
      : budget_(budget), give_up_(std::move(give_up)), witness_(std::move(witness)) {}

  // Runs `attempt` until it succeeds, fails for good, or the budget is spent: then the last
  // transient error becomes reason "io_error", saying how long and how often it was tried.
  template <typename T>
  absl::StatusOr<T> Run(const std::function<absl::StatusOr<T>()>& attempt) {
    while (true) {
      const auto started = std::chrono::steady_clock::now();
      absl::StatusOr<T> result = attempt();
      ++tries_;
      if (result.ok() || !image::IsTransient(result.status())) return result;
      const auto spent = std::chrono::steady_clock::now() - started;
      if (give_up_ && give_up_()) return result;
      // Witnessed since the previous attempt began (the first: since its own start): an answer
      // to what was asked after that attempt failed (a probe) shows the storage works.
      const int64_t started_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(started.time_since_epoch()).count();
      const int64_t since_ns = previous_started_ns_ != 0 ? previous_started_ns_ : started_ns;
      previous_started_ns_ = started_ns;
      // Only the storage's own failures can be an outage; running out of descriptors or memory
      // is this process's, and counts.
      const bool outage =
          witness_ && image::IsStorageFailure(result.status()) && !witness_(since_ns);
      if (outage) {
        outage_ += spent + backoff_;
        in_outage_ = true;
      } else {
        // The storage answers others again: the sample's own retries start from the shortest.
        if (in_outage_) backoff_ = kFirstBackoff;
        in_outage_ = false;
        failing_ += spent;
        if (failing_ + backoff_ > budget_) return Exhausted(result.status(), failing_);
        failing_ += backoff_;
      }
      std::this_thread::sleep_for(backoff_);
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(1000));
    }
  }

 private:
  absl::Status Exhausted(const absl::Status& last, std::chrono::nanoseconds spent) const {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(spent).count();
    return image::WithReason(
        absl::UnavailableError(absl::StrCat(
            last.message(), " (io_error: still failing after ", tries_,
            tries_ == 1 ? " try" : " tries", " over ", ms, " ms; server.io_retry_ms = ",
            budget_.count(),
            outage_.count() > 0
                ? absl::StrCat("; besides ",
                               std::chrono::duration_cast<std::chrono::milliseconds>(outage_)
                                   .count(),
                               " ms while the storage answered nothing)")
                : std::string(")"))),
        "io_error");
  }

  std::chrono::milliseconds budget_;
  std::function<bool()> give_up_;
  std::function<bool(int64_t since_ns)> witness_;
  std::chrono::nanoseconds failing_{0};  // in failed attempts and backoff, so far
  std::chrono::nanoseconds outage_{0};   // the same, while the storage answered nothing
  static constexpr std::chrono::milliseconds kFirstBackoff{10};
  std::chrono::milliseconds backoff_ = kFirstBackoff;
  bool in_outage_ = false;  // the last failure was while the storage answered nothing
  int64_t previous_started_ns_ = 0;  // when the latest failed attempt began
  int tries_ = 0;
};

}  // namespace ringloader::pipeline
