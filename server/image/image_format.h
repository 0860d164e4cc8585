// SPDX-License-Identifier: Apache-2.0
#pragma once
// Which image format a file holds, told by its first bytes (never by its name: a PNG saved as
// ".jpg" decodes as a PNG, as PIL does).

#include <cstdint>
#include <span>
#include <string_view>

namespace ringloader::image {

enum class ImageFormat { kUnknown, kJpeg, kPng, kWebp, kBmp, kPnm, kTiff };

// Needs at most the first 16 bytes; fewer only tell what they can.
ImageFormat SniffFormat(std::span<const uint8_t> head);
// "jpeg", "png", "webp", "bmp", "pnm", "tiff", "unknown".
std::string_view FormatName(ImageFormat format);

// The file extensions torchvision's ImageFolder lists (IMG_EXTENSIONS), lower case, with the dot.
inline constexpr std::string_view kImageFolderExtensions[] = {
    ".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp"};
// Whether `name` ends in one of them, compared case-insensitively (as torchvision's lower()).
bool HasImageFolderExtension(std::string_view name);

}  // namespace ringloader::image
