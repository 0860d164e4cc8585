// SPDX-License-Identifier: Apache-2.0
// container::OpenFiles (issue 29): a shard's samples share one open file (an open is a round trip
// on a network mount), at most `capacity` stay open, and a failed open is never remembered.
#include "server/pipeline/container_file.h"

#include <catch2/catch.hpp>

#include <string>

#include "tests/support/test_support.h"

namespace ringloader::pipeline::container {
namespace {

TEST_CASE("OpenFiles: shares an open file, keeps the most recent few, remembers no failure",
          "[pipeline][open_files]") {
  testing::TempDir dir;
  for (const char* name : {"a", "b", "c"}) testing::WriteFile(dir.Join(name), name);
  OpenFiles files(2);
  auto a = files.Open(dir.Join("a"));
  REQUIRE(a.ok());
  auto again = files.Open(dir.Join("a"));
  REQUIRE(again.ok());
  CHECK(again->get() == a->get());  // one open, shared
  CHECK((*a)->size() == 1);
  REQUIRE(files.Open(dir.Join("b")).ok());
  REQUIRE(files.Open(dir.Join("c")).ok());  // a, the least recent, is let go of
  auto reopened = files.Open(dir.Join("a"));
  REQUIRE(reopened.ok());
  CHECK(reopened->get() != a->get());
  CHECK((*a)->fd() >= 0);  // still open for whoever holds it
  // A missing file is an error, and not one that sticks.
  CHECK_FALSE(files.Open(dir.Join("late")).ok());
  testing::WriteFile(dir.Join("late"), "now");
  CHECK(files.Open(dir.Join("late")).ok());
}

}  // namespace
}  // namespace ringloader::pipeline::container
