// SPDX-License-Identifier: Apache-2.0
#pragma once
// The image formats besides JPEG that torchvision's ImageFolder reads: PNG (libspng), WebP
// (libwebp), BMP and PPM/PGM (stb_image), one file per format (png_codec.cc, webp_codec.cc,
// bmp_codec.cc, pnm_codec.cc). Each reads its header (dimensions, and the memory its decode
// needs, before any pixel) and decodes the part of the image a sample needs (RasterBox) to 8-bit
// RGB the way PIL's Image.open(...).convert("RGB") does: alpha dropped (not composited), grey and palettes
// expanded, 16-bit samples reduced to their high byte (16-bit grey without alpha, which PIL opens
// as 32-bit integers, clipped to 255 instead). SampleDecoder then crops, resizes and augments the
// pixels exactly as it does a JPEG's. TIFF is recognised and refused ("unsupported").
//
// Errors belong to the sample: DataLoss "<path>: <reason>: <what the library said>", reasons
// "truncated", "corrupt" or "unsupported" (sample_decoder.h lists them all).
//
// Thread-safety: stateless; any thread.

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/image/image_format.h"

namespace ringloader::image {

struct RasterInfo {
  int32_t width = 0;
  int32_t height = 0;
  int32_t channels = 0;  // in the file: 1 grey, 2 grey + alpha, 3 RGB or palette, 4 RGBA
  int32_t bit_depth = 8;
  // What the library allocates while decoding, beyond the RGB output (the memory plan).
  uint64_t work_bytes = 0;
};

// A rectangle of an image: columns [x0, x1), rows [y0, y1).
struct RasterBox {
  int32_t x0 = 0, y0 = 0, x1 = 0, y1 = 0;
  int32_t width() const { return x1 - x0; }
  int32_t height() const { return y1 - y0; }
  static RasterBox Whole(const RasterInfo& info) { return {0, 0, info.width, info.height}; }
};

struct RasterCodec {
  ImageFormat format;
  // From the file's first bytes (or all of them). A header cut off by their end fails with
  // reason "truncated".
  absl::StatusOr<RasterInfo> (*read_header)(std::span<const uint8_t> head, std::string_view path);
  // The pixels of `box` as RGB, row after row (box.width() * 3 bytes a row), into `out`. Decodes
  // only what the box needs where the format allows it (PNG stops after the box's last row, WebP
  // decodes the box alone), but the file's integrity is judged the same whatever the box: a cut
  // file, or a PNG chunk whose CRC fails, fails every box alike.
  // REQUIRES: `info` came from read_header on these bytes; 0 <= x0 < x1 <= width and
  // 0 <= y0 < y1 <= height; x0 and y0 even (WebP crops from even offsets);
  // out.size() >= box.width() * box.height() * 3.
  absl::Status (*decode_box)(std::span<const uint8_t> bytes, std::string_view path,
                             const RasterInfo& info, const RasterBox& box,
                             std::span<uint8_t> out);
};

// Copies `box` of a whole decoded RGB image (info.width * 3 bytes a row) into `out`.
void CopyBox(const uint8_t* whole, const RasterInfo& info, const RasterBox& box, uint8_t* out);

// nullptr for JPEG (SampleDecoder's own crop-aware path), TIFF and unknown content.
const RasterCodec* RasterCodecFor(ImageFormat format);

// The codecs (defined in their own files).
const RasterCodec& PngCodec();
const RasterCodec& WebpCodec();
const RasterCodec& BmpCodec();
const RasterCodec& PnmCodec();

// DataLoss "<path>: <reason>: <detail>" with `reason` attached (see ErrorReason).
absl::Status ImageDataError(std::string_view path, std::string_view reason,
                            std::string_view detail);

}  // namespace ringloader::image
