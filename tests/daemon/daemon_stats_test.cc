// SPDX-License-Identifier: Apache-2.0
// DaemonStats' bad-file counts (issue 38.3): each bad file is logged once, memory stays bounded
// past any number of them, and files known only by their count are counted all the same.
#include "server/daemon/daemon_stats.h"

#include <catch2/catch.hpp>

namespace ringloader::server {
namespace {

BadFileRecord Record(const std::string& reason) { return {"ds", "a/b.jpg", reason, "msg"}; }

TEST_CASE("DaemonStats: a bad file is news once, and past the remembered bound new ones are "
          "counted, said as not remembered, never as news again",
          "[daemon][stats]") {
  using News = DaemonStats::BadFileNews;
  DaemonStats stats;
  CHECK(stats.RecordBadFile(7, Record("empty")) == News::kFirstTime);
  CHECK(stats.RecordBadFile(7, Record("empty")) == News::kSeenBefore);
  for (uint64_t i = 1000; stats.decode_errors() < DaemonStats::kMaxRememberedBadFiles + 1; ++i) {
    REQUIRE(stats.RecordBadFile(i, Record("empty")) == News::kFirstTime);
  }
  // Full: a new file is counted and not remembered (so it is never logged by its own line).
  CHECK(stats.RecordBadFile(1, Record("truncated")) == News::kNotRemembered);
  CHECK(stats.RecordBadFile(1, Record("truncated")) == News::kNotRemembered);
  CHECK(stats.RecordBadFile(7, Record("empty")) == News::kSeenBefore);
  stats.CountBadFiles("empty", 5);
  CHECK(stats.decode_errors() == DaemonStats::kMaxRememberedBadFiles + 1 + 2 + 1 + 5);
  CHECK(stats.errors_by_reason().at("truncated") == 2);
}

}  // namespace
}  // namespace ringloader::server
