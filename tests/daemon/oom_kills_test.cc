// SPDX-License-Identifier: Apache-2.0
// Issue 15 item 3: each incarnation's OOM kill count is recorded (the count itself is
// base::MemoryCgroup's: tests/shm/cgroup_test.cc).
#include "server/daemon/oom_kills.h"

#include <catch2/catch.hpp>

#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

using testing::TempDir;
using testing::WriteFile;


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
