// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers shared by the shm tests and tests/shm/shm_test_peer.cc (header-only on purpose: the peer
// is a separate executable).

#include <cstdint>
#include <optional>
#include <span>

namespace ringloader::shm::testing {

// The byte at `index` of the test batch with `ring_sequence`: depends on both, so a slot holding
// the wrong batch, a shifted copy or a torn write all show.
inline uint8_t PatternByte(uint64_t ring_sequence, uint64_t index) {
  return static_cast<uint8_t>(index * 31 + (index >> 8) * 7 + ring_sequence * 101 + 13);
}

inline void FillPattern(std::span<uint8_t> bytes, uint64_t ring_sequence) {
  for (uint64_t i = 0; i < bytes.size(); ++i) bytes[i] = PatternByte(ring_sequence, i);
}

// Index of the first byte that differs from the pattern, or nullopt if all match.
inline std::optional<uint64_t> FindPatternMismatch(std::span<const uint8_t> bytes,
                                                   uint64_t ring_sequence) {
  for (uint64_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] != PatternByte(ring_sequence, i)) return i;
  }
  return std::nullopt;
}

// Payload length the peer uses for slot `slot` (varies so payload_bytes is checked too).
inline uint64_t TestPayloadBytes(uint64_t slot_bytes, uint32_t slot) {
  return slot_bytes - 1000 * (uint64_t{slot} + 1);
}

}  // namespace ringloader::shm::testing
