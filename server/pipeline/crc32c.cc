// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/crc32c.h"

#include <array>
#include <cstring>

namespace ringloader::pipeline {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected

constexpr std::array<uint32_t, 256> MakeTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = MakeTable();

uint32_t TableCrc(uint32_t crc, const uint8_t* p, size_t n) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
// SSE4.2's crc32 instruction, chosen at run time (x86-64 machines without it take the table).
__attribute__((target("sse4.2"))) uint32_t HardwareCrc(uint32_t crc, const uint8_t* p, size_t n) {
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = __builtin_ia32_crc32qi(c32, *p);
  return c32;
}

const bool kHaveHardwareCrc = __builtin_cpu_supports("sse4.2");
#else
// Elsewhere (aarch64: Grace, Graviton) the portable table; ARMv8's crc32c instructions are a
// possible later speed-up, measured first.
uint32_t HardwareCrc(uint32_t crc, const uint8_t* p, size_t n) { return TableCrc(crc, p, n); }
constexpr bool kHaveHardwareCrc = false;
#endif

}  // namespace

uint32_t Crc32c(std::span<const uint8_t> bytes) {
  const uint32_t crc = kHaveHardwareCrc ? HardwareCrc(0xFFFFFFFFu, bytes.data(), bytes.size())
                                        : TableCrc(0xFFFFFFFFu, bytes.data(), bytes.size());
  return crc ^ 0xFFFFFFFFu;
}

uint32_t internal::Crc32cTable(std::span<const uint8_t> bytes) {
  return TableCrc(0xFFFFFFFFu, bytes.data(), bytes.size()) ^ 0xFFFFFFFFu;
}

}  // namespace ringloader::pipeline
