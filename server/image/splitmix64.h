// SPDX-License-Identifier: Apache-2.0
#pragma once
// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, passes BigCrush, and defined purely by 64-bit
// unsigned arithmetic, so every stream of numbers drawn from it (sample augmentation, epoch
// order) is the same on every platform and compiler. Changing it changes every sample's bytes.

#include <cstdint>

namespace ringloader::image {

// The SplitMix64 output function: a strong 64-bit mixer.
inline uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Advances `state` and returns the next number.
inline uint64_t SplitMix64(uint64_t& state) { return SplitMix64Mix(state += 0x9E3779B97F4A7C15ull); }

}  // namespace ringloader::image
