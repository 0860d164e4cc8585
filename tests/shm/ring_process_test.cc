// SPDX-License-Identifier: Apache-2.0
// Producer and consumer in different real processes (tests/shm/shm_test_peer is the other one).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "shm/ring.h"
#include "tests/shm/ring_test_util.h"
#include "tests/support/test_support.h"

namespace ringloader::shm {
namespace {

using ringloader::testing::BuiltBinary;
using ringloader::testing::Subprocess;
using ringloader::testing::TempDir;
using ringloader::testing::UniqueName;
using ringloader::testing::WaitFor;

constexpr uint32_t kSlots = 4;
constexpr uint64_t kSlotBytes = 256 * 1024;

std::string Peer() { return BuiltBinary("tests/shm/shm_test_peer"); }

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

// Verifies every slot the way the peer producer filled it (odd slots LEASED, even ones READY).
void VerifyPeerSlots(const ConsumerRing& ring, uint64_t first_seq) {
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    INFO("slot " << slot);
    const uint64_t seq = first_seq + slot;
    const SlotInfo info = ring.Slot(slot);
    CHECK(info.state == (slot % 2 == 1 ? SlotState::kLeased : SlotState::kReady));
    CHECK(info.ring_sequence == seq);
    CHECK(info.payload_bytes == testing::TestPayloadBytes(ring.slot_bytes(), slot));
    const absl::Status verified = ring.Verify(slot, seq);
    CHECK(verified.ok());
    if (!verified.ok()) UNSCOPED_INFO(verified.message());
    CHECK_FALSE(testing::FindPatternMismatch(ring.Payload(slot).first(info.payload_bytes), seq)
                    .has_value());
  }
}

// Runs the peer as producer in `shm_dir` and waits until it has published.
std::unique_ptr<Subprocess> StartPeerProducer(const TempDir& tmp, const std::string& shm_dir,
                                              const std::string& name, uint64_t first_seq) {
  const std::string ready = tmp.Join(UniqueName("ready"));
  auto peer = std::make_unique<Subprocess>(
      std::vector<std::string>{Peer(), "produce", shm_dir, name, std::to_string(kSlots),
                               std::to_string(kSlotBytes), std::to_string(first_seq), ready});
  REQUIRE(WaitFor([&] { return Exists(ready) || !peer->Running(); }, std::chrono::seconds(20)));
  REQUIRE(Exists(ready));
  return peer;
}

TEST_CASE("Two processes: a consumer process verifies batches published by this one", "[shm]") {
  RingOptions options;
  options.name = "/" + UniqueName("twoproc");
  options.slot_count = kSlots;
  options.slot_bytes = kSlotBytes;
  options.incarnation = 500;
  auto ring = ProducerRing::Create(options);
  REQUIRE(ring.ok());
  // The consumer starts first and blocks in FUTEX_WAIT on each slot of its read-only mapping.
  Subprocess consumer(
      {Peer(), "consume", "/dev/shm", options.name, std::to_string(kSlots), "500", "20000"});
  for (uint32_t slot = 0; slot < kSlots; ++slot) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const uint64_t seq = 500 + slot;
    const uint64_t bytes = testing::TestPayloadBytes((*ring)->slot_bytes(), slot);
    REQUIRE((*ring)->BeginFill(slot).ok());
    testing::FillPattern((*ring)->Payload(slot).first(bytes), seq);
    REQUIRE((*ring)->Publish(slot, seq, bytes).ok());
  }
  CHECK(consumer.WaitExitCode(std::chrono::seconds(30)) == 0);
}

TEST_CASE("Two processes: this process verifies batches published by a producer process", "[shm]") {
  TempDir tmp;
  const std::string name = "/" + UniqueName("peerprod");
  auto producer = StartPeerProducer(tmp, "/dev/shm", name, 900);
  auto ring = ConsumerRing::Open(name, /*expected_incarnation=*/900);
  REQUIRE(ring.ok());
  CHECK((*ring)->slot_count() == kSlots);
  VerifyPeerSlots(**ring, 900);
  producer->Kill(SIGKILL);
  producer->Wait();
  CHECK(::unlink(("/dev/shm" + name).c_str()) == 0);
}

TEST_CASE("A write through the consumer's read-only mapping faults", "[shm]") {
  RingOptions options;
  options.name = "/" + UniqueName("readonly");
  options.slot_bytes = 4096;
  auto ring = ProducerRing::Create(options);
  REQUIRE(ring.ok());
  auto consumer = ConsumerRing::Open(options.name);
  REQUIRE(consumer.ok());
  const uint8_t* payload = (*consumer)->Payload(0).data();
  SECTION("into a payload") {}
  SECTION("into the header") { payload -= 4096; }  // the page holding header and descriptors
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // Default action, so neither Catch2's nor a sanitizer's handler turns the fault into an exit.
    std::signal(SIGSEGV, SIG_DFL);
    *const_cast<volatile uint8_t*>(payload) = 1;
    ::_exit(0);  // reached only if the write did not fault
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);
  CHECK((*ring)->Slot(0).state == SlotState::kFree);  // nothing changed
}

TEST_CASE("A SIGKILLed producer leaves intact batches and its successor removes the old name",
          "[shm]") {
  TempDir tmp;
  TempDir shm_dir;  // hermetic stand-in for /dev/shm, so the stale scan sees only our segments
  const uint64_t stream = 3;
  const std::string ready = tmp.Join("ready");
  // The peer names its segment after its own pid, as the daemon does: `sh -c 'exec peer ...$$'`
  // keeps the pid across exec, so the name is known from Subprocess::pid().
  const std::string script = "exec \"$0\" produce \"$1\" /ringloader.$$.1." +
                             std::to_string(stream) + " " + std::to_string(kSlots) + " " +
                             std::to_string(kSlotBytes) + " 1 \"$2\"";
  Subprocess producer({"/bin/sh", "-c", script, Peer(), shm_dir.path(), ready});
  const std::string name = SegmentName(producer.pid(), 1, stream);
  REQUIRE(WaitFor([&] { return Exists(ready) || !producer.Running(); }, std::chrono::seconds(20)));
  REQUIRE(Exists(ready));
  REQUIRE(Exists(shm_dir.path() + name));

  auto consumer = ConsumerRing::Open(name, /*expected_incarnation=*/1, shm_dir.path());
  REQUIRE(consumer.ok());
  VerifyPeerSlots(**consumer, 1);  // slot 0 READY, slot 1 LEASED, ...

  producer.Kill(SIGKILL);
  REQUIRE(producer.Wait() != -1);
  CHECK(WaitFor([&] { return ::kill(producer.pid(), 0) != 0; }, std::chrono::seconds(5)));
  VerifyPeerSlots(**consumer, 1);  // the dead producer's batches are intact

  // The next daemon incarnation: a new name, then the stale scan.
  RingOptions options;
  options.name = SegmentName(::getpid(), 2, stream);
  options.slot_count = kSlots;
  options.slot_bytes = kSlotBytes;
  options.incarnation = 2;
  options.shm_dir = shm_dir.path();
  auto successor = ProducerRing::Create(options);
  REQUIRE(successor.ok());
  auto removed = RemoveStaleSegments(shm_dir.path());
  REQUIRE(removed.ok());
  CHECK(*removed == 1);
  CHECK_FALSE(Exists(shm_dir.path() + name));
  CHECK(Exists(shm_dir.path() + options.name));
  CHECK(absl::IsNotFound(ConsumerRing::Open(name, {}, shm_dir.path()).status()));
  VerifyPeerSlots(**consumer, 1);  // the consumer's mapping outlives the name
}

}  // namespace
}  // namespace ringloader::shm
