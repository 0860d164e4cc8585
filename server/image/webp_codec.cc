// SPDX-License-Identifier: Apache-2.0
// WebP through libwebp (still images; an animation is refused).
#include <webp/decode.h>

#include "absl/strings/str_cat.h"
#include "server/image/raster_codec.h"

namespace ringloader::image {
namespace {

absl::Status Failure(std::string_view path, VP8StatusCode code) {
  switch (code) {
    case VP8_STATUS_NOT_ENOUGH_DATA:
      return ImageDataError(path, "truncated", "libwebp: not enough data (the file is cut short)");
    case VP8_STATUS_UNSUPPORTED_FEATURE:
      return ImageDataError(path, "unsupported", "libwebp: unsupported feature");
    case VP8_STATUS_OUT_OF_MEMORY:
      return ImageDataError(path, "other", "libwebp: out of memory");
    default:
      return ImageDataError(path, "corrupt",
                            absl::StrCat("libwebp: bitstream error (status ", code, ")"));
  }
}

absl::StatusOr<RasterInfo> ReadHeader(std::span<const uint8_t> head, std::string_view path) {
  WebPBitstreamFeatures features;
  if (VP8StatusCode s = WebPGetFeatures(head.data(), head.size(), &features);
      s != VP8_STATUS_OK) {
    return Failure(path, s);
  }
  if (features.has_animation) {
    return ImageDataError(path, "unsupported", "animated WebP images are not decoded");
  }
  RasterInfo info;
  info.width = features.width;
  info.height = features.height;
  info.channels = features.has_alpha ? 4 : 3;
  // Lossless images are decoded through a whole-image ARGB buffer plus a copy; lossy ones need
  // far less. Count the lossless case for both.
  info.work_bytes = uint64_t(features.width) * uint64_t(features.height) * 8 + (1 << 20);
  return info;
}

uint32_t Le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

absl::Status DecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                       const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out) {
  // A cut file fails whatever the box: the RIFF header says how long the file is.
  if (bytes.size() < 12 || bytes.size() < uint64_t{Le32(&bytes[4])} + 8) {
    return ImageDataError(path, "truncated",
                          absl::StrCat("the file ends at byte ", bytes.size(),
                                       ", its RIFF header says ",
                                       bytes.size() < 12 ? 0 : uint64_t{Le32(&bytes[4])} + 8));
  }
  WebPDecoderConfig config;
  if (!WebPInitDecoderConfig(&config)) return ImageDataError(path, "other", "libwebp: bad version");
  // Only the box, straight into `out` as RGB: alpha is dropped, colours are not premultiplied
  // (PIL's convert("RGB") of the RGBA image it decodes).
  if (box.x0 != 0 || box.y0 != 0 || box.x1 != info.width || box.y1 != info.height) {
    config.options.use_cropping = 1;
    config.options.crop_left = box.x0;
    config.options.crop_top = box.y0;
    config.options.crop_width = box.width();
    config.options.crop_height = box.height();
  }
  config.output.colorspace = MODE_RGB;
  config.output.is_external_memory = 1;
  config.output.u.RGBA.rgba = out.data();
  config.output.u.RGBA.stride = box.width() * 3;
  config.output.u.RGBA.size = size_t(box.width()) * size_t(box.height()) * 3;
  const VP8StatusCode s = WebPDecode(bytes.data(), bytes.size(), &config);
  WebPFreeDecBuffer(&config.output);  // nothing of ours: external memory
  if (s != VP8_STATUS_OK) return Failure(path, s);
  return absl::OkStatus();
}

}  // namespace

const RasterCodec& WebpCodec() {
  static const RasterCodec codec{ImageFormat::kWebp, &ReadHeader, &DecodeBox};
  return codec;
}

}  // namespace ringloader::image
