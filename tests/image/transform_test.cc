// SPDX-License-Identifier: Apache-2.0
// The per-sample random draw and the crop geometry (torchvision semantics).

#include "server/image/transform.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <set>

namespace ringloader::image {
namespace {

TEST_CASE("SampleRng: a pure function of (seed, epoch, index)", "[image][transform]") {
  SampleRng a(1, 2, 3), b(1, 2, 3), c(1, 2, 4), d(1, 3, 3), e(2, 2, 3);
  const uint64_t first = a.NextU64();
  CHECK(b.NextU64() == first);
  CHECK(c.NextU64() != first);
  CHECK(d.NextU64() != first);
  CHECK(e.NextU64() != first);
  SampleRng u(9, 9, 9);
  double sum = 0;
  for (int i = 0; i < 10000; ++i) {
    const double v = u.NextUniform();
    REQUIRE(v >= 0.0);
    REQUIRE(v < 1.0);
    sum += v;
  }
  CHECK(std::abs(sum / 10000 - 0.5) < 0.02);
}

TEST_CASE("TransformSpec: SampleBytes", "[image][transform]") {
  TransformSpec spec;
  CHECK(spec.SampleBytes() == 224u * 224u * 3u);
  spec.dtype = DType::kFloat32;
  spec.image_size = 7;
  CHECK(spec.SampleBytes() == 7u * 7u * 3u * 4u);
}

// Area and aspect rules of RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)); w and h are
// rounded from the drawn real values, hence the small tolerances.
// `violations` counts draws outside the rules (each must look like the fallback); `centred`
// counts draws that look like the fallback (centred, spanning one axis).
void CheckTrainCrops(int32_t width, int32_t height, int* violations, int* centred = nullptr) {
  int flips = 0;
  const double area = static_cast<double>(width) * height;
  for (uint64_t i = 0; i < 10000; ++i) {
    SampleRng rng(123, 4, i);
    const CropBox box = DrawTrainCrop(width, height, rng);
    INFO(width << "x" << height << " draw " << i << ": " << box.x << "," << box.y << " "
               << box.width << "x" << box.height);
    REQUIRE(box.width > 0);
    REQUIRE(box.height > 0);
    REQUIRE(box.x >= 0);
    REQUIRE(box.y >= 0);
    REQUIRE(box.x + box.width <= width);
    REQUIRE(box.y + box.height <= height);
    flips += box.flip ? 1 : 0;
    const double frac = box.width * static_cast<double>(box.height) / area;
    const double aspect = static_cast<double>(box.width) / box.height;
    // Fallback: centered, full along one axis, aspect clamped to the range.
    const bool centered = box.x == (width - box.width) / 2 && box.y == (height - box.height) / 2;
    const bool full_axis = box.width == width || box.height == height;
    const double tol_w = 0.5 / box.width + 0.5 / box.height;
    const bool ratio_ok =
        aspect >= (3.0 / 4.0) * (1 - tol_w) && aspect <= (4.0 / 3.0) * (1 + tol_w);
    const bool area_ok = frac >= 0.08 * (1 - 2 * tol_w) && frac <= 1.0;
    if (centred != nullptr && centered && full_axis) ++*centred;
    if (!(ratio_ok && area_ok)) {
      ++*violations;
      REQUIRE(centered);
      REQUIRE(full_axis);
    }
  }
  CHECK(flips > 4800);
  CHECK(flips < 5200);
}

TEST_CASE("DrawTrainCrop: 10,000 draws obey torchvision's scale and ratio rules",
          "[image][transform]") {
  int fallbacks = 0;
  CheckTrainCrops(500, 375, &fallbacks);
  CheckTrainCrops(333, 500, &fallbacks);
  CheckTrainCrops(2000, 1500, &fallbacks);
  CHECK(fallbacks == 0);
  // Extreme aspect ratios force torchvision's centre-crop fallback.
  int extreme = 0, centred = 0;
  CheckTrainCrops(1000, 100, &extreme, &centred);
  CHECK(centred > 5000);  // most draws of a 10:1 image fall back (~77%)
  centred = 0;
  CheckTrainCrops(17, 9, &extreme, &centred);
  CHECK(extreme == 0);
  SampleRng rng(0, 0, 0);
  const CropBox thin = DrawTrainCrop(1000, 10, rng);
  CHECK(thin.height == 10);
  CHECK(thin.width == 13);  // round(10 * 4/3)
  CHECK(thin.x == (1000 - 13) / 2);
}

TEST_CASE("DrawTrainCrop: positions and sizes vary across samples", "[image][transform]") {
  std::set<std::tuple<int, int, int, int>> boxes;
  for (uint64_t i = 0; i < 100; ++i) {
    SampleRng rng(1, 0, i);
    const CropBox b = DrawTrainCrop(500, 375, rng);
    boxes.insert({b.x, b.y, b.width, b.height});
  }
  CHECK(boxes.size() > 95);
}

TEST_CASE("EvalCrop: Resize(256) + CenterCrop(224) geometry with torchvision rounding",
          "[image][transform]") {
  // 500x375 -> resize to 341x256 (int(256 * 500 / 375) = 341); crop left round(58.5) = 58
  // (round half to even), top 16.
  const CropRect r = EvalCropExact(500, 375, 224);
  CHECK(r.x == Approx(58.0 * 500 / 341));
  CHECK(r.y == Approx(16.0 * 375 / 256));
  CHECK(r.width == Approx(224.0 * 500 / 341));
  CHECK(r.height == Approx(224.0 * 375 / 256));
  const CropBox b = EvalCrop(500, 375, 224);
  CHECK(b.x == 85);
  CHECK(b.y == 23);
  CHECK(b.width == 328);
  CHECK(b.height == 328);
  CHECK_FALSE(b.flip);
  // Portrait: the width is the short side.
  const CropRect p = EvalCropExact(375, 500, 224);
  CHECK(p.x == Approx(r.y));
  CHECK(p.width == Approx(r.height));
  // A square image: centred square of 224/256 of the side.
  const CropRect s = EvalCropExact(512, 512, 224);
  CHECK(s.x == Approx(32.0));
  CHECK(s.width == Approx(448.0));
  // Tiny images still give a box inside the image.
  const CropBox t = EvalCrop(3, 2, 224);
  CHECK(t.x >= 0);
  CHECK(t.x + t.width <= 3);
  CHECK(t.y + t.height <= 2);
}

}  // namespace
}  // namespace ringloader::image
