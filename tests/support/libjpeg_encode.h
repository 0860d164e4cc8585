// SPDX-License-Identifier: Apache-2.0
#pragma once
// Encodes test images through the libjpeg API rather than TurboJPEG, for encoder options
// TurboJPEG does not expose: arithmetic coding, custom scan scripts, CMYK without an Adobe marker.
// Tests only.

#include <cstdint>
#include <cstdio>  // jpeglib.h needs FILE
#include <functional>
#include <vector>

#include <jpeglib.h>

namespace ringloader::testing {

// `pixels` are interleaved, `components` per pixel: 3 (RGB) or 4 (CMYK). `configure` runs after
// jpeg_set_defaults and may change anything (colour space, quality, scans, arith_code, ...).
// Aborts the test process if libjpeg refuses the settings.
std::vector<uint8_t> EncodeWithLibjpeg(const std::vector<uint8_t>& pixels, int width, int height,
                                       int components,
                                       const std::function<void(jpeg_compress_struct&)>& configure);

}  // namespace ringloader::testing
