#include "shm/futex.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace ringloader::shm::internal {
namespace {

long Futex(const std::atomic<uint32_t>& word, int op, uint32_t value, const timespec* timeout) {
  // The kernel reads (FUTEX_WAIT) or only hashes (FUTEX_WAKE) the word; it never writes it, so the
  // const_cast does not let anything write through a read-only mapping.
  auto* addr = const_cast<std::atomic<uint32_t>*>(&word);
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, value, timeout, nullptr, 0);
}

}  // namespace

void FutexWakeAll(const std::atomic<uint32_t>& word) { Futex(word, FUTEX_WAKE, INT_MAX, nullptr); }

void FutexWait(const std::atomic<uint32_t>& word, uint32_t expected,
               std::chrono::nanoseconds timeout) {
  if (timeout <= std::chrono::nanoseconds::zero()) return;
  timespec ts{};
  ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
  ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
  // Relative timeout on CLOCK_MONOTONIC. EAGAIN (value differs), EINTR and ETIMEDOUT all just
  // return: the caller re-checks the word and its own deadline.
  Futex(word, FUTEX_WAIT, expected, &ts);
}

}  // namespace ringloader::shm::internal
