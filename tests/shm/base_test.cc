// SPDX-License-Identifier: Apache-2.0
// Tests of shm/base: the helpers every binary shares.
#include <catch2/catch.hpp>

#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "shm/base/atomic_file.h"
#include "shm/base/text.h"
#include "tests/support/test_support.h"

namespace ringloader {
namespace {

using testing::TempDir;

std::vector<std::string> Entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  return names;
}

TEST_CASE("FormatBytes: whole multiples without a fraction, others to one decimal", "[base]") {
  CHECK(base::FormatBytes(0) == "0 B");
  CHECK(base::FormatBytes(1023) == "1023 B");
  CHECK(base::FormatBytes(1024) == "1 KiB");
  CHECK(base::FormatBytes(1536) == "1.5 KiB");
  CHECK(base::FormatBytes(100ull << 20) == "100 MiB");
  CHECK(base::FormatBytes((100ull << 20) + 1) == "100.0 MiB");
  CHECK(base::FormatBytes(4ull << 30) == "4 GiB");
  CHECK(base::FormatBytes(3ull << 40) == "3 TiB");
  CHECK(base::FormatBytes(5000ull << 40) == "5000 TiB");
}

TEST_CASE("WriteFileAtomically: replaces the file whole and leaves nothing beside it", "[base]") {
  TempDir dir;
  const std::string path = dir.Join("state");
  REQUIRE(base::WriteFileAtomically(path, "one").ok());
  REQUIRE(base::WriteFileAtomically(path, {"tw", "", "o"}).ok());
  CHECK(testing::ReadFile(path) == "two");
  CHECK(Entries(dir.path()) == std::vector<std::string>{"state"});
}

TEST_CASE("WriteFileAtomically: a failure names the path and keeps the old file", "[base]") {
  TempDir dir;
  const std::string missing = dir.Join("no-such-dir/state");
  absl::Status s = base::WriteFileAtomically(missing, "x");
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(s.message()), Catch::Contains(missing) && Catch::Contains("No such file"));

  // A directory where the file should be: rename fails, the directory stays, no temp is left.
  const std::string taken = dir.Join("taken");
  std::filesystem::create_directory(taken);
  std::filesystem::create_directory(taken + "/inside");
  s = base::WriteFileAtomically(taken, "x");
  CHECK_FALSE(s.ok());
  CHECK_THAT(std::string(s.message()), Catch::Contains(taken));
  CHECK(std::filesystem::is_directory(taken + "/inside"));
  CHECK(Entries(dir.path()) == std::vector<std::string>{"taken"});
}

TEST_CASE("WriteFileAtomically: concurrent writers of one path never mix their contents",
          "[base]") {
  TempDir dir;
  const std::string path = dir.Join("shared");
  constexpr int kWriters = 4;
  constexpr int kRounds = 50;
  std::vector<std::thread> writers;
  std::vector<int> failures(kWriters, 0);
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&, w] {
      // Each writer's file is 64 KiB of one letter: a mixture shows as two letters.
      const std::string contents(64 << 10, static_cast<char>('a' + w));
      for (int r = 0; r < kRounds; ++r) {
        if (!base::WriteFileAtomically(path, contents).ok()) ++failures[w];
        const std::string seen = testing::ReadFile(path);
        if (seen.size() != contents.size() ||
            seen.find_first_not_of(seen.front()) != std::string::npos) {
          ++failures[w];
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  CHECK(failures == std::vector<int>(kWriters, 0));
  CHECK(Entries(dir.path()) == std::vector<std::string>{"shared"});
}

}  // namespace
}  // namespace ringloader
