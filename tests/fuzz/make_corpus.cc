// SPDX-License-Identifier: Apache-2.0
// Writes the seed corpus of fuzz_decode: small real JPEGs of each kind the decoder handles
// (baseline 4:2:0 / 4:2:2 / 4:4:0 / 4:4:4, progressive, grayscale, CMYK, YCCK, restart markers,
// arithmetic coding, sizes that exercise DCT scaling) and a few broken ones (truncated, 12-bit,
// huge dimensions, not a JPEG). Each file is one control byte (see decode_fuzzer.cc) + the JPEG.
//
// The committed files in corpus/decode were made with it; run it by hand to regenerate them:
//   ninja -C build-fuzz make_fuzz_corpus
//   build-fuzz/tests/fuzz/make_fuzz_corpus tests/fuzz/corpus/decode
// Deterministic: the same files every time.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

// jpeglib.h needs size_t and FILE declared first.
#include <jpeglib.h>

namespace {

struct Options {
  int width = 64;
  int height = 48;
  int components = 3;  // 1 gray, 3 RGB -> YCbCr, 4 CMYK
  J_COLOR_SPACE jpeg_color_space = JCS_YCbCr;
  int h_samp = 2, v_samp = 2;  // luma sampling factors (chroma are 1x1)
  int quality = 75;
  bool progressive = false;
  bool arithmetic = false;
  unsigned restart_rows = 0;
};

// Smooth gradients with a little texture: photo-like enough for the DCT, small when compressed.
std::vector<uint8_t> Pixels(int width, int height, int components, uint32_t seed) {
  std::vector<uint8_t> px(static_cast<size_t>(width) * height * components);
  uint32_t state = seed * 2654435761u + 1;
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      state = state * 1664525u + 1013904223u;
      const int noise = static_cast<int>(state >> 29) - 4;
      for (int c = 0; c < components; ++c) {
        const int v = (x * (60 + 50 * c)) / (width + 1) + (y * (200 - 60 * c)) / (height + 1) +
                      ((x / 8 + y / 8 + c) % 2) * 20 + noise;
        px[(static_cast<size_t>(y) * width + x) * components + c] =
            static_cast<uint8_t>(std::clamp(v, 0, 255));
      }
    }
  }
  return px;
}

std::vector<uint8_t> Encode(const Options& o, uint32_t seed) {
  jpeg_compress_struct cinfo;
  jpeg_error_mgr jerr;
  cinfo.err = jpeg_std_error(&jerr);  // exits on error: fine for a one-off tool
  jpeg_create_compress(&cinfo);
  unsigned char* buffer = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&cinfo, &buffer, &size);
  cinfo.image_width = static_cast<JDIMENSION>(o.width);
  cinfo.image_height = static_cast<JDIMENSION>(o.height);
  cinfo.input_components = o.components;
  cinfo.in_color_space = o.components == 1 ? JCS_GRAYSCALE : o.components == 4 ? JCS_CMYK : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_colorspace(&cinfo, o.jpeg_color_space);
  jpeg_set_quality(&cinfo, o.quality, TRUE);
  if (o.components == 3 && o.jpeg_color_space == JCS_YCbCr) {
    cinfo.comp_info[0].h_samp_factor = o.h_samp;
    cinfo.comp_info[0].v_samp_factor = o.v_samp;
  }
  if (o.progressive) jpeg_simple_progression(&cinfo);
  cinfo.arith_code = o.arithmetic ? TRUE : FALSE;
  cinfo.restart_in_rows = static_cast<int>(o.restart_rows);
  jpeg_start_compress(&cinfo, TRUE);
  const std::vector<uint8_t> px = Pixels(o.width, o.height, o.components, seed);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(px.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * o.width * o.components;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::vector<uint8_t> out(buffer, buffer + size);
  std::free(buffer);
  return out;
}

// Offset of the first SOFn marker's segment (FF C0..C2), or 0.
size_t FindSof(const std::vector<uint8_t>& jpeg) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] >= 0xC0 && jpeg[i + 1] <= 0xC2) return i;
  }
  return 0;
}

std::string g_dir;

