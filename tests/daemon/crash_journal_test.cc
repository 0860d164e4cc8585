// SPDX-License-Identifier: Apache-2.0
// server/daemon/crash_journal: real child processes that crash (SIGSEGV after
// InstallCrashHandlers), are killed (SIGKILL) or exit cleanly, and what the next Open() sees.
#include "server/daemon/crash_journal.h"

#include <catch2/catch.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <set>
#include <string>

#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

// Runs `body` in a forked child; returns its raw wait status.
int InChild(const std::function<void()>& body) {
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    body();
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  return status;
}

}  // namespace

TEST_CASE("CrashJournal: a fresh journal has nothing in flight", "[daemon][journal]") {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.path(), 4);
  REQUIRE(j.ok());
  CHECK((*j)->crashed_in_flight().empty());
  CHECK_FALSE((*j)->previous_exit_was_abnormal());
}

TEST_CASE("DatasetHash: the same in every process, and distinct for similar names",
          "[daemon][journal]") {
  // The journal is written by a daemon that crashes and read by the next one: a per-process
  // salted hash (like std::hash may be) would name no dataset after a restart.
  testing::TempDir dir;
  const std::string path = dir.Join("hash");
  InChild([&] { testing::WriteFile(path, std::to_string(DatasetHash("imagenet-train"))); });
  CHECK(testing::ReadFile(path) == std::to_string(DatasetHash("imagenet-train")));
  // Names one character apart, in any position, never collide; 0 is never a hash.
  std::set<uint64_t> seen;
  const std::string base = "imagenet-train";
  for (size_t at = 0; at < base.size(); ++at) {
    for (char c : {'a', 'b', '0', '-'}) {
      std::string name = base;
      name[at] = c;
      const uint64_t h = DatasetHash(name);
      CHECK(h != 0);
      if (name != base) CHECK(h != DatasetHash(base));
      seen.insert(h);
    }
  }
  std::set<std::string> names;
  for (size_t at = 0; at < base.size(); ++at) {
    for (char c : {'a', 'b', '0', '-'}) {
      std::string name = base;
      name[at] = c;
      names.insert(name);
    }
  }
  CHECK(seen.size() == names.size());
}

TEST_CASE("CrashJournal: a SIGSEGV after InstallCrashHandlers lists the samples in flight",
          "[daemon][journal]") {
  testing::TempDir dir;
  const int status = InChild([&] {
    auto j = CrashJournal::Open(dir.path(), 3);
    if (!j.ok()) _exit(3);
    (*j)->InstallCrashHandlers();
    (*j)->Begin(0, DatasetHash("train"), 41);
    (*j)->End(0);  // finished: not in flight
    (*j)->Begin(1, DatasetHash("train"), 42);
    (*j)->Begin(2, DatasetHash("val"), 7);
    (*j)->Begin(7, DatasetHash("val"), 8);  // no such worker: ignored
    raise(SIGSEGV);
    _exit(4);
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGSEGV);  // the handler re-raised with the default action

  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.path(), 2);
  REQUIRE(j.ok());
  CHECK((*j)->previous_exit_was_abnormal());
  const auto samples = [](const std::vector<InFlightSample>& in) {
    std::set<std::pair<uint32_t, uint64_t>> out;
    for (const InFlightSample& s : in) out.emplace(s.dataset_hash, s.sample_index);
    return out;
  };
  const std::set<std::pair<uint32_t, uint64_t>> expected = {{DatasetHash("train"), 42},
                                                            {DatasetHash("val"), 7}};
  CHECK(samples((*j)->crashed_in_flight()) == expected);
  j->reset();

  // Not applied (this incarnation stopped before it struck them): the next one gets them too,
  // though the journal itself was reset and the stop was clean.
  absl::StatusOr<std::unique_ptr<CrashJournal>> next = CrashJournal::Open(dir.path(), 2);
  REQUIRE(next.ok());
  CHECK(samples((*next)->crashed_in_flight()) == expected);
  CHECK(samples((*next)->killed_in_flight()) == expected);
  (*next)->MarkCleanExit();
  REQUIRE((*next)->StrikesApplied().ok());
  next->reset();

  // Applied: the crash is reported once.
  absl::StatusOr<std::unique_ptr<CrashJournal>> again = CrashJournal::Open(dir.path(), 2);
  REQUIRE(again.ok());
  CHECK((*again)->crashed_in_flight().empty());
  CHECK((*again)->killed_in_flight().empty());
}

