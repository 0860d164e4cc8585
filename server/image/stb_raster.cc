// SPDX-License-Identifier: Apache-2.0
#include "server/image/stb_raster.h"

#include <stb/stb_image.h>

#include <climits>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "shm/base/text.h"

namespace ringloader::image {
namespace {

std::string_view Reason() {
  const char* why = stbi_failure_reason();
  return why != nullptr ? why : "unknown error";
}

}  // namespace

absl::StatusOr<RasterInfo> StbReadHeader(std::span<const uint8_t> head, std::string_view path,
                                         std::string_view format_name) {
  if (head.size() > INT_MAX) return ImageDataError(path, "too_large", "file over 2 GiB");
  int width = 0, height = 0, channels = 0;
  if (!stbi_info_from_memory(head.data(), static_cast<int>(head.size()), &width, &height,
                             &channels)) {
    return ImageDataError(path, "corrupt",
                          absl::StrCat("stb_image: not a readable ", base::Sv(format_name),
                                       " header (", base::Sv(Reason()), ")"));
  }
  RasterInfo info;
  info.width = width;
  info.height = height;
  info.channels = channels;
  info.bit_depth = stbi_is_16_bit_from_memory(head.data(), static_cast<int>(head.size())) ? 16 : 8;
  // stb_image's own copy of the pixels in the file's channel count, plus its RGB conversion.
  info.work_bytes = uint64_t(width) * uint64_t(height) * (uint64_t(channels) + 3) + (1 << 20);
  return info;
}

absl::Status StbDecodeBox(std::span<const uint8_t> bytes, std::string_view path,
                          const RasterInfo& info, const RasterBox& box, std::span<uint8_t> out) {
  int width = 0, height = 0, channels = 0;
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(
      stbi_load_from_memory(bytes.data(), static_cast<int>(bytes.size()), &width, &height,
                            &channels, 3),
      &stbi_image_free);
  if (pixels == nullptr) {
    // stb_image says "corrupt" for cut files too; a cut is all it can be when the header read.
    const std::string_view why = Reason();
    const bool cut = why.find("eof") != std::string_view::npos ||
                     why.find("truncated") != std::string_view::npos ||
                     why.find("bad file") != std::string_view::npos;
    return ImageDataError(path, cut ? "truncated" : "corrupt",
                          absl::StrCat("stb_image: ", base::Sv(why)));
  }
  if (width != info.width || height != info.height) {
    return ImageDataError(path, "corrupt", "stb_image: the size changed between header and data");
  }
  CopyBox(pixels.get(), info, box, out.data());
  return absl::OkStatus();
}

}  // namespace ringloader::image
