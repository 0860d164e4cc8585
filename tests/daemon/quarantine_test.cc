// SPDX-License-Identifier: Apache-2.0
// server/daemon/quarantine: strikes, persistence, reload, clear, absolve.
#include "server/daemon/quarantine.h"

#include <catch2/catch.hpp>

#include <filesystem>

#include "tests/support/test_support.h"

namespace ringloader::server {

using testing::ReadFile;
using testing::TempDir;
using testing::WriteFile;

TEST_CASE("Quarantine: two strikes quarantine a sample, persisted and reloaded",
          "[daemon][quarantine]") {
  TempDir dir;
  {
    absl::StatusOr<std::unique_ptr<Quarantine>> q = Quarantine::Load(dir.path());
    REQUIRE(q.ok());
    Quarantine& quarantine = **q;
    CHECK(quarantine.Quarantined().empty());
    CHECK(quarantine.StrikesOf("train", 5) == 0);

    CHECK(*quarantine.Strike("train", 5, "class_01/a.jpg") == 1);
    CHECK(quarantine.StrikesOf("train", 5) == 1);
    CHECK_FALSE(quarantine.IsQuarantined("train", 5));
    CHECK(quarantine.Quarantined().empty());

    CHECK(*quarantine.Strike("train", 5, "class_01/a.jpg") == Quarantine::kStrikesToQuarantine);
    CHECK(quarantine.IsQuarantined("train", 5));
    CHECK_FALSE(quarantine.IsQuarantined("val", 5));  // per dataset
    CHECK_FALSE(quarantine.IsQuarantined("train", 6));
    CHECK(*quarantine.Strike("val", 9, "x.jpg") == 1);
  }
  CHECK(ReadFile(dir.Join("quarantine.tsv")) == "train\t5\t2\tclass_01/a.jpg\nval\t9\t1\tx.jpg\n");

  absl::StatusOr<std::unique_ptr<Quarantine>> reloaded = Quarantine::Load(dir.path());
  REQUIRE(reloaded.ok());
  CHECK((*reloaded)->IsQuarantined("train", 5));
  CHECK((*reloaded)->StrikesOf("val", 9) == 1);
  std::vector<QuarantineEntry> q = (*reloaded)->Quarantined();
  REQUIRE(q.size() == 1);
  CHECK(q[0].dataset == "train");
  CHECK(q[0].sample_index == 5);
  CHECK(q[0].path == "class_01/a.jpg");
  CHECK(q[0].strikes == 2);
}

TEST_CASE("Quarantine: another file at the same index starts from zero strikes",
          "[daemon][quarantine]") {
  TempDir dir;
  auto q = *Quarantine::Load(dir.path());
  CHECK(*q->Strike("train", 3, "old.jpg") == 1);
  CHECK(*q->Strike("train", 3, "new.jpg") == 1);  // the dataset changed under the index
  CHECK(*q->Strike("train", 3, "new.jpg") == 2);
  CHECK(q->Quarantined().at(0).path == "new.jpg");
}

TEST_CASE("Quarantine: absolve clears a strike but never a quarantine", "[daemon][quarantine]") {
  TempDir dir;
  auto q = *Quarantine::Load(dir.path());
  REQUIRE(q->Strike("train", 1, "a.jpg").ok());
  REQUIRE(q->Strike("train", 2, "b.jpg").ok());
  REQUIRE(q->Strike("train", 2, "b.jpg").ok());
  CHECK(q->Absolve("train", 1).ok());
  CHECK(q->StrikesOf("train", 1) == 0);
  CHECK(q->Absolve("train", 2).ok());
  CHECK(q->IsQuarantined("train", 2));  // quarantined stays quarantined
  CHECK(q->Absolve("train", 99).ok());  // unknown: nothing to do
  CHECK(ReadFile(dir.Join("quarantine.tsv")) == "train\t2\t2\tb.jpg\n");
}

TEST_CASE("Quarantine: clear one dataset or all, counting quarantined samples",
          "[daemon][quarantine]") {
  TempDir dir;
  auto q = *Quarantine::Load(dir.path());
  for (int i = 0; i < 2; ++i) {
    REQUIRE(q->Strike("train", 1, "a.jpg").ok());
    REQUIRE(q->Strike("train", 2, "b.jpg").ok());
    REQUIRE(q->Strike("val", 1, "c.jpg").ok());
  }
  REQUIRE(q->Strike("train", 3, "d.jpg").ok());  // one strike: cleared, not counted
  CHECK(*q->Clear("train") == 2);
  CHECK_FALSE(q->IsQuarantined("train", 1));
  CHECK(q->StrikesOf("train", 3) == 0);
  CHECK(q->IsQuarantined("val", 1));
  CHECK(*q->Clear("nope") == 0);
  CHECK(*q->Clear("") == 1);
  CHECK(q->Quarantined().empty());
  CHECK(ReadFile(dir.Join("quarantine.tsv")).empty());
  CHECK((*Quarantine::Load(dir.path()))->Quarantined().empty());
}

TEST_CASE("15.7: a damaged quarantine file is moved aside, named with its line, and the "
          "quarantine starts empty", "[daemon][quarantine]") {
  TempDir dir;
  const std::string damaged = "train\t1\t2\ta.jpg\n\ntrain\tone\t2\tb.jpg\n";
  WriteFile(dir.Join("quarantine.tsv"), damaged);
  absl::StatusOr<std::unique_ptr<Quarantine>> q = Quarantine::Load(dir.path());
  REQUIRE(q.ok());
  CHECK((*q)->Quarantined().empty());
  CHECK_THAT((*q)->load_warning(),
             Catch::StartsWith(dir.Join("quarantine.tsv") + ":3: expected") &&
                 Catch::Contains("moved to " + dir.Join("quarantine.tsv.damaged")));
  CHECK(ReadFile(dir.Join("quarantine.tsv.damaged")) == damaged);
  CHECK_FALSE(std::filesystem::exists(dir.Join("quarantine.tsv")));
  // It works on: a strike is saved to a fresh file.
  REQUIRE((*q)->Strike("train", 4, "c.jpg").ok());
  CHECK(ReadFile(dir.Join("quarantine.tsv")) == "train\t4\t1\tc.jpg\n");
  // Paths may contain tabs: only the first three are separators.
  WriteFile(dir.Join("quarantine.tsv"), "train\t1\t2\tdir\twith tab.jpg\n");
  q = Quarantine::Load(dir.path());
  REQUIRE(q.ok());
  CHECK((*q)->Quarantined().at(0).path == "dir\twith tab.jpg");
}

TEST_CASE("Quarantine: a state dir that cannot be written is an error on change",
          "[daemon][quarantine]") {
  TempDir dir;
  auto q = *Quarantine::Load(dir.Join("missing/sub"));
  absl::StatusOr<uint32_t> s = q->Strike("train", 1, "a.jpg");
  REQUIRE_FALSE(s.ok());
  CHECK_THAT(std::string(s.status().message()), Catch::Contains("missing/sub/quarantine.tsv"));
}

}  // namespace ringloader::server
