// SPDX-License-Identifier: Apache-2.0
#pragma once
// stb_image (Debian's libstb) behind the BMP and PPM/PGM codecs: the header and whole-image
// decode both formats share. Internal to server/image.

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/image/raster_codec.h"

namespace ringloader::image {

// `format_name` ("BMP", "PPM/PGM") goes into messages.
absl::StatusOr<RasterInfo> StbReadHeader(std::span<const uint8_t> head, std::string_view path,
                                         std::string_view format_name);
// The whole image decoded (BMP and PPM are not compressed: nothing to skip), then `box` copied.
absl::Status StbDecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                          const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out);

}  // namespace ringloader::image
