// SPDX-License-Identifier: Apache-2.0
// Clock readings as plain integers, for timestamps that cross threads, files and the wire.
#pragma once

#include <chrono>
#include <cstdint>

namespace ringloader::base {

// Monotonic nanoseconds: for deadlines and durations inside one boot.
inline int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Wall-clock nanoseconds since the Unix epoch: for comparing with file times.
inline int64_t WallNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Wall-clock milliseconds since the Unix epoch: for times other processes read.
inline uint64_t WallNowMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

}  // namespace ringloader::base
