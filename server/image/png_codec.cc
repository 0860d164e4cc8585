// PNG through libspng.
#include <spng.h>

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
  // The whole image decoded as RGBA (8 or 16 bits a sample), plus zlib and row buffers.
  info.work_bytes = uint64_t{ihdr.width} * ihdr.height * (ihdr.bit_depth == 16 ? 8 : 4) +
                    uint64_t{ihdr.width} * 16 + (1 << 20) + kChunkLimitBytes;
  return info;
}

absl::Status DecodeRgb(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, std::span<uint8_t> rgb) {
  Context ctx = Open(bytes);
  if (!ctx) return ImageDataError(path, "other", "libspng: out of memory");
  const bool wide = info.bit_depth == 16;
  const int fmt = wide ? SPNG_FMT_RGBA16 : SPNG_FMT_RGBA8;
  size_t len = 0;
  if (int r = spng_decoded_image_size(ctx.get(), fmt, &len); r != 0) return Failure(path, r);
  std::vector<uint8_t> rgba(len);
  // No gamma or transparency applied: PIL's convert("RGB") uses the stored values as they are.
  if (int r = spng_decode_image(ctx.get(), rgba.data(), len, fmt, 0); r != 0) {
    return Failure(path, r);
  }
  const size_t pixels = size_t(info.width) * size_t(info.height);
  if (!wide) {
    for (size_t i = 0; i < pixels; ++i) std::memcpy(&rgb[3 * i], &rgba[4 * i], 3);
    return absl::OkStatus();
  }
  // 16-bit samples: PIL keeps the high byte, except for grey without alpha, which it opens as
  // 32-bit integers ("I") and clips to 255 when converting to RGB.
  const bool clip = info.channels == 1;
  for (size_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < 3; ++c) {
      uint16_t v;
      std::memcpy(&v, &rgba[8 * i + 2 * c], 2);
      rgb[3 * i + c] = clip ? static_cast<uint8_t>(v > 255 ? 255 : v) : static_cast<uint8_t>(v >> 8);
    }
  }
  return absl::OkStatus();
}

}  // namespace

const RasterCodec& PngCodec() {
  static const RasterCodec codec{ImageFormat::kPng, &ReadHeader, &DecodeRgb};
  return codec;
}

}  // namespace ringloader::image
