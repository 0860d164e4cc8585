// SPDX-License-Identifier: Apache-2.0
// .npy headers: files written by numpy itself, every supported dtype, rows found by offset, and
// each unsupported or damaged case refused naming the file and the problem.
#include "server/pipeline/npy.h"

#include <catch2/catch.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "server/image/sample_decoder.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

using testing::TempDir;

// Runs numpy (Debian's python3-numpy, installed by scripts/setup) in `dir`.
void Numpy(const TempDir& dir, const std::string& code) {
  auto r = testing::RunCommand(
      {"/usr/bin/python3", "-c", "import os, numpy as np\nos.chdir('" + dir.path() + "')\n" + code});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
}

std::string Row(const std::string& path, const NpyHeader& h, uint64_t row) {
  std::string bytes(h.row_bytes, '\0');
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(::pread(fd, bytes.data(), bytes.size(), static_cast<off_t>(h.RowOffset(row))) ==
          static_cast<ssize_t>(bytes.size()));
  ::close(fd);
  return bytes;
}

TEST_CASE("headers numpy writes: dtype, shape, and each row at its offset", "[npy]") {
  TempDir dir;
  Numpy(dir, R"(
a = np.arange(10 * 3 * 4, dtype=np.float32).reshape(10, 3, 4)
np.save('f32.npy', a); open('f32.row7', 'wb').write(a[7].tobytes())
np.save('labels.npy', np.arange(10, dtype=np.int64) * 3)
np.save('mask.npy', np.array([[True, False], [False, True]]))
np.save('half.npy', np.ones((4, 2), dtype=np.float16))
with open('v2.npy', 'wb') as f:
    np.lib.format.write_array(f, np.arange(6, dtype=np.uint8).reshape(3, 2), version=(2, 0))
for t in ['int8', 'int16', 'uint16', 'int32', 'uint32', 'uint64', 'float64']:
    np.save(t + '.npy', np.zeros((2, 5), dtype=t))
)");
  auto f32 = ReadNpyHeader(dir.Join("f32.npy"));
  REQUIRE(f32.ok());
  CHECK(f32->type == NpyType::kFloat32);
  CHECK(f32->shape == std::vector<uint64_t>{10, 3, 4});
  CHECK(f32->row_bytes == 48);
  CHECK(Row(dir.Join("f32.npy"), *f32, 7) == testing::ReadFile(dir.Join("f32.row7")));

  auto labels = ReadNpyHeader(dir.Join("labels.npy"));
  REQUIRE(labels.ok());
  CHECK(labels->type == NpyType::kInt64);
  CHECK(labels->shape == std::vector<uint64_t>{10});
  CHECK(labels->row_bytes == 8);
  const std::string nine = Row(dir.Join("labels.npy"), *labels, 9);
  int64_t value = 0;
  std::memcpy(&value, nine.data(), 8);
  CHECK(value == 27);

  auto mask = ReadNpyHeader(dir.Join("mask.npy"));
  REQUIRE(mask.ok());
  CHECK(mask->type == NpyType::kBool);
  CHECK(std::string(NpyTypeName(mask->type)) == "bool");
  auto half = ReadNpyHeader(dir.Join("half.npy"));
  REQUIRE(half.ok());
  CHECK(half->type == NpyType::kFloat16);
  CHECK(half->row_bytes == 4);
  auto v2 = ReadNpyHeader(dir.Join("v2.npy"));
  REQUIRE(v2.ok());
  CHECK(v2->shape == std::vector<uint64_t>{3, 2});
  CHECK(Row(dir.Join("v2.npy"), *v2, 2) == std::string("\x04\x05", 2));
  for (const char* t : {"int8", "int16", "uint16", "int32", "uint32", "uint64", "float64"}) {
    auto h = ReadNpyHeader(dir.Join(std::string(t) + ".npy"));
    REQUIRE(h.ok());
    CHECK(std::string(NpyTypeName(h->type)) == t);
    CHECK(h->row_bytes == 5 * NpyTypeBytes(h->type));
  }
}

TEST_CASE("what the arrays format cannot read is refused, naming the file and why", "[npy]") {
  TempDir dir;
  Numpy(dir, R"(
np.save('big_endian.npy', np.zeros(4, dtype='>i8'))
np.save('fortran.npy', np.asfortranarray(np.zeros((3, 4), dtype=np.float32)))
np.save('objects.npy', np.array([{'a': 1}, None], dtype=object), allow_pickle=True)
np.save('structured.npy', np.zeros(3, dtype=[('x', 'f4'), ('y', 'i4')]))
np.save('scalar.npy', np.float32(3))
np.save('cut.npy', np.zeros((100, 8), dtype=np.float64))
open('not.npy', 'wb').write(b'hello')
)");
  std::filesystem::resize_file(dir.Join("cut.npy"), 1000);
  auto check = [&](const std::string& name, const std::string& fragment) {
    auto h = ReadNpyHeader(dir.Join(name));
    REQUIRE_FALSE(h.ok());
    CHECK_THAT(std::string(h.status().message()),
               Catch::StartsWith(dir.Join(name) + ": ") && Catch::Contains(fragment));
  };
  check("big_endian.npy", "dtype '>i8' is not supported");
  check("fortran.npy", "Fortran-order");
  check("objects.npy", "dtype '|O' is not supported");
  check("structured.npy", "structured or unknown dtype");
  check("scalar.npy", "0-dimensional");
  check("cut.npy", "the shape claims 100 rows of 64 bytes");
  check("not.npy", "not a .npy file");
  CHECK(image::ErrorReason(ReadNpyHeader(dir.Join("cut.npy")).status()) == "truncated");
  CHECK(ReadNpyHeader(dir.Join("absent.npy")).status().code() == absl::StatusCode::kNotFound);

  // A WebDataset member may be a scalar (one number per sample); its one item must be there.
  const std::string scalar = testing::ReadFile(dir.Join("scalar.npy"));
  auto h = ParseNpyHeader(scalar, scalar.size(), "m", /*allow_scalar=*/true);
  REQUIRE(h.ok());
  CHECK(h->shape.empty());
  CHECK(h->type == NpyType::kFloat32);
  CHECK(h->row_bytes == 4);
  CHECK(h->DataBytes() == 4);
  auto cut_scalar = ParseNpyHeader(scalar, scalar.size() - 1, "m", /*allow_scalar=*/true);
  REQUIRE_FALSE(cut_scalar.ok());
  CHECK(image::ErrorReason(cut_scalar.status()) == "truncated");
}

}  // namespace
}  // namespace ringloader::pipeline
