// SPDX-License-Identifier: Apache-2.0
#pragma once
// A process's cgroup, v1 or v2, found the way the kernel describes it: /proc/PID/cgroup names the
// cgroup's path in its hierarchy, /proc/PID/mountinfo where that hierarchy is mounted and which
// of its paths the mount shows. So a nested cgroup (systemd's system.slice/ringloader.service
// with MemoryMax=), a container's own cgroup namespace (the path is "/" and the namespace's root
// is mounted at /sys/fs/cgroup) and a bind-mounted subtree all resolve to the directory that
// holds the cgroup's files. One helper for the daemon's memory_limit check, `ringloaderctl
// doctor`, the OOM-kill count, and the cores decode_threads = 0 means (UsableCores).

#include <cstdint>
#include <optional>
#include <string>

namespace ringloader::base {

struct MemoryLimit {
  uint64_t bytes = 0;
  std::string path;  // the file that sets it: ".../memory.max" or ".../memory.limit_in_bytes"
};

struct MemoryCgroup {
  int version = 2;    // 2: the unified hierarchy; 1: the memory controller's own hierarchy
  std::string dir;    // the cgroup's directory, e.g. /sys/fs/cgroup/system.slice/x.service
  std::string mount;  // where its hierarchy is mounted; `dir` is at or below it

  // The tightest limit of this cgroup and its ancestors up to the mount: v2 memory.max, v1
  // memory.limit_in_bytes ("max" and v1's page-rounded LONG_MAX mean none). nullopt: none.
  std::optional<MemoryLimit> Limit() const;
  // The processes of this cgroup the OOM killer has killed: v2 memory.events "oom_kill", v1
  // memory.oom_control "oom_kill". nullopt when unreadable.
  std::optional<uint64_t> OomKills() const;

  // A cgroup directory given by hand (`doctor --cgroup DIR`): its version from its files, its
  // mount the hierarchy root above it (/sys/fs/cgroup, /sys/fs/cgroup/memory) or "/".
  static MemoryCgroup AtDirectory(const std::string& dir);
};

// From the texts of /proc/PID/cgroup and /proc/PID/mountinfo (tests pass their own; mount
// points are taken as they are written). The v2 line is used when its hierarchy has the memory
// controller (cgroup.controllers lists "memory"), else the v1 memory line. nullopt when the
// process has no memory cgroup that is mounted.
std::optional<MemoryCgroup> MemoryCgroupFrom(const std::string& proc_cgroup,
                                             const std::string& mountinfo);

// Of process `pid` ("self" or a number), read from /proc.
std::optional<MemoryCgroup> MemoryCgroupOf(const std::string& pid = "self");

// A CPU quota: how many cores' time a cgroup lets its processes use.
struct CpuQuota {
  double cores = 0;
  std::string path;  // the file that sets it
};

// The CPU quota of a process's cgroup (a container's --cpus, Kubernetes' CPU limit, systemd's
// CPUQuota=): the tightest of its cgroup and its ancestors up to the mount, v2 cpu.max
// ("QUOTA PERIOD", "max" for none), v1 cpu.cfs_quota_us over cpu.cfs_period_us (-1 for none).
// The cgroup is found as MemoryCgroupFrom finds the memory one, by the cpu controller. nullopt:
// no quota.
std::optional<CpuQuota> CpuQuotaFrom(const std::string& proc_cgroup, const std::string& mountinfo);
std::optional<CpuQuota> CpuQuotaOf(const std::string& pid = "self");

// The cores a process may run on: the machine's, fewer when its CPU affinity allows fewer
// (taskset, systemd's CPUAffinity=, a container's cpuset), fewer again when its cgroup's CPU
// quota does (rounded up); at least 1. `why`, when given, says which bound it is. What
// [server] decode_threads = 0 means: std::thread::hardware_concurrency() counts the machine's, so
// a daemon pinned to 1 core of 64 ran 64 decode threads taking turns on it.
uint32_t UsableCoresFrom(uint32_t machine, std::optional<uint32_t> affinity,
                         const std::optional<CpuQuota>& quota, std::string* why = nullptr);
// Of process `pid` ("self" or a number): its affinity (sched_getaffinity) and CpuQuotaOf(pid).
uint32_t UsableCores(const std::string& pid = "self", std::string* why = nullptr);

}  // namespace ringloader::base
