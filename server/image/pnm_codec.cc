// SPDX-License-Identifier: Apache-2.0
// PPM and PGM (binary P6 and P5, 8 bits a sample) through stb_image. The ASCII and bitmap
// variants (P1-P4) and 16-bit files are refused ("unsupported").
#include "absl/strings/str_cat.h"
#include "server/image/raster_codec.h"
#include "server/image/stb_raster.h"

namespace ringloader::image {
namespace {

absl::StatusOr<RasterInfo> ReadHeader(std::span<const uint8_t> head, std::string_view path) {
  if (head.size() >= 2 && head[1] != '5' && head[1] != '6') {
    return ImageDataError(path, "unsupported",
                          absl::StrCat("PNM type P", std::string(1, static_cast<char>(head[1])),
                                       " is not decoded (only binary P5 and P6)"));
  }
  absl::StatusOr<RasterInfo> info = StbReadHeader(head, path, "PPM/PGM");
  if (info.ok() && info->bit_depth != 8) {
    return ImageDataError(path, "unsupported", "16-bit PPM/PGM files are not decoded");
  }
  return info;
}

// A file too short for its pixels after the header is cut (stb_image just says "bad PNM").
absl::Status DecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out) {
  const uint64_t pixels = uint64_t(info.width) * uint64_t(info.height) * (info.channels >= 3 ? 3 : 1);
  if (bytes.size() < pixels) {
    return ImageDataError(path, "truncated",
                          absl::StrCat("PPM/PGM data ends at byte ", bytes.size(), " of at least ",
                                       pixels));
  }
  absl::Status s = StbDecodeBox(bytes, path, info, box, out);
  if (!s.ok() && bytes.size() < pixels + 16) {  // "P6 W H 255\n" is at least 7 bytes
    return ImageDataError(path, "truncated", std::string(s.message()));
  }
  return s;
}

}  // namespace

const RasterCodec& PnmCodec() {
  static const RasterCodec codec{ImageFormat::kPnm, &ReadHeader, &DecodeBox};
  return codec;
}

}  // namespace ringloader::image
