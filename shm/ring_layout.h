// SPDX-License-Identifier: Apache-2.0
#pragma once
// The binary layout of a ring segment, shared by the daemon and every trainer process.
// Bump kRingLayoutVersion on ANY change below; tests/shm/ring_layout_test.cc pins it with literals.
//
//  offset 0 ---------------- RingHeader (128 B, two cache lines) -------------------------------
//    +0   magic             u32  atomic; creator stores it LAST, with release ("RLRG")
//    +4   layout_version    u32  kRingLayoutVersion
//    +8   layout_hash       u64  kRingLayoutHash (sizes and offsets of everything in this file)
//    +16  slot_count        u32  >= 1
//    +20  creator_pid       i32  pid of the daemon that created the segment
//    +24  slot_bytes        u64  payload capacity (= stride) of one slot; a page-size multiple
//    +32  incarnation       u64  daemon incarnation id
//    +40  creation_time_ms  u64  ms since the Unix epoch
//    +48  slots_offset      u64  = 128; offsets from the segment base, never pointers
//    +56  payload_offset    u64  page-aligned
//    +64  reserved          u64 x 8, zero (version 1 had a heartbeat here that nobody read)
//  slots_offset ------------ SlotDescriptor x slot_count (64 B each, one cache line) ------------
//    +0   state             u32  atomic SlotState
//    +4   reserved          u32  zero
//    +8   ring_sequence     u64  atomic
//    +16  payload_bytes     u64  atomic
//    +24  checksum          u64  atomic; XXH3-64 of payload[0, payload_bytes)
//    +32..63 reserved            zero
//  (zero padding up to the next page boundary)
//  payload_offset ---------- payload x slot_count (slot_bytes each, page-aligned) --------------
//  payload_offset + slot_count * slot_bytes = end of segment (the file may be longer, never
//  shorter)
//
// Every field is written by the creating daemon only; trainers map the segment PROT_READ.
// Fields without a comment saying otherwise are written once, before magic is published, and
// never change afterwards.
// Publication rule: a slot's payload and descriptor fields are published by the release store of
// its state (to READY); a reader that acquire-loads READY and then reads the same ring_sequence
// sees them complete. Descriptor fields are atomics (accessed relaxed) only so that a reader racing
// a writer is never undefined behaviour; all ordering comes from `state`.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ringloader::shm {

inline constexpr uint32_t kRingMagic = 0x47524C52;  // bytes "RLRG" in little-endian memory order
inline constexpr uint32_t kRingLayoutVersion = 2;   // bump on ANY change in this file
inline constexpr uint64_t kCacheLineBytes = 64;

struct alignas(64) RingHeader {
  // Written by the creator only, last, with release: 0 means "still initialising".
  std::atomic<uint32_t> magic;
  uint32_t layout_version;
  uint64_t layout_hash;
  uint32_t slot_count;
  int32_t creator_pid;
  uint64_t slot_bytes;
  uint64_t incarnation;
  uint64_t creation_time_ms;
  uint64_t slots_offset;
  uint64_t payload_offset;
  // Zero. (Liveness is the incarnation's flock, see IncarnationLock, not a word in the ring.)
  uint64_t reserved[8];
};

struct alignas(64) SlotDescriptor {
  // Written by the daemon only (ProducerRing transitions), release on every change. Holds a
  // SlotState value.
  std::atomic<uint32_t> state;
  uint32_t reserved0;
  // Written by the daemon only, relaxed, while the slot is FILLING (published by `state`).
  std::atomic<uint64_t> ring_sequence;
  // Written by the daemon only, relaxed, while the slot is FILLING (published by `state`).
  std::atomic<uint64_t> payload_bytes;
  // Written by the daemon only, relaxed, while the slot is FILLING (published by `state`).
  std::atomic<uint64_t> checksum;
  uint64_t reserved1[4];
};

// Shared between processes: the atomics must be plain memory words, not a lock in some other
// process's address space.
static_assert(std::atomic<uint64_t>::is_always_lock_free,
              "u64 atomics are shared across processes");
static_assert(std::atomic<uint32_t>::is_always_lock_free,
              "u32 atomics are shared across processes");
static_assert(sizeof(std::atomic<uint32_t>) == 4 && alignof(std::atomic<uint32_t>) == 4,
              "the state word is exactly one aligned u32");
static_assert(sizeof(std::atomic<uint64_t>) == 8 && alignof(std::atomic<uint64_t>) == 8,
              "atomics must have the size of the word they replace");
// Standard layout: offsetof is well-defined and the bytes mean the same in every process/compiler.
static_assert(std::is_standard_layout_v<RingHeader>, "mapped by other processes");
static_assert(std::is_standard_layout_v<SlotDescriptor>, "mapped by other processes");
// The memory comes zero-filled from the kernel; no constructor ever runs on it.
static_assert(std::is_trivially_destructible_v<RingHeader>, "never destroyed, only unmapped");
static_assert(std::is_trivially_destructible_v<SlotDescriptor>, "never destroyed, only unmapped");
// Sizes: whole cache lines, so the descriptor array keeps one descriptor per line (no false
// sharing between slots that different threads fill).
static_assert(sizeof(RingHeader) == 2 * kCacheLineBytes, "header is two cache lines");
static_assert(alignof(RingHeader) == kCacheLineBytes, "header starts a cache line");
static_assert(offsetof(RingHeader, reserved) == kCacheLineBytes, "line 1 is reserved");
static_assert(sizeof(SlotDescriptor) == kCacheLineBytes, "one descriptor per cache line");
static_assert(alignof(SlotDescriptor) == kCacheLineBytes, "descriptors start cache lines");
static_assert(sizeof(pid_t) == sizeof(int32_t), "creator_pid is stored as i32");

namespace layout_internal {
constexpr uint64_t Mix(uint64_t hash, uint64_t value) {
  // FNV-1a over the 8 bytes of `value`.
  for (int i = 0; i < 8; ++i) {
    hash ^= (value >> (8 * i)) & 0xff;
    hash *= 0x100000001b3ULL;
  }
  return hash;
}
constexpr uint64_t ComputeLayoutHash() {
  uint64_t h = 0xcbf29ce484222325ULL;
  const uint64_t values[] = {
      sizeof(RingHeader),
      alignof(RingHeader),
      offsetof(RingHeader, magic),
      offsetof(RingHeader, layout_version),
      offsetof(RingHeader, layout_hash),
      offsetof(RingHeader, slot_count),
      offsetof(RingHeader, creator_pid),
      offsetof(RingHeader, slot_bytes),
      offsetof(RingHeader, incarnation),
      offsetof(RingHeader, creation_time_ms),
      offsetof(RingHeader, slots_offset),
      offsetof(RingHeader, payload_offset),
      offsetof(RingHeader, reserved),
      sizeof(SlotDescriptor),
      alignof(SlotDescriptor),
      offsetof(SlotDescriptor, state),
      offsetof(SlotDescriptor, reserved0),
      offsetof(SlotDescriptor, ring_sequence),
      offsetof(SlotDescriptor, payload_bytes),
      offsetof(SlotDescriptor, checksum),
      offsetof(SlotDescriptor, reserved1),
      kRingLayoutVersion,
  };
  for (uint64_t v : values) h = Mix(h, v);
  return h;
}
}  // namespace layout_internal

// Any change of a size or an offset above changes this value; a daemon and a trainer built from
// different layouts refuse each other even if someone forgot to bump kRingLayoutVersion.
inline constexpr uint64_t kRingLayoutHash = layout_internal::ComputeLayoutHash();

}  // namespace ringloader::shm
