// SPDX-License-Identifier: Apache-2.0
// Binary compatibility: the segment layout is pinned with literal numbers.
#include "shm/ring_layout.h"

#include <catch2/catch.hpp>
#include <cstddef>
#include <string>

namespace ringloader::shm {
namespace {

// Literal numbers on purpose: if any of these fails, the layout changed. Bump kRingLayoutVersion,
// update shm/ring_layout.h's drawing, then these numbers.
TEST_CASE("RingHeader layout is pinned to version 2", "[shm][abi]") {
  CHECK(kRingLayoutVersion == 2);
  CHECK(kRingMagic == 0x47524C52);
  CHECK(sizeof(RingHeader) == 128);
  CHECK(alignof(RingHeader) == 64);
  CHECK(offsetof(RingHeader, magic) == 0);
  CHECK(offsetof(RingHeader, layout_version) == 4);
  CHECK(offsetof(RingHeader, layout_hash) == 8);
  CHECK(offsetof(RingHeader, slot_count) == 16);
  CHECK(offsetof(RingHeader, creator_pid) == 20);
  CHECK(offsetof(RingHeader, slot_bytes) == 24);
  CHECK(offsetof(RingHeader, incarnation) == 32);
  CHECK(offsetof(RingHeader, creation_time_ms) == 40);
  CHECK(offsetof(RingHeader, slots_offset) == 48);
  CHECK(offsetof(RingHeader, payload_offset) == 56);
  CHECK(offsetof(RingHeader, reserved) == 64);
}

TEST_CASE("SlotDescriptor layout is pinned to version 2", "[shm][abi]") {
  CHECK(sizeof(SlotDescriptor) == 64);
  CHECK(alignof(SlotDescriptor) == 64);
  CHECK(offsetof(SlotDescriptor, state) == 0);
  CHECK(offsetof(SlotDescriptor, reserved0) == 4);
  CHECK(offsetof(SlotDescriptor, ring_sequence) == 8);
  CHECK(offsetof(SlotDescriptor, payload_bytes) == 16);
  CHECK(offsetof(SlotDescriptor, checksum) == 24);
  CHECK(offsetof(SlotDescriptor, reserved1) == 32);
}

TEST_CASE("The layout hash is pinned and the magic reads RLRG in memory", "[shm][abi]") {
  // Changes whenever any size or offset above changes (even without a version bump).
  CHECK(kRingLayoutHash == 0xf2165d6b31f4cb13ULL);
  const uint32_t magic = kRingMagic;
  const auto* bytes = reinterpret_cast<const unsigned char*>(&magic);
  CHECK(std::string(bytes, bytes + 4) == "RLRG");
}

}  // namespace
}  // namespace ringloader::shm
