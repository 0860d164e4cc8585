// SPDX-License-Identifier: Apache-2.0
// ProducerRing / ConsumerRing in one process: the slot state machine, names, modes, waiting.
#include "shm/ring.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/shm/ring_test_util.h"
#include "tests/support/test_support.h"

namespace ringloader::shm {
namespace {

using ringloader::testing::TempDir;
using ringloader::testing::UniqueName;

constexpr uint64_t kSlotBytes = 64 * 1024;

std::unique_ptr<ProducerRing> MakeRing(uint32_t slots, const std::string& shm_dir = "/dev/shm") {
  RingOptions options;
  options.name = "/" + UniqueName("ring");
  options.slot_count = slots;
  options.slot_bytes = kSlotBytes;
  options.incarnation = 7;
  options.shm_dir = shm_dir;
  auto ring = ProducerRing::Create(options);
  REQUIRE(ring.ok());
  return std::move(*ring);
}

// Fills `slot` with the pattern of `seq` and publishes it.
void FillAndPublish(ProducerRing& ring, uint32_t slot, uint64_t seq, uint64_t bytes = 1000) {
  REQUIRE(ring.BeginFill(slot).ok());
  testing::FillPattern(ring.Payload(slot).first(bytes), seq);
  REQUIRE(ring.Publish(slot, seq, bytes).ok());
}

bool SameInfo(const SlotInfo& a, const SlotInfo& b) {
  return a.state == b.state && a.ring_sequence == b.ring_sequence &&
         a.payload_bytes == b.payload_bytes && a.checksum == b.checksum;
}

TEST_CASE("SlotRing: a slot goes FREE -> FILLING -> READY -> LEASED -> FREE", "[shm]") {
  auto ring = MakeRing(2);
  CHECK(ring->slot_bytes() == kSlotBytes);
  CHECK(ring->Slot(0).state == SlotState::kFree);
  REQUIRE(ring->BeginFill(0).ok());
  CHECK(ring->Slot(0).state == SlotState::kFilling);
  testing::FillPattern(ring->Payload(0).first(5000), 42);
  REQUIRE(ring->Publish(0, 42, 5000).ok());
  SlotInfo info = ring->Slot(0);
  CHECK(info.state == SlotState::kReady);
  CHECK(info.ring_sequence == 42);
  CHECK(info.payload_bytes == 5000);
  CHECK(info.checksum == Checksum(ring->Payload(0).first(5000)));
  REQUIRE(ring->Lease(0, 42).ok());
  CHECK(ring->Slot(0).state == SlotState::kLeased);
  REQUIRE(ring->Release(0, 42).ok());
  CHECK(ring->Slot(0).state == SlotState::kFree);
  // An abandoned fill goes back to FREE.
  REQUIRE(ring->BeginFill(0).ok());
  REQUIRE(ring->Abandon(0).ok());
  CHECK(ring->Slot(0).state == SlotState::kFree);
  CHECK(ring->Slot(1).state == SlotState::kFree);  // untouched neighbour
}

TEST_CASE("SlotRing: illegal transitions are refused and change nothing", "[shm]") {
  auto ring = MakeRing(1);
  auto expect_refused = [&](const absl::Status& s, const std::string& text) {
    CHECK(absl::IsFailedPrecondition(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains(text));
  };
  SECTION("from FREE") {
    const SlotInfo before = ring->Slot(0);
    expect_refused(ring->Publish(0, 1, 10), "Publish needs FILLING, found FREE");
    expect_refused(ring->Abandon(0), "Abandon needs FILLING, found FREE");
    expect_refused(ring->Lease(0, 0), "Lease needs READY, found FREE");
    expect_refused(ring->Release(0, 0), "Release needs LEASED, found FREE");
    CHECK(SameInfo(ring->Slot(0), before));
  }
  SECTION("from FILLING") {
    REQUIRE(ring->BeginFill(0).ok());
    expect_refused(ring->BeginFill(0), "BeginFill needs FREE, found FILLING");
    expect_refused(ring->Lease(0, 0), "Lease needs READY, found FILLING");
    expect_refused(ring->Release(0, 0), "Release needs LEASED, found FILLING");
    CHECK(ring->Slot(0).state == SlotState::kFilling);
  }
  SECTION("from READY") {
    FillAndPublish(*ring, 0, 3);
    const SlotInfo before = ring->Slot(0);
    expect_refused(ring->BeginFill(0), "BeginFill needs FREE, found READY");
    expect_refused(ring->Publish(0, 4, 10), "Publish needs FILLING, found READY");
    expect_refused(ring->Abandon(0), "Abandon needs FILLING, found READY");
    expect_refused(ring->Release(0, 3), "Release needs LEASED, found READY");
    CHECK(SameInfo(ring->Slot(0), before));
  }
  SECTION("from LEASED") {
    FillAndPublish(*ring, 0, 3);
    REQUIRE(ring->Lease(0, 3).ok());
    const SlotInfo before = ring->Slot(0);
    expect_refused(ring->BeginFill(0), "BeginFill needs FREE, found LEASED");
    expect_refused(ring->Lease(0, 3), "Lease needs READY, found LEASED");
    expect_refused(ring->Abandon(0), "Abandon needs FILLING, found LEASED");
    CHECK(SameInfo(ring->Slot(0), before));
  }
  SECTION("bad arguments") {
    CHECK(absl::IsOutOfRange(ring->BeginFill(1)));
    REQUIRE(ring->BeginFill(0).ok());
    const absl::Status s = ring->Publish(0, 1, kSlotBytes + 1);
    CHECK(absl::IsInvalidArgument(s));
    CHECK_THAT(std::string(s.message()), Catch::Contains("exceeds slot_bytes"));
    CHECK(ring->Slot(0).state == SlotState::kFilling);
  }
}

TEST_CASE("SlotRing: a double release is refused", "[shm]") {
  auto ring = MakeRing(1);
  FillAndPublish(*ring, 0, 9);
  REQUIRE(ring->Lease(0, 9).ok());
  REQUIRE(ring->Release(0, 9).ok());
  const absl::Status again = ring->Release(0, 9);
  CHECK(absl::IsFailedPrecondition(again));
  CHECK_THAT(std::string(again.message()), Catch::Contains("double release"));
  CHECK(ring->Slot(0).state == SlotState::kFree);
  // The slot is refilled with a later batch: the old handle's release still changes nothing.
  FillAndPublish(*ring, 0, 10);
  REQUIRE(ring->Lease(0, 10).ok());
  CHECK(absl::IsFailedPrecondition(ring->Release(0, 9)));
  CHECK(ring->Slot(0).state == SlotState::kLeased);
}

TEST_CASE("SlotRing: a stale ring_sequence is refused", "[shm]") {
  auto ring = MakeRing(1);
  FillAndPublish(*ring, 0, 5);
  const absl::Status lease = ring->Lease(0, 4);
  CHECK(absl::IsFailedPrecondition(lease));
  CHECK_THAT(std::string(lease.message()),
             Catch::Contains("holds ring_sequence 5") && Catch::Contains("stale"));
  CHECK(ring->Slot(0).state == SlotState::kReady);
  REQUIRE(ring->Lease(0, 5).ok());
  CHECK(absl::IsFailedPrecondition(ring->Release(0, 6)));
  CHECK(ring->Slot(0).state == SlotState::kLeased);
  REQUIRE(ring->Release(0, 5).ok());
}

TEST_CASE("SlotRing: sequence numbers only grow, per slot and as published", "[shm]") {
  auto ring = MakeRing(4);
  auto consumer = ConsumerRing::Open(ring->name());
  REQUIRE(consumer.ok());
  uint64_t next = 0;
  std::vector<uint64_t> last(4, 0);
  for (int round = 0; round < 3; ++round) {
    for (uint32_t slot = 0; slot < 4; ++slot) {
      FillAndPublish(*ring, slot, next);
      const SlotInfo seen = (*consumer)->Slot(slot);
      CHECK(seen.state == SlotState::kReady);
      CHECK(seen.ring_sequence == next);
      if (round > 0) CHECK(seen.ring_sequence > last[slot]);
      last[slot] = seen.ring_sequence;
      CHECK((*consumer)->Verify(slot, next).ok());
      REQUIRE(ring->Lease(slot, next).ok());
      REQUIRE(ring->Release(slot, next).ok());
      ++next;
    }
  }
  // Re-publishing an older sequence into a slot is refused (a stale handle could match it).
  REQUIRE(ring->BeginFill(0).ok());
  const absl::Status s = ring->Publish(0, last[0], 10);
  CHECK(absl::IsFailedPrecondition(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("sequences only grow"));
  CHECK(ring->Slot(0).state == SlotState::kFilling);
  CHECK(ring->Publish(0, last[0] + 100, 10).ok());
}

TEST_CASE("ConsumerRing: Verify catches a payload changed after publication", "[shm]") {
  auto ring = MakeRing(1);
  FillAndPublish(*ring, 0, 77, 4096);
  auto consumer = ConsumerRing::Open(ring->name(), /*expected_incarnation=*/7);
  REQUIRE(consumer.ok());
  CHECK((*consumer)->incarnation() == 7);
  REQUIRE((*consumer)->Verify(0, 77).ok());
  CHECK_FALSE(testing::FindPatternMismatch((*consumer)->Payload(0).first(4096), 77).has_value());
  ring->Payload(0)[100] ^= 0xff;  // breaks the publication rule on purpose
  const absl::Status s = (*consumer)->Verify(0, 77);
  CHECK(absl::IsDataLoss(s));
  CHECK_THAT(std::string(s.message()), Catch::Contains("checksum"));
  const absl::Status wrong_seq = (*consumer)->Verify(0, 78);
  CHECK(absl::IsDataLoss(wrong_seq));
  CHECK_THAT(std::string(wrong_seq.message()), Catch::Contains("ring_sequence 77"));
}

TEST_CASE("ProducerRing: segment files get the mode and group asked for", "[shm]") {
  TempDir tmp;
  for (const std::string& dir : {std::string("/dev/shm"), tmp.path()}) {
    INFO("shm_dir " << dir);
    const mode_t old_umask = ::umask(077);  // the mode must not depend on the umask
    RingOptions options;
    options.name = "/" + UniqueName("mode");
    options.slot_bytes = 4096;
    options.shm_dir = dir;
    auto default_ring = ProducerRing::Create(options);
    options.name = "/" + UniqueName("group");
    options.mode = 0640;
    options.group = ::getgid();
    auto group_ring = ProducerRing::Create(options);
    ::umask(old_umask);
    REQUIRE(default_ring.ok());
    REQUIRE(group_ring.ok());
    struct stat st {};
    REQUIRE(::stat((dir + (*default_ring)->name()).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0600);
    REQUIRE(::stat((dir + (*group_ring)->name()).c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0640);
    CHECK(st.st_gid == ::getgid());
    CHECK(static_cast<uint64_t>(st.st_size) == (*group_ring)->segment_bytes());
  }
}

TEST_CASE("ProducerRing: the name is unlinked on destruction unless told otherwise", "[shm]") {
  std::string path;
  {
    auto ring = MakeRing(1);
    path = "/dev/shm" + ring->name();
    struct stat st {};
    CHECK(::stat(path.c_str(), &st) == 0);
    // A second ring of the same name is refused (O_EXCL): never two writers.
    RingOptions options;
    options.name = ring->name();
    options.slot_bytes = 4096;
    auto twin = ProducerRing::Create(options);
    CHECK(absl::IsAlreadyExists(twin.status()));
    CHECK(::stat(path.c_str(), &st) == 0);  // the failed twin left the original alone
    CHECK(ConsumerRing::Open(ring->name()).ok());
  }
  struct stat st {};
  CHECK(::stat(path.c_str(), &st) != 0);
  CHECK(errno == ENOENT);

  auto kept = MakeRing(1);
  kept->set_unlink_on_destroy(false);
  const std::string name = kept->name();
  kept.reset();
  CHECK(ConsumerRing::Open(name).ok());
  REQUIRE(::unlink(("/dev/shm" + name).c_str()) == 0);
}

TEST_CASE("SegmentName encodes pid, incarnation (hex) and stream", "[shm]") {
  CHECK(SegmentName(4711, 255, 3) == "/ringloader.4711.ff.3");
  CHECK(SlotStateName(SlotState::kLeased) == "LEASED");
}

TEST_CASE("RemoveStaleSegments removes only segments of dead daemons", "[shm]") {
  TempDir dir;
  // A pid that is certainly dead: a child we have reaped.
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);

  const std::string dead = SegmentName(child, 1, 0).substr(1);
  const std::string live = SegmentName(::getppid(), 1, 0).substr(1);
  const std::string ours = SegmentName(::getpid(), 1, 0).substr(1);
  for (const auto& name : {dead, live, ours, std::string("ringloader.garbage"),
                           std::string("ringloader.") + std::to_string(child) + ".zz.1",
                           std::string("other.") + std::to_string(child) + ".1.0"}) {
    ringloader::testing::WriteFile(dir.Join(name), "x");
  }
  auto removed = RemoveStaleSegments(dir.path());
  REQUIRE(removed.ok());
  CHECK(*removed == 1);
  struct stat st {};
  CHECK(::stat(dir.Join(dead).c_str(), &st) != 0);
  CHECK(::stat(dir.Join(live).c_str(), &st) == 0);
  CHECK(::stat(dir.Join(ours).c_str(), &st) == 0);
  CHECK(::stat(dir.Join("ringloader.garbage").c_str(), &st) == 0);
  CHECK(absl::IsNotFound(RemoveStaleSegments(dir.Join("missing")).status()));
}

}  // namespace
}  // namespace ringloader::shm
