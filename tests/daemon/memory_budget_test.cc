// SPDX-License-Identifier: Apache-2.0
// server/daemon/memory_budget: reserve, refuse with the numbers, give back.
#include "server/daemon/memory_budget.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

namespace ringloader::server {

TEST_CASE("MemoryBudget: reserves, refuses with the numbers, and gets bytes back",
          "[daemon][memory]") {
  MemoryBudget budget(100ull << 20);
  CHECK(budget.limit() == 100ull << 20);
  CHECK(budget.reserved() == 0);
  {
    absl::StatusOr<Reservation> a = budget.Reserve(60ull << 20, "stream A");
    REQUIRE(a.ok());
    CHECK(a->bytes() == 60ull << 20);
    CHECK(budget.reserved() == 60ull << 20);

    absl::StatusOr<Reservation> b = budget.Reserve(50ull << 20, "stream B");
    REQUIRE_FALSE(b.ok());
    CHECK(b.status().code() == absl::StatusCode::kResourceExhausted);
    CHECK(std::string(b.status().message()) ==
          "stream B needs 50 MiB; memory_limit 100 MiB has 40 MiB free (60 MiB reserved)");
    CHECK(budget.reserved() == 60ull << 20);  // a refusal reserves nothing

    absl::StatusOr<Reservation> exact = budget.Reserve(40ull << 20, "the rest");
    REQUIRE(exact.ok());
    CHECK(budget.reserved() == budget.limit());
    CHECK_FALSE(budget.Reserve(1, "one byte").ok());
    CHECK(budget.Reserve(0, "nothing").ok());
  }
  CHECK(budget.reserved() == 0);  // both reservations went back when destroyed
}

TEST_CASE("MemoryBudget: huge requests cannot overflow the accounting", "[daemon][memory]") {
  MemoryBudget budget(1ull << 30);
  absl::StatusOr<Reservation> some = budget.Reserve(1ull << 29, "some");
  REQUIRE(some.ok());
  absl::StatusOr<Reservation> huge = budget.Reserve(~uint64_t{0}, "huge");
  REQUIRE_FALSE(huge.ok());
  CHECK_THAT(std::string(huge.status().message()), Catch::StartsWith("huge needs "));
  absl::StatusOr<Reservation> wrap = budget.Reserve(~uint64_t{0} - (1ull << 28), "wrap");
  CHECK_FALSE(wrap.ok());
  CHECK(budget.reserved() == 1ull << 29);
}

TEST_CASE("Reservation: moves carry the bytes, assignment gives the old ones back",
          "[daemon][memory]") {
  MemoryBudget budget(1000);
  absl::StatusOr<Reservation> a = budget.Reserve(300, "a");
  absl::StatusOr<Reservation> b = budget.Reserve(200, "b");
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  Reservation moved(std::move(*a));
  CHECK(moved.bytes() == 300);
  CHECK(a->bytes() == 0);
  CHECK(budget.reserved() == 500);
  moved = std::move(*b);  // a's 300 go back
  CHECK(budget.reserved() == 200);
  CHECK(moved.bytes() == 200);
  Reservation empty;
  CHECK(empty.bytes() == 0);
  moved = std::move(empty);
  CHECK(budget.reserved() == 0);
}

TEST_CASE("MemoryBudget: concurrent reservations past the limit are refused, never granted",
          "[daemon][memory]") {
  // Four threads each try to hold up to 12 reservations of ~1,000 bytes under a 10,000-byte
  // limit: more than fits even for one thread alone (so refusals happen however the threads are
  // scheduled), nearly five times what fits for all. What the threads hold (counted by
  // themselves, not by the budget) must never pass the limit.
  constexpr uint64_t kLimit = 10'000;
  MemoryBudget budget(kLimit);
  std::atomic<uint64_t> held{0}, peak{0};
  std::atomic<int> granted{0}, refused{0};
  std::vector<std::thread> threads;
  // Catch2 assertions are not thread-safe: the workers count, the main thread checks.
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Reservation> mine;
      for (int i = 0; i < 3000; ++i) {
        if (mine.size() == 12 || (i + t) % 5 == 0) {
          if (!mine.empty()) {
            held -= mine.back().bytes();
            mine.pop_back();
          }
          continue;
        }
        const uint64_t bytes = 1000 + (i % 7);
        absl::StatusOr<Reservation> r = budget.Reserve(bytes, "t", std::chrono::milliseconds(0));
        if (!r.ok()) {
          ++refused;
          continue;
        }
        ++granted;
        const uint64_t now = held += bytes;
        uint64_t p = peak.load();
        while (now > p && !peak.compare_exchange_weak(p, now)) {
        }
        mine.push_back(*std::move(r));
      }
      for (Reservation& r : mine) held -= r.bytes();
    });
  }
  for (auto& t : threads) t.join();
  CHECK(peak.load() <= kLimit);
  CHECK(refused.load() > 0);  // the limit really was in the way
  CHECK(granted.load() > 0);
  CHECK(budget.reserved() == 0);
}

