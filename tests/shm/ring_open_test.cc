// SPDX-License-Identifier: Apache-2.0
// Creating and opening segments that are wrong: corrupt headers, too little space, overflow.
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "shm/ring.h"
#include "shm/ring_layout.h"
#include "tests/support/test_support.h"

namespace ringloader::shm {
namespace {

using ringloader::testing::TempDir;
using ringloader::testing::UniqueName;

template <typename T>
void PwriteAt(const std::string& path, uint64_t offset, T value) {
  const int fd = ::open(path.c_str(), O_WRONLY);
  REQUIRE(fd >= 0);
  REQUIRE(::pwrite(fd, &value, sizeof(value), static_cast<off_t>(offset)) ==
          static_cast<ssize_t>(sizeof(value)));
  ::close(fd);
}

std::string Message(const absl::Status& s) { return std::string(s.message()); }

TEST_CASE("ConsumerRing::Open rejects a corrupt header, naming the check and the values", "[shm]") {
  TempDir dir;
  RingOptions options;
  options.name = "/" + UniqueName("corrupt");
  options.slot_count = 3;
  options.slot_bytes = 8192;
  options.incarnation = 0x2a;
  options.shm_dir = dir.path();
  auto ring = ProducerRing::Create(options);
  REQUIRE(ring.ok());
  const std::string path = dir.path() + options.name;
  const uint64_t size = (*ring)->segment_bytes();
  auto open = [&] { return ConsumerRing::Open(options.name, 0x2a, dir.path()).status(); };
  REQUIRE(open().ok());

  SECTION("wrong magic") {
    PwriteAt<uint32_t>(path, offsetof(RingHeader, magic), 0xdeadbeef);
    CHECK(absl::IsDataLoss(open()));
    CHECK(Message(open()) ==
          absl::StrCat("segment ", options.name,
                       ": magic 0xdeadbeef, expected 0x47524c52 (not a ringloader ring)"));
  }
  SECTION("magic 0 means the creator is still initialising") {
    PwriteAt<uint32_t>(path, offsetof(RingHeader, magic), 0);
    CHECK(absl::IsUnavailable(open()));
    CHECK_THAT(Message(open()), Catch::Contains("not initialised yet"));
  }
  SECTION("wrong layout version") {
    PwriteAt<uint32_t>(path, offsetof(RingHeader, layout_version), 7);
    CHECK(absl::IsFailedPrecondition(open()));
    CHECK(Message(open()) ==
          absl::StrCat("segment ", options.name, ": layout version 7, expected 2"));
  }
  SECTION("wrong layout hash") {
    PwriteAt<uint64_t>(path, offsetof(RingHeader, layout_hash), 0x1234);
    CHECK(absl::IsFailedPrecondition(open()));
    CHECK_THAT(Message(open()), Catch::StartsWith(absl::StrCat("segment ", options.name,
                                                               ": layout hash 0x1234, expected 0x",
                                                               absl::Hex(kRingLayoutHash))));
  }
  SECTION("truncated file") {
    REQUIRE(::truncate(path.c_str(), static_cast<off_t>(size - 4096)) == 0);
    CHECK(absl::IsDataLoss(open()));
    CHECK_THAT(Message(open()), Catch::Contains(absl::StrCat("file size ", size - 4096,
                                                             " bytes, expected at least ", size)));
  }
  SECTION("file shorter than the header") {
    REQUIRE(::truncate(path.c_str(), 100) == 0);
    CHECK(absl::IsDataLoss(open()));
    CHECK_THAT(Message(open()), Catch::Contains("file size 100 bytes, expected at least 128"));
  }
  SECTION("empty file: the creator is still initialising") {
    REQUIRE(::truncate(path.c_str(), 0) == 0);
    CHECK(absl::IsUnavailable(open()));
    CHECK_THAT(Message(open()), Catch::Contains("not initialised yet"));
  }
  SECTION("zero slots") {
    PwriteAt<uint32_t>(path, offsetof(RingHeader, slot_count), 0);
    CHECK(absl::IsDataLoss(open()));
    CHECK_THAT(Message(open()), Catch::Contains("slot count 0, expected >= 1"));
  }
  SECTION("slot count larger than the file") {
    PwriteAt<uint32_t>(path, offsetof(RingHeader, slot_count), 4);
    CHECK(absl::IsDataLoss(open()));
    CHECK_THAT(Message(open()), Catch::Contains("expected at least"));
  }
  SECTION("another incarnation") {
    const absl::Status s = ConsumerRing::Open(options.name, 0x2b, dir.path()).status();
    CHECK(absl::IsFailedPrecondition(s));
    CHECK(Message(s) ==
          absl::StrCat("segment ", options.name, ": incarnation 0x2a, expected 0x2b"));
  }
  SECTION("no such segment") {
    const absl::Status s = ConsumerRing::Open("/" + UniqueName("absent"), {}, dir.path()).status();
    CHECK(absl::IsNotFound(s));
  }
}

// Mounts a tmpfs of `size_option` on `dir` when running as root; unmounts on destruction.
class ScopedTmpfs {
 public:
  ScopedTmpfs(const std::string& dir, const char* size_option) : dir_(dir) {
    mounted_ = ::geteuid() == 0 && ::mount("tmpfs", dir.c_str(), "tmpfs", 0, size_option) == 0;
  }
  ~ScopedTmpfs() {
    if (mounted_) ::umount2(dir_.c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

uint64_t FreeBytes(const std::string& dir) {
  struct statvfs vfs {};
  REQUIRE(::statvfs(dir.c_str(), &vfs) == 0);
  return uint64_t{vfs.f_bavail} * vfs.f_frsize;
}

TEST_CASE("ProducerRing::Create fails with a clear message when the ring does not fit", "[shm]") {
  TempDir dir;
  const std::string mount_point = dir.Join("tmpfs");
  REQUIRE(::mkdir(mount_point.c_str(), 0700) == 0);
  ScopedTmpfs tmpfs(mount_point, "size=8m");
  const std::string shm_dir = tmpfs.mounted() ? mount_point : "/dev/shm";
  INFO("shm_dir " << shm_dir << (tmpfs.mounted() ? " (8 MiB tmpfs)" : " (no tmpfs: not root?)"));

  RingOptions options;
  options.name = "/" + UniqueName("toobig");
  options.shm_dir = shm_dir;
  options.slot_count = 4;
  // 4 x 4 MiB on an 8 MiB tmpfs, or 4 x (free / 2) elsewhere: twice the free space either way.
  options.slot_bytes = tmpfs.mounted() ? (4u << 20) : FreeBytes(shm_dir) / 2 + 4096;
  auto ring = ProducerRing::Create(options);
  REQUIRE_FALSE(ring.ok());
  CHECK(absl::IsResourceExhausted(ring.status()));
  const std::string message(ring.status().message());
  CHECK_THAT(message, Catch::StartsWith("ring " + options.name + " of ") &&
                          Catch::Contains(" does not fit: " + shm_dir + " has ") &&
                          Catch::EndsWith(" free; raise the size of " + shm_dir +
                                          " (e.g. docker --shm-size) or lower ring_slots / "
                                          "batch_size / image_size"));
  if (tmpfs.mounted()) {
    CHECK_THAT(message,
               Catch::Contains("of 16.0 MiB does not fit") && Catch::Contains("has 8 MiB free"));
  }
  struct stat st {};
  CHECK(::stat((shm_dir + options.name).c_str(), &st) != 0);  // nothing was created

  if (tmpfs.mounted()) {
    // A ring that fits is reserved up front: every byte can be written without SIGBUS.
    options.slot_bytes = 1u << 20;
    options.name = "/" + UniqueName("fits");
    auto fits = ProducerRing::Create(options);
    REQUIRE(fits.ok());
    for (uint32_t slot = 0; slot < 4; ++slot) {
      REQUIRE((*fits)->BeginFill(slot).ok());
      std::memset((*fits)->Payload(slot).data(), 0xab, (*fits)->slot_bytes());
    }
    CHECK(FreeBytes(shm_dir) < (4u << 20));
  }
}

TEST_CASE("ProducerRing::Create refuses sizes that overflow and bad options", "[shm]") {
  TempDir dir;
  RingOptions options;
  options.name = "/" + UniqueName("overflow");
  options.shm_dir = dir.path();
  options.slot_count = 0xffffffffu;
  options.slot_bytes = uint64_t{1} << 40;
  auto ring = ProducerRing::Create(options);
  CHECK(absl::IsInvalidArgument(ring.status()));
  CHECK_THAT(std::string(ring.status().message()), Catch::Contains("overflows"));
  options.slot_bytes = UINT64_MAX;
  CHECK(absl::IsInvalidArgument(ProducerRing::Create(options).status()));
  options.slot_count = 0;
  options.slot_bytes = 4096;
  CHECK(absl::IsInvalidArgument(ProducerRing::Create(options).status()));
  options.slot_count = 1;
  options.name = "no-leading-slash";
  CHECK(absl::IsInvalidArgument(ProducerRing::Create(options).status()));
  options.name = "/a/b";
  CHECK(absl::IsInvalidArgument(ProducerRing::Create(options).status()));
}

}  // namespace
}  // namespace ringloader::shm
