// SPDX-License-Identifier: Apache-2.0
#include "shm/base/cgroup.h"

#include <sched.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace ringloader::base {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> ReadText(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// A limit file's value; nullopt for "max", v1's "no limit" (a page-rounded LONG_MAX) or junk.
std::optional<uint64_t> ReadLimit(const std::string& path) {
  const std::optional<std::string> text = ReadText(path);
  uint64_t value = 0;
  if (!text || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*text), &value)) return std::nullopt;
  if (value == 0 || value >= (uint64_t{1} << 62)) return std::nullopt;
  return value;
}

// "key value" lines: the value of `key`.
std::optional<uint64_t> Field(const std::string& text, absl::string_view key) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, ' ');
    uint64_t n = 0;
    if (kv.first == key && absl::SimpleAtoi(kv.second, &n)) return n;
  }
  return std::nullopt;
}

// One mountinfo line's fields that matter here.
struct Mount {
  std::string root;         // the hierarchy path the mount shows at its mount point
  std::string mount_point;  // with mountinfo's octal escapes ("\040" for a space) undone
  std::string fstype;
  std::string super_options;
};

// mountinfo escapes a space, tab, newline and backslash in paths as \ooo (octal).
std::string Unescape(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const bool escape = s[i] == '\\' && i + 3 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '3';
    if (escape) {
      out.push_back(static_cast<char>((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 +
                                      (s[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<Mount> CgroupMounts(const std::string& mountinfo) {
  std::vector<Mount> mounts;
  for (absl::string_view line : absl::StrSplit(mountinfo, '\n')) {
    // ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER_OPTIONS
    std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 1 >= f.size()) continue;
    const absl::string_view fstype = f[dash + 1];
    if (fstype != "cgroup" && fstype != "cgroup2") continue;
    mounts.push_back({Unescape(f[3]), Unescape(f[4]), std::string(fstype),
                      dash + 3 < f.size() ? std::string(f[dash + 3]) : ""});
  }
  return mounts;
}

// The directory of hierarchy path `path` under `mount`, or nullopt when the mount does not show
// it (its root is elsewhere in the hierarchy).
std::optional<std::string> DirUnder(const Mount& mount, const std::string& path) {
  if (mount.root == "/") return mount.mount_point + (path == "/" ? "" : path);
  if (path == mount.root) return mount.mount_point;
  if (absl::StartsWith(path, mount.root + "/")) {
    return mount.mount_point + path.substr(mount.root.size());
  }
  return std::nullopt;
}

bool HasController(const std::string& mount_point, absl::string_view controller) {
  const std::optional<std::string> controllers = ReadText(mount_point + "/cgroup.controllers");
  if (!controllers) return false;
  for (absl::string_view c : absl::StrSplit(*controllers, absl::ByAnyChar(" \n"))) {
    if (c == controller) return true;
  }
  return false;
}

// The process's cgroup in the hierarchy that has `controller`: the v2 one when its hierarchy has
// it, else the v1 hierarchy whose mount names it.
std::optional<MemoryCgroup> ControllerCgroupFrom(const std::string& proc_cgroup,
                                                 const std::string& mountinfo,
                                                 absl::string_view controller) {
  const std::vector<Mount> mounts = CgroupMounts(mountinfo);
  std::optional<MemoryCgroup> v1;
  for (absl::string_view line : absl::StrSplit(proc_cgroup, '\n')) {
    // "hierarchy-id:controllers:path"; v2's is "0::path".
    std::vector<absl::string_view> f = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (f.size() != 3) continue;
    const std::string path(f[2]);
    const bool unified = f[0] == "0" && f[1].empty();
    bool named = false;
    for (absl::string_view c : absl::StrSplit(f[1], ',')) named = named || c == controller;
    if (!unified && !named) continue;
    for (const Mount& m : mounts) {
      const bool fits =
          unified ? m.fstype == "cgroup2"
                  : m.fstype == "cgroup" && absl::StrContains("," + m.super_options + ",",
                                                              absl::StrCat(",", controller, ","));
      if (!fits) continue;
      const std::optional<std::string> dir = DirUnder(m, path);
      if (!dir) continue;
      if (unified) {
        if (!HasController(m.mount_point, controller)) break;  // v2 without it: v1 has it
        return MemoryCgroup{2, *dir, m.mount_point};
      }
      if (!v1) v1 = MemoryCgroup{1, *dir, m.mount_point};
      break;
    }
  }
  return v1;
}

// A cgroup's own CPU quota in cores; nullopt for none, or a file unreadable or junk.
std::optional<double> CoresAt(const fs::path& dir, int version) {
  int64_t quota = 0, period = 0;
  if (version == 2) {
    const std::optional<std::string> text = ReadText((dir / "cpu.max").string());
    if (!text) return std::nullopt;
    std::vector<absl::string_view> f =
        absl::StrSplit(absl::StripAsciiWhitespace(*text), ' ', absl::SkipEmpty());
    if (f.size() != 2 || !absl::SimpleAtoi(f[0], &quota) || !absl::SimpleAtoi(f[1], &period)) {
      return std::nullopt;  // "max PERIOD": none
    }
  } else {
    const std::optional<std::string> q = ReadText((dir / "cpu.cfs_quota_us").string());
    const std::optional<std::string> p = ReadText((dir / "cpu.cfs_period_us").string());
    if (!q || !p || !absl::SimpleAtoi(absl::StripAsciiWhitespace(*q), &quota) ||
        !absl::SimpleAtoi(absl::StripAsciiWhitespace(*p), &period)) {
      return std::nullopt;
    }
  }
  if (quota <= 0 || period <= 0) return std::nullopt;  // v1's -1: none
  return static_cast<double>(quota) / static_cast<double>(period);
}

}  // namespace

std::optional<MemoryLimit> MemoryCgroup::Limit() const {
  std::optional<MemoryLimit> tightest;
  const char* file = version == 2 ? "memory.max" : "memory.limit_in_bytes";
  fs::path at = dir;
  for (int depth = 0; depth < 64; ++depth) {
    const std::string path = (at / file).string();
    if (std::optional<uint64_t> v = ReadLimit(path); v && (!tightest || *v < tightest->bytes)) {
      tightest = MemoryLimit{*v, path};
    }
    if (at.string() == mount || at == at.root_path() || !at.has_parent_path()) break;
    at = at.parent_path();
  }
  return tightest;
}

std::optional<uint64_t> MemoryCgroup::OomKills() const {
  const std::optional<std::string> text =
      ReadText(dir + (version == 2 ? "/memory.events" : "/memory.oom_control"));
  if (!text) return std::nullopt;
  return Field(*text, "oom_kill");
}

MemoryCgroup MemoryCgroup::AtDirectory(const std::string& dir) {
  MemoryCgroup c;
  c.dir = dir;
  c.version = fs::exists(dir + "/memory.limit_in_bytes") ? 1 : 2;
  for (const char* root : {"/sys/fs/cgroup/memory", "/sys/fs/cgroup"}) {
    if (dir == root || absl::StartsWith(dir, std::string(root) + "/")) {
      c.mount = root;
      return c;
    }
  }
  c.mount = "/";
  return c;
}

std::optional<MemoryCgroup> MemoryCgroupFrom(const std::string& proc_cgroup,
                                             const std::string& mountinfo) {
  return ControllerCgroupFrom(proc_cgroup, mountinfo, "memory");
}

std::optional<MemoryCgroup> MemoryCgroupOf(const std::string& pid) {
  const std::optional<std::string> cgroup = ReadText("/proc/" + pid + "/cgroup");
  const std::optional<std::string> mountinfo = ReadText("/proc/" + pid + "/mountinfo");
  if (!cgroup || !mountinfo) return std::nullopt;
  return MemoryCgroupFrom(*cgroup, *mountinfo);
}

std::optional<CpuQuota> CpuQuotaFrom(const std::string& proc_cgroup,
                                     const std::string& mountinfo) {
  const std::optional<MemoryCgroup> c = ControllerCgroupFrom(proc_cgroup, mountinfo, "cpu");
  if (!c) return std::nullopt;
  std::optional<CpuQuota> tightest;
  fs::path at = c->dir;
  for (int depth = 0; depth < 64; ++depth) {
    if (std::optional<double> cores = CoresAt(at, c->version);
        cores && (!tightest || *cores < tightest->cores)) {
      const char* file = c->version == 2 ? "cpu.max" : "cpu.cfs_quota_us";
      tightest = CpuQuota{*cores, (at / file).string()};
    }
    if (at.string() == c->mount || at == at.root_path() || !at.has_parent_path()) break;
    at = at.parent_path();
  }
  return tightest;
}

std::optional<CpuQuota> CpuQuotaOf(const std::string& pid) {
  const std::optional<std::string> cgroup = ReadText("/proc/" + pid + "/cgroup");
  const std::optional<std::string> mountinfo = ReadText("/proc/" + pid + "/mountinfo");
  if (!cgroup || !mountinfo) return std::nullopt;
  return CpuQuotaFrom(*cgroup, *mountinfo);
}

uint32_t UsableCoresFrom(uint32_t machine, std::optional<uint32_t> affinity,
                         const std::optional<CpuQuota>& quota, std::string* why) {
  uint32_t cores = std::max(1u, machine);
  std::string said = absl::StrCat(cores, " cores here");
  if (affinity && *affinity >= 1 && *affinity < cores) {
    cores = *affinity;
    said = absl::StrCat(cores, " of ", machine, " cores in its CPU affinity");
  }
  // Compared as a double: an absurd quota must not overflow the cast.
  if (quota && quota->cores > 0 && std::ceil(quota->cores) < static_cast<double>(cores)) {
    cores = std::max(1u, static_cast<uint32_t>(std::ceil(quota->cores)));
    said = absl::StrFormat("a CPU quota of %.2f cores (%s)", quota->cores, quota->path);
  }
  if (why != nullptr) *why = said;
  return cores;
}

uint32_t UsableCores(const std::string& pid, std::string* why) {
  std::optional<uint32_t> affinity;
  int id = 0;  // 0: this process
  if (pid == "self" || absl::SimpleAtoi(pid, &id)) {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(id, sizeof(set), &set) == 0) {
      affinity = static_cast<uint32_t>(CPU_COUNT(&set));
    }
  }
  return UsableCoresFrom(std::thread::hardware_concurrency(), affinity, CpuQuotaOf(pid), why);
}

}  // namespace ringloader::base
