// SPDX-License-Identifier: Apache-2.0
// base::MemoryCgroup (issue 28): one cgroup helper for v1 and v2, nested, with and without a
// cgroup namespace, on the layouts real hosts have (their /proc/PID/cgroup and mountinfo lines,
// copied from systemd, Docker and Kubernetes hosts, over a tree of the files the kernel shows),
// and on this machine's own.
#include "shm/base/cgroup.h"

#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "tests/support/test_support.h"

namespace ringloader::base {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;
using testing::WriteFile;

void Files(const std::string& dir, std::initializer_list<std::pair<const char*, const char*>> f) {
  fs::create_directories(dir);
  for (const auto& [name, text] : f) WriteFile(dir + "/" + name, text);
}

TEST_CASE("MemoryCgroup: cgroup v2 under systemd, nested: MemoryMax= of the unit or its slice",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup");
  Files(mnt, {{"cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n"}});
  Files(mnt + "/system.slice", {{"memory.max", "8589934592\n"}});
  Files(mnt + "/system.slice/ringloader.service",
        {{"memory.max", "4294967296\n"},
         {"memory.events", "low 0\nhigh 0\nmax 17\noom 2\noom_kill 2\noom_group_kill 0\n"}});
  const std::string mountinfo =
      "25 31 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw\n"
      "35 25 0:30 / " + mnt + " rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n";
  auto c = MemoryCgroupFrom("0::/system.slice/ringloader.service\n", mountinfo);
  REQUIRE(c.has_value());
  CHECK(c->version == 2);
  CHECK(c->dir == mnt + "/system.slice/ringloader.service");
  REQUIRE(c->Limit().has_value());
  CHECK(c->Limit()->bytes == 4294967296u);
  CHECK(c->Limit()->path == mnt + "/system.slice/ringloader.service/memory.max");
  CHECK(c->OomKills() == 2u);
  // The slice is tighter: its limit is the one that binds.
  WriteFile(mnt + "/system.slice/memory.max", "1073741824\n");
  CHECK(c->Limit()->bytes == 1073741824u);
  CHECK(c->Limit()->path == mnt + "/system.slice/memory.max");
  // "max" everywhere: no limit.
  WriteFile(mnt + "/system.slice/memory.max", "max\n");
  WriteFile(mnt + "/system.slice/ringloader.service/memory.max", "max\n");
  CHECK_FALSE(c->Limit().has_value());
}

TEST_CASE("MemoryCgroup: cgroup v2 in a container's cgroup namespace (path \"/\")",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup");
  Files(mnt, {{"cgroup.controllers", "cpu io memory pids\n"},
              {"memory.max", "2147483648\n"},
              {"memory.events", "oom_kill 5\n"}});
  // What Docker and containerd show inside: the namespace's root, mounted read-only.
  const std::string mountinfo =
      "1040 1031 0:29 / " + mnt + " ro,nosuid,nodev,noexec,relatime - cgroup2 cgroup rw\n";
  auto c = MemoryCgroupFrom("0::/\n", mountinfo);
  REQUIRE(c.has_value());
  CHECK(c->dir == mnt);
  CHECK(c->Limit()->bytes == 2147483648u);
  CHECK(c->OomKills() == 5u);
}

TEST_CASE("MemoryCgroup: cgroup v2 without a namespace, the host's tree bind-mounted at a subtree",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("cg");
  Files(mnt, {{"cgroup.controllers", "memory\n"}});
  Files(mnt + "/task-7", {{"memory.max", "536870912\n"}});
  // The mount shows /kubepods/pod1 of the hierarchy at `mnt`.
  const std::string mountinfo = "60 50 0:29 /kubepods/pod1 " + mnt + " rw - cgroup2 cgroup2 rw\n";
  auto c = MemoryCgroupFrom("0::/kubepods/pod1/task-7\n", mountinfo);
  REQUIRE(c.has_value());
  CHECK(c->dir == mnt + "/task-7");
  CHECK(c->Limit()->bytes == 536870912u);
  // A path the mount does not show: not this mount.
  CHECK_FALSE(MemoryCgroupFrom("0::/elsewhere\n", mountinfo).has_value());
}

TEST_CASE("MemoryCgroup: cgroup v1, nested (the memory hierarchy at .../memory), and a hybrid "
          "host whose v2 hierarchy has no memory controller",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup/memory");
  Files(mnt, {{"memory.limit_in_bytes", "9223372036854771712\n"}});
  Files(mnt + "/process_api", {{"memory.limit_in_bytes", "9223372036854771712\n"}});
  Files(mnt + "/process_api/job7", {{"memory.limit_in_bytes", "3221225472\n"},
                                    {"memory.oom_control",
                                     "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n"}});
  Files(t.Join("sys/fs/cgroup/unified"), {{"cgroup.controllers", ""}});
  const std::string mountinfo =
      "31 23 0:28 / " + t.Join("sys/fs/cgroup") + " rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / " + t.Join("sys/fs/cgroup/unified") + " rw - cgroup2 cgroup2 rw\n"
      "35 31 0:32 / " + mnt + " rw,relatime - cgroup cgroup rw,memory\n"
      "36 31 0:33 / " + t.Join("sys/fs/cgroup/cpu,cpuacct") + " rw - cgroup cgroup rw,cpu,cpuacct\n";
  const std::string proc =
      "9:name=systemd:/\n8:cpu,cpuacct:/\n4:memory:/process_api/job7\n0::/\n";
  auto c = MemoryCgroupFrom(proc, mountinfo);
  REQUIRE(c.has_value());
  CHECK(c->version == 1);
  CHECK(c->dir == mnt + "/process_api/job7");
  CHECK(c->mount == mnt);
  REQUIRE(c->Limit().has_value());
  CHECK(c->Limit()->bytes == 3221225472u);  // v1's "no limit" (LONG_MAX) above is not a limit
  CHECK(c->OomKills() == 7u);
}

TEST_CASE("MemoryCgroup: cgroup v1 in a container (the mount shows the container's own subtree)",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup/memory");
  Files(mnt, {{"memory.limit_in_bytes", "1073741824\n"}, {"memory.oom_control", "oom_kill 1\n"}});
  const std::string mountinfo = "700 690 0:35 /docker/0123abcd " + mnt +
                                " ro,nosuid - cgroup cgroup rw,memory\n";
  auto c = MemoryCgroupFrom("5:memory:/docker/0123abcd\n", mountinfo);
  REQUIRE(c.has_value());
  CHECK(c->dir == mnt);
  CHECK(c->Limit()->bytes == 1073741824u);
  CHECK(c->OomKills() == 1u);
  // A mount point with a space, as mountinfo escapes it.
  const std::string spaced = t.Join("a b");
  Files(spaced, {{"memory.limit_in_bytes", "4096\n"}});
  auto s = MemoryCgroupFrom("5:memory:/\n", "1 0 0:35 / " + t.Join("a\\040b") +
                                                " rw - cgroup cgroup rw,memory\n");
  REQUIRE(s.has_value());
  CHECK(s->dir == spaced);
  CHECK(s->Limit()->bytes == 4096u);
}

TEST_CASE("MemoryCgroup: no memory cgroup, or one not mounted here, is none", "[base][cgroup]") {
  CHECK_FALSE(MemoryCgroupFrom("", "").has_value());
  CHECK_FALSE(MemoryCgroupFrom("4:memory:/x\n", "1 0 0:1 / /proc rw - proc proc rw\n").has_value());
}

TEST_CASE("CpuQuota: cgroup v2 nested (CPUQuota= of the unit or its slice, the tightest), \"max\" "
          "is none",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup");
  Files(mnt, {{"cgroup.controllers", "cpuset cpu io memory pids\n"}});
  Files(mnt + "/system.slice", {{"cpu.max", "400000 100000\n"}});
  Files(mnt + "/system.slice/ringloader.service", {{"cpu.max", "150000 100000\n"}});
  const std::string mountinfo = "35 25 0:30 / " + mnt +
                                " rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw\n";
  const std::string proc = "0::/system.slice/ringloader.service\n";
  std::optional<CpuQuota> q = CpuQuotaFrom(proc, mountinfo);
  REQUIRE(q.has_value());
  CHECK(q->cores == Approx(1.5));
  CHECK(q->path == mnt + "/system.slice/ringloader.service/cpu.max");
  WriteFile(mnt + "/system.slice/ringloader.service/cpu.max", "max 100000\n");
  q = CpuQuotaFrom(proc, mountinfo);
  REQUIRE(q.has_value());
  CHECK(q->cores == Approx(4.0));  // the slice's
  WriteFile(mnt + "/system.slice/cpu.max", "max 100000\n");
  CHECK_FALSE(CpuQuotaFrom(proc, mountinfo).has_value());
  WriteFile(mnt + "/system.slice/cpu.max", "junk\n");
  CHECK_FALSE(CpuQuotaFrom(proc, mountinfo).has_value());
  // A v2 hierarchy without the cpu controller says nothing (nor does one with no cpu line).
  WriteFile(mnt + "/cgroup.controllers", "memory pids\n");
  WriteFile(mnt + "/system.slice/cpu.max", "100000 100000\n");
  CHECK_FALSE(CpuQuotaFrom(proc, mountinfo).has_value());
}

TEST_CASE("CpuQuota: cgroup v1 (the cpu,cpuacct hierarchy), a container's quota, and -1 is none",
          "[base][cgroup]") {
  TempDir t;
  const std::string mnt = t.Join("sys/fs/cgroup/cpu,cpuacct");
  Files(mnt, {{"cpu.cfs_quota_us", "-1\n"}, {"cpu.cfs_period_us", "100000\n"}});
  Files(mnt + "/kubepods/pod1",
        {{"cpu.cfs_quota_us", "50000\n"}, {"cpu.cfs_period_us", "100000\n"}});
  const std::string mountinfo =
      "35 31 0:32 / " + t.Join("sys/fs/cgroup/memory") + " rw - cgroup cgroup rw,memory\n"
      "36 31 0:33 / " + mnt + " rw - cgroup cgroup rw,cpu,cpuacct\n";
  std::optional<CpuQuota> q =
      CpuQuotaFrom("8:cpu,cpuacct:/kubepods/pod1\n4:memory:/kubepods/pod1\n", mountinfo);
  REQUIRE(q.has_value());
  CHECK(q->cores == Approx(0.5));
  CHECK(q->path == mnt + "/kubepods/pod1/cpu.cfs_quota_us");
  CHECK_FALSE(CpuQuotaFrom("8:cpu,cpuacct:/\n", mountinfo).has_value());
  CHECK_FALSE(CpuQuotaFrom("4:memory:/kubepods/pod1\n", mountinfo).has_value());  // no cpu line
}

TEST_CASE("UsableCores: the machine's, fewer by the CPU affinity, fewer again by a CPU quota "
          "(rounded up), at least one, and says which",
          "[base][cgroup]") {
  std::string why;
  CHECK(UsableCoresFrom(64, std::nullopt, std::nullopt, &why) == 64);
  CHECK(why == "64 cores here");
  CHECK(UsableCoresFrom(64, 64, std::nullopt, &why) == 64);
  CHECK(UsableCoresFrom(64, 1, std::nullopt, &why) == 1);
  CHECK(why == "1 of 64 cores in its CPU affinity");
  const CpuQuota one_and_a_half{1.5, "/sys/fs/cgroup/x/cpu.max"};
  CHECK(UsableCoresFrom(64, 8, one_and_a_half, &why) == 2);
  CHECK(why == "a CPU quota of 1.50 cores (/sys/fs/cgroup/x/cpu.max)");
  CHECK(UsableCoresFrom(64, 1, one_and_a_half, &why) == 1);  // the affinity is tighter
  CHECK(why == "1 of 64 cores in its CPU affinity");
  CHECK(UsableCoresFrom(4, std::nullopt, CpuQuota{0.1, "q"}) == 1);
  CHECK(UsableCoresFrom(4, std::nullopt, CpuQuota{1e300, "q"}) == 4);  // no overflow
  CHECK(UsableCoresFrom(0, 0, std::nullopt) == 1);
  // This process: within the machine's cores.
  CHECK(UsableCores() >= 1);
  CHECK(UsableCores() <= std::max(1u, std::thread::hardware_concurrency()));
}

TEST_CASE("MemoryCgroup: this machine's own cgroup resolves to a directory with its files",
          "[base][cgroup]") {
  std::optional<MemoryCgroup> c = MemoryCgroupOf();
  if (!c) RINGLOADER_SKIP("this machine has no mounted memory cgroup");
  INFO(c->dir);
  CHECK(fs::is_directory(c->dir));
  CHECK(fs::exists(c->dir + (c->version == 2 ? "/memory.events" : "/memory.oom_control")));
  CHECK(c->OomKills().has_value());
  const MemoryCgroup by_hand = MemoryCgroup::AtDirectory(c->dir);
  CHECK(by_hand.version == c->version);
}

}  // namespace
}  // namespace ringloader::base