TEST_CASE("CrashJournal: SIGKILL from outside strikes nobody but is seen as abnormal",
          "[daemon][journal]") {
  testing::TempDir dir;
  const int status = InChild([&] {
    auto j = CrashJournal::Open(dir.path(), 2);
    if (!j.ok()) _exit(3);
    (*j)->InstallCrashHandlers();
    (*j)->Begin(1, DatasetHash("train"), 5);
    kill(getpid(), SIGKILL);
    _exit(4);
  });
  REQUIRE(WIFSIGNALED(status));
  CHECK(WTERMSIG(status) == SIGKILL);
  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.path(), 2);
  REQUIRE(j.ok());
  CHECK((*j)->crashed_in_flight().empty());
  CHECK((*j)->previous_exit_was_abnormal());
}

TEST_CASE("CrashJournal: a daemon killed while idle (nothing in flight) is seen as abnormal too, "
          "and a version 1 journal is still read",
          "[daemon][journal]") {
  testing::TempDir dir;
  const int status = InChild([&] {
    auto j = CrashJournal::Open(dir.path(), 2);
    if (!j.ok()) _exit(3);
    (*j)->InstallCrashHandlers();
    kill(getpid(), SIGKILL);
    _exit(4);
  });
  REQUIRE(WIFSIGNALED(status));
  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.path(), 2);
  REQUIRE(j.ok());
  CHECK((*j)->crashed_in_flight().empty());
  CHECK((*j)->previous_exit_was_abnormal());
  j->reset();

  // Version 1 (before the "running" state): 'RLIF', 1, crashed = 1, 1 worker on sample 9.
  const uint32_t header[4] = {0x46494c52, 1, 1, 1};
  const uint64_t entry[2] = {(uint64_t{DatasetHash("train")} << 32) | 1, 9};
  std::string v1(reinterpret_cast<const char*>(header), sizeof(header));
  v1.append(reinterpret_cast<const char*>(entry), sizeof(entry));
  testing::WriteFile(dir.Join("inflight"), v1);
  absl::StatusOr<std::unique_ptr<CrashJournal>> old = CrashJournal::Open(dir.path(), 2);
  REQUIRE(old.ok());
  CHECK((*old)->previous_exit_was_abnormal());
  REQUIRE((*old)->crashed_in_flight().size() == 1);
  CHECK((*old)->crashed_in_flight()[0].sample_index == 9);
}

TEST_CASE("CrashJournal: a clean exit leaves nothing behind", "[daemon][journal]") {
  testing::TempDir dir;
  const int status = InChild([&] {
    auto j = CrashJournal::Open(dir.path(), 2);
    if (!j.ok()) _exit(3);
    (*j)->InstallCrashHandlers();
    (*j)->Begin(0, DatasetHash("train"), 5);
    (*j)->MarkCleanExit();
    _exit(0);
  });
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.path(), 2);
  REQUIRE(j.ok());
  CHECK((*j)->crashed_in_flight().empty());
  CHECK_FALSE((*j)->previous_exit_was_abnormal());
}

TEST_CASE("CrashJournal: an unwritable state dir is an error naming the file",
          "[daemon][journal]") {
  testing::TempDir dir;
  absl::StatusOr<std::unique_ptr<CrashJournal>> j = CrashJournal::Open(dir.Join("nope/x"), 2);
  REQUIRE_FALSE(j.ok());
  CHECK_THAT(std::string(j.status().message()), Catch::Contains("nope/x/inflight"));
}

}  // namespace ringloader::server
