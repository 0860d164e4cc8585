// SPDX-License-Identifier: Apache-2.0
#pragma once
// .npy files (NumPy's format, versions 1-3): a header naming the dtype, the memory order and the
// shape, then the array's bytes. The "arrays" dataset format reads one row (one sample) at a time
// with pread at RowOffset(i), never the whole file.
//
// Supported: little-endian (or byte-order-free) bool, uint8, int8, int16, uint16, int32, uint32,
// int64, uint64, float16, float32, float64; C order; at least one dimension. Anything else
// (object arrays, big-endian, Fortran order, structured dtypes) is refused naming the file and
// the dtype or field.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ringloader::pipeline {

enum class NpyType { kBool, kUint8, kInt8, kInt16, kUint16, kInt32, kUint32, kInt64, kUint64,
                     kFloat16, kFloat32, kFloat64 };
const char* NpyTypeName(NpyType type);  // numpy's name: "uint8", "float32", ...
uint32_t NpyTypeBytes(NpyType type);

struct NpyHeader {
  NpyType type = NpyType::kUint8;
  std::vector<uint64_t> shape;  // shape[0]: the rows (samples)
  uint64_t data_offset = 0;     // where row 0 starts
  uint64_t row_bytes = 0;       // bytes of one row (the product of shape[1:] times the item size)
  uint64_t RowOffset(uint64_t row) const { return data_offset + row * row_bytes; }
  // Every element's bytes (a 0-d array: its one item).
  uint64_t DataBytes() const { return shape.empty() ? row_bytes : shape[0] * row_bytes; }
};

// Reads and checks the header of `path`, and that the file holds all the rows the shape claims.
// InvalidArgument naming the file and what is unsupported or malformed; NotFound etc. for I/O.
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path);

// Parses a header from the file's first bytes (tests; ReadNpyHeader uses it). `file_bytes` is the
// file's size, to check the data is all there. `allow_scalar`: a 0-d array (np.save of one
// number: one sample's tensor in a WebDataset member) is accepted, with an empty shape and
// row_bytes its one item; otherwise it is refused (an arrays column needs rows).
absl::StatusOr<NpyHeader> ParseNpyHeader(const std::string& head, uint64_t file_bytes,
                                         const std::string& path, bool allow_scalar = false);

// The whole header of a version 1.0 .npy file of a C-order array of `type` and `shape`, byte for
// byte as numpy >= 1.23 writes it: magic, version, length, the dict
// "{'descr': '<f4', 'fortran_order': False, 'shape': (N, 8, 8), }", room for shape[0] to grow to
// 21 digits, spaces up to a multiple of 64 bytes, '\n'. The rows follow it (writers append them
// one at a time, so a header is all they need up front). (Not "NpyHeader": that names the
// struct above.)
std::string MakeNpyHeader(NpyType type, const std::vector<uint64_t>& shape);

}  // namespace ringloader::pipeline
