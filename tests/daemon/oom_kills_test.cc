// Issue 15 item 3: reading a memory cgroup's OOM kill count (v1 and v2 layouts), and its record.
#include "server/daemon/oom_kills.h"

#include <catch2/catch.hpp>

#include <filesystem>

#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

using testing::TempDir;
using testing::WriteFile;

TEST_CASE("15.3: the OOM kill count is read from a v1 or a v2 memory cgroup", "[daemon][oom]") {
  TempDir root;
  std::filesystem::create_directories(root.Join("memory/job/a"));
  WriteFile(root.Join("memory/job/a/memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 7\n");
  CHECK(CgroupOomKillsAt("9:name=systemd:/\n4:memory:/job/a\n0::/\n", root.path()) == 7u);

  std::filesystem::create_directories(root.Join("system.slice/rl.service"));
  WriteFile(root.Join("system.slice/rl.service/memory.events"),
            "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 0\n");
  CHECK(CgroupOomKillsAt("0::/system.slice/rl.service\n", root.path()) == 2u);

  CHECK_FALSE(CgroupOomKillsAt("0::/nowhere\n", root.path()).has_value());
  CHECK_FALSE(CgroupOomKillsAt("", root.path()).has_value());
}

TEST_CASE("15.3: each incarnation's count is recorded in the state dir", "[daemon][oom]") {
  TempDir state;
  CHECK_FALSE(LoadRecordedOomKills(state.path()).has_value());
  REQUIRE(RecordOomKills(state.path(), 41).ok());
  CHECK(LoadRecordedOomKills(state.path()) == 41u);
  WriteFile(state.Join("oom_kills"), "garbage");
  CHECK_FALSE(LoadRecordedOomKills(state.path()).has_value());
}

}  // namespace
}  // namespace ringloader::server
