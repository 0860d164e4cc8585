// SPDX-License-Identifier: Apache-2.0
// BatchSchedule: every producer transition and the client's side, one step at a time, on a real
// shared-memory ring. Interleavings are forced with the schedule's own observation hooks
// (AwaitProducerWaiting, AwaitClientWaiting), never with sleeps.
#include "server/daemon/batch_schedule.h"

#include <catch2/catch.hpp>
#include <future>
#include <memory>
#include <thread>

#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

using Step = BatchSchedule::Step;
using Clock = BatchSchedule::Clock;
using std::chrono::milliseconds;

constexpr milliseconds kLong{10'000};  // only ever waited out when the schedule is broken

struct Fixture {
  explicit Fixture(uint32_t slots) {
    shm::RingOptions options;
    options.name = "/" + testing::UniqueName("schedule");
    options.slot_count = slots;
    options.slot_bytes = 4096;
    options.incarnation = 7;
    auto created = shm::ProducerRing::Create(options);
    REQUIRE(created.ok());
    ring = *std::move(created);
    schedule = std::make_unique<BatchSchedule>(1, *ring, v1::Position());
  }
  ~Fixture() { schedule->Stop(); }

  // AwaitSlot that must not wait.
  Step Poll() { return schedule->AwaitSlot(Clock::now()); }

  // A handle for the batch `step` filled, at batch index `sequence` of epoch 0.
  static v1::BatchHandle Handle(uint32_t slot, uint64_t ring_sequence) {
    v1::BatchHandle h;
    h.set_slot(slot);
    h.set_ring_sequence(ring_sequence);
    h.mutable_position()->set_sequence(ring_sequence);
    h.mutable_next()->set_sequence(ring_sequence + 1);
    return h;
  }

  // Fills the next slot and publishes it; returns the step.
  Step FillAndPublish() {
    const Step step = Poll();
    REQUIRE(step.kind == Step::kFill);
    schedule->Publish(Handle(step.slot, step.sequence), 100);
    return step;
  }

  // A Next() that must return at once with a batch.
  v1::BatchHandle Lease() {
    v1::NextBatchResponse out;
    REQUIRE(schedule->Next(Clock::now(), &out).ok());
    REQUIRE(out.has_batch());
    return out.batch();
  }

  std::unique_ptr<shm::ProducerRing> ring;
  std::unique_ptr<BatchSchedule> schedule;
};

TEST_CASE("BatchSchedule: AwaitSlot gives FREE slots round robin, FILLING, with growing sequences",
          "[daemon][schedule]") {
  Fixture f(3);
  CHECK(f.schedule->state() == ProducerState::kAwaitingSlot);
  const Step a = f.Poll();
  REQUIRE(a.kind == Step::kFill);
  CHECK(f.schedule->state() == ProducerState::kFilling);
  CHECK(f.ring->Slot(a.slot).state == shm::SlotState::kFilling);
  f.schedule->Publish(Fixture::Handle(a.slot, a.sequence), 100);
  CHECK(f.schedule->state() == ProducerState::kAwaitingSlot);
  CHECK(f.ring->Slot(a.slot).state == shm::SlotState::kReady);
  const Step b = f.FillAndPublish();
  const Step c = f.FillAndPublish();
  CHECK(a.slot != b.slot);
  CHECK(b.slot != c.slot);
  CHECK(a.slot != c.slot);
  CHECK(a.sequence == 0);
  CHECK(b.sequence == 1);
  CHECK(c.sequence == 2);
  // Every slot READY: the producer waits.
  CHECK(f.Poll().kind == Step::kNotYet);
  CHECK(f.schedule->published_next().sequence() == 3);
}

TEST_CASE("BatchSchedule: Next leases in sequence order, and Release makes the slot FREE again",
          "[daemon][schedule]") {
  Fixture f(2);
  const Step a = f.FillAndPublish();
  const Step b = f.FillAndPublish();
  const v1::BatchHandle first = f.Lease();
  CHECK(first.slot() == a.slot);
  CHECK(first.ring_sequence() == 0);
  CHECK(first.payload_checksum() == f.ring->Slot(a.slot).checksum);
  CHECK(f.Lease().ring_sequence() == b.sequence);
  CHECK(f.schedule->batches_served() == 2);
  CHECK(f.Poll().kind == Step::kNotYet);
  REQUIRE(f.schedule->Release(a.slot, 0, /*copied_out=*/true).ok());
  CHECK(f.schedule->batches_copied_out() == 1);
  const Step c = f.Poll();
  REQUIRE(c.kind == Step::kFill);
  CHECK(c.slot == a.slot);
  CHECK(c.sequence == 2);
}

TEST_CASE("BatchSchedule: a stale, double or out-of-range release changes nothing",
          "[daemon][schedule]") {
  Fixture f(2);
  const Step a = f.FillAndPublish();
  f.Lease();
  CHECK(absl::IsFailedPrecondition(f.schedule->Release(a.slot, 5, false)));
  CHECK(absl::IsInvalidArgument(f.schedule->Release(9, 0, false)));
  REQUIRE(f.schedule->Release(a.slot, 0, false).ok());
  CHECK(absl::IsFailedPrecondition(f.schedule->Release(a.slot, 0, false)));
}

TEST_CASE("BatchSchedule: Abandon gives the slot back FREE and keeps its sequence for the next",
          "[daemon][schedule]") {
  Fixture f(2);
  const Step a = f.Poll();
  REQUIRE(a.kind == Step::kFill);
  f.schedule->Abandon();
  CHECK(f.schedule->state() == ProducerState::kAwaitingSlot);
  CHECK(f.ring->Slot(a.slot).state == shm::SlotState::kFree);
  const Step b = f.Poll();
  REQUIRE(b.kind == Step::kFill);
  CHECK(b.sequence == a.sequence);
}

TEST_CASE("BatchSchedule: the look-ahead is published before the batch filled behind it",
          "[daemon][schedule]") {
  Fixture f(3);
  const Step a = f.Poll();
  REQUIRE(a.kind == Step::kFill);
  f.schedule->KeepAsLookAhead();
  CHECK(f.schedule->state() == ProducerState::kAwaitingSlotBehindLookAhead);
  v1::NextBatchResponse out;
  REQUIRE(f.schedule->Next(Clock::now(), &out).ok());
  CHECK(out.pending());  // kept unpublished
  const Step b = f.Poll();
  REQUIRE(b.kind == Step::kFill);
  CHECK(f.schedule->state() == ProducerState::kFillingBehindLookAhead);
  CHECK(b.sequence == a.sequence + 1);
  f.schedule->PublishLookAhead(Fixture::Handle(a.slot, a.sequence), 100);
  CHECK(f.schedule->state() == ProducerState::kFilling);
  f.schedule->Publish(Fixture::Handle(b.slot, b.sequence), 100);
  CHECK(f.Lease().ring_sequence() == a.sequence);
  CHECK(f.Lease().ring_sequence() == b.sequence);
}

TEST_CASE("BatchSchedule: behind the look-ahead, a fill that yields nothing is abandoned after it",
          "[daemon][schedule]") {
  Fixture f(2);
  REQUIRE(f.Poll().kind == Step::kFill);
  f.schedule->KeepAsLookAhead();
  const Step b = f.Poll();
  REQUIRE(b.kind == Step::kFill);
  f.schedule->PublishLookAhead(Fixture::Handle(0, 0), 100);
  f.schedule->Abandon();
  CHECK(f.ring->Slot(b.slot).state == shm::SlotState::kFree);
  CHECK(f.Lease().ring_sequence() == 0);
  CHECK(f.Poll().sequence == 1);
}

// The 2-slot hang of issue 26: the client holds its previous batch (one slot) and waits for the
// look-ahead (the other). Only publishing the look-ahead unmarked can answer it.
TEST_CASE(
    "BatchSchedule: a client waiting for the look-ahead while holding every other slot gets "
    "it, also when the producer was already asleep",
    "[daemon][schedule]") {
  Fixture f(2);
  const Step held = f.FillAndPublish();
  f.Lease();  // the client keeps it, as a Python loop keeps its previous batch
  const Step look_ahead = f.Poll();
  REQUIRE(look_ahead.kind == Step::kFill);
  f.schedule->KeepAsLookAhead();
  CHECK(f.Poll().kind == Step::kNotYet);  // no slot FREE, and no client waits yet

  SECTION("the producer sleeps first, then the client begins to wait") {
    auto producer = std::async(std::launch::async, [&] { return f.schedule->AwaitSlot(); });
    REQUIRE(f.schedule->AwaitProducerWaiting(kLong));
    auto client = std::async(std::launch::async, [&] {
      v1::NextBatchResponse out;
      absl::Status s = f.schedule->Next(Clock::now() + kLong, &out);
      return std::make_pair(s, out);
    });
    // Before the fix the producer slept on: Next() never woke it.
    REQUIRE(producer.wait_for(kLong) == std::future_status::ready);
    const Step step = producer.get();
    REQUIRE(step.kind == Step::kReleaseLookAhead);
    CHECK(step.slot == look_ahead.slot);
    CHECK(f.schedule->state() == ProducerState::kReleasingLookAhead);
    f.schedule->PublishLookAhead(Fixture::Handle(look_ahead.slot, look_ahead.sequence), 100);
    CHECK(f.schedule->state() == ProducerState::kAwaitingSlot);
    REQUIRE(client.wait_for(kLong) == std::future_status::ready);
    auto [status, out] = client.get();
    REQUIRE(status.ok());
    REQUIRE(out.has_batch());
    CHECK(out.batch().ring_sequence() == look_ahead.sequence);
  }

  SECTION("the client waits first, then the producer looks") {
    auto client = std::async(std::launch::async, [&] {
      v1::NextBatchResponse out;
      absl::Status s = f.schedule->Next(Clock::now() + kLong, &out);
      return std::make_pair(s, out);
    });
    REQUIRE(f.schedule->AwaitClientWaiting(kLong));
    const Step step = f.Poll();
    REQUIRE(step.kind == Step::kReleaseLookAhead);
    f.schedule->PublishLookAhead(Fixture::Handle(look_ahead.slot, look_ahead.sequence), 100);
    REQUIRE(client.wait_for(kLong) == std::future_status::ready);
    CHECK(client.get().second.batch().ring_sequence() == look_ahead.sequence);
  }

  SECTION("a release frees a slot: the producer fills behind the look-ahead instead") {
    REQUIRE(f.schedule->Release(held.slot, held.sequence, false).ok());
    const Step step = f.Poll();
    REQUIRE(step.kind == Step::kFill);
    CHECK(f.schedule->state() == ProducerState::kFillingBehindLookAhead);
  }
}

TEST_CASE("BatchSchedule: a client waiting for an earlier batch does not release the look-ahead",
          "[daemon][schedule]") {
  Fixture f(3);
  f.FillAndPublish();  // sequence 0, READY, not leased
  f.FillAndPublish();  // sequence 1
  REQUIRE(f.Poll().kind == Step::kFill);
  f.schedule->KeepAsLookAhead();  // sequence 2
  f.Lease();
  // The client leased 0 and 1 is READY: the look-ahead is not what it waits for.
  auto client = std::async(std::launch::async, [&] {
    v1::NextBatchResponse out;
    return std::make_pair(f.schedule->Next(Clock::now() + kLong, &out), out);
  });
  REQUIRE(client.wait_for(kLong) == std::future_status::ready);
  CHECK(client.get().second.batch().ring_sequence() == 1);
  CHECK(f.Poll().kind == Step::kNotYet);
}

TEST_CASE("BatchSchedule: End answers end of stream, or its error, after the published batches",
          "[daemon][schedule]") {
  SECTION("OK: end of stream") {
    Fixture f(2);
    f.FillAndPublish();
    f.schedule->End(absl::OkStatus());
    CHECK(f.schedule->state() == ProducerState::kEnded);
    f.Lease();
    v1::NextBatchResponse out;
    REQUIRE(f.schedule->Next(Clock::now(), &out).ok());
    CHECK(out.end_of_stream());
  }
  SECTION("an error, from kFilling: the slot goes back FREE") {
    Fixture f(2);
    f.FillAndPublish();
    const Step b = f.Poll();
    REQUIRE(b.kind == Step::kFill);
    f.schedule->End(absl::DataLossError("bad.jpg"));
    CHECK(f.ring->Slot(b.slot).state == shm::SlotState::kFree);
    f.Lease();
    v1::NextBatchResponse out;
    CHECK(absl::IsDataLoss(f.schedule->Next(Clock::now(), &out)));
  }
  SECTION("an ended producer only ever stops") {
    Fixture f(2);
    f.schedule->End(absl::OkStatus());
    CHECK(f.Poll().kind == Step::kNotYet);
    f.schedule->Stop();
    CHECK(f.Poll().kind == Step::kStop);
    CHECK(f.schedule->state() == ProducerState::kStopped);
  }
}

TEST_CASE("BatchSchedule: Stop wakes a sleeping producer and a waiting client",
          "[daemon][schedule]") {
  SECTION("the producer") {
    Fixture f(1);
    f.FillAndPublish();
    auto producer = std::async(std::launch::async, [&] { return f.schedule->AwaitSlot(); });
    REQUIRE(f.schedule->AwaitProducerWaiting(kLong));
    f.schedule->Stop();
    REQUIRE(producer.wait_for(kLong) == std::future_status::ready);
    CHECK(producer.get().kind == Step::kStop);
    CHECK(f.schedule->state() == ProducerState::kStopped);
  }
  SECTION("the client") {
    Fixture f(2);
    REQUIRE(f.Poll().kind == Step::kFill);  // filling: nothing ready yet
    auto client = std::async(std::launch::async, [&] {
      v1::NextBatchResponse out;
      return f.schedule->Next(Clock::now() + kLong, &out);
    });
    REQUIRE(f.schedule->AwaitClientWaiting(kLong));
    f.schedule->Stop();
    REQUIRE(client.wait_for(kLong) == std::future_status::ready);
    CHECK(absl::IsUnavailable(client.get()));
  }
}

TEST_CASE("BatchSchedule: one Next at a time, and a client holding every slot is told so",
          "[daemon][schedule]") {
  Fixture f(2);
  auto first = std::async(std::launch::async, [&] {
    v1::NextBatchResponse out;
    return f.schedule->Next(Clock::now() + kLong, &out);
  });
  REQUIRE(f.schedule->AwaitClientWaiting(kLong));
  v1::NextBatchResponse out;
  CHECK(absl::IsFailedPrecondition(f.schedule->Next(Clock::now(), &out)));
  f.FillAndPublish();  // answers the first
  REQUIRE(first.wait_for(kLong) == std::future_status::ready);
  REQUIRE(first.get().ok());
  f.FillAndPublish();
  f.Lease();
  v1::NextBatchResponse more;
  CHECK(absl::IsResourceExhausted(f.schedule->Next(Clock::now(), &more)));
}

TEST_CASE("BatchSchedule: a cancelled Next ends at once", "[daemon][schedule]") {
  Fixture f(2);
  v1::NextBatchResponse out;
  CHECK(absl::IsCancelled(f.schedule->Next(Clock::now() + kLong, &out, [] { return true; })));
}

}  // namespace
}  // namespace ringloader::server
