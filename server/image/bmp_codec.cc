// BMP through stb_image (1, 4, 8, 16, 24 and 32 bits a pixel; RLE-compressed files are refused).
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/image/raster_codec.h"
#include "server/image/stb_raster.h"

namespace ringloader::image {
namespace {

uint32_t Le32(std::span<const uint8_t> b, size_t at) {
  return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8 | uint32_t{b[at + 2]} << 16 |
         uint32_t{b[at + 3]} << 24;
}

absl::StatusOr<RasterInfo> ReadHeader(std::span<const uint8_t> head, std::string_view path) {
  return StbReadHeader(head, path, "BMP");
}

// stb_image reads past the end of a cut BMP as zeros; PIL calls it truncated, and so do we. The
// pixel array of an uncompressed file (BI_RGB, BI_BITFIELDS) has a size the header fixes.
absl::Status DecodeRgb(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, std::span<uint8_t> rgb) {
  if (bytes.size() >= 34) {
    const uint64_t data_offset = Le32(bytes, 10);
    const uint32_t header_size = Le32(bytes, 14);
    const uint32_t compression = header_size >= 40 ? Le32(bytes, 30) : 0;
    const uint64_t bits = header_size >= 40 ? (uint32_t{bytes[28]} | uint32_t{bytes[29]} << 8)
                                            : (uint32_t{bytes[24]} | uint32_t{bytes[25]} << 8);
    if (compression == 0 || compression == 3) {
      const uint64_t row_bytes = (uint64_t(info.width) * bits + 31) / 32 * 4;
      const uint64_t need = data_offset + row_bytes * uint64_t(info.height);
      if (bytes.size() < need) {
        return ImageDataError(path, "truncated",
                              absl::StrCat("BMP pixel data ends at byte ", bytes.size(),
                                           ", the header says ", need));
      }
    }
  }
  return StbDecodeRgb(bytes, path, info, rgb);
}

}  // namespace

const RasterCodec& BmpCodec() {
  static const RasterCodec codec{ImageFormat::kBmp, &ReadHeader, &DecodeRgb};
  return codec;
}

}  // namespace ringloader::image
