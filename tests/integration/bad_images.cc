// SPDX-License-Identifier: Apache-2.0
#include "tests/integration/bad_images.h"

#include <spng.h>
#include <webp/encode.h>

#include <cstdlib>
#include <memory>

#include <cstdio>
#include <cstdlib>
#include <functional>

// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "server/image/synthetic.h"
#include "tests/support/libjpeg_encode.h"

namespace ringloader::testing {
namespace {

// Position of the first marker FF <marker>, or -1.
long FindMarker(const std::vector<uint8_t>& jpeg, uint8_t marker) {
  for (size_t i = 0; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == marker) return static_cast<long>(i);
  }
  return -1;
}

std::vector<uint8_t> Pattern(int w, int h) {
  std::vector<uint8_t> rgb(static_cast<size_t>(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      uint8_t* p = &rgb[(static_cast<size_t>(y) * w + x) * 3];
      p[0] = static_cast<uint8_t>(x * 255 / w);
      p[1] = static_cast<uint8_t>(y * 255 / h);
      p[2] = static_cast<uint8_t>((x * y) & 0xFF);
    }
  }
  return rgb;
}

// A 3-component pattern image encoded with libjpeg, `configure` adjusting the compressor.
std::vector<uint8_t> Compress(int w, int h,
                              const std::function<void(jpeg_compress_struct&)>& configure) {
  return EncodeWithLibjpeg(Pattern(w, h), w, h, 3, configure);
}

}  // namespace

std::vector<uint8_t> GoodJpegBytes(uint64_t seed, bool progressive) {
  image::SyntheticImageOptions o;
  o.width = 320;
  o.height = 240;
  o.seed = seed;
  o.progressive = progressive;
  absl::StatusOr<std::vector<uint8_t>> jpeg = image::MakeSyntheticJpeg(o);
  if (!jpeg.ok()) std::abort();
  return *jpeg;
}

std::vector<uint8_t> ManyScansJpeg(int scans_at_least) {
  // DC of all components first at Al=1, then its refinement; then per component and AC
  // coefficient k: a first scan at Al=2 and two refinements. 2 + 3*63*3 = 569 scans at most.
  std::vector<jpeg_scan_info> script;
  auto add = [&](int comps, int c0, int ss, int se, int ah, int al) {
    jpeg_scan_info s{};
    s.comps_in_scan = comps;
    for (int i = 0; i < comps; ++i) s.component_index[i] = c0 + i;
    s.Ss = ss;
    s.Se = se;
    s.Ah = ah;
    s.Al = al;
    script.push_back(s);
  };
  add(3, 0, 0, 0, 0, 1);
  add(3, 0, 0, 0, 1, 0);
  for (int c = 0; c < 3; ++c) {
    for (int k = 1; k <= 63; ++k) {
      if (static_cast<int>(script.size()) >= scans_at_least) break;
      add(1, c, k, k, 0, 2);
      add(1, c, k, k, 2, 1);
      add(1, c, k, k, 1, 0);
    }
  }
  return Compress(32, 32, [&](jpeg_compress_struct& c) {
    c.scan_info = script.data();
    c.num_scans = static_cast<int>(script.size());
  });
}

std::vector<uint8_t> ArithmeticJpeg() {
  return Compress(96, 64, [](jpeg_compress_struct& c) { c.arith_code = TRUE; });
}

