// SPDX-License-Identifier: Apache-2.0
// server/daemon/spare_buffers: feed answers' buffers kept for the next call, counted in
// memory_limit, never in the way of memory someone needs.
#include "server/daemon/spare_buffers.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <thread>

namespace ringloader::server {

TEST_CASE("SpareBuffers: a buffer given back serves the next call that fits it, its memory "
          "counted meanwhile",
          "[daemon][memory][feeder]") {
  MemoryBudget budget(10 << 20);
  SpareBuffers answers(budget, 2, 4 << 20);
  absl::StatusOr<SpareBuffers::Buffer> first = answers.Take(3 << 20, "an answer");
  REQUIRE(first.ok());
  CHECK(first->bytes.size() == 3u << 20);
  const uint8_t* const pages = first->bytes.data();
  first->bytes[0] = 0x5a;
  answers.Give(*std::move(first));
  CHECK(answers.spares() == 1);
  CHECK(budget.reserved() == 3u << 20);  // kept, and still counted
  absl::StatusOr<SpareBuffers::Buffer> again = answers.Take(2 << 20, "an answer");
  REQUIRE(again.ok());
  CHECK(again->bytes.data() == pages);  // the same pages: no allocation, no faults
  CHECK(again->bytes[0] == 0x5a);       // nor zeroed: its user writes it whole
  CHECK(again->bytes.size() == 2u << 20);
  CHECK(budget.reserved() == 3u << 20);
  CHECK(answers.spares() == 0);
  // One that does not fit is freed before anything new is reserved: spares never stand in the
  // way (3 MiB kept + 8 MiB would pass the 10 MiB limit).
  answers.Give(*std::move(again));
  absl::StatusOr<SpareBuffers::Buffer> big = answers.Take(8 << 20, "a big answer");
  REQUIRE(big.ok());
  CHECK(budget.reserved() == 8u << 20);
  CHECK(answers.spares() == 0);
  // Larger than `largest`: freed with its reservation.
  answers.Give(*std::move(big));
  CHECK(answers.spares() == 0);
  CHECK(budget.reserved() == 0);
  // Short of memory: refused at once, naming what.
  absl::StatusOr<SpareBuffers::Buffer> huge = answers.Take(11 << 20, "a huge answer");
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(huge.status().message()), Catch::StartsWith("a huge answer needs"));
}

TEST_CASE("SpareBuffers: spares are given back whenever a ring or a decode would not fit "
          "otherwise, at once, not refused nor waiting behind them",
          "[daemon][memory][feeder]") {
  MemoryBudget budget(10 << 20);
  SpareBuffers answers(budget, 2, 4 << 20);
  const auto keep_two = [&] {  // 8 of the 10 MiB held by spares
    absl::StatusOr<SpareBuffers::Buffer> a = answers.Take(4 << 20, "an answer");
    absl::StatusOr<SpareBuffers::Buffer> b = answers.Take(4 << 20, "an answer");
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    answers.Give(*std::move(a));
    answers.Give(*std::move(b));
    REQUIRE(answers.spares() == 2);
    REQUIRE(budget.reserved() == 8u << 20);
  };
  keep_two();
  {  // a ring that fits only without them: reserved, without waiting
    absl::StatusOr<Reservation> ring =
        budget.Reserve(5 << 20, "a ring", std::chrono::milliseconds(0));
    REQUIRE(ring.ok());
    CHECK(answers.spares() == 0);
    CHECK(budget.reserved() == 5u << 20);
  }
  keep_two();
  REQUIRE(budget.Acquire(6 << 20).ok());  // a decode likewise
  CHECK(answers.spares() == 0);
  budget.Release(6 << 20);
  // Fixed use leaves room but decodes in flight do not: the spares go before waiting.
  absl::StatusOr<SpareBuffers::Buffer> one = answers.Take(4 << 20, "an answer");
  REQUIRE(one.ok());
  answers.Give(*std::move(one));
  REQUIRE(budget.Acquire(4 << 20).ok());
  absl::StatusOr<Reservation> index =
      budget.Reserve(3 << 20, "an index", std::chrono::milliseconds(0));
  CHECK(index.ok());
  CHECK(answers.spares() == 0);
  budget.Release(4 << 20);
}

TEST_CASE("SpareBuffers: at most `most` are kept, and none while anything waits for memory",
          "[daemon][memory][feeder]") {
  MemoryBudget budget(10 << 20);
  SpareBuffers answers(budget, 2, 4 << 20);
  std::vector<SpareBuffers::Buffer> three;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<SpareBuffers::Buffer> b = answers.Take(1 << 20, "an answer");
    REQUIRE(b.ok());
    three.push_back(*std::move(b));
  }
  for (auto& b : three) answers.Give(std::move(b));
  CHECK(answers.spares() == 2);
  CHECK(budget.reserved() == 2u << 20);
  // A decode holds 5 MiB and another waits for 5: the spare goes back as it starts to wait, but
  // the answer in use (1 MiB) still stands in its way. That answer's buffer, given back, goes
  // back to memory_limit, and the decode goes on.
  absl::StatusOr<SpareBuffers::Buffer> taken = answers.Take(1 << 20, "an answer");
  REQUIRE(taken.ok());
  REQUIRE(budget.Acquire(5 << 20).ok());
  std::atomic<bool> decoded{false};  // checked on the test's thread
  std::thread decode([&] {
    decoded = budget.Acquire(5 << 20).ok();
    if (decoded) budget.Release(5 << 20);
  });
  while (budget.waiting() == 0) std::this_thread::yield();  // the decode is queued
  answers.Give(*std::move(taken));
  CHECK(answers.spares() == 0);  // not kept
  decode.join();
  CHECK(decoded);
  budget.Release(5 << 20);
}

}  // namespace ringloader::server
