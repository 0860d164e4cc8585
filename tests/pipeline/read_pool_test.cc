// SPDX-License-Identifier: Apache-2.0
// ReadPool as a read lane (issue 38): an overdue read is poison only when the storage answers
// something that started after it became overdue; a probe nobody answers makes the lane
// stalled, and the first answer resumes it with every read's deadline counted afresh. The probe
// is the test's (a latch it opens), so every outcome is forced, not waited for by luck.
#include "server/pipeline/read_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "shm/base/clock.h"
#include "tests/support/latch.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

using std::chrono::milliseconds;

using testing::Latch;  // probes (and reads) wait at one until the test opens it

struct Lane {
  explicit Lane(bool probes = true) {
    LaneOptions options;
    if (probes) {
      options.probe = [this](uint64_t) {
        ++probes_started;
        probe.Wait();
        return probe_answers.load();
      };
    }
    options.on_stall_change = [this](bool stalled, milliseconds) {
      (stalled ? stall_events : resume_events).fetch_add(1);
    };
    pool = std::make_unique<ReadPool>(4, std::move(options));
  }
  ~Lane() {
    probe.Open();
    read.Open();
    pool->Shutdown();
    (void)pool->WaitIdle(std::chrono::seconds(10));
  }
  // Judges a read that started at `started_ns` until the verdict is not kWait or `until` holds.
  ReadPool::Verdict JudgeUntil(int64_t started_ns, milliseconds deadline,
                               const std::function<bool()>& until) {
    ReadPool::Verdict verdict = ReadPool::Verdict::kWait;
    testing::WaitFor(
        [&] {
          verdict = pool->Judge(started_ns, deadline);
          return verdict != ReadPool::Verdict::kWait || until();
        },
        std::chrono::seconds(30));
    return verdict;
  }

  Latch probe, read;
  std::atomic<int> probes_started{0};
  std::atomic<bool> probe_answers{true};  // false: the storage fails the probe (EIO)
  std::atomic<int> stall_events{0}, resume_events{0};
  std::unique_ptr<ReadPool> pool;
};

constexpr milliseconds kDeadline{100};

TEST_CASE("ReadPool lane: a read is not judged before its deadline, and no probe is made",
          "[pipeline][read_pool]") {
  Lane lane;
  const int64_t now = base::SteadyNowNs();
  CHECK(lane.pool->Judge(now, std::chrono::seconds(60)) == ReadPool::Verdict::kWait);
  CHECK(lane.probes_started == 0);
  CHECK_FALSE(lane.pool->health().stalled);
}

TEST_CASE("ReadPool lane: an overdue read is poison once a probe started after its deadline "
          "is answered, and the lane never stalls",
          "[pipeline][read_pool]") {
  Lane lane;
  const int64_t started = base::SteadyNowNs() - 2 * kDeadline.count() * 1'000'000;  // overdue
  // No witness yet: it waits, and a probe asks the storage.
  CHECK(lane.pool->Judge(started, kDeadline) == ReadPool::Verdict::kWait);
  REQUIRE(testing::WaitFor([&] { return lane.probe.waiting() == 1; }, std::chrono::seconds(10)));
  CHECK(lane.pool->Judge(started, kDeadline) == ReadPool::Verdict::kWait);
  CHECK(lane.probes_started == 1);  // one probe at a time
  lane.probe.Open();                // the storage answers it
  CHECK(lane.JudgeUntil(started, kDeadline, [] { return false; }) ==
        ReadPool::Verdict::kPoison);
  CHECK(lane.stall_events == 0);
  CHECK(lane.pool->health().stalls == 0);
}

TEST_CASE("ReadPool lane: another read that started after the overdue read's deadline and got "
          "its answer is a witness too",
          "[pipeline][read_pool]") {
  Lane lane;  // its probe never answers: the witness is the read
  // Overdue by 1 ms, with a deadline (and so a probe timeout) long enough that the lane does not
  // stall while this runs.
  const milliseconds deadline = std::chrono::seconds(10);
  const int64_t started = base::SteadyNowNs() - (deadline.count() + 1) * 1'000'000;
  CHECK(lane.pool->Judge(started, deadline) == ReadPool::Verdict::kWait);  // no witness
  std::atomic<bool> answered{false};
  lane.pool->Submit([&] {
    lane.read.Wait();
    answered = true;
    return ReadPool::Answer::kAnswered;
  });
  REQUIRE(testing::WaitFor([&] { return lane.read.waiting() == 1; }, std::chrono::seconds(10)));
  const int64_t after_it_started = base::SteadyNowNs();
  CHECK(lane.pool->Judge(started, deadline) == ReadPool::Verdict::kWait);  // running: not yet
  lane.read.Open();
  REQUIRE(testing::WaitFor([&] { return answered.load(); }, std::chrono::seconds(10)));
  CHECK(testing::WaitFor(
      [&] { return lane.pool->Judge(started, deadline) == ReadPool::Verdict::kPoison; },
      std::chrono::seconds(10)));
  CHECK_FALSE(lane.pool->health().stalled);
  // It proves nothing for a read that became overdue after it had started.
  CHECK(lane.pool->Judge(after_it_started, milliseconds(0)) == ReadPool::Verdict::kWait);
}

