// SPDX-License-Identifier: Apache-2.0
#pragma once
// Photo-like synthetic JPEGs (gradients, textures, noise) for the demo, tests and benchmarks.
// Deterministic in (seed, index). Uses TurboJPEG's compressor.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringloader::image {

struct SyntheticImageOptions {
  int32_t width = 500;
  int32_t height = 375;
  int quality = 90;
  bool grayscale = false;
  bool progressive = false;
  bool cmyk = false;  // 4-component Adobe JPEG
  uint64_t seed = 0;
};

// Returns encoded JPEG bytes.
absl::StatusOr<std::vector<uint8_t>> MakeSyntheticJpeg(const SyntheticImageOptions& options);
// Encodes caller-supplied RGB pixels (width*height*3) at `quality` (4:4:4 subsampling).
absl::StatusOr<std::vector<uint8_t>> EncodeRgbJpeg(const std::vector<uint8_t>& rgb, int width,
                                                   int height, int quality);

struct SyntheticDatasetOptions {
  std::string out_dir;
  uint32_t count = 2000;
  uint32_t classes = 10;
  uint64_t seed = 0;
  // Shares of large (> 2 MP) and progressive images (ImageNet-like mixes: 0.02 and 0.15).
  double large_fraction = 0.01;
  double progressive_fraction = 0.03;
};

// Writes an imagefolder dataset: out_dir/class_XX/img_NNNNNN.jpg, sizes varying around 500x375,
// some portrait, large_fraction large (> 2 MP), ~3% grayscale, progressive_fraction progressive.
// Returns the file count.
absl::StatusOr<uint32_t> WriteSyntheticDataset(const SyntheticDatasetOptions& options);

}  // namespace ringloader::image
