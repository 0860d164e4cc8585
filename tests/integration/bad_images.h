// SPDX-License-Identifier: Apache-2.0
#pragma once
// Broken image files for the corrupt-corpus tests: one recipe per kind of bad input that issue 6
// lists, each with the reason (image::ErrorReason) the decoder gives it. The byte recipes are the
// ones tests/image/sample_decoder_errors_test.cc pins against the decoder itself; here they are
// written into a real dataset and read through the real daemon and ringloaderctl.

#include <cstdint>
#include <string>
#include <vector>

namespace ringloader::testing {

struct BadImage {
  std::string name;            // file name, e.g. "bad_truncated.jpg"
  std::vector<uint8_t> bytes;  // file contents
  std::string reason;          // expected image::ErrorReason; empty = decided at run time
};

// A valid baseline (or progressive) photo-like JPEG, ~320x240.
std::vector<uint8_t> GoodJpegBytes(uint64_t seed = 1, bool progressive = false);

// A progressive JPEG with `scans` scans (>= 5): spectral selection one coefficient at a time with
// successive approximation, as a crafted file would do to make the decoder spin.
std::vector<uint8_t> ManyScansJpeg(int scans_at_least);

// An arithmetic-coded JPEG (SOF9). Debian's libjpeg-turbo decodes these; a build without
// arithmetic decoding refuses them as "unsupported". Its `reason` in AllBadImages() is empty.
std::vector<uint8_t> ArithmeticJpeg();

// Valid small images of the other formats (libspng, libwebp), for damaging.
std::vector<uint8_t> GoodPngBytes();
std::vector<uint8_t> GoodWebpBytes();

// One of each kind: truncated, zero bytes, random bytes, a PNG signature over garbage named .jpg,
// a header claiming 60000x60000 (> any max_pixels), > 500 progressive scans, a bad Huffman table,
// 12-bit precision, lossless (SOF3), the arithmetic-coded file (reason empty: decoded or
// "unsupported"); and of the other formats: a cut PNG, a PNG whose CRC fails, a cut WebP, an
// RLE BMP, a TIFF, and text named .png.
std::vector<BadImage> AllBadImages();

}  // namespace ringloader::testing