TEST_CASE("ReadPool lane: a probe nobody answers makes the lane stalled, the first answer "
          "resumes it and overdue reads count their deadlines afresh",
          "[pipeline][read_pool]") {
  Lane lane;
  const int64_t started = base::SteadyNowNs() - 2 * kDeadline.count() * 1'000'000;
  // The probe hangs: past the probe timeout (the deadline, here 100 ms) the lane is stalled.
  CHECK(lane.JudgeUntil(started, kDeadline, [&] { return lane.pool->health().stalled; }) ==
        ReadPool::Verdict::kWait);
  ReadPool::Health stalled = lane.pool->health();
  CHECK(stalled.stalled);
  CHECK(stalled.stalls == 1);
  CHECK(lane.stall_events == 1);
  // However long it lasts, the read is never judged poison.
  for (int i = 0; i < 20; ++i) CHECK(lane.pool->Judge(started, kDeadline) == ReadPool::Verdict::kWait);
  CHECK(lane.probe.waiting() == 1);  // the one probe, unanswered
  CHECK(lane.stall_events == 1);  // said once
  // The storage answers: the lane resumes, and the overdue read has a whole deadline again
  // (it was waiting for the storage, not stuck on its own).
  lane.probe.Open();
  REQUIRE(testing::WaitFor([&] { return !lane.pool->health().stalled; }, std::chrono::seconds(10)));
  // Said after the lane's lock is let go: it may come just after.
  CHECK(testing::WaitFor([&] { return lane.resume_events == 1; }, std::chrono::seconds(10)));
  CHECK(lane.pool->Judge(started, kDeadline) == ReadPool::Verdict::kWait);
  // Past that fresh deadline, with the storage answering (a new probe), it is poison.
  CHECK(lane.JudgeUntil(started, kDeadline, [] { return false; }) ==
        ReadPool::Verdict::kPoison);
  CHECK(lane.pool->health().stalls == 1);  // a counter: it stays
}

TEST_CASE("ReadPool lane: probes left unanswered are bounded", "[pipeline][read_pool]") {
  // A probe stuck on one bad file is followed by another (on another file), up to kMaxProbes.
  Lane lane;
  const int64_t started = base::SteadyNowNs() - 2 * kDeadline.count() * 1'000'000;
  // Each probe unanswered for 4 probe timeouts (here 400 ms) is followed by another.
  CHECK(testing::WaitFor(
      [&] {
        (void)lane.pool->Judge(started, kDeadline);
        return lane.probes_started == static_cast<int>(ReadPool::kMaxProbes);
      },
      std::chrono::seconds(30)));
  CHECK(testing::WaitFor([&] { return lane.probe.waiting() == int{ReadPool::kMaxProbes}; },
                         std::chrono::seconds(10)));
  for (int i = 0; i < 10; ++i) (void)lane.pool->Judge(started, kDeadline);
  CHECK(lane.probes_started == static_cast<int>(ReadPool::kMaxProbes));
}

// A read retrying EIO asks the lane (IoRetryBudget's witness) whether the storage answered
// anything since; when not, the lane asks the storage itself, and an error is no answer.
TEST_CASE("ReadPool lane: Witness is true once an operation started since was answered, else it "
          "starts a probe, and a probe the storage fails (EIO) is no answer",
          "[pipeline][read_pool]") {
  Lane lane;
  const std::function<bool(int64_t)> witness = lane.pool->Witness();
  const int64_t since = base::SteadyNowNs();
  lane.probe_answers = false;
  lane.probe.Open();  // probes return at once
  CHECK_FALSE(witness(since));
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  CHECK(lane.probes_started == 1);
  CHECK_FALSE(witness(since));  // the probe met an error: another is started
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  CHECK(lane.probes_started == 2);
  lane.probe_answers = true;
  CHECK_FALSE(witness(since));
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  CHECK(witness(since));  // that probe started after `since` and was answered
  CHECK(lane.probes_started == 3);
  // A later failure is not witnessed by an answer to what started before it.
  CHECK_FALSE(witness(base::SteadyNowNs()));
}

