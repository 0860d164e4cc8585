#include "server/image/raster_codec.h"

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

absl::Status ImageDataError(std::string_view path, std::string_view reason,
                            std::string_view detail) {
  using base::Sv;
  return WithReason(
      absl::DataLossError(absl::StrCat(Sv(path), ": ", Sv(reason), ": ", Sv(detail))), reason);
}

}  // namespace ringloader::image
