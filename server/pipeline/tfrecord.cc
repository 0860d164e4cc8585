// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/tfrecord.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/pipeline/container_file.h"
#include "server/pipeline/sample_list.h"
#include "server/pipeline/crc32c.h"

namespace ringloader::pipeline {
namespace {

using container::Damaged;
using container::IoError;
using container::ReadAt;

constexpr uint64_t kHeaderBytes = 12;  // length + its CRC
constexpr uint64_t kFooterBytes = 4;   // the data's CRC

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint32_t LoadU32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void StoreU32(uint32_t v, std::string& out) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

}  // namespace

absl::StatusOr<TfRecordScan> ScanTfRecordFile(
    const std::string& path, const std::function<absl::Status(uint64_t bytes)>& hold) {
  constexpr size_t kHoldEvery = 4096;
  absl::StatusOr<container::File> file = container::File::Open(path);
  if (!file.ok()) return file.status();
  const int fd = file->fd();
  const uint64_t size = file->size();
  TfRecordScan scan;
  uint64_t offset = 0;
  while (offset < size) {
    uint8_t header[kHeaderBytes];
    const int64_t got = ReadAt(fd, header, kHeaderBytes, offset);
    if (got < 0) return IoError(path, static_cast<int>(-got));
    if (static_cast<uint64_t>(got) < kHeaderBytes) {
      scan.stopped = Damaged(path, offset, "truncated",
                             absl::StrCat("record header cut short (", got, " of 12 bytes)"));
      break;
    }
    if (MaskCrc32c(Crc32c({header, 8})) != LoadU32(header + 8)) {
      scan.stopped = Damaged(path, offset, "crc_mismatch",
                             "record length CRC mismatch: the rest of the file cannot be framed");
      break;
    }
    const uint64_t length = LoadU64(header);
    const uint64_t data = offset + kHeaderBytes;
    // (Written so that a length near 2^64 cannot wrap past the check.)
    if (length > size - data || size - data - length < kFooterBytes) {
      scan.stopped = Damaged(path, offset, "truncated",
                             absl::StrCat("record of ", length, " bytes runs past the end of the "
                                          "file (", size - data, " bytes left)"));
      break;
    }
    scan.records.push_back({data, length});
    if (hold && scan.records.size() % kHoldEvery == 0) {
      if (absl::Status held = hold(BytesAfterGrowth(scan.records.size(), kHoldEvery,
                                                    scan.records.capacity(), sizeof(TfRecordSpan)));
          !held.ok()) {
        return held;
      }
    }
    offset = data + length + kFooterBytes;
  }
  return scan;
}

absl::Status ReadTfRecord(int fd, const std::string& path, const TfRecordSpan& record,
                          std::vector<uint8_t>& out) {
  out.resize(record.length + kFooterBytes);
  const int64_t got = ReadAt(fd, out.data(), out.size(), record.offset);
  if (got < 0) return IoError(path, static_cast<int>(-got));
  if (static_cast<uint64_t>(got) < out.size()) {
    return Damaged(path, record.offset - kHeaderBytes, "truncated",
                   "record cut short (the file shrank since it was indexed)");
  }
  const uint32_t stored = LoadU32(out.data() + record.length);
  out.resize(record.length);
  if (MaskCrc32c(Crc32c(out)) != stored) {
    return Damaged(path, record.offset - kHeaderBytes, "crc_mismatch", "record data CRC mismatch");
  }
  return absl::OkStatus();
}

void AppendTfRecord(std::span<const uint8_t> data, std::string& out) {
  std::string header;
  for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>(uint64_t{data.size()} >> (8 * i)));
  const uint32_t header_crc =
      MaskCrc32c(Crc32c({reinterpret_cast<const uint8_t*>(header.data()), header.size()}));
  out += header;
  StoreU32(header_crc, out);
  out.append(reinterpret_cast<const char*>(data.data()), data.size());
  StoreU32(MaskCrc32c(Crc32c(data)), out);
}

}  // namespace ringloader::pipeline
