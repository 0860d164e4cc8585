// SPDX-License-Identifier: Apache-2.0
#pragma once
// One budget of retries for transient I/O errors (image::IsTransient: EIO, EMFILE, ENOMEM,
// ESTALE, ...), shared by every read of one sample, or of one file while indexing: a flaky mount
// gets `budget` in all, never `budget` per call. What counts is the time spent failing (failed
// attempts and the backoff after them, 10 ms doubling to 1 s), not the time between: a sample
// that waited for memory, or a long scan that failed near its end, still gets its retries.
// Not thread-safe; one per sample or file.

#include <algorithm>
#include <chrono>
#include <functional>
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
  explicit IoRetryBudget(std::chrono::milliseconds budget, std::function<bool()> give_up = {})
      : budget_(budget), give_up_(std::move(give_up)) {}

  // Runs `attempt` until it succeeds, fails for good, or the budget is spent: then the last
  // transient error becomes reason "io_error", saying how long and how often it was tried.
  template <typename T>
  absl::StatusOr<T> Run(const std::function<absl::StatusOr<T>()>& attempt) {
    while (true) {
      const auto started = std::chrono::steady_clock::now();
      absl::StatusOr<T> result = attempt();
      ++tries_;
      if (result.ok() || !image::IsTransient(result.status())) return result;
      failing_ += std::chrono::steady_clock::now() - started;
      if (give_up_ && give_up_()) return result;
      if (failing_ + backoff_ > budget_) return Exhausted(result.status(), failing_);
      std::this_thread::sleep_for(backoff_);
      failing_ += backoff_;
      backoff_ = std::min(backoff_ * 2, std::chrono::milliseconds(1000));
    }
  }

 private:
  absl::Status Exhausted(const absl::Status& last, std::chrono::nanoseconds spent) const {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(spent).count();
    return image::WithReason(
        absl::UnavailableError(absl::StrCat(last.message(), " (io_error: still failing after ",
                                            tries_, tries_ == 1 ? " try" : " tries", " over ", ms,
                                            " ms; server.io_retry_ms = ", budget_.count(), ")")),
        "io_error");
  }

  std::chrono::milliseconds budget_;
  std::function<bool()> give_up_;
  std::chrono::nanoseconds failing_{0};  // in failed attempts and backoff, so far
  std::chrono::milliseconds backoff_{10};
  int tries_ = 0;
};

}  // namespace ringloader::pipeline
