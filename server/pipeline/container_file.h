#pragma once
// What the container formats (tar shards, TFRecord files) share: positioned reads and errors
// that name the file, the offset and a reason (image::ErrorReason). Internal to the pipeline.

#include <cstdint>
#include <string>
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

// pread until `n` bytes or the end of the file: the bytes read, or -errno.
int64_t ReadAt(int fd, void* buf, uint64_t n, uint64_t offset);

// DataLoss "<path>: offset <offset>: <what>" with `reason` attached.
absl::Status Damaged(const std::string& path, uint64_t offset, std::string_view reason,
                     const std::string& what);

// NotFound / PermissionDenied / Unavailable "<path>: <strerror>", reason "read_error".
absl::Status IoError(const std::string& path, int err);

}  // namespace ringloader::pipeline::container
