// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/contact_sheet.h"

#include <spng.h>
#include <turbojpeg.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ringloader::ctl {
namespace {

absl::Status WriteBytes(const std::string& path, const void* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status WritePng(const ContactSheet& sheet, const std::string& path) {
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER),
                                                      &spng_ctx_free);
  if (!ctx) return absl::ResourceExhaustedError("libspng: out of memory");
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = sheet.width;
  ihdr.height = sheet.height;
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx.get(), &ihdr);
  if (int r = spng_encode_image(ctx.get(), sheet.rgb.data(), sheet.rgb.size(), SPNG_FMT_PNG,
                                SPNG_ENCODE_FINALIZE);
      r != 0) {
    return absl::InternalError(absl::StrCat("libspng: ", spng_strerror(r)));
  }
  int r = 0;
  size_t size = 0;
  std::unique_ptr<void, void (*)(void*)> png(spng_get_png_buffer(ctx.get(), &size, &r), &std::free);
  if (!png) return absl::InternalError(absl::StrCat("libspng: ", spng_strerror(r)));
  return WriteBytes(path, png.get(), size);
}

absl::Status WriteJpeg(const ContactSheet& sheet, const std::string& path) {
  std::unique_ptr<void, int (*)(tjhandle)> tj(tjInitCompress(), &tjDestroy);
  if (!tj) return absl::ResourceExhaustedError("TurboJPEG: cannot initialise");
  unsigned char* jpeg = nullptr;
  unsigned long size = 0;
  if (tjCompress2(tj.get(), sheet.rgb.data(), static_cast<int>(sheet.width), 0,
                  static_cast<int>(sheet.height), TJPF_RGB, &jpeg, &size, TJSAMP_444, 95,
                  TJFLAG_ACCURATEDCT) != 0) {
    return absl::InternalError(absl::StrCat("TurboJPEG: ", tjGetErrorStr2(tj.get())));
  }
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> owned(jpeg, &tjFree);
  return WriteBytes(path, jpeg, size);
}

}  // namespace

ContactSheet ComposeSheet(const uint8_t* images, uint32_t count, uint32_t size, uint32_t columns) {
  ContactSheet sheet;
  const uint32_t cols = std::max<uint32_t>(1, std::min(columns, std::max<uint32_t>(count, 1)));
  const uint32_t rows = std::max<uint32_t>(1, (count + cols - 1) / cols);
  sheet.width = cols * size;
  sheet.height = rows * size;
  sheet.rgb.assign(size_t{sheet.width} * sheet.height * 3, 0);
  const size_t tile_row = size_t{size} * 3;
  for (uint32_t k = 0; k < count; ++k) {
    const uint8_t* tile = images + size_t{k} * size * tile_row;
    const size_t x = size_t{k % cols} * size, y = size_t{k / cols} * size;
    for (uint32_t r = 0; r < size; ++r) {
      std::memcpy(&sheet.rgb[((y + r) * sheet.width + x) * 3], tile + r * tile_row, tile_row);
    }
  }
  return sheet;
}

absl::Status WriteSheet(const ContactSheet& sheet, const std::string& path) {
  const std::string lower = absl::AsciiStrToLower(path);
  if (absl::EndsWith(lower, ".png")) return WritePng(sheet, path);
  if (absl::EndsWith(lower, ".jpg") || absl::EndsWith(lower, ".jpeg")) return WriteJpeg(sheet, path);
  return absl::InvalidArgumentError(
      absl::StrCat("--out ", path, ": must end in .png (lossless: the bytes a trainer gets) or "
                   ".jpg"));
}

}  // namespace ringloader::ctl
