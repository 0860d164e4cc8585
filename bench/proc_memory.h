// SPDX-License-Identifier: Apache-2.0
#pragma once
// A process's memory as the kernel counts it (/proc/<pid>/status), and memory_limit's units: for
// the benchmarks that set ringloaderd's RSS against its memory_limit.

#include <sys/types.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

namespace ringloader::bench {

// Fields of /proc/<pid>/status, in bytes.
struct ProcMemory {
  uint64_t vm_rss = 0, vm_hwm = 0, rss_anon = 0, rss_file = 0, rss_shmem = 0;
};

// False once the process is gone.
inline bool ReadProcMemory(pid_t pid, ProcMemory* out) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  if (!in) return false;
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    fields >> key >> kib;
    uint64_t* slot = key == "VmRSS:"      ? &out->vm_rss
                     : key == "VmHWM:"    ? &out->vm_hwm
                     : key == "RssAnon:"  ? &out->rss_anon
                     : key == "RssFile:"  ? &out->rss_file
                     : key == "RssShmem:" ? &out->rss_shmem
                                          : nullptr;
    if (slot != nullptr) {
      *slot = kib * 1024;
      any = true;
    }
  }
  return any;
}

inline double MiB(uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// memory_limit as the config parses it ("512MiB", "1GiB", "100MB" or bytes).
inline uint64_t ParseSize(const std::string& text) {
  size_t used = 0;
  const double value = std::stod(text, &used);
  const std::string unit = text.substr(used);
  double scale = 1;
  if (unit == "KiB") scale = 1024.0;
  if (unit == "MiB") scale = 1024.0 * 1024;
  if (unit == "GiB") scale = 1024.0 * 1024 * 1024;
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  return static_cast<uint64_t>(value * scale);
}

}  // namespace ringloader::bench
