#pragma once
// Internal to shm/: futex(2) on a 32-bit word in a MAP_SHARED segment. Not part of the contract.
//
// The words live in memory shared between processes, so these use the shared (non-_PRIVATE)
// futex operations: the kernel keys them by the page's inode and offset, not by the address space.
// FUTEX_WAIT works on a PROT_READ mapping (the kernel only needs to read the word), which is how
// trainers wait on slots they cannot write.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ringloader::shm::internal {

// Wakes every process/thread waiting on `word`. Cheap (one syscall) when nobody waits.
void FutexWakeAll(const std::atomic<uint32_t>& word);

// Sleeps while `word` holds `expected`, at most `timeout`. May return early (spuriously, on a
// signal, or because the value already differs): callers re-check the word in a loop.
void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected,
               std::chrono::nanoseconds timeout);

}  // namespace ringloader::shm::internal
