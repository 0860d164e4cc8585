// SPDX-License-Identifier: Apache-2.0
// ring_bench: the daemon's side of the shared-memory batch ring (shm/): payload write bandwidth
// into a ring slot vs. memcpy into private memory, for 1 MiB and for 38 MiB (one 256 x 224 x 224 x
// 3 uint8 batch), and the cost of Publish (XXH3-64 checksum). The trainer's side (handoff,
// copy-on-write, copy-out) is bench/client_bench. Not a test: it prints, never fails.
//
// Target (issue 2): slot write >= 0.9x memcpy.
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "shm/ring.h"

namespace {

using ringloader::shm::ProducerRing;
using ringloader::shm::RingOptions;
using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "ring_bench: %s\n", what.c_str());
  std::exit(1);
}

std::unique_ptr<ProducerRing> MakeRing(uint32_t slots, uint64_t slot_bytes, uint64_t stream) {
  RingOptions options;
  options.name = ringloader::shm::SegmentName(getpid(), 0xbe7c, stream);
  options.slot_count = slots;
  options.slot_bytes = slot_bytes;
  auto ring = ProducerRing::Create(options);
  if (!ring.ok()) Die(std::string(ring.status().message()));
  return std::move(*ring);
}

// Best-of-`reps` seconds for copying `src` into `dst`.
double BestCopySeconds(uint8_t* dst, const std::vector<uint8_t>& src, int reps) {
  double best = 1e9;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    std::memcpy(dst, src.data(), src.size());
    asm volatile("" : : "r"(dst) : "memory");  // keep the copy
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

void Bandwidth(const char* label, uint64_t bytes, int reps) {
  auto ring = MakeRing(2, bytes, 10 + bytes % 7);
  std::vector<uint8_t> src(bytes);
  std::mt19937_64 rng(42);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  std::vector<uint8_t> priv(bytes, 1);  // touched: no page faults while timing

  if (!ring->BeginFill(0).ok()) Die("BeginFill");
  uint8_t* slot = ring->Payload(0).data();
  const auto cold0 = Clock::now();
  std::memcpy(slot, src.data(), bytes);  // first touch of the mapping: minor page faults
  const double cold = std::chrono::duration<double>(Clock::now() - cold0).count();

  // Interleave so both see the same machine load.
  double best_slot = 1e9, best_priv = 1e9;
  for (int round = 0; round < 3; ++round) {
    best_slot = std::min(best_slot, BestCopySeconds(slot, src, reps));
    best_priv = std::min(best_priv, BestCopySeconds(priv.data(), src, reps));
  }
  const double gbs_slot = static_cast<double>(bytes) / best_slot / 1e9;
  const double gbs_priv = static_cast<double>(bytes) / best_priv / 1e9;
  const double ratio = gbs_slot / gbs_priv;

  double publish = 1e9;  // best of 3: Publish hashes the whole payload (XXH3-64)
  for (uint64_t seq = 0; seq < 3; ++seq) {
    if (seq > 0 && !(ring->Lease(0, seq - 1).ok() && ring->Release(0, seq - 1).ok() &&
                     ring->BeginFill(0).ok())) {
      Die("recycle slot");
    }
    const auto p0 = Clock::now();
    if (!ring->Publish(0, seq, bytes).ok()) Die("Publish");
    publish = std::min(publish, std::chrono::duration<double>(Clock::now() - p0).count());
  }

  std::printf("  %-7s slot %6.2f GB/s   memcpy %6.2f GB/s   ratio %.2fx   target >= 0.9x: %s\n",
              label, gbs_slot, gbs_priv, ratio, ratio >= 0.9 ? "met" : "MISSED");
  std::printf(
      "          first write into a fresh slot %.2f GB/s; Publish (XXH3-64 checksum) %.2f ms "
      "(%.2f GB/s)\n",
      static_cast<double>(bytes) / cold / 1e9, publish * 1e3,
      static_cast<double>(bytes) / publish / 1e9);
}

}  // namespace

int main() {
  const auto start = Clock::now();
  std::printf("ring_bench: the daemon writing a shm ring slot in /dev/shm\n");
  std::printf("payload write bandwidth, ring slot vs memcpy into private memory (best of runs):\n");
  Bandwidth("1 MiB", 1ull << 20, 200);
  Bandwidth("38 MiB", 256ull * 224 * 224 * 3, 8);
  std::printf("total %.1f s\n", std::chrono::duration<double>(Clock::now() - start).count());
  return 0;
}
