// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/container_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"
#include "server/image/sample_file.h"

namespace ringloader::pipeline::container {

absl::StatusOr<File> File::Open(const std::string& path) {
  if (const int err = image::InjectedReadFault(path); err != 0) return IoError(path, err);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return IoError(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return IoError(path, err);
  }
  return File(fd, static_cast<uint64_t>(st.st_size));
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::shared_ptr<const File>> OpenFiles::Open(const std::string& path,
                                                             bool* opened_now) {
  if (opened_now != nullptr) *opened_now = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = recent_.begin(); it != recent_.end(); ++it) {
      if (it->first == path) {
        recent_.splice(recent_.begin(), recent_, it);
        return recent_.front().second;
      }
    }
  }
  if (opened_now != nullptr) *opened_now = true;
  absl::StatusOr<File> opened = File::Open(path);  // outside the lock: it may be slow
  if (!opened.ok()) return opened.status();
  auto file = std::make_shared<const File>(*std::move(opened));
  std::lock_guard<std::mutex> lock(mu_);
  recent_.emplace_front(path, file);
  while (recent_.size() > capacity_) recent_.pop_back();
  return file;
}

int64_t ReadAt(int fd, void* buf, uint64_t n, uint64_t offset) {
  auto* out = static_cast<char*>(buf);
  uint64_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, out + got, n - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) break;
    got += static_cast<uint64_t>(r);
  }
  return static_cast<int64_t>(got);
}

absl::Status Damaged(const std::string& path, uint64_t offset, std::string_view reason,
                     const std::string& what) {
  return image::WithReason(
      absl::DataLossError(absl::StrCat(path, ": offset ", offset, ": ", what)), reason);
}

absl::Status IoError(const std::string& path, int err) {
  const std::string text = absl::StrCat(path, ": ", std::strerror(err));
  absl::Status s = err == ENOENT   ? absl::NotFoundError(text)
                   : err == EACCES ? absl::PermissionDeniedError(text)
                                   : absl::UnavailableError(text);
  s = image::WithReason(std::move(s), "read_error");
  return image::MarkTransientErrno(std::move(s), err);
}

}  // namespace ringloader::pipeline::container
