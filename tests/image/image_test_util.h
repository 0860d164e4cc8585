// SPDX-License-Identifier: Apache-2.0
#pragma once
// Helpers for the server/image tests: smooth test patterns, an independent double-precision
// reference resampler and PSNR.

#include <cstdint>
#include <string>
#include <vector>

#include "server/image/transform.h"

namespace ringloader::image::testing {

// A smooth RGB pattern (low-frequency sines and gradients): JPEG at quality 95, 4:4:4 keeps it
// nearly intact, so decode differences are measured against the original pixels.
std::vector<uint8_t> SmoothPattern(int width, int height);

// Reference for one output sample: the source box `crop` resampled to size x size with a
// triangle (bilinear) filter widened by the scale when downscaling, in double precision, reading
// only source pixels inside [clamp_x0, clamp_x1) x [clamp_y0, clamp_y1). Returns RGB HWC doubles.
std::vector<double> ReferenceResample(const std::vector<uint8_t>& rgb, int width, int height,
                                      const CropRect& crop, int clamp_x0, int clamp_y0,
                                      int clamp_x1, int clamp_y1, int size, bool flip);

// PSNR in dB of uint8 `got` against reference values (same length).
double Psnr(const std::vector<uint8_t>& got, const std::vector<double>& want);

// Encodes RGB pixels with TurboJPEG; subsamp is a TJSAMP_* value; progressive uses
// TJFLAG_PROGRESSIVE.
std::vector<uint8_t> EncodeJpeg(const std::vector<uint8_t>& rgb, int width, int height, int quality,
                                int subsamp, bool progressive = false);

// Position of the first marker FF <marker> in `jpeg`, or -1.
long FindMarker(const std::vector<uint8_t>& jpeg, uint8_t marker);

}  // namespace ringloader::image::testing
