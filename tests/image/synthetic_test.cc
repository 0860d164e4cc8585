// SPDX-License-Identifier: Apache-2.0
// Synthetic JPEGs and the imagefolder dataset writer.

#include "server/image/synthetic.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <map>

#include "server/image/sample_decoder.h"
#include "tests/support/test_support.h"

namespace ringloader::image {
namespace {

TEST_CASE("MakeSyntheticJpeg: decodable, deterministic, in every flavour", "[image][synthetic]") {
  SampleDecoder dec(DecodeLimits{});
  SyntheticImageOptions o;
  o.seed = 17;
  const absl::StatusOr<std::vector<uint8_t>> a = MakeSyntheticJpeg(o);
  const absl::StatusOr<std::vector<uint8_t>> b = MakeSyntheticJpeg(o);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(*a == *b);
  CHECK(a->size() > 10'000);  // photo-like, not a flat colour
  o.seed = 18;
  CHECK(*MakeSyntheticJpeg(o) != *a);

  struct Flavour {
    bool gray, progressive, cmyk;
    int components;
  };
  for (const Flavour f : {Flavour{false, false, false, 3}, Flavour{true, false, false, 1},
                          Flavour{false, true, false, 3}, Flavour{false, false, true, 4}}) {
    o.grayscale = f.gray;
    o.progressive = f.progressive;
    o.cmyk = f.cmyk;
    o.width = 123;
    o.height = 77;
    absl::StatusOr<std::vector<uint8_t>> jpeg = MakeSyntheticJpeg(o);
    REQUIRE(jpeg.ok());
    ImageInfo info;
    absl::StatusOr<std::vector<uint8_t>> rgb = dec.DecodeRgb(*jpeg, "s.jpg", &info);
    REQUIRE(rgb.ok());
    CHECK(info.width == 123);
    CHECK(info.height == 77);
    CHECK(info.components == f.components);
    CHECK(info.progressive == f.progressive);
    CHECK(rgb->size() == 123u * 77u * 3u);
  }
  o.width = 0;
  CHECK_FALSE(MakeSyntheticJpeg(o).ok());
}

TEST_CASE("EncodeRgbJpeg: round-trips at high quality", "[image][synthetic]") {
  std::vector<uint8_t> rgb(40 * 30 * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(100 + i % 3 * 40);
  absl::StatusOr<std::vector<uint8_t>> jpeg = EncodeRgbJpeg(rgb, 40, 30, 98);
  REQUIRE(jpeg.ok());
  SampleDecoder dec(DecodeLimits{});
  absl::StatusOr<std::vector<uint8_t>> back = dec.DecodeRgb(*jpeg, "rt.jpg", nullptr);
  REQUIRE(back.ok());
  int off = 0;
  for (size_t i = 0; i < rgb.size(); ++i) off += std::abs((*back)[i] - rgb[i]) > 3;
  CHECK(off == 0);
  CHECK_FALSE(EncodeRgbJpeg(rgb, 41, 30, 90).ok());
}

TEST_CASE("WriteSyntheticDataset: imagefolder layout, deterministic, varied images",
          "[image][synthetic]") {
  ringloader::testing::TempDir dir;
  SyntheticDatasetOptions o;
  o.out_dir = dir.Join("ds");
  o.count = 150;
  o.classes = 3;
  o.seed = 5;
  absl::StatusOr<uint32_t> n = WriteSyntheticDataset(o);
  REQUIRE(n.ok());
  CHECK(*n == 150);
  namespace fs = std::filesystem;
  CHECK(fs::exists(o.out_dir + "/class_00/img_000000.jpg"));
  CHECK(fs::exists(o.out_dir + "/class_01/img_000001.jpg"));
  CHECK(fs::exists(o.out_dir + "/class_02/img_000149.jpg"));
  SampleDecoder dec(DecodeLimits{});
  int files = 0, portrait = 0, progressive = 0;
  std::map<int, int> widths;
  for (const auto& entry : fs::recursive_directory_iterator(o.out_dir)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(entry.path().string());
    REQUIRE(bytes.ok());
    absl::StatusOr<ImageInfo> info = dec.ReadInfo(*bytes, entry.path().string());
    REQUIRE(info.ok());
    // Every file decodes cleanly (a progressive image once broke the ones after it).
    const absl::Status full = dec.DecodeRgb(*bytes, entry.path().string(), nullptr).status();
    INFO(full.ToString());
    CHECK(full.ok());
    portrait += info->height > info->width;
    progressive += info->progressive;
    ++widths[info->width];
  }
  CHECK(files == 150);
  CHECK(portrait > 10);
  CHECK(progressive > 0);
  CHECK(widths.size() > 50);
  // Same seed, same bytes.
  ringloader::testing::TempDir dir2;
  o.out_dir = dir2.Join("ds");
  o.count = 5;
  REQUIRE(WriteSyntheticDataset(o).ok());
  CHECK(ringloader::testing::ReadFile(o.out_dir + "/class_01/img_000004.jpg") ==
        ringloader::testing::ReadFile(dir.Join("ds/class_01/img_000004.jpg")));
}

}  // namespace
}  // namespace ringloader::image