TEST_CASE("MemoryBudget: decode draws wait for room, first come first served, and fixed plus "
          "decoding never exceeds the limit",
          "[daemon][memory]") {
  MemoryBudget budget(100ull << 20);
  absl::StatusOr<Reservation> ring = budget.Reserve(40ull << 20, "a ring");
  REQUIRE(ring.ok());
  // Needs more than rings leave: fails at once, naming the sizes.
  absl::Status too_big = budget.Acquire(61ull << 20);
  CHECK(too_big.code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_big.message()), Catch::Contains("needs 61 MiB") &&
                                                 Catch::Contains("(40 MiB)"));
  REQUIRE(budget.Acquire(50ull << 20).ok());
  CHECK(budget.reserved() == 90ull << 20);
  CHECK(budget.decoding() == 50ull << 20);

  // A second big decode waits until the first gives its bytes back.
  std::atomic<bool> second_in{false};
  std::thread second([&] {
    REQUIRE(budget.Acquire(40ull << 20).ok());
    second_in = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK_FALSE(second_in.load());
  // A ring that fits beside the rings but not beside the decodes in flight times out.
  absl::StatusOr<Reservation> late = budget.Reserve(20ull << 20, "another ring",
                                                    std::chrono::milliseconds(100));
  CHECK(late.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(late.status().message()), Catch::Contains("decodes in flight hold"));
  budget.Release(50ull << 20);
  second.join();
  CHECK(second_in.load());
  CHECK(budget.reserved() == 80ull << 20);
  CHECK(budget.peak_reserved() == 90ull << 20);
  budget.Release(40ull << 20);
  CHECK(budget.reserved() == 40ull << 20);
}

}  // namespace ringloader::server

namespace ringloader::server {

TEST_CASE("MemoryBudget: read-ahead holds take only spare memory and are evicted for a decode",
          "[daemon][memory][read_ahead]") {
  MemoryBudget budget(100ull << 20);
  // At most half of the limit is read ahead.
  const uint64_t a = budget.TryAcquireReadAhead(30ull << 20);
  REQUIRE(a != 0);
  CHECK(budget.TryAcquireReadAhead(30ull << 20) == 0);
  const uint64_t b = budget.TryAcquireReadAhead(20ull << 20);
  REQUIRE(b != 0);
  CHECK(budget.read_ahead() == 50ull << 20);
  CHECK(budget.peak_read_ahead() == 50ull << 20);
  int evicted_a = 0, evicted_b = 0;
  budget.ArmEviction(a, [&] { ++evicted_a; });
  budget.ArmEviction(b, [&] { ++evicted_b; });
  // A decode that needs 60 MiB of the 50 free takes the newest hold back, and no more.
  REQUIRE(budget.Acquire(60ull << 20).ok());
  CHECK(evicted_b == 1);
  CHECK(evicted_a == 0);
  CHECK(budget.read_ahead() == 30ull << 20);
  CHECK(budget.decoding() == 90ull << 20);
  budget.ReleaseReadAhead(b);  // its holder lets go later: nothing is given back twice
  CHECK(budget.decoding() == 90ull << 20);
  // A pinned hold (a decode uses its bytes) is never evicted: the next decode waits for room.
  REQUIRE(budget.Pin(a));
  std::atomic<bool> granted{false};
  std::thread waiter([&] {
    granted = budget.Acquire(20ull << 20).ok();
  });
  // No read-ahead while a decode waits.
  while (budget.waiting() == 0) std::this_thread::yield();
  CHECK(budget.TryAcquireReadAhead(1) == 0);
  budget.ReleaseReadAhead(a);
  waiter.join();
  CHECK(granted);
  CHECK(evicted_a == 0);
  budget.Release(60ull << 20);
  budget.Release(20ull << 20);
  CHECK(budget.decoding() == 0);
  CHECK(budget.read_ahead() == 0);
}

TEST_CASE("MemoryBudget: a decode waiting for memory takes back read-ahead armed after it began "
          "waiting",
          "[daemon][memory][read_ahead]") {
  MemoryBudget budget(100ull << 20);
  const uint64_t reading = budget.TryAcquireReadAhead(50ull << 20);  // its read in progress
  REQUIRE(reading != 0);
  REQUIRE(budget.Acquire(40ull << 20).ok());
  std::atomic<bool> granted{false};
  std::thread decode([&] { granted = budget.Acquire(30ull << 20).ok(); });  // 10 MiB free
  while (budget.waiting() == 0) std::this_thread::yield();
  CHECK(budget.TryAcquireReadAhead(1) == 0);  // nothing new is read ahead meanwhile
  int evicted = 0;
  budget.ArmEviction(reading, [&] { ++evicted; });  // the read ends: now it can go
  decode.join();
  CHECK(granted);
  CHECK(evicted == 1);
  CHECK(budget.read_ahead() == 0);
  budget.ReleaseReadAhead(reading);  // its holder lets go later: nothing given back twice
  CHECK(budget.decoding() == 70ull << 20);
  budget.Release(70ull << 20);
}

TEST_CASE("MemoryBudget: a re-read's read-ahead hold waits in the decodes' queue, may exceed "
          "half the limit, and is evicted like the others once armed",
          "[daemon][memory][read_ahead]") {
  MemoryBudget budget(100ull << 20);
  CHECK(budget.AcquireReadAhead(101ull << 20) == 0);  // never fits: not waited for
  REQUIRE(budget.Acquire(50ull << 20).ok());
  std::atomic<uint64_t> hold{0};
  std::thread reread([&] { hold = budget.AcquireReadAhead(60ull << 20); });
  while (budget.waiting() == 0) std::this_thread::yield();
  CHECK(hold.load() == 0);  // 50 MiB free: it waits
  budget.Release(50ull << 20);
  reread.join();
  REQUIRE(hold.load() != 0);
  CHECK(budget.read_ahead() == 60ull << 20);  // above half of the limit
  int evicted = 0;
  budget.ArmEviction(hold, [&] { ++evicted; });
  REQUIRE(budget.Acquire(70ull << 20).ok());  // a decode takes it back
  CHECK(evicted == 1);
  CHECK(budget.read_ahead() == 0);
  budget.Release(70ull << 20);
  CHECK(budget.decoding() == 0);
}

}  // namespace ringloader::server
