// SPDX-License-Identifier: Apache-2.0
#pragma once
// A child memory cgroup (v1) of this process's own, removed when done, and how many OOM kills it
// has seen: for the tests that run the daemon within a container's memory limit.

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tests/support/test_support.h"

namespace ringloader::testing {

class MemoryCgroup {
 public:
  explicit MemoryCgroup(uint64_t limit_bytes) {
    const std::string self = ReadFile("/proc/self/cgroup");
    const size_t at = self.find(":memory:");
    if (at == std::string::npos) return;
    const size_t end = self.find('\n', at);
    path_ = "/sys/fs/cgroup/memory" + self.substr(at + 8, end - at - 8) + "/rl-test-" +
            std::to_string(::getpid());
    std::error_code ec;
    if (!std::filesystem::create_directory(path_, ec) || ec) {
      path_.clear();
      return;
    }
    WriteFile(path_ + "/memory.limit_in_bytes", std::to_string(limit_bytes));
    if (std::filesystem::exists(path_ + "/memory.memsw.limit_in_bytes")) {  // no escape into swap
      WriteFile(path_ + "/memory.memsw.limit_in_bytes", std::to_string(limit_bytes));
    }
  }
  ~MemoryCgroup() {
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // The command that runs `daemon --supervise --config CONFIG` inside this cgroup (the shell
  // joins it, then execs the daemon), as under a systemd unit's MemoryMax= or a container's limit.
  std::vector<std::string> SuperviseInside(const std::string& daemon,
                                           const std::string& config) const {
    return {"/bin/sh", "-c",
            "echo $$ > \"$0\"/cgroup.procs && exec \"$1\" --supervise --config \"$2\"", path_,
            daemon, config};
  }
  // OOM kills in this cgroup since it was made.
  uint64_t oom_kills() const {
    const std::string text = ReadFile(path_ + "/memory.oom_control");
    const size_t at = text.find("oom_kill ");
    return at == std::string::npos ? 0 : std::stoull(text.substr(at + 9));
  }

 private:
  std::string path_;
};

}  // namespace ringloader::testing
