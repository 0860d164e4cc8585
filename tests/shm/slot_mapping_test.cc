// SPDX-License-Identifier: Apache-2.0
// shm/slot_mapping: a trainer's own view of one slot, copied out in place, written privately.
#include "shm/slot_mapping.h"

#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <csignal>
#include <cstring>

#include "shm/ring.h"
#include "tests/shm/ring_test_util.h"
#include "tests/support/test_support.h"

namespace ringloader::shm {
namespace {

constexpr uint64_t kSlotBytes = 64 * 1024;

struct Rings {
  Rings() {
    RingOptions options;
    options.name = "/" + ringloader::testing::UniqueName("slotmap");
    options.slot_count = 2;
    options.slot_bytes = kSlotBytes;
    auto p = ProducerRing::Create(options);
    REQUIRE(p.ok());
    producer = std::move(*p);
    auto c = ConsumerRing::Open(options.name);
    REQUIRE(c.ok());
    consumer = std::move(*c);
  }
  void Fill(uint32_t slot, uint64_t seq) {
    testing::FillPattern(producer->Payload(slot), seq);  // the whole slot
  }
  std::unique_ptr<ProducerRing> producer;
  std::unique_ptr<ConsumerRing> consumer;
};

TEST_CASE("SlotMapping: a read-only view shows the slot and follows the daemon's writes",
          "[shm]") {
  Rings r;
  r.Fill(1, 5);
  auto view = r.consumer->MapSlot(1, SlotAccess::kReadOnly);
  REQUIRE(view.ok());
  CHECK(view->size() == kSlotBytes);
  CHECK_FALSE(testing::FindPatternMismatch(view->bytes(), 5).has_value());
  r.Fill(1, 6);
  CHECK_FALSE(testing::FindPatternMismatch(view->bytes(), 6).has_value());
  CHECK(absl::IsOutOfRange(r.consumer->MapSlot(2, SlotAccess::kReadOnly).status()));
}

TEST_CASE("SlotMapping: CopyOut keeps the addresses and the bytes while the slot is refilled",
          "[shm]") {
  Rings r;
  r.Fill(0, 11);
  auto view = r.consumer->MapSlot(0, SlotAccess::kReadOnly);
  REQUIRE(view.ok());
  const uint8_t* before = view->data();
  REQUIRE(view->CopyOut(kSlotBytes / 2).ok());
  CHECK(view->copied_out());
  CHECK(view->data() == before);
  r.Fill(0, 12);  // the daemon reuses the slot
  // The copied half is still batch 11; the rest was not part of the batch and reads as zeros.
  CHECK_FALSE(
      testing::FindPatternMismatch(view->bytes().first(kSlotBytes / 2), 11).has_value());
  CHECK(view->data()[kSlotBytes - 1] == 0);
  // A second copy-out changes nothing.
  REQUIRE(view->CopyOut(kSlotBytes).ok());
  CHECK(view->data()[0] == before[0]);
}

TEST_CASE("SlotMapping: copy-on-write views take writes privately and drop them on request",
          "[shm]") {
  Rings r;
  r.Fill(1, 21);
  auto view = r.consumer->MapSlot(1, SlotAccess::kCopyOnWrite);
  REQUIRE(view.ok());
  std::memset(view->data(), 0xee, 3 * 4096 + 7);
  CHECK(view->data()[100] == 0xee);
  // The ring never saw the write.
  CHECK_FALSE(testing::FindPatternMismatch(r.producer->Payload(1), 21).has_value());
  REQUIRE(view->DropPrivatePages().ok());
  CHECK_FALSE(testing::FindPatternMismatch(view->bytes(), 21).has_value());
  // After a drop, the view follows the daemon's next batch again, and a copy-out keeps writes.
  r.Fill(1, 22);
  CHECK_FALSE(testing::FindPatternMismatch(view->bytes(), 22).has_value());
  view->data()[0] = 0x5a;
  REQUIRE(view->CopyOut(kSlotBytes).ok());
  CHECK(view->data()[0] == 0x5a);
  view->data()[1] = 0x5b;  // still writable after the copy-out
  CHECK(view->data()[1] == 0x5b);
}

TEST_CASE("SlotMapping: a read-only view faults on a write, before and after CopyOut", "[shm]") {
  Rings r;
  r.Fill(0, 31);
  auto view = r.consumer->MapSlot(0, SlotAccess::kReadOnly);
  REQUIRE(view.ok());
  for (bool copied : {false, true}) {
    if (copied) REQUIRE(view->CopyOut(kSlotBytes).ok());
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      // Default action, so neither Catch2's nor a sanitizer's handler turns the fault into an exit.
      std::signal(SIGSEGV, SIG_DFL);
      *const_cast<volatile uint8_t*>(view->data()) = 1;
      ::_exit(0);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGSEGV);
  }
}

}  // namespace
}  // namespace ringloader::shm
