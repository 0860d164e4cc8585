// SPDX-License-Identifier: Apache-2.0
#pragma once
// Telling an OOM kill from any other SIGKILL. The kernel's OOM killer sends SIGKILL, which the
// crash journal cannot catch; but the memory cgroup counts its kills (v2: memory.events
// "oom_kill N", v1: memory.oom_control "oom_kill N"). Each incarnation records the count when it
// starts (<state_dir>/oom_kills); the next one compares: a count that rose while the previous
// incarnation died with samples in flight means the OOM killer took it while decoding them, and
// they are struck like a crash's. A SIGKILL from anyone else leaves the count alone and strikes
// nothing. (An OOM kill of another process in the same cgroup in that window is taken for ours:
// the cgroup is the daemon's own under systemd, MemoryMax=.)

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace ringloader::server {

// The oom_kill count of this process's memory cgroup (base::MemoryCgroup); nullopt without a
// readable one.
std::optional<uint64_t> CgroupOomKills();

// What the previous incarnation recorded (nullopt: nothing recorded), and this one's record.
std::optional<uint64_t> LoadRecordedOomKills(const std::string& state_dir);
absl::Status RecordOomKills(const std::string& state_dir, uint64_t count);

}  // namespace ringloader::server