void Write(const std::string& name, uint8_t control, const std::vector<uint8_t>& jpeg) {
  std::ofstream out(g_dir + "/" + name, std::ios::binary);
  out.put(static_cast<char>(control));
  out.write(reinterpret_cast<const char*>(jpeg.data()), static_cast<std::streamsize>(jpeg.size()));
  if (!out) {
    std::fprintf(stderr, "make_corpus: cannot write %s/%s\n", g_dir.c_str(), name.c_str());
    std::exit(1);
  }
  std::printf("%-28s control=0x%02x %6zu bytes\n", name.c_str(), control, jpeg.size() + 1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_fuzz_corpus OUT_DIR\n");
    return 2;
  }
  g_dir = argv[1];

  // Control byte: bit0 eval, bit1 float32, bit2 NCHW, bits3-4 size (32/24/9/1),
  // bit5 warnings not errors, bit6 + DecodeRgb, bit7 seed.
  Options o;
  const auto baseline = Encode(o, 1);
  Write("baseline-420", 0x00, baseline);
  Write("baseline-420-eval-f32-nchw", 0x47, baseline);

  o = Options{};
  o.width = 41, o.height = 33, o.h_samp = 1, o.v_samp = 1, o.quality = 90;
  Write("baseline-444-odd", 0x41, Encode(o, 2));

  o = Options{};
  o.width = 50, o.height = 30, o.h_samp = 2, o.v_samp = 1;
  Write("baseline-422", 0x0A, Encode(o, 3));

  o = Options{};
  o.width = 30, o.height = 50, o.h_samp = 1, o.v_samp = 2;
  Write("baseline-440-portrait", 0x91, Encode(o, 4));

  o = Options{};
  o.width = 72, o.height = 56, o.progressive = true;
  Write("progressive-420", 0x02, Encode(o, 5));

  o = Options{};
  o.width = 37, o.height = 29, o.components = 1, o.jpeg_color_space = JCS_GRAYSCALE;
  Write("gray", 0x04, Encode(o, 6));
  o.progressive = true;
  Write("gray-progressive", 0xC9, Encode(o, 7));

  o = Options{};
  o.width = 32, o.height = 24, o.components = 4, o.jpeg_color_space = JCS_CMYK;
  Write("cmyk-adobe", 0x40, Encode(o, 8));
  o.jpeg_color_space = JCS_YCCK;
  Write("ycck-adobe", 0x03, Encode(o, 9));

  o = Options{};
  o.width = 64, o.height = 64, o.restart_rows = 1;
  Write("restart-markers", 0x10, Encode(o, 10));

  o = Options{};
  o.width = 48, o.height = 40, o.arithmetic = true;
  Write("arithmetic", 0x20, Encode(o, 11));

  o = Options{};
  o.width = 1, o.height = 1;
  Write("one-pixel", 0x18, Encode(o, 12));
  o.width = 300, o.height = 2;
  Write("wide-strip", 0x01, Encode(o, 13));

  // Big enough for DCT scaling by 1/2..1/8 with a 32-pixel output (crops >= 64 pixels).
  o = Options{};
  o.width = 320, o.height = 240, o.quality = 30;
  const auto large = Encode(o, 14);
  Write("scaled-320x240-train", 0x80, large);
  Write("scaled-320x240-eval", 0x01, large);
  o.progressive = true;
  Write("scaled-progressive", 0x09, Encode(o, 15));

  // Broken files.
  Write("truncated-half", 0x00,
        std::vector<uint8_t>(baseline.begin(), baseline.begin() + baseline.size() / 2));
  Write("truncated-tolerated", 0x20,
        std::vector<uint8_t>(baseline.begin(), baseline.begin() + baseline.size() * 3 / 4));
  std::vector<uint8_t> patched = baseline;
  if (const size_t sof = FindSof(patched); sof != 0) {
    patched[sof + 4] = 12;  // precision
    Write("precision-12", 0x00, patched);
    patched = baseline;
    patched[sof + 5] = 0xFF, patched[sof + 6] = 0xF0;  // height 65520
    patched[sof + 7] = 0xFF, patched[sof + 8] = 0xF0;  // width 65520
    Write("huge-dimensions", 0x00, patched);
    patched = baseline;
    patched[sof + 5] = 0x07, patched[sof + 6] = 0xD0;  // height 2000: the data runs out early
    patched[sof + 7] = 0x07, patched[sof + 8] = 0xD0;  // width 2000
    Write("claims-2000x2000", 0x20, patched);
  }
  Write("not-a-jpeg", 0x00, {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13});
  Write("empty", 0x00, {});
  return 0;
}
