// SPDX-License-Identifier: Apache-2.0
#include "server/image/image_format.h"

#include <cstring>

namespace ringloader::image {
namespace {

bool StartsWith(std::span<const uint8_t> head, std::string_view magic, size_t at = 0) {
  return head.size() >= at + magic.size() &&
         std::memcmp(head.data() + at, magic.data(), magic.size()) == 0;
}

char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

}  // namespace

ImageFormat SniffFormat(std::span<const uint8_t> head) {
  using std::string_view_literals::operator""sv;
  if (StartsWith(head, "\xFF\xD8\xFF"sv)) return ImageFormat::kJpeg;
  if (StartsWith(head, "\x89PNG\r\n\x1A\n"sv)) return ImageFormat::kPng;
  if (StartsWith(head, "RIFF"sv) && StartsWith(head, "WEBP"sv, 8)) return ImageFormat::kWebp;
  if (StartsWith(head, "BM"sv)) return ImageFormat::kBmp;
  // Netpbm: "P1".."P6" then whitespace (PIL's PpmImagePlugin reads these too).
  if (head.size() >= 3 && head[0] == 'P' && head[1] >= '1' && head[1] <= '6' &&
      (head[2] == ' ' || head[2] == '\n' || head[2] == '\r' || head[2] == '\t')) {
    return ImageFormat::kPnm;
  }
  if (StartsWith(head, "II*\0"sv) || StartsWith(head, "MM\0*"sv)) return ImageFormat::kTiff;
  return ImageFormat::kUnknown;
}

std::string_view FormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg: return "jpeg";
    case ImageFormat::kPng: return "png";
    case ImageFormat::kWebp: return "webp";
    case ImageFormat::kBmp: return "bmp";
    case ImageFormat::kPnm: return "pnm";
    case ImageFormat::kTiff: return "tiff";
    case ImageFormat::kUnknown: break;
  }
  return "unknown";
}

bool HasImageFolderExtension(std::string_view name) {
  for (std::string_view ext : kImageFolderExtensions) {
    if (name.size() < ext.size()) continue;
    const std::string_view tail = name.substr(name.size() - ext.size());
    bool same = true;
    for (size_t i = 0; i < ext.size() && same; ++i) same = Lower(tail[i]) == ext[i];
    if (same) return true;
  }
  return false;
}

}  // namespace ringloader::image
