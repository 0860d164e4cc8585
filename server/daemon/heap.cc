// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/heap.h"

#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>

namespace ringloader::server {

uint32_t LimitHeapArenas() {
  if (const char* env = std::getenv("MALLOC_ARENA_MAX"); env != nullptr && *env != '\0') {
    return static_cast<uint32_t>(std::strtoul(env, nullptr, 10));
  }
  return ::mallopt(M_ARENA_MAX, static_cast<int>(kHeapArenas)) == 1 ? kHeapArenas : 0;
}

HeapUse ReadHeapUse() {
  HeapUse use;
  const struct mallinfo2 info = ::mallinfo2();
  use.system_bytes = info.arena + info.hblkhd;
  use.free_bytes = info.fordblks;
  // malloc_info writes one <heap nr="N"> element per arena; nothing else counts them.
  char* text = nullptr;
  size_t size = 0;
  FILE* out = ::open_memstream(&text, &size);
  if (out == nullptr) return use;
  const bool written = ::malloc_info(0, out) == 0;
  std::fclose(out);
  if (written) {
    constexpr std::string_view kHeap = "<heap nr=";
    const std::string_view xml(text, size);
    for (size_t at = xml.find(kHeap); at != std::string_view::npos;
         at = xml.find(kHeap, at + kHeap.size())) {
      ++use.arenas;
    }
  }
  std::free(text);
  return use;
}

}  // namespace ringloader::server
