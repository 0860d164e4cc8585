// SPDX-License-Identifier: Apache-2.0
#pragma once
// What one output sample looks like, and the per-sample random draw that shapes it.
// Pure functions of their inputs: a sample's bytes depend only on (file bytes, spec, seed, epoch,
// sample index), never on threads or timing.

#include <array>
#include <cstdint>
#include <string_view>

namespace ringloader::image {

enum class Augment : uint8_t {
  kTrain,  // torchvision RandomResizedCrop(size, scale=(0.08,1), ratio=(3/4,4/3)) + hflip(p=0.5)
  kEval,   // Resize(short side -> int(size/0.875)) + CenterCrop(size); 224 -> 256 -> 224
};
enum class DType : uint8_t { kUint8, kFloat32 };
enum class Layout : uint8_t { kNHWC, kNCHW };

struct TransformSpec {
  uint32_t image_size = 224;  // output is image_size x image_size x 3
  Augment augment = Augment::kTrain;
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNHWC;
  // Float32 only: out = (pixel/255 - mean[c]) / std[c].
  std::array<float, 3> mean = {0.485f, 0.456f, 0.406f};
  std::array<float, 3> std = {0.229f, 0.224f, 0.225f};
  // false (default): decode with libjpeg's DCT scaling (1/2, 1/4, 1/8) when the scaled image still
  // covers the output; fast, and within ~0.001 levels of torchvision while the short side is under
  // ~512 px, but above it the mean shifts by 0.3-0.6 levels (up to ~40 at sharp edges).
  // true: decode at full size and resample like PIL, as torchvision does (within 0.01 levels).
  bool exact_resize = false;

  // Bytes of one output sample: image_size^2 * 3 * (1 or 4).
  uint64_t SampleBytes() const;
};

// A crop of the source image, in source pixel coordinates, plus the flip decision.
struct CropBox {
  int32_t x = 0, y = 0, width = 0, height = 0;
  bool flip = false;
};

// Deterministic per-sample random stream (SplitMix64 seeded by hashing the three inputs).
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t sample_index);
  uint64_t NextU64();
  double NextUniform();  // [0, 1)

 private:
  uint64_t state_;
};

// torchvision's RandomResizedCrop.get_params (10 attempts, then the central-crop fallback) and a
// flip draw, for a source of width x height. REQUIRES: width, height > 0.
CropBox DrawTrainCrop(int32_t width, int32_t height, SampleRng& rng);
// The region of the source that Resize(int(size/0.875)) + CenterCrop(size) keeps, rounded to
// whole source pixels (the decoder itself resamples from the exact box, EvalCropExact).
// REQUIRES: width, height > 0, image_size > 0.
CropBox EvalCrop(int32_t width, int32_t height, uint32_t image_size);

// A crop in fractional source pixel coordinates (x, y is the top-left corner of the box).
struct CropRect {
  double x = 0, y = 0, width = 0, height = 0;
};
// The exact source box of Resize(int(size/0.875)) + CenterCrop(size), using torchvision's
// rounding: the resized image is (new_w, new_h) with the short side int(size/0.875) and the long
// side int(short * long / short_src); the center crop starts at round((new - size) / 2).
// REQUIRES: width, height > 0, image_size > 0.
CropRect EvalCropExact(int32_t width, int32_t height, uint32_t image_size);

}  // namespace ringloader::image