std::vector<BadImage> AllBadImages() {
  std::vector<BadImage> out;
  const std::vector<uint8_t> good = GoodJpegBytes(99);

  std::vector<uint8_t> truncated = good;
  truncated.resize(truncated.size() / 2);
  out.push_back({"bad_truncated.jpg", truncated, "truncated"});

  out.push_back({"bad_zero.jpg", {}, "empty"});

  std::vector<uint8_t> random(4096);
  uint64_t x = 0x1234567;
  for (uint8_t& b : random) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(x >> 56);
  }
  random[0] = 0x42;  // not a JPEG's 0xFF
  out.push_back({"bad_random.jpg", random, "not_image"});

  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  png.insert(png.end(), random.begin(), random.begin() + 200);
  // A PNG signature over garbage: the content says PNG, and libspng refuses the chunks.
  out.push_back({"bad_png.jpg", png, "corrupt"});

  // SOF0: FF C0, length(2), precision(1), height(2), width(2).
  const long sof = FindMarker(good, 0xC0);
  if (sof < 0) std::abort();
  std::vector<uint8_t> bomb = good;
  bomb[sof + 5] = 0xEA;
  bomb[sof + 6] = 0x60;  // 60000
  bomb[sof + 7] = 0xEA;
  bomb[sof + 8] = 0x60;
  out.push_back({"bad_huge_dimensions.jpg", bomb, "too_large"});

  out.push_back({"bad_many_scans.jpg", ManyScansJpeg(560), "too_many_scans"});

  std::vector<uint8_t> huffman = good;
  const long dht = FindMarker(huffman, 0xC4);
  if (dht < 0) std::abort();
  // FF C4, length(2), class/id(1), then 16 code-length counts: claim far more than 256 codes.
  for (int i = 0; i < 16; ++i) huffman[dht + 5 + i] = 0xFF;
  out.push_back({"bad_huffman.jpg", huffman, "corrupt"});

  std::vector<uint8_t> twelve = good;
  twelve[sof + 4] = 12;  // precision; libjpeg-turbo's 8-bit build refuses it
  out.push_back({"bad_12bit.jpg", twelve, "unsupported"});

  std::vector<uint8_t> lossless = good;
  lossless[sof + 1] = 0xC3;  // SOF3
  out.push_back({"bad_lossless.jpg", lossless, "unsupported"});

  out.push_back({"maybe_arithmetic.jpg", ArithmeticJpeg(), ""});

  // The other formats an ImageFolder holds (issue 18): each damage its decoder must report.
  const std::vector<uint8_t> good_png = GoodPngBytes();
  std::vector<uint8_t> cut_png(good_png.begin(),
                               good_png.begin() + static_cast<long>(good_png.size() / 2));
  out.push_back({"bad_cut.png", cut_png, "truncated"});
  std::vector<uint8_t> crc_png = good_png;
  crc_png[crc_png.size() - 20] ^= 0x10;  // inside the last IDAT chunk: its CRC fails
  out.push_back({"bad_crc.png", crc_png, "corrupt"});
  std::vector<uint8_t> webp = GoodWebpBytes();
  webp.resize(webp.size() * 2 / 3);
  out.push_back({"bad_cut.webp", webp, "truncated"});
  // A BMP header declaring RLE8 compression (not decoded: refused before any pixel).
  std::vector<uint8_t> bmp(1078 + 64, 0);
  const uint32_t fields[][2] = {{2, uint32_t(bmp.size())}, {10, 1078}, {14, 40}, {18, 8},
                                {22, 8}, {30, 1}};
  bmp[0] = 'B', bmp[1] = 'M';
  for (const auto& [at, value] : fields) {
    for (int k = 0; k < 4; ++k) bmp[at + k] = static_cast<uint8_t>(value >> (8 * k));
  }
  bmp[26] = 1, bmp[28] = 8;  // planes, bits a pixel
  out.push_back({"bad_rle.bmp", bmp, "unsupported"});
  out.push_back({"bad_scan.tiff", {'I', 'I', '*', 0, 8, 0, 0, 0, 0, 0}, "unsupported"});
  const std::string text = "a text file named like a PNG";
  out.push_back({"bad_text.png", std::vector<uint8_t>(text.begin(), text.end()), "not_image"});
  return out;
}

std::vector<uint8_t> GoodPngBytes() {
  constexpr uint32_t kWidth = 48, kHeight = 32;
  std::vector<uint8_t> rgb(kWidth * kHeight * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>((i * 7) ^ (i >> 5));
  std::unique_ptr<spng_ctx, void (*)(spng_ctx*)> ctx(spng_ctx_new(SPNG_CTX_ENCODER),
                                                      &spng_ctx_free);
  spng_set_option(ctx.get(), SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = kWidth;
  ihdr.height = kHeight;
  ihdr.bit_depth = 8;
  ihdr.color_type = SPNG_COLOR_TYPE_TRUECOLOR;
  spng_set_ihdr(ctx.get(), &ihdr);
  if (spng_encode_image(ctx.get(), rgb.data(), rgb.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) != 0) {
    std::abort();
  }
  size_t size = 0;
  int error = 0;
  std::unique_ptr<void, void (*)(void*)> png(spng_get_png_buffer(ctx.get(), &size, &error),
                                             &std::free);
  if (!png) std::abort();
  const auto* bytes = static_cast<const uint8_t*>(png.get());
  return std::vector<uint8_t>(bytes, bytes + size);
}

std::vector<uint8_t> GoodWebpBytes() {
  constexpr int kWidth = 64, kHeight = 48;
  std::vector<uint8_t> rgb(kWidth * kHeight * 3);
  for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = static_cast<uint8_t>(i * 3 + (i >> 7));
  uint8_t* out = nullptr;
  const size_t size = WebPEncodeRGB(rgb.data(), kWidth, kHeight, kWidth * 3, 80.0f, &out);
  if (size == 0) std::abort();
  std::vector<uint8_t> bytes(out, out + size);
  WebPFree(out);
  return bytes;
}

}  // namespace ringloader::testing
