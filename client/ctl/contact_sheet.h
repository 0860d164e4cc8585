// SPDX-License-Identifier: Apache-2.0
#pragma once
// A contact sheet: the images of one batch as tiles of image_size x image_size, row-major,
// `columns` per row, no borders (tile k = sample k), written as PNG (lossless: the very bytes a
// trainer gets) or JPEG. Used by `ringloaderctl peek`.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace ringloader::ctl {

struct ContactSheet {
  uint32_t width = 0;
  uint32_t height = 0;
  std::vector<uint8_t> rgb;  // width * height * 3; tiles past the last sample stay black
};

// `images`: `count` samples of size x size x 3 uint8 (NHWC), back to back.
// REQUIRES: size > 0, columns > 0.
ContactSheet ComposeSheet(const uint8_t* images, uint32_t count, uint32_t size, uint32_t columns);

// By the extension of `path`: ".png" (libspng) or ".jpg"/".jpeg" (TurboJPEG, quality 95, 4:4:4).
// InvalidArgument for another extension; Unavailable naming the path when it cannot be written.
absl::Status WriteSheet(const ContactSheet& sheet, const std::string& path);

}  // namespace ringloader::ctl