// A read served through a file kept open may have come from the kernel's page cache while the
// mount is gone (storage_outage_test's flake): it is no answer, but it says to look.
TEST_CASE("ReadPool lane: a read answered kUnconfirmed witnesses nothing and ends no stall, but "
          "on a stalled lane starts a probe, whose answer ends it",
          "[pipeline][read_pool]") {
  Lane lane;
  const int64_t started = base::SteadyNowNs() - 2 * kDeadline.count() * 1'000'000;
  std::atomic<int> reads{0};
  const auto unconfirmed = [&] {
    ++reads;
    return ReadPool::Answer::kUnconfirmed;
  };
  // Not stalled: it starts no probe.
  REQUIRE(lane.pool->Submit(unconfirmed) != 0);
  REQUIRE(testing::WaitFor([&] { return reads.load() == 1; }, std::chrono::seconds(10)));
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  CHECK(lane.probes_started == 0);
  // No witness for an overdue read: the lane probes, and with the probe unanswered it stalls.
  CHECK(lane.JudgeUntil(started, kDeadline, [&] { return lane.pool->health().stalled; }) ==
        ReadPool::Verdict::kWait);
  REQUIRE(lane.pool->health().stalled);
  const int probes = lane.probes_started.load();
  // That probe is failed (EIO): still stalled, no probe runs.
  lane.probe_answers = false;
  lane.probe.Open();
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  // A read through a kept-open file: stalled still, and it started a probe (failed as well).
  REQUIRE(lane.pool->Submit(unconfirmed) != 0);
  REQUIRE(testing::WaitFor([&] { return reads.load() == 2; }, std::chrono::seconds(10)));
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  CHECK(lane.probes_started == probes + 1);
  CHECK(lane.pool->health().stalled);
  CHECK(lane.resume_events == 0);
  CHECK(lane.pool->Judge(started, kDeadline) == ReadPool::Verdict::kWait);  // no witness
  REQUIRE(lane.pool->WaitIdle(std::chrono::seconds(10)));
  // The storage is back: the probe the next such read starts is answered, and ends the stall.
  lane.probe_answers = true;
  REQUIRE(lane.pool->Submit(unconfirmed) != 0);
  CHECK(testing::WaitFor([&] { return !lane.pool->health().stalled; },
                         std::chrono::seconds(10)));
  CHECK(testing::WaitFor([&] { return lane.resume_events == 1; }, std::chrono::seconds(10)));
}

TEST_CASE("ReadPool lane: with a probe stuck for good, reads through kept-open files still start "
          "probes (one a second, on other files), and the first answered ends the stall",
          "[pipeline][read_pool]") {
  Latch stuck;  // the first probe's file never answers
  std::atomic<int> probes{0};
  std::atomic<bool> stalled_said{false};
  LaneOptions options;
  options.probe = [&](uint64_t attempt) {
    ++probes;
    if (attempt == 0) stuck.Wait();
    return attempt != 0;
  };
  options.on_stall_change = [&](bool stalled, milliseconds) { stalled_said = stalled; };
  ReadPool pool(4, std::move(options));
  struct Unstick {
    Latch& latch;
    ReadPool& lane;
    ~Unstick() {
      latch.Open();
      lane.Shutdown();
      (void)lane.WaitIdle(std::chrono::seconds(10));
    }
  } unstick{stuck, pool};
  // A deadline (and probe timeout) of 1 s: Judge would probe again only 4 s on.
  const milliseconds deadline(1000);
  const int64_t started = base::SteadyNowNs() - 2 * deadline.count() * 1'000'000;
  REQUIRE(testing::WaitFor(
      [&] {
        (void)pool.Judge(started, deadline);
        return pool.health().stalled;
      },
      std::chrono::seconds(30)));
  CHECK(probes == 1);
  // Nothing is overdue any more (no Judge); reads through kept-open files go on succeeding.
  CHECK(testing::WaitFor(
      [&] {
        pool.Submit([] { return ReadPool::Answer::kUnconfirmed; });
        return !pool.health().stalled;
      },
      std::chrono::seconds(10)));
  CHECK(probes >= 2);
  CHECK(testing::WaitFor([&] { return !stalled_said.load(); }, std::chrono::seconds(10)));
}

}  // namespace
}  // namespace ringloader::pipeline
