// SPDX-License-Identifier: Apache-2.0
// Tar shards: members found by scanning headers, read by offset; WebDataset keys; damage.
#include "server/pipeline/tar_shard.h"

#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"

#include "server/image/sample_decoder.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

using testing::TempDir;

std::string MemberData(const std::string& shard, const TarMember& m) {
  return testing::ReadFile(shard).substr(m.offset, m.size);
}

// A header of any `type` whose size field says `header_size`, then `data` padded to 512 bytes
// (AppendTarMember's, with the type and size changed and the checksum made right again).
void AppendRaw(const std::string& path, char type, uint64_t header_size, const std::string& data,
               std::string& out) {
  std::string member;
  AppendTarMember(path, data, member);
  char* h = member.data();
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(header_size));
  h[156] = type;
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (int i = 0; i < 512; ++i) sum += static_cast<unsigned char>(h[i]);
  std::snprintf(h + 148, 8, "%06o", sum);
  h[155] = ' ';
  out += member;
}

// A pax record: "<len> key=value\n", len counting itself.
std::string PaxRecord(const std::string& key, const std::string& value) {
  const std::string body = " " + key + "=" + value + "\n";
  size_t len = body.size() + 1;
  while (std::to_string(len).size() + body.size() != len) {
    len = std::to_string(len).size() + body.size();
  }
  return std::to_string(len) + body;
}

// "<path> <size>" of each regular member, as GNU tar (`tar -tv`) and Python's tarfile list them.
std::vector<std::string> ListedBy(const std::string& reader, const std::string& shard) {
  testing::CommandResult r;
  if (reader == "tar") {
    r = testing::RunCommand({"/bin/sh", "-c",
                             "/usr/bin/tar -tvf \"$0\" | awk '{print $6 \" \" $3}'", shard});
  } else {
    r = testing::RunCommand(
        {"/usr/bin/python3", "-c",
         "import sys, tarfile\n"
         "for m in tarfile.open(sys.argv[1]):\n"
         "    print(m.name, m.size)\n",
         shard});
  }
  INFO(reader << ": " << r.output);
  REQUIRE(r.exit_code == 0);
  return absl::StrSplit(r.output, '\n', absl::SkipEmpty());
}

std::vector<std::string> ListedByScan(const TarScan& scan) {
  std::vector<std::string> listed;
  for (const TarMember& m : scan.members) listed.push_back(m.path + " " + std::to_string(m.size));
  return listed;
}

TEST_CASE("a shard written by GNU tar: every member, its bytes, and WebDataset samples",
          "[tar]") {
  TempDir dir;
  const std::string src = dir.Join("src");
  std::filesystem::create_directories(src + "/train");
  const std::string long_dir(120, 'd');  // longer than ustar's 100-byte name field
  std::filesystem::create_directories(src + "/" + long_dir);
  testing::WriteFile(src + "/train/0001.jpg", "jpeg bytes 1");
  testing::WriteFile(src + "/train/0001.cls", "3");
  testing::WriteFile(src + "/train/0001.seg.png", std::string(700, 'p'));  // > one block
  testing::WriteFile(src + "/train/0002.jpg", "jpeg bytes 2");
  testing::WriteFile(src + "/train/0002.cls", "1");
  testing::WriteFile(src + "/" + long_dir + "/0003.jpg", "");
  const std::string shard = dir.Join("shard.tar");
  auto r = testing::RunCommand({"/usr/bin/tar", "--format=gnu", "-cf", shard, "-C", src, "--sort=name",
                                "train", long_dir});
  REQUIRE(r.exit_code == 0);

  auto scan = ScanTarShard(shard);
  REQUIRE(scan.ok());
  CHECK(scan->stopped.ok());
  std::vector<std::string> paths;
  for (const TarMember& m : scan->members) paths.push_back(m.path);
  // Arguments in the order given, each directory's entries sorted by name.
  CHECK(paths == std::vector<std::string>{"train/0001.cls", "train/0001.jpg", "train/0001.seg.png",
                                          "train/0002.cls", "train/0002.jpg",
                                          long_dir + "/0003.jpg"});
  CHECK(MemberData(shard, scan->members[1]) == "jpeg bytes 1");
  CHECK(MemberData(shard, scan->members[2]) == std::string(700, 'p'));
  CHECK(scan->members[5].size == 0);  // read from a GNU long-name header

  // The same files as a POSIX (pax) archive: long names come from pax headers.
  const std::string pax = dir.Join("pax.tar");
  REQUIRE(testing::RunCommand({"/usr/bin/tar", "--format=posix", "-cf", pax, "-C", src,
                               "--sort=name", "train", long_dir})
              .exit_code == 0);
  auto pax_scan = ScanTarShard(pax);
  REQUIRE(pax_scan.ok());
  CHECK(pax_scan->stopped.ok());
  std::vector<std::string> pax_paths;
  for (const TarMember& m : pax_scan->members) pax_paths.push_back(m.path);
  CHECK(pax_paths == paths);

  const std::vector<WebDatasetSample> samples = GroupWebDatasetSamples(scan->members);
  REQUIRE(samples.size() == 3);
  CHECK(samples[0].key == "train/0001");
  CHECK(samples[0].members ==
        std::vector<std::pair<std::string, uint32_t>>{{"cls", 0}, {"jpg", 1}, {"seg.png", 2}});
  CHECK(samples[1].key == "train/0002");
  CHECK(samples[2].key == long_dir + "/0003");
}

