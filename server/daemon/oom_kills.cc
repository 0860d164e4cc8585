// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/oom_kills.h"

#include "server/daemon/state_counter.h"
#include "shm/base/cgroup.h"

namespace ringloader::server {

std::optional<uint64_t> CgroupOomKills() {
  const std::optional<base::MemoryCgroup> cgroup = base::MemoryCgroupOf();
  if (!cgroup) return std::nullopt;
  return cgroup->OomKills();
}

std::optional<uint64_t> LoadRecordedOomKills(const std::string& state_dir) {
  return LoadStateCounter(state_dir, "oom_kills");
}

absl::Status RecordOomKills(const std::string& state_dir, uint64_t count) {
  return StoreStateCounter(state_dir, "oom_kills", count);
}

}  // namespace ringloader::server
