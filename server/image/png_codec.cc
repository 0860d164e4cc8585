// SPDX-License-Identifier: Apache-2.0
// PNG through libspng.
#include <spng.h>
#include <zlib.h>

#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/image/raster_codec.h"

namespace ringloader::image {
namespace {

using Context = std::unique_ptr<spng_ctx, void (*)(spng_ctx*)>;

// Ancillary chunks (text, ICC profiles) a file may make libspng keep: bounded, so a crafted file
// cannot grow the decoder past the memory plan.
constexpr size_t kChunkLimitBytes = 16 << 20;

Context Open(std::span<const uint8_t> bytes) {
  Context ctx(spng_ctx_new(0), &spng_ctx_free);
  if (ctx) {
    spng_set_chunk_limits(ctx.get(), kChunkLimitBytes, kChunkLimitBytes);
    spng_set_png_buffer(ctx.get(), bytes.data(), bytes.size());
  }
  return ctx;
}

absl::Status Failure(std::string_view path, int error) {
  // Running out of data anywhere means the file (or the head we were given) was cut.
  const bool cut = error == SPNG_IO_EOF || error == SPNG_EOF || error == SPNG_IO_ERROR ||
                   error == SPNG_EIDAT_TOO_SHORT;
  return ImageDataError(path, cut ? "truncated" : "corrupt",
                        absl::StrCat("libspng: ", spng_strerror(error)));
}

absl::StatusOr<RasterInfo> ReadHeader(std::span<const uint8_t> head, std::string_view path) {
  Context ctx = Open(head);
  if (!ctx) return ImageDataError(path, "other", "libspng: out of memory");
  spng_ihdr ihdr{};
  if (int r = spng_get_ihdr(ctx.get(), &ihdr); r != 0) return Failure(path, r);
  RasterInfo info;
  info.width = static_cast<int32_t>(std::min<uint32_t>(ihdr.width, INT32_MAX));
  info.height = static_cast<int32_t>(std::min<uint32_t>(ihdr.height, INT32_MAX));
  info.bit_depth = ihdr.bit_depth;
  switch (ihdr.color_type) {
    case SPNG_COLOR_TYPE_GRAYSCALE: info.channels = 1; break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA: info.channels = 2; break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA: info.channels = 4; break;
    default: info.channels = 3; break;  // truecolor, indexed
  }
  // An interlaced image is decoded whole (RGB, or RGBA at 16 bits a sample) before its box is
  // taken; others a row at a time. Plus zlib's window and libspng's row buffers.
  const uint64_t pixel_bytes = ihdr.bit_depth == 16 ? 8 : 3;
  info.work_bytes = (ihdr.interlace_method != 0 ? uint64_t{ihdr.width} * ihdr.height * pixel_bytes
                                                : 0) +
                    uint64_t{ihdr.width} * 16 + (1 << 20) + kChunkLimitBytes;
  return info;
}

uint32_t Be32(const uint8_t* p) {
  return uint32_t{p[0]} << 24 | uint32_t{p[1]} << 16 | uint32_t{p[2]} << 8 | p[3];
}

// The whole file's integrity, judged before any row is decoded and whatever part of the image a
// sample needs: every chunk whole and its CRC right, up to IEND. (libspng then skips the CRCs it
// would check again, and a decode that stops after the crop's last row fails or succeeds exactly
// as a whole decode would, for cut files and flipped bytes alike.)
absl::Status CheckChunks(std::span<const uint8_t> bytes, std::string_view path) {
  size_t at = 8;  // after the signature
  while (true) {
    if (at + 12 > bytes.size()) {
      return ImageDataError(path, "truncated",
                            absl::StrCat("the file ends at byte ", bytes.size(),
                                         " before its IEND chunk"));
    }
    const uint64_t length = Be32(&bytes[at]);
    if (at + 12 + length > bytes.size()) {
      return ImageDataError(path, "truncated",
                            absl::StrCat("chunk at byte ", at, " runs past the end of the file"));
    }
    const uint8_t* type = &bytes[at + 4];
    const uint32_t crc = static_cast<uint32_t>(
        crc32(crc32(0, nullptr, 0), type, static_cast<uInt>(length + 4)));
    if (crc != Be32(&bytes[at + 8 + length])) {
      return ImageDataError(path, "corrupt",
                            absl::StrCat("chunk ", std::string(reinterpret_cast<const char*>(type), 4),
                                         " at byte ", at, ": CRC mismatch"));
    }
    if (std::memcmp(type, "IEND", 4) == 0) return absl::OkStatus();
    at += 12 + length;
  }
}

// 16-bit samples: PIL keeps the high byte, except for grey without alpha, which it opens as
// 32-bit integers ("I") and clips to 255 when converting to RGB.
void Narrow16(const uint8_t* rgba16, int32_t x0, int32_t x1, bool clip, uint8_t* rgb) {
  for (int32_t x = x0; x < x1; ++x) {
    for (int c = 0; c < 3; ++c) {
      uint16_t v;
      std::memcpy(&v, &rgba16[8 * size_t(x) + 2 * c], 2);
      *rgb++ = clip ? static_cast<uint8_t>(v > 255 ? 255 : v) : static_cast<uint8_t>(v >> 8);
    }
  }
}

absl::Status DecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out) {
  if (absl::Status s = CheckChunks(bytes, path); !s.ok()) return s;
  Context ctx = Open(bytes);
  if (!ctx) return ImageDataError(path, "other", "libspng: out of memory");
  spng_set_crc_action(ctx.get(), SPNG_CRC_USE, SPNG_CRC_USE);  // CheckChunks did it
  spng_ihdr ihdr{};
  if (int r = spng_get_ihdr(ctx.get(), &ihdr); r != 0) return Failure(path, r);
  const bool wide = info.bit_depth == 16;
  // No gamma or transparency applied: PIL's convert("RGB") uses the stored values as they are.
  const int fmt = wide ? SPNG_FMT_RGBA16 : SPNG_FMT_RGB8;
  const size_t row_bytes = size_t(info.width) * (wide ? 8 : 3);
  const size_t out_row = size_t(box.width()) * 3;
  const bool clip = info.channels == 1;
  if (ihdr.interlace_method != SPNG_INTERLACE_NONE) {
    // Adam7 hands out rows pass by pass: decode it all, then take the box.
    size_t len = 0;
    if (int r = spng_decoded_image_size(ctx.get(), fmt, &len); r != 0) return Failure(path, r);
    std::vector<uint8_t> whole(len);
    if (int r = spng_decode_image(ctx.get(), whole.data(), len, fmt, 0); r != 0) {
      return Failure(path, r);
    }
    for (int32_t y = box.y0; y < box.y1; ++y) {
      const uint8_t* src = whole.data() + size_t(y) * row_bytes;
      uint8_t* dst = out.data() + size_t(y - box.y0) * out_row;
      if (wide) {
        Narrow16(src, box.x0, box.x1, clip, dst);
      } else {
        std::memcpy(dst, src + size_t(box.x0) * 3, out_row);
      }
    }
    return absl::OkStatus();
  }
  if (int r = spng_decode_image(ctx.get(), nullptr, 0, fmt, SPNG_DECODE_PROGRESSIVE); r != 0) {
    return Failure(path, r);
  }
  // Rows above the box must be inflated anyway (PNG has no random access); rows below it are not.
  std::vector<uint8_t> row(row_bytes);
  for (int32_t y = 0; y < box.y1; ++y) {
    if (int r = spng_decode_row(ctx.get(), row.data(), row.size()); r != 0 && r != SPNG_EOI) {
      return Failure(path, r);
    }
    if (y < box.y0) continue;
    uint8_t* dst = out.data() + size_t(y - box.y0) * out_row;
    if (wide) {
      Narrow16(row.data(), box.x0, box.x1, clip, dst);
    } else {
      std::memcpy(dst, row.data() + size_t(box.x0) * 3, out_row);
    }
  }
  return absl::OkStatus();
}

}  // namespace

const RasterCodec& PngCodec() {
  static const RasterCodec codec{ImageFormat::kPng, &ReadHeader, &DecodeBox};
  return codec;
}

}  // namespace ringloader::image