TEST_CASE("AppendTarMember writes what GNU tar reads", "[tar]") {
  TempDir dir;
  std::string shard;
  AppendTarMember("a/0001.jpg", "abc", shard);
  AppendTarMember("a/0001.cls", std::string(1025, 'z'), shard);
  AppendTarEnd(shard);
  testing::WriteFile(dir.Join("w.tar"), shard);
  auto r = testing::RunCommand({"/usr/bin/tar", "-tvf", dir.Join("w.tar")});
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("a/0001.jpg") && Catch::Contains("1025 "));
  auto scan = ScanTarShard(dir.Join("w.tar"));
  REQUIRE(scan.ok());
  CHECK(scan->stopped.ok());
  REQUIRE(scan->members.size() == 2);
  CHECK(MemberData(dir.Join("w.tar"), scan->members[1]) == std::string(1025, 'z'));
}

TEST_CASE("damage stops the scan where it is, naming offset and reason", "[tar]") {
  TempDir dir;
  std::string shard;
  AppendTarMember("k/1.jpg", std::string(600, 'a'), shard);  // header 0, data 512..1536
  AppendTarMember("k/2.jpg", "bb", shard);                   // header at 1536
  AppendTarEnd(shard);
  const std::string path = dir.Join("s.tar");
  SECTION("a header checksum that does not add up") {
    shard[1536 + 2] ^= 1;  // inside the second member's name
    testing::WriteFile(path, shard);
    auto scan = ScanTarShard(path);
    REQUIRE(scan.ok());
    CHECK(scan->members.size() == 1);
    CHECK(image::ErrorReason(scan->stopped) == "corrupt");
    CHECK_THAT(std::string(scan->stopped.message()),
               Catch::Contains(path + ": offset 1536: tar header checksum mismatch"));
  }
  SECTION("a last member cut short") {
    testing::WriteFile(path, shard.substr(0, 1000));
    auto scan = ScanTarShard(path);
    REQUIRE(scan.ok());
    CHECK(scan->members.empty());
    CHECK(image::ErrorReason(scan->stopped) == "truncated");
    CHECK_THAT(std::string(scan->stopped.message()), Catch::Contains("runs past the end"));
  }
  SECTION("no end marker") {
    testing::WriteFile(path, shard.substr(0, 1536 + 1024));
    auto scan = ScanTarShard(path);
    REQUIRE(scan.ok());
    CHECK(scan->members.size() == 2);
    CHECK_THAT(std::string(scan->stopped.message()), Catch::Contains("without a tar end marker"));
  }
  SECTION("a huge member whose header holds is listed, and the scan goes on past it") {
    std::string big;
    AppendTarMember("k/0.jpg", std::string(3 << 20, 'x'), big);
    testing::WriteFile(path, big + shard);
    auto scan = ScanTarShard(path);
    REQUIRE(scan.ok());
    CHECK(scan->stopped.ok());
    REQUIRE(scan->members.size() == 3);
    CHECK(scan->members[0].size == 3u << 20);
    CHECK(scan->members[2].path == "k/2.jpg");
  }
}

