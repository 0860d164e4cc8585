// SPDX-License-Identifier: Apache-2.0
// IoRetryBudget: one budget of retries for all of a sample's reads (issue 28).
#include "server/pipeline/io_retry.h"

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <thread>
#include <vector>

#include "server/image/sample_decoder.h"

namespace ringloader::pipeline {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

absl::StatusOr<int> FailingTransiently(int& tries, int err = EIO) {
  ++tries;
  return image::WithReason(
      image::MarkTransientErrno(absl::UnavailableError("f: Input/output error"), err),
      "read_error");
}

TEST_CASE("IoRetryBudget: retries a transient failure, then io_error naming tries and time",
          "[pipeline][io_retry]") {
  IoRetryBudget budget(milliseconds(150));
  int tries = 0;
  absl::StatusOr<int> r = budget.Run<int>([&] { return FailingTransiently(tries); });
  REQUIRE_FALSE(r.ok());
  CHECK(image::ErrorReason(r.status()) == "io_error");
  CHECK(tries >= 3);  // 10, 20, 40 ms of backoff fit
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains("f: Input/output error (io_error: still failing after ") &&
                 Catch::Contains("server.io_retry_ms = 150"));
}

TEST_CASE("IoRetryBudget: a sample's reads share one budget, never one each",
          "[pipeline][io_retry]") {
  IoRetryBudget budget(milliseconds(200));
  const auto start = steady_clock::now();
  int first = 0, second = 0, third = 0;
  CHECK_FALSE(budget.Run<int>([&] { return FailingTransiently(first); }).ok());
  // The budget is spent: later reads get one try each, not another 200 ms.
  CHECK_FALSE(budget.Run<int>([&] { return FailingTransiently(second); }).ok());
  CHECK_FALSE(budget.Run<int>([&] { return FailingTransiently(third); }).ok());
  CHECK(second == 1);
  CHECK(third == 1);
  CHECK(steady_clock::now() - start < milliseconds(200 + 150));
}

TEST_CASE("IoRetryBudget: success and lasting errors return at once, and give_up stops retries",
          "[pipeline][io_retry]") {
  IoRetryBudget budget(milliseconds(10'000));
  int calls = 0;
  CHECK(*budget.Run<int>([&]() -> absl::StatusOr<int> { return ++calls; }) == 1);
  absl::StatusOr<int> lasting = budget.Run<int>([&]() -> absl::StatusOr<int> {
    ++calls;
    return image::WithReason(absl::NotFoundError("gone"), "read_error");
  });
  CHECK(calls == 2);
  CHECK(image::ErrorReason(lasting.status()) == "read_error");
  bool stop = false;
  IoRetryBudget stopping(milliseconds(10'000), [&] { return stop; });
  int tries = 0;
  absl::StatusOr<int> r = stopping.Run<int>([&] {
    if (tries == 2) stop = true;
    return FailingTransiently(tries);
  });
  CHECK(tries == 3);
  CHECK(image::ErrorReason(r.status()) == "read_error");  // the last error itself
}

TEST_CASE("IoRetryBudget: only time spent failing counts, not the time between reads",
          "[pipeline][io_retry]") {
  IoRetryBudget budget(milliseconds(150));
  // The sample waited for memory (or its first read was long and worked): not retry time.
  std::this_thread::sleep_for(milliseconds(200));
  int tries = 0;
  CHECK_FALSE(budget.Run<int>([&] { return FailingTransiently(tries); }).ok());
  CHECK(tries >= 3);
}

// The lane's witness (ReadPool::Witness): failures while the storage answers nothing else are
// an outage's and spend nothing; once it answers others, the sample's own failures count.
TEST_CASE("IoRetryBudget: with a witness, failures while the storage answers nothing are waited "
          "out, and once it answers others they count and end in io_error",
          "[pipeline][io_retry]") {
  int asked = 0;
  bool storage_answers = false;
  std::vector<int64_t> since;
  IoRetryBudget budget(milliseconds(50), {}, [&](int64_t since_ns) {
    ++asked;
    since.push_back(since_ns);
    return storage_answers;
  });
  int tries = 0;
  // Eight failures (10+20+...+1000 ms of backoff would be far past 50 ms), then success.
  absl::StatusOr<int> r = budget.Run<int>([&]() -> absl::StatusOr<int> {
    if (tries == 8) return 7;
    return FailingTransiently(tries);
  });
  REQUIRE(r.ok());
  CHECK(*r == 7);
  CHECK(asked == 8);
  // Each failure asks about the time since the attempt before it began (the first: its own).
  REQUIRE(since.size() == 8);
  CHECK(since[1] == since[0]);
  for (size_t i = 2; i < since.size(); ++i) CHECK(since[i] > since[i - 1]);

  // The storage answers others now: this sample's failures count, from the shortest backoff.
  storage_answers = true;
  tries = 0;
  const auto start = steady_clock::now();
  r = budget.Run<int>([&] { return FailingTransiently(tries); });
  REQUIRE_FALSE(r.ok());
  CHECK(image::ErrorReason(r.status()) == "io_error");
  CHECK(tries >= 2);
  CHECK(steady_clock::now() - start < milliseconds(1000));
  CHECK_THAT(std::string(r.status().message()),
             Catch::Contains("server.io_retry_ms = 50; besides ") &&
                 Catch::Contains(" ms while the storage answered nothing)"));

  // Out of descriptors is this process's failure, not the storage's: it counts, witness or not.
  storage_answers = false;
  IoRetryBudget local(milliseconds(50), {}, [&](int64_t) { return storage_answers; });
  tries = 0;
  r = local.Run<int>([&] { return FailingTransiently(tries, EMFILE); });
  REQUIRE_FALSE(r.ok());
  CHECK(image::ErrorReason(r.status()) == "io_error");
}

}  // namespace
}  // namespace ringloader::pipeline
