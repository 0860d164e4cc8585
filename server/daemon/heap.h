// SPDX-License-Identifier: Apache-2.0
#pragma once
// The daemon's heap (glibc malloc). Reads ahead allocate a file's bytes on the dataset's read
// threads and free them on a decode thread; glibc gives every new thread an arena of its own, up
// to 8 per core, and what one arena frees only it reuses, so a read-ahead daemon's heap grew
// epoch after epoch (bench/rss_bench: +16 MiB of heap over 120 epochs of one stream on 2 cores).
// A few shared arenas keep it flat at no measured cost (each thread keeps its own cache of small
// blocks; the large ones are a few per sample). See README "Memory over weeks".

#include <cstdint>

namespace ringloader::server {

// The arenas the daemon keeps unless the environment says otherwise.
inline constexpr uint32_t kHeapArenas = 2;

// Caps malloc's arenas at kHeapArenas; call first thing in main(), before any thread starts.
// An operator's MALLOC_ARENA_MAX in the environment wins (glibc reads it itself). Returns the
// cap in force: kHeapArenas, MALLOC_ARENA_MAX's value, or 0 when neither could be set.
uint32_t LimitHeapArenas();

// What malloc holds now, over all arenas (glibc's mallinfo2 and malloc_info).
struct HeapUse {
  uint32_t arenas = 0;        // arenas in use: the main one plus one per thread group
  uint64_t system_bytes = 0;  // taken from the system: arenas' heaps plus mmapped blocks
  uint64_t free_bytes = 0;    // of those, free in the arenas (kept for reuse, or fragmented)
};
HeapUse ReadHeapUse();

}  // namespace ringloader::server
