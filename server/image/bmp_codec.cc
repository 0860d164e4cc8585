// SPDX-License-Identifier: Apache-2.0
// BMP through stb_image: uncompressed (BI_RGB, BI_BITFIELDS) files of 1, 4, 8, 16, 24 and 32 bits
// a pixel; other compressions are refused ("unsupported").
#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "server/image/raster_codec.h"
#include "server/image/stb_raster.h"

namespace ringloader::image {
namespace {

uint32_t Le32(std::span<const uint8_t> b, size_t at) {
  return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8 | uint32_t{b[at + 2]} << 16 |
         uint32_t{b[at + 3]} << 24;
}

uint32_t Le16(std::span<const uint8_t> b, size_t at) { return uint32_t{b[at]} | uint32_t{b[at + 1]} << 8; }

// A palette image whose pixels name colours the palette does not have: stb_image would read
// them from memory it never wrote (the fuzzer saw two decodes of one file differ). Refused.
absl::Status CheckPaletteIndices(std::span<const uint8_t> bytes, std::string_view path, bool core,
                                 uint32_t header_size, uint32_t bits, int64_t width,
                                 int64_t height) {
  const uint64_t data_offset = Le32(bytes, 10);
  const uint64_t entry_bytes = core ? 3 : 4;
  const uint64_t header_end = 14 + uint64_t{header_size};
  const uint64_t colours =
      data_offset > header_end ? std::min<uint64_t>(256, (data_offset - header_end) / entry_bytes) : 0;
  const uint64_t row_bytes = (uint64_t(std::llabs(width)) * bits + 31) / 32 * 4;
  const uint32_t mask = (1u << bits) - 1;
  for (int64_t y = 0; y < std::llabs(height); ++y) {
    const uint8_t* row = bytes.data() + data_offset + uint64_t(y) * row_bytes;
    for (int64_t x = 0; x < std::llabs(width); ++x) {
      const uint64_t bit = uint64_t(x) * bits;
      const uint32_t index = (row[bit / 8] >> (8 - bits - bit % 8)) & mask;
      if (index >= colours) {
        return ImageDataError(path, "corrupt",
                              absl::StrCat("pixel (", x, ", ", y, ") names colour ", index,
                                           " of a ", colours, "-colour palette"));
      }
    }
  }
  return absl::OkStatus();
}

// What stb_image is handed, checked first: it decodes odd headers leniently and reads past the end
// of a cut file as zeros (or leaves pixels unwritten: the fuzzer saw a reused decoder and a fresh
// one differ), where PIL refuses. Only uncompressed pixel arrays of the usual depths, whose size
// the header fixes; `whole_file`: also that the file holds all of it.
absl::Status CheckHeader(std::span<const uint8_t> bytes, std::string_view path, bool whole_file) {
  if (bytes.size() < 26) return ImageDataError(path, "truncated", "the BMP header is cut short");
  const uint32_t header_size = Le32(bytes, 14);
  const bool core = header_size == 12;  // OS/2 BITMAPCOREHEADER: 16-bit sizes, no compression
  if (!core && (header_size < 40 || header_size > 124)) {
    return ImageDataError(path, "unsupported",
                          absl::StrCat("BMP info header of ", header_size, " bytes"));
  }
  if (!core && bytes.size() < 34) {
    return ImageDataError(path, "truncated", "the BMP header is cut short");
  }
  const uint32_t bits = core ? Le16(bytes, 24) : Le16(bytes, 28);
  const uint32_t compression = core ? 0 : Le32(bytes, 30);
  if (compression != 0 && compression != 3) {
    return ImageDataError(path, "unsupported",
                          absl::StrCat("BMP compression ", compression,
                                       " is not decoded (only uncompressed BI_RGB and "
                                       "BI_BITFIELDS files)"));
  }
  if (bits != 1 && bits != 4 && bits != 8 && bits != 16 && bits != 24 && bits != 32) {
    return ImageDataError(path, "unsupported", absl::StrCat("BMP with ", bits, " bits a pixel"));
  }
  if (!whole_file) return absl::OkStatus();
  const int64_t width = core ? int64_t{Le16(bytes, 18)} : static_cast<int32_t>(Le32(bytes, 18));
  const int64_t height = core ? int64_t{Le16(bytes, 20)} : static_cast<int32_t>(Le32(bytes, 22));
  const uint64_t row_bytes = (uint64_t(std::llabs(width)) * bits + 31) / 32 * 4;
  const uint64_t need = uint64_t{Le32(bytes, 10)} + row_bytes * uint64_t(std::llabs(height));
  if (bytes.size() < need) {
    return ImageDataError(path, "truncated",
                          absl::StrCat("BMP pixel data ends at byte ", bytes.size(),
                                       ", the header says ", need));
  }
  if (bits <= 8) return CheckPaletteIndices(bytes, path, core, header_size, bits, width, height);
  return absl::OkStatus();
}

absl::StatusOr<RasterInfo> ReadHeader(std::span<const uint8_t> head, std::string_view path) {
  if (absl::Status s = CheckHeader(head, path, /*whole_file=*/false); !s.ok()) return s;
  return StbReadHeader(head, path, "BMP");
}

absl::Status DecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out) {
  if (absl::Status s = CheckHeader(bytes, path, /*whole_file=*/true); !s.ok()) return s;
  return StbDecodeBox(bytes, path, info, box, out);
}

}  // namespace

const RasterCodec& BmpCodec() {
  static const RasterCodec codec{ImageFormat::kBmp, &ReadHeader, &DecodeBox};
  return codec;
}

}  // namespace ringloader::image