TEST_CASE("a pax size is the member's size, as GNU tar and Python's tarfile read it: no member "
          "hides inside another", "[tar]") {
  TempDir dir;
  // The pax header says 1536 bytes; the member's own header says 3. Inside those 1536 bytes, after
  // the 3 and their padding, lies what reads as a header of its own: a smuggled label member.
  std::string inner;
  AppendTarMember("k/0001.cls", "7", inner);
  std::string shard;
  const std::string records = PaxRecord("size", "1536");
  AppendRaw("PaxHeaders/0001.jpg", 'x', records.size(), records, shard);
  AppendRaw("k/0001.jpg", '0', 3, std::string("abc") + std::string(509, '\0') + inner, shard);
  AppendTarMember("k/0002.jpg", "def", shard);
  AppendTarEnd(shard);
  const std::string path = dir.Join("pax_size.tar");
  testing::WriteFile(path, shard);

  auto scan = ScanTarShard(path);
  REQUIRE(scan.ok());
  CHECK(scan->stopped.ok());
  const std::vector<std::string> expected = {"k/0001.jpg 1536", "k/0002.jpg 3"};
  CHECK(ListedByScan(*scan) == expected);
  CHECK(ListedBy("tar", path) == expected);
  CHECK(ListedBy("python", path) == expected);
  CHECK(MemberData(path, scan->members[1]) == "def");
}

TEST_CASE("a tar the readers read differently is refused where it stops meaning one thing, "
          "naming why", "[tar]") {
  TempDir dir;
  const std::string path = dir.Join("odd.tar");
  std::string first;
  AppendTarMember("k/0001.jpg", "abc", first);  // served whatever follows
  const auto scan_of = [&](const std::string& rest) {
    std::string shard = first + rest;
    AppendTarEnd(shard);
    testing::WriteFile(path, shard);
    auto scan = ScanTarShard(path);
    REQUIRE(scan.ok());
    CHECK(ListedByScan(*scan) == std::vector<std::string>{"k/0001.jpg 3"});
    CHECK(image::ErrorReason(scan->stopped) == "corrupt");
    return std::string(scan->stopped.message());
  };
  std::string rest;
  SECTION("a symbolic link with a size (tarfile skips no data after it, GNU tar does)") {
    AppendRaw("k/link", '2', 1024, std::string(1024, 'x'), rest);
    CHECK_THAT(scan_of(rest), Catch::Contains(path + ": offset 1024: a tar header of type '2' "
                                              "(no data) with a size of 1024"));
  }
  SECTION("a directory as an old-style regular file with a trailing '/', with a size") {
    AppendRaw("k/dir/", '\0', 512, std::string(512, 'x'), rest);
    CHECK_THAT(scan_of(rest), Catch::Contains("type '0' (no data) with a size of 512"));
  }
  SECTION("a pax global header that sets size") {
    const std::string records = PaxRecord("size", "0");
    AppendRaw("GlobalHead", 'g', records.size(), records, rest);
    AppendTarMember("k/0002.jpg", "def", rest);
    CHECK_THAT(scan_of(rest), Catch::Contains("pax header: a global header sets 'size'"));
  }
  SECTION("records in a pax header's padding (tarfile reads them, GNU tar does not)") {
    const std::string records = PaxRecord("mtime", "1");
    std::string data = records + PaxRecord("size", "0");
    AppendRaw("PaxHeaders/x", 'x', records.size(), data, rest);
    AppendTarMember("k/0002.jpg", "def", rest);
    CHECK_THAT(scan_of(rest),
               Catch::Contains("pax header: bytes other than NUL after its records"));
  }
  SECTION("a pax size that is not a decimal number (tarfile reads 0)") {
    const std::string records = PaxRecord("size", "0x10");
    AppendRaw("PaxHeaders/x", 'x', records.size(), records, rest);
    AppendTarMember("k/0002.jpg", "def", rest);
    CHECK_THAT(scan_of(rest),
               Catch::Contains("pax header: a size that is not a decimal number: '0x10'"));
  }
}

TEST_CASE("ScanTarShard tells its hold what the member list may hold and stops when refused",
          "[tar]") {
  testing::TempDir dir;
  std::string shard;
  for (int i = 0; i < 5'000; ++i) AppendTarMember("k" + std::to_string(i) + ".cls", "", shard);
  AppendTarEnd(shard);
  testing::WriteFile(dir.Join("many.tar"), shard);
  int calls = 0;
  auto all = ScanTarShard(dir.Join("many.tar"), [&](uint64_t bytes) {
    ++calls;
    CHECK(bytes >= 4'096 * sizeof(TarMember));
    return absl::OkStatus();
  });
  REQUIRE(all.ok());
  CHECK(all->members.size() == 5'000);
  CHECK(calls == 1);
  auto refused = ScanTarShard(dir.Join("many.tar"), [](uint64_t) {
    return absl::ResourceExhaustedError("over memory_limit");
  });
  CHECK(absl::IsResourceExhausted(refused.status()));
}

}  // namespace
}  // namespace ringloader::pipeline
