#include "server/daemon/oom_kills.h"

#include <fstream>
#include <sstream>
#include <string_view>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/daemon/state_counter.h"

namespace ringloader::server {
namespace {

std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// "oom_kill N" in a "key value" list.
std::optional<uint64_t> OomKillField(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, ' ');
    uint64_t n = 0;
    if (kv.first == "oom_kill" && absl::SimpleAtoi(kv.second, &n)) return n;
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> CgroupOomKillsAt(const std::string& proc_self_cgroup,
                                         const std::string& cgroup_root) {
  std::optional<uint64_t> v2;
  for (absl::string_view line : absl::StrSplit(proc_self_cgroup, '\n')) {
    // "hierarchy-id:controllers:path"
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::string path(f[2]);
    if (f[0] != "0" && absl::StrContains(f[1], "memory")) {  // v1: the memory hierarchy
      for (absl::string_view c : absl::StrSplit(f[1], ',')) {
        if (c != "memory") continue;
        if (auto text = ReadText(absl::StrCat(cgroup_root, "/", f[1], path, "/memory.oom_control"))) {
          return OomKillField(*text);
        }
      }
    }
    if (f[0] == "0" && f[1].empty()) {  // v2: the unified hierarchy
      auto text = ReadText(absl::StrCat(cgroup_root, path, "/memory.events"));
      if (!text) text = ReadText(absl::StrCat(cgroup_root, "/unified", path, "/memory.events"));
      if (text) v2 = OomKillField(*text);
    }
  }
  return v2;
}

std::optional<uint64_t> CgroupOomKills() {
  const std::optional<std::string> cgroups = ReadText("/proc/self/cgroup");
  if (!cgroups) return std::nullopt;
  return CgroupOomKillsAt(*cgroups, "/sys/fs/cgroup");
}

std::optional<uint64_t> LoadRecordedOomKills(const std::string& state_dir) {
  return LoadStateCounter(state_dir, "oom_kills");
}

absl::Status RecordOomKills(const std::string& state_dir, uint64_t count) {
  return StoreStateCounter(state_dir, "oom_kills", count);
}

}  // namespace ringloader::server
