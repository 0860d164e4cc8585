// SPDX-License-Identifier: Apache-2.0
// server/daemon/spare_buffers: feed answers' buffers kept for the next call, counted in
// memory_limit, never in the way of memory someone needs.
#include "server/daemon/spare_buffers.h"

#include <catch2/catch.hpp>

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
  CHECK_FALSE(first->reused);  // new: all zero
  const uint8_t* const pages = first->bytes.data();
  answers.Give(*std::move(first));
  CHECK(answers.spares() == 1);
  CHECK(budget.reserved() == 3u << 20);  // kept, and still counted
  absl::StatusOr<SpareBuffers::Buffer> again = answers.Take(2 << 20, "an answer");
  REQUIRE(again.ok());
  CHECK(again->reused);
  CHECK(again->bytes.data() == pages);  // the same pages: no allocation, no faults
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
  // A decode holds 5 MiB and another waits for 4 (2 MiB of answers + 5 + 4 would pass the
  // limit): the next buffer given back goes back to memory_limit, and the decode goes on.
  absl::StatusOr<SpareBuffers::Buffer> taken = answers.Take(1 << 20, "an answer");
  REQUIRE(taken.ok());
  REQUIRE(budget.Acquire(5 << 20).ok());
  std::thread decode([&] {
    CHECK(budget.Acquire(4 << 20).ok());
    budget.Release(4 << 20);
  });
  while (budget.waiting() == 0) std::this_thread::yield();  // the decode is queued
  answers.Give(*std::move(taken));
  CHECK(answers.spares() == 1);  // not kept
  decode.join();  // (the other spare is still counted: 1 + 5 + 4 fits the limit)
  budget.Release(5 << 20);
}

}  // namespace ringloader::server
