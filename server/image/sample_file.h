// SPDX-License-Identifier: Apache-2.0
#pragma once
// Reading a sample's file: regular files only, bounded in size, errors that name the file and
// carry a reason (see ErrorReason in sample_decoder.h).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace ringloader::image {

// The default of DecodeLimits::max_file_bytes and of [[datasets]] max_file_bytes.
inline constexpr uint64_t kDefaultMaxFileBytes = uint64_t{64} << 20;

// A sample file opened for reading: only regular files are (a FIFO would block the reader for
// good, a device has no end). Closed on destruction. Move-only.
class SampleFile {
 public:
  // NotFound / PermissionDenied / DataLoss with the path and errno text, reason "read_error"
  // (marked transient when the errno may pass: see IsTransientErrno);
  // "not_regular_file" for anything but a regular file (refused before any read: opening does
  // not block, even on a FIFO); "too_large" above `max_bytes` (DecodeLimits::max_file_bytes),
  // refused unread; "empty" for zero bytes.
  static absl::StatusOr<SampleFile> Open(const std::string& path, uint64_t max_bytes);
  SampleFile(SampleFile&& other) noexcept;
  SampleFile& operator=(SampleFile&& other) = delete;
  ~SampleFile();
  uint64_t size() const { return size_; }
  // Reads up to `max` bytes from the start (a header peek); may block on a slow mount.
  absl::StatusOr<std::vector<uint8_t>> ReadHead(uint64_t max);
  // Reads the whole file (which may have grown or shrunk since Open, within `max_bytes`).
  absl::StatusOr<std::vector<uint8_t>> ReadAll();

 private:
  SampleFile(std::string path, int fd, uint64_t size, uint64_t max_bytes)
      : path_(std::move(path)), fd_(fd), size_(size), max_bytes_(max_bytes) {}
  absl::StatusOr<std::vector<uint8_t>> ReadRange(uint64_t max);
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
  uint64_t max_bytes_ = 0;
};

// A test seam for I/O faults (the daemon's io_fault failpoint): called before every read of a
// sample file with its path; a non-zero errno makes that read fail as if the kernel had said so.
// Set once, before any read; nullptr (the default) = none.
// Container files (tar shards, TFRecord files) ask it when they are opened.
using ReadFaultInjector = int (*)(const std::string& path);
void SetReadFaultInjector(ReadFaultInjector injector);
// The injector's errno for a read of `path` now; 0 without an injector or a fault.
int InjectedReadFault(const std::string& path);

// SampleFile::Open + ReadAll.
absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(
    const std::string& path, uint64_t max_bytes = kDefaultMaxFileBytes);

}  // namespace ringloader::image
