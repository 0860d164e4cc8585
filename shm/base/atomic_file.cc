// SPDX-License-Identifier: Apache-2.0
#include "shm/base/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace ringloader::base {
namespace {

// Distinct temporaries for concurrent writers of one path, in this process and in others.
std::atomic<uint64_t> g_temp_counter{0};

int WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return EIO;
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

}  // namespace

absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> parts) {
  const std::string temp =
      absl::StrCat(path, ".tmp.", ::getpid(), ".", g_temp_counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat(path, ": cannot create ", temp, ": ", std::strerror(errno)));
  }
  int err = 0;  // the first errno seen
  for (std::string_view part : parts) {
    if (err == 0) err = WriteAll(fd, part);
  }
  if (err == 0 && ::fsync(fd) != 0) err = errno;
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && std::rename(temp.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlink(temp.c_str());
    return absl::UnavailableError(absl::StrCat(path, ": cannot write: ", std::strerror(err)));
  }
  // The rename is durable only once the directory entry is on disk too.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    // Best effort: some filesystems refuse fsync on a directory (EINVAL); the data is written.
    (void)::fsync(dir_fd);
    ::close(dir_fd);
  }
  return absl::OkStatus();
}

}  // namespace ringloader::base
