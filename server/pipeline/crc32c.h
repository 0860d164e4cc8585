// SPDX-License-Identifier: Apache-2.0
#pragma once
// CRC-32C (Castagnoli), as TFRecord files checksum their records. Uses the SSE4.2 crc32
// instruction where the CPU has it, a table otherwise; both give the same values.

#include <cstdint>
#include <span>

namespace ringloader::pipeline {

// The CRC-32C of `bytes` (initial value and final xor 0xFFFFFFFF, as everyone uses it):
// Crc32c("123456789") == 0xE3069283.
uint32_t Crc32c(std::span<const uint8_t> bytes);

// TFRecord's masked form: rotated right by 15 and offset, so a CRC over data containing CRCs
// stays strong.
namespace internal {
// The table-driven path alone (tests compare it with the hardware one).
uint32_t Crc32cTable(std::span<const uint8_t> bytes);
}  // namespace internal

inline uint32_t MaskCrc32c(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace ringloader::pipeline
