// SPDX-License-Identifier: Apache-2.0
// TFRecord framing: CRC-32C, scanning headers only, reading and checking one record, damage.
#include "server/pipeline/tfrecord.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <random>
#include <algorithm>
#include <string>
#include <vector>

#include "server/image/sample_decoder.h"
#include "server/pipeline/crc32c.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

using testing::TempDir;

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST_CASE("Crc32c: the standard check value, and hardware and table paths agree", "[tfrecord]") {
  CHECK(Crc32c(Bytes("123456789")) == 0xE3069283u);
  CHECK(Crc32c({}) == 0u);
  std::mt19937 rng(1);
  for (size_t n : {1u, 7u, 8u, 9u, 63u, 64u, 1000u, 4099u}) {
    std::string data(n, '\0');
    for (char& c : data) c = static_cast<char>(rng());
    CHECK(Crc32c(Bytes(data)) == internal::Crc32cTable(Bytes(data)));
  }
}

// Three records of different lengths (one empty), written as tf.data would.
struct ThreeRecords {
  TempDir dir;
  std::string path = dir.Join("data.tfrecord");
  std::vector<std::string> records = {"first record", "", std::string(5000, 'x')};
  std::string file;
  ThreeRecords() {
    for (const std::string& r : records) AppendTfRecord(Bytes(r), file);
    testing::WriteFile(path, file);
  }
};

TEST_CASE("ScanTfRecordFile finds every record and ReadTfRecord returns its data", "[tfrecord]") {
  ThreeRecords f;
  auto scan = ScanTfRecordFile(f.path);
  REQUIRE(scan.ok());
  CHECK(scan->stopped.ok());
  REQUIRE(scan->records.size() == 3);
  CHECK(scan->records[0] == TfRecordSpan{12, 12});
  CHECK(scan->records[1] == TfRecordSpan{12 + 12 + 4 + 12, 0});
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  std::vector<uint8_t> out;
  for (size_t i = 0; i < 3; ++i) {
    REQUIRE(ReadTfRecord(fd, f.path, scan->records[i], out).ok());
    CHECK(std::string(out.begin(), out.end()) == f.records[i]);
  }
  ::close(fd);
}

TEST_CASE("a flipped data byte fails that record only, with crc_mismatch, path and offset",
          "[tfrecord]") {
  ThreeRecords f;
  f.file[12 + 3] ^= 0x20;  // inside the first record's data
  testing::WriteFile(f.path, f.file);
  auto scan = ScanTfRecordFile(f.path);
  REQUIRE(scan.ok());
  REQUIRE(scan->records.size() == 3);  // headers are intact: the file still frames
  const int fd = ::open(f.path.c_str(), O_RDONLY);
  std::vector<uint8_t> out;
  absl::Status bad = ReadTfRecord(fd, f.path, scan->records[0], out);
  CHECK(bad.code() == absl::StatusCode::kDataLoss);
  CHECK(image::ErrorReason(bad) == "crc_mismatch");
  CHECK_THAT(std::string(bad.message()), Catch::Contains(f.path + ": offset 0: "));
  CHECK(ReadTfRecord(fd, f.path, scan->records[2], out).ok());
  ::close(fd);
}

TEST_CASE("damaged framing stops the scan where it is, saying why", "[tfrecord]") {
  ThreeRecords f;
  const uint64_t second = 12 + 12 + 4;  // offset of the second record's header
  SECTION("a header CRC mismatch") {
    f.file[second + 9] ^= 1;
    testing::WriteFile(f.path, f.file);
    auto scan = ScanTfRecordFile(f.path);
    REQUIRE(scan.ok());
    CHECK(scan->records.size() == 1);
    CHECK(image::ErrorReason(scan->stopped) == "crc_mismatch");
    CHECK_THAT(std::string(scan->stopped.message()),
               Catch::Contains("offset " + std::to_string(second)));
  }
  SECTION("a file cut inside its last record") {
    testing::WriteFile(f.path, f.file.substr(0, f.file.size() - 10));
    auto scan = ScanTfRecordFile(f.path);
    REQUIRE(scan.ok());
    CHECK(scan->records.size() == 2);
    CHECK(image::ErrorReason(scan->stopped) == "truncated");
    CHECK_THAT(std::string(scan->stopped.message()), Catch::Contains("runs past the end"));
  }
  SECTION("a file cut inside a header") {
    testing::WriteFile(f.path, f.file.substr(0, second + 5));
    auto scan = ScanTfRecordFile(f.path);
    REQUIRE(scan.ok());
    CHECK(scan->records.size() == 1);
    CHECK_THAT(std::string(scan->stopped.message()), Catch::Contains("cut short (5 of 12"));
  }
  SECTION("a missing file is an error of its own") {
    auto scan = ScanTfRecordFile(f.dir.Join("absent"));
    CHECK(scan.status().code() == absl::StatusCode::kNotFound);
  }
}

TEST_CASE("ScanTfRecordFile tells its hold what the record list may hold and stops when refused",
          "[tfrecord]") {
  testing::TempDir dir;
  std::string file;
  for (int i = 0; i < 10'000; ++i) AppendTfRecord(Bytes(""), file);  // 16 bytes each
  testing::WriteFile(dir.Join("many.tfrecord"), file);
  uint64_t most = 0;
  int calls = 0;
  auto all = ScanTfRecordFile(dir.Join("many.tfrecord"), [&](uint64_t bytes) {
    ++calls;
    most = std::max(most, bytes);
    return absl::OkStatus();
  });
  REQUIRE(all.ok());
  CHECK(all->records.size() == 10'000);
  CHECK(calls == 2);  // at 4,096 and 8,192 records
  CHECK(most >= 8'192 * sizeof(TfRecordSpan));
  auto refused = ScanTfRecordFile(dir.Join("many.tfrecord"), [](uint64_t bytes) {
    return bytes > 100'000 ? absl::ResourceExhaustedError("over") : absl::OkStatus();
  });
  CHECK(absl::IsResourceExhausted(refused.status()));
}

}  // namespace
}  // namespace ringloader::pipeline
