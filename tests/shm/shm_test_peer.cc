// SPDX-License-Identifier: Apache-2.0
// A second real process for the shm tests (tests only, never installed).
//
//   shm_test_peer produce <shm_dir> <name> <slots> <slot_bytes> <first_seq> <ready_file>
//     Creates the ring (incarnation = first_seq), fills slot i with the pattern of batch
//     first_seq + i, publishes it, leases the odd slots, then creates <ready_file> and sleeps
//     until killed (the segment is deliberately not unlinked: tests SIGKILL this process).
//   shm_test_peer consume <shm_dir> <name> <slots> <first_seq> <timeout_ms>
//     Opens the ring read-only (retrying until it exists), polls each slot until READY,
//     then verifies ring_sequence, payload_bytes, checksum and pattern. Exit 0 iff all match.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include "shm/ring.h"
#include "tests/shm/ring_test_util.h"

namespace {

using ringloader::shm::ConsumerRing;
using ringloader::shm::ProducerRing;
using ringloader::shm::RingOptions;
using ringloader::shm::SlotState;
namespace t = ringloader::shm::testing;

int Fail(const std::string& what) {
  std::fprintf(stderr, "shm_test_peer: %s\n", what.c_str());
  return 1;
}

int Produce(char** argv) {
  RingOptions options;
  options.shm_dir = argv[0];
  options.name = argv[1];
  options.slot_count = static_cast<uint32_t>(std::stoul(argv[2]));
  options.slot_bytes = std::stoull(argv[3]);
  const uint64_t first_seq = std::stoull(argv[4]);
  const std::string ready_file = argv[5];
  options.incarnation = first_seq;
  auto ring = ProducerRing::Create(options);
  if (!ring.ok()) return Fail(std::string(ring.status().message()));
  (*ring)->set_unlink_on_destroy(false);
  for (uint32_t slot = 0; slot < options.slot_count; ++slot) {
    const uint64_t seq = first_seq + slot;
    const uint64_t bytes = t::TestPayloadBytes((*ring)->slot_bytes(), slot);
    if (auto s = (*ring)->BeginFill(slot); !s.ok()) return Fail(std::string(s.message()));
    t::FillPattern((*ring)->Payload(slot).first(bytes), seq);
    if (auto s = (*ring)->Publish(slot, seq, bytes); !s.ok()) return Fail(std::string(s.message()));
    if (slot % 2 == 1) {
      if (auto s = (*ring)->Lease(slot, seq); !s.ok()) return Fail(std::string(s.message()));
    }
  }
  {
    std::ofstream out(ready_file + ".tmp");
    out << getpid() << "\n";
  }
  if (std::rename((ready_file + ".tmp").c_str(), ready_file.c_str()) != 0) {
    return Fail("rename " + ready_file);
  }
  while (true) pause();  // until the test kills us
}

int Consume(char** argv) {
  const std::string shm_dir = argv[0];
  const std::string name = argv[1];
  const auto slots = static_cast<uint32_t>(std::stoul(argv[2]));
  const uint64_t first_seq = std::stoull(argv[3]);
  const auto timeout = std::chrono::milliseconds(std::stoll(argv[4]));
  const auto deadline = std::chrono::steady_clock::now() + timeout;

  absl::StatusOr<std::unique_ptr<ConsumerRing>> ring;
  while (true) {
    ring = ConsumerRing::Open(name, first_seq, shm_dir);
    if (ring.ok()) break;
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail("open: " + std::string(ring.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if ((*ring)->slot_count() != slots) return Fail("slot_count mismatch");
  for (uint32_t slot = 0; slot < slots; ++slot) {
    const uint64_t seq = first_seq + slot;
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(
        deadline - std::chrono::steady_clock::now());
    // Polls (the trainer's real path waits in the daemon's NextBatch, not on the ring).
    while ((*ring)->Slot(slot).state != SlotState::kReady) {
      if (left.count() <= 0 || std::chrono::steady_clock::now() >= deadline) {
        return Fail("slot " + std::to_string(slot) + " never became READY");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    if (auto s = (*ring)->Verify(slot, seq); !s.ok()) return Fail(std::string(s.message()));
    const uint64_t bytes = (*ring)->Slot(slot).payload_bytes;
    if (bytes != t::TestPayloadBytes((*ring)->slot_bytes(), slot)) {
      return Fail("slot " + std::to_string(slot) + ": payload_bytes " + std::to_string(bytes));
    }
    if (auto bad = t::FindPatternMismatch((*ring)->Payload(slot).first(bytes), seq)) {
      return Fail("slot " + std::to_string(slot) + ": pattern differs at byte " +
                  std::to_string(*bad));
    }
  }
  std::printf("verified %u slots\n", slots);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "produce" && argc == 8) return Produce(argv + 2);
  if (mode == "consume" && argc == 7) return Consume(argv + 2);
  std::fprintf(stderr, "usage: see the comment at the top of tests/shm/shm_test_peer.cc\n");
  return 2;
}
