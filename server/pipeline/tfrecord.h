// SPDX-License-Identifier: Apache-2.0
#pragma once
// TFRecord files, as tf.data writes them: a sequence of records, each
//   uint64 length | uint32 masked CRC-32C of those 8 bytes | data (length bytes) | uint32 masked
//   CRC-32C of the data
// all little-endian. Scanning reads only each record's 12-byte header and seeks past its data,
// so indexing costs one small read per record; a record's data CRC is checked when it is read.
//
// Errors are the sample's (or, for a header, the rest of the file's): DataLoss whose message is
// "<path>: offset <N>: <what>", with reason "crc_mismatch" or "truncated" (image::ErrorReason).

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringloader::pipeline {

// One record: where its data starts in the file, and how long it is.
struct TfRecordSpan {
  uint64_t offset = 0;
  uint64_t length = 0;
  bool operator==(const TfRecordSpan&) const = default;
};

struct TfRecordScan {
  std::vector<TfRecordSpan> records;  // every record before the first unusable header
  // Why the scan stopped before the end of the file (a header whose CRC does not match, or a
  // record cut short): the rest of the file cannot be framed. OK when it read to the end.
  absl::Status stopped;
};

// Fails only when the file cannot be opened or read (NotFound, PermissionDenied, ...); damage
// inside it is reported in `stopped`. A record of any length whose header CRC holds and whose data
// lies inside the file is listed: only its reader decides whether it is too large to read
// (max_file_bytes), so one huge record costs that sample, not the rest of the file.
// `hold` (optional) is told, every 4,096 records, what the record list may hold by the next
// time; its error stops the scan with it.
absl::StatusOr<TfRecordScan> ScanTfRecordFile(
    const std::string& path, const std::function<absl::Status(uint64_t bytes)>& hold = {});

// Reads the data of `record` from `fd` (the file `path`, opened for reading) into `out` (resized
// to its length) and checks its CRC.
absl::Status ReadTfRecord(int fd, const std::string& path, const TfRecordSpan& record,
                          std::vector<uint8_t>& out);

// Frames `data` as one record (header, data, CRC), appended to `out`: for writers and tests.
void AppendTfRecord(std::span<const uint8_t> data, std::string& out);

}  // namespace ringloader::pipeline
