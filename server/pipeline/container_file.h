// SPDX-License-Identifier: Apache-2.0
#pragma once
// What the container formats (tar shards, TFRecord files) share: positioned reads and errors
// that name the file, the offset and a reason (image::ErrorReason). Internal to the pipeline.

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringloader::pipeline::container {

// A file opened for reading, with its size at open; closed on destruction. Move-only.
class File {
 public:
  // The errors of IoError.
  static absl::StatusOr<File> Open(const std::string& path);
  File(File&& other) noexcept : fd_(other.fd_), size_(other.size_) { other.fd_ = -1; }
  File& operator=(File&&) = delete;
  ~File();
  int fd() const { return fd_; }
  uint64_t size() const { return size_; }

 private:
  File(int fd, uint64_t size) : fd_(fd), size_(size) {}
  int fd_ = -1;
  uint64_t size_ = 0;
};

// Container files kept open for the samples read from them: a shard holds hundreds of samples,
// and on a network mount every open is a round trip. At most `capacity` stay open, the least
// recently used closed first (a file in use stays open until its last user lets go). The cached
// file is the one indexed: offsets come from the index of that very file. Thread-safe.
class OpenFiles {
 public:
  explicit OpenFiles(size_t capacity) : capacity_(capacity) {}
  // The open file at `path`, opened now (File::Open's errors; not cached) or shared.
  // `opened_now` (if set) says which: true when File::Open was called, whatever it returned.
  absl::StatusOr<std::shared_ptr<const File>> Open(const std::string& path,
                                                   bool* opened_now = nullptr);

 private:
  const size_t capacity_;
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const File>>> recent_;  // newest first
};

// pread until `n` bytes or the end of the file: the bytes read, or -errno.
int64_t ReadAt(int fd, void* buf, uint64_t n, uint64_t offset);

// DataLoss "<path>: offset <offset>: <what>" with `reason` attached.
absl::Status Damaged(const std::string& path, uint64_t offset, std::string_view reason,
                     const std::string& what);

// NotFound / PermissionDenied / Unavailable "<path>: <strerror>", reason "read_error".
absl::Status IoError(const std::string& path, int err);

}  // namespace ringloader::pipeline::container
