// SPDX-License-Identifier: Apache-2.0
#include "server/image/transform.h"

#include <algorithm>
#include <cmath>

#include "server/image/splitmix64.h"

namespace ringloader::image {
namespace {

// Python's round(): halves go to the even neighbour (std::nearbyint in the default mode).
int32_t PyRound(double v) { return static_cast<int32_t>(std::nearbyint(v)); }

// Uniform integer in [0, n) like torch.randint(0, n); n >= 1.
int32_t UniformInt(SampleRng& rng, int32_t n) {
  const auto v = static_cast<int32_t>(rng.NextUniform() * n);
  return std::min(v, n - 1);
}

}  // namespace

uint64_t TransformSpec::SampleBytes() const {
  const uint64_t elem = dtype == DType::kFloat32 ? 4 : 1;
  return uint64_t{image_size} * image_size * 3 * elem;
}

SampleRng::SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample_index) {
  uint64_t h = SplitMix64Mix(seed ^ 0x52494E474C4F4144ull);  // "RINGLOAD"
  h = SplitMix64Mix(h ^ (epoch + 0x9E3779B97F4A7C15ull));
  h = SplitMix64Mix(h ^ (sample_index + 0x632BE59BD9B4E019ull));
  state_ = h;
}

uint64_t SampleRng::NextU64() { return SplitMix64(state_); }

double SampleRng::NextUniform() {
  return static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0);  // 2^-53
}

CropBox DrawTrainCrop(int32_t width, int32_t height, SampleRng& rng) {
  constexpr double kScaleMin = 0.08, kScaleMax = 1.0;
  constexpr double kRatioMin = 3.0 / 4.0, kRatioMax = 4.0 / 3.0;
  const double area = static_cast<double>(width) * height;
  const double log_min = std::log(kRatioMin), log_max = std::log(kRatioMax);
  CropBox box;
  bool found = false;
  for (int attempt = 0; attempt < 10 && !found; ++attempt) {
    const double target_area = area * (kScaleMin + (kScaleMax - kScaleMin) * rng.NextUniform());
    const double aspect = std::exp(log_min + (log_max - log_min) * rng.NextUniform());
    const int32_t w = PyRound(std::sqrt(target_area * aspect));
    const int32_t h = PyRound(std::sqrt(target_area / aspect));
    if (w > 0 && w <= width && h > 0 && h <= height) {
      box.y = UniformInt(rng, height - h + 1);
      box.x = UniformInt(rng, width - w + 1);
      box.width = w;
      box.height = h;
      found = true;
    }
  }
  if (!found) {  // torchvision's fallback: the central crop, clamped to the ratio range
    const double in_ratio = static_cast<double>(width) / height;
    int32_t w = width, h = height;
    if (in_ratio < kRatioMin) {
      h = std::clamp(PyRound(w / kRatioMin), 1, height);
    } else if (in_ratio > kRatioMax) {
      w = std::clamp(PyRound(h * kRatioMax), 1, width);
    }
    box = CropBox{(width - w) / 2, (height - h) / 2, w, h, false};
  }
  box.flip = rng.NextUniform() < 0.5;
  return box;
}

CropRect EvalCropExact(int32_t width, int32_t height, uint32_t image_size) {
  const auto size = static_cast<int64_t>(image_size);
  const auto resize_short = static_cast<int64_t>(static_cast<double>(image_size) / 0.875);
  const bool w_short = width <= height;
  const int64_t src_short = w_short ? width : height;
  const int64_t src_long = w_short ? height : width;
  const auto resize_long =
      static_cast<int64_t>(static_cast<double>(resize_short) * static_cast<double>(src_long) /
                           static_cast<double>(src_short));
  const int64_t new_w = w_short ? resize_short : resize_long;
  const int64_t new_h = w_short ? resize_long : resize_short;
  const int64_t crop_w = std::min(size, new_w), crop_h = std::min(size, new_h);
  const int64_t left = PyRound(static_cast<double>(new_w - crop_w) / 2.0);
  const int64_t top = PyRound(static_cast<double>(new_h - crop_h) / 2.0);
  const double sx = static_cast<double>(width) / static_cast<double>(new_w);
  const double sy = static_cast<double>(height) / static_cast<double>(new_h);
  return CropRect{static_cast<double>(left) * sx, static_cast<double>(top) * sy,
                  static_cast<double>(crop_w) * sx, static_cast<double>(crop_h) * sy};
}

CropBox EvalCrop(int32_t width, int32_t height, uint32_t image_size) {
  const CropRect r = EvalCropExact(width, height, image_size);
  CropBox box;
  box.x = std::clamp(static_cast<int32_t>(std::lround(r.x)), 0, width - 1);
  box.y = std::clamp(static_cast<int32_t>(std::lround(r.y)), 0, height - 1);
  box.width = std::clamp(static_cast<int32_t>(std::lround(r.width)), 1, width - box.x);
  box.height = std::clamp(static_cast<int32_t>(std::lround(r.height)), 1, height - box.y);
  return box;
}

}  // namespace ringloader::image
