// SPDX-License-Identifier: Apache-2.0
#include "server/image/sample_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"
#include "shm/base/text.h"

namespace ringloader::image {
namespace {

constexpr uint64_t kMaxFileBytes = uint64_t{1} << 30;  // no sample file is read above this

absl::Status DataError(const std::string& path, std::string_view reason, std::string_view detail) {
  return WithReason(
      absl::DataLossError(absl::StrCat(path, ": ", base::Sv(reason), ": ", base::Sv(detail))),
      reason);
}

absl::Status ReadError(const std::string& path, int err) {
  const std::string text = absl::StrCat(path, ": read_error: ", std::strerror(err));
  absl::Status s = err == ENOENT   ? absl::NotFoundError(text)
                   : err == EACCES ? absl::PermissionDeniedError(text)
                   : IsTransientErrno(err) ? absl::UnavailableError(text)
                                           : absl::DataLossError(text);
  s = WithReason(std::move(s), "read_error");
  return MarkTransientErrno(std::move(s), err);
}

std::atomic<ReadFaultInjector> g_read_fault_injector{nullptr};

}  // namespace

absl::StatusOr<SampleFile> SampleFile::Open(const std::string& path, uint64_t max_bytes) {
  const uint64_t limit = std::min(max_bytes, kMaxFileBytes);
  // O_NONBLOCK: opening a FIFO must not wait for a writer. It changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ReadError(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ReadError(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                     : "not a regular file";
    return DataError(path, "not_regular_file",
                     absl::StrCat("is ", kind, ", not a regular file: refused unread"));
  }
  if (static_cast<uint64_t>(st.st_size) > limit) {
    ::close(fd);
    return DataError(path, "too_large",
                     absl::StrCat("file has ", st.st_size, " bytes, above max_file_bytes ", limit));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return DataError(path, "empty", "file is empty (0 bytes)");
  }
  return SampleFile(path, fd, static_cast<uint64_t>(st.st_size), limit);
}

SampleFile::SampleFile(SampleFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      max_bytes_(other.max_bytes_) {}

SampleFile::~SampleFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadHead(uint64_t max) {
  return ReadRange(std::min(max, size_));
}

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadAll() { return ReadRange(UINT64_MAX); }

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadRange(uint64_t max) try {
  const bool whole = max == UINT64_MAX;
  // One byte more than the file had, to see its end in the same read without growing the buffer
  // (growing would double its capacity: memory the accounting did not draw).
  std::vector<uint8_t> bytes(static_cast<size_t>(whole ? size_ + 1 : max));
  size_t got = 0;
  while (true) {
    if (got == bytes.size()) {
      if (!whole) break;
      bytes.resize(got + 65536);  // the file grew since Open (rare)
    }
    if (const int err = InjectedReadFault(path_); err != 0) return ReadError(path_, err);
    const ssize_t n = ::pread(fd_, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ReadError(path_, errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
    if (got > max_bytes_) {
      return DataError(path_, "too_large",
                       absl::StrCat("file is above max_file_bytes ", max_bytes_, " bytes"));
    }
  }
  bytes.resize(got);
  if (bytes.empty()) return DataError(path_, "empty", "file is empty (0 bytes)");
  return bytes;
} catch (const std::bad_alloc&) {
  return MarkTransient(WithReason(
      absl::ResourceExhaustedError(absl::StrCat(path_, ": read_error: out of memory")),
      "read_error"));
}

void SetReadFaultInjector(ReadFaultInjector injector) {
  g_read_fault_injector.store(injector, std::memory_order_relaxed);
}

int InjectedReadFault(const std::string& path) {
  ReadFaultInjector inject = g_read_fault_injector.load(std::memory_order_relaxed);
  return inject != nullptr ? inject(path) : 0;
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<SampleFile> file = SampleFile::Open(path, max_bytes);
  if (!file.ok()) return file.status();
  return file->ReadAll();
}

}  // namespace ringloader::image
