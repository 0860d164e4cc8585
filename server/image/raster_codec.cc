// SPDX-License-Identifier: Apache-2.0
#include "server/image/raster_codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"
#include "shm/base/text.h"

namespace ringloader::image {

const RasterCodec* RasterCodecFor(ImageFormat format) {
  switch (format) {
    case ImageFormat::kPng: return &PngCodec();
    case ImageFormat::kWebp: return &WebpCodec();
    case ImageFormat::kBmp: return &BmpCodec();
    case ImageFormat::kPnm: return &PnmCodec();
    case ImageFormat::kJpeg:
    case ImageFormat::kTiff:
    case ImageFormat::kUnknown: break;
  }
  return nullptr;
}

void CopyBox(const uint8_t* whole, const RasterInfo& info, const RasterBox& box, uint8_t* out) {
  const size_t row = size_t(box.width()) * 3;
  for (int32_t y = box.y0; y < box.y1; ++y) {
    std::memcpy(out + size_t(y - box.y0) * row, whole + (size_t(y) * info.width + box.x0) * 3, row);
  }
}

absl::Status ImageDataError(std::string_view path, std::string_view reason,
                            std::string_view detail) {
  using base::Sv;
  return WithReason(
      absl::DataLossError(absl::StrCat(Sv(path), ": ", Sv(reason), ": ", Sv(detail))), reason);
}

}  // namespace ringloader::image
