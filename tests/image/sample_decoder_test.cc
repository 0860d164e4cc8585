// SPDX-License-Identifier: Apache-2.0
// Decoding and transforming real JPEGs made in the test: correctness against a double-precision
// reference (PSNR), layouts and dtypes, colour spaces, DCT scaling and crop decoding, determinism.

#include "server/image/sample_decoder.h"

#include <turbojpeg.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <vector>

// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "server/image/synthetic.h"
#include "tests/image/image_test_util.h"
#include "tests/support/libjpeg_encode.h"

namespace ringloader::image {
namespace {

using testing::EncodeJpeg;
using testing::Psnr;
using testing::ReferenceResample;
using testing::SmoothPattern;

std::vector<uint8_t> Decode(SampleDecoder& dec, const std::vector<uint8_t>& jpeg,
                            const TransformSpec& spec, SampleRng rng) {
  std::vector<uint8_t> out(spec.SampleBytes());
  const absl::Status s = dec.DecodeInto(jpeg, "test.jpg", spec, rng, out);
  INFO(s.ToString());
  REQUIRE(s.ok());
  return out;
}

TransformSpec Spec(Augment augment, uint32_t size, DType dtype = DType::kUint8,
                   Layout layout = Layout::kNHWC) {
  TransformSpec spec;
  spec.image_size = size;
  spec.augment = augment;
  spec.dtype = dtype;
  spec.layout = layout;
  return spec;
}

// Eval: compare with Resize + CenterCrop computed from the original pixels.
double EvalPsnr(int w, int h, uint32_t size, SampleDecoder& dec) {
  const std::vector<uint8_t> rgb = SmoothPattern(w, h);
  const std::vector<uint8_t> jpeg = EncodeJpeg(rgb, w, h, 95, TJSAMP_444);
  const std::vector<uint8_t> out =
      Decode(dec, jpeg, Spec(Augment::kEval, size), SampleRng(1, 0, 0));
  const CropRect crop = EvalCropExact(w, h, size);
  return Psnr(out, ReferenceResample(rgb, w, h, crop, 0, 0, w, h, static_cast<int>(size), false));
}

TEST_CASE("SampleDecoder: eval transform matches a reference resize + center crop",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  SECTION("500x375 landscape") { CHECK(EvalPsnr(500, 375, 224, dec) >= 30.0); }
  SECTION("333x500 portrait") { CHECK(EvalPsnr(333, 500, 224, dec) >= 30.0); }
  SECTION("17x9 tiny, upscaled") { CHECK(EvalPsnr(17, 9, 32, dec) >= 30.0); }
  SECTION("1x1") { CHECK(EvalPsnr(1, 1, 8, dec) >= 30.0); }
  SECTION("odd output size") { CHECK(EvalPsnr(301, 207, 99, dec) >= 30.0); }
}

TEST_CASE("SampleDecoder: exact_resize decodes a large image at full size and matches the "
          "reference within 0.01 levels on average",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  const int w = 2000, h = 1500;
  const std::vector<uint8_t> rgb = SmoothPattern(w, h);
  const std::vector<uint8_t> jpeg = EncodeJpeg(rgb, w, h, 95, TJSAMP_444);
  absl::StatusOr<std::vector<uint8_t>> full = dec.DecodeRgb(jpeg, "big.jpg", nullptr);
  REQUIRE(full.ok());
  TransformSpec spec = Spec(Augment::kEval, 224);
  const CropRect crop = EvalCropExact(w, h, 224);
  // The reference: libjpeg's own full-size pixels, resized and cropped in double precision.
  const std::vector<double> want = ReferenceResample(*full, w, h, crop, 0, 0, w, h, 224, false);
  const auto mean_shift = [&](const std::vector<uint8_t>& out) {
    double sum = 0;
    for (size_t i = 0; i < out.size(); ++i) sum += out[i] - want[i];
    return std::abs(sum / static_cast<double>(out.size()));
  };
  spec.exact_resize = true;
  const std::vector<uint8_t> exact = Decode(dec, jpeg, spec, SampleRng(1, 0, 0));
  CHECK(dec.last_scale_denom() == 1);
  CHECK(mean_shift(exact) < 0.01);
  for (size_t i = 0; i < exact.size(); ++i) {
    if (std::abs(exact[i] - want[i]) > 1.0) FAIL("pixel " << i << ": " << int(exact[i]) << " vs " << want[i]);
  }
  spec.exact_resize = false;
  const std::vector<uint8_t> fast = Decode(dec, jpeg, spec, SampleRng(1, 0, 0));
  CHECK(dec.last_scale_denom() == 4);
  CHECK(fast != exact);
}

TEST_CASE("SampleDecoder: a large image is decoded with DCT scaling and only its crop",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  const int w = 2000, h = 1500;
  CHECK(EvalPsnr(w, h, 224, dec) >= 30.0);
  // Eval crop of 2000x1500 at 224 is ~1312 source pixels: 1/4 scale keeps 328 >= 224.
  const DecodeStats& st = dec.last_decode();
  CHECK(dec.last_scale_denom() == 4);
  CHECK(st.scaled_width == 500);
  CHECK(st.scaled_height == 375);
  CHECK(st.decoded_y > 0);
  CHECK(st.decoded_y + st.decoded_rows < st.scaled_height);
  CHECK(st.decoded_width < st.scaled_width);
  CHECK(st.decoded_x > 0);
  CHECK_FALSE(st.full_decode_fallback);
}

TEST_CASE("SampleDecoder: train transform matches the reference for its crop box",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  struct Case {
    int w, h;
    uint32_t size;
  };
  for (const Case c :
       {Case{500, 375, 224}, Case{333, 500, 128}, Case{17, 9, 16}, Case{2000, 1500, 224}}) {
    const std::vector<uint8_t> rgb = SmoothPattern(c.w, c.h);
    const std::vector<uint8_t> jpeg = EncodeJpeg(rgb, c.w, c.h, 95, TJSAMP_444);
    for (uint64_t index = 0; index < 4; ++index) {
      SampleRng rng(7, 1, index);
      SampleRng copy = rng;
      const CropBox box = DrawTrainCrop(c.w, c.h, copy);
      const std::vector<uint8_t> out = Decode(dec, jpeg, Spec(Augment::kTrain, c.size), rng);
      const CropRect r{double(box.x), double(box.y), double(box.width), double(box.height)};
      const auto want = ReferenceResample(rgb, c.w, c.h, r, box.x, box.y, box.x + box.width,
                                          box.y + box.height, static_cast<int>(c.size), box.flip);
      INFO(c.w << "x" << c.h << " box " << box.x << "," << box.y << " " << box.width << "x"
               << box.height << " flip " << box.flip << " denom " << dec.last_scale_denom());
      CHECK(Psnr(out, want) >= 30.0);
    }
  }
}

TEST_CASE("SampleDecoder: float32 outputs are the normalised uint8 output, in HWC and CHW",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  const int w = 320, h = 240;
  const uint32_t size = 64;
  const std::vector<uint8_t> jpeg = EncodeJpeg(SmoothPattern(w, h), w, h, 95, TJSAMP_420);
  const SampleRng rng(3, 4, 5);
  const std::vector<uint8_t> u8 = Decode(dec, jpeg, Spec(Augment::kTrain, size), rng);
  const std::vector<uint8_t> u8_chw =
      Decode(dec, jpeg, Spec(Augment::kTrain, size, DType::kUint8, Layout::kNCHW), rng);
  const TransformSpec fhwc = Spec(Augment::kTrain, size, DType::kFloat32, Layout::kNHWC);
  const TransformSpec fchw = Spec(Augment::kTrain, size, DType::kFloat32, Layout::kNCHW);
  const std::vector<uint8_t> f_hwc_bytes = Decode(dec, jpeg, fhwc, rng);
  const std::vector<uint8_t> f_chw_bytes = Decode(dec, jpeg, fchw, rng);
  REQUIRE(f_hwc_bytes.size() == size * size * 3 * 4);
  std::vector<float> f_hwc(size * size * 3), f_chw(size * size * 3);
  std::memcpy(f_hwc.data(), f_hwc_bytes.data(), f_hwc_bytes.size());
  std::memcpy(f_chw.data(), f_chw_bytes.data(), f_chw_bytes.size());
  int mismatches = 0;
  for (uint32_t y = 0; y < size; ++y) {
    for (uint32_t x = 0; x < size; ++x) {
      for (uint32_t c = 0; c < 3; ++c) {
        const uint8_t v = u8[(y * size + x) * 3 + c];
        const float want = (static_cast<float>(v) / 255.0f - fhwc.mean[c]) / fhwc.std[c];
        if (u8_chw[(c * size + y) * size + x] != v) ++mismatches;
        if (std::abs(f_hwc[(y * size + x) * 3 + c] - want) > 1e-5f) ++mismatches;
        if (std::abs(f_chw[(c * size + y) * size + x] - want) > 1e-5f) ++mismatches;
      }
    }
  }
  CHECK(mismatches == 0);
  // Values, not only agreement between outputs: a flat grey 128 image comes out as ImageNet's
  // normalisation of 128/255 per channel, (0.50196 - mean) / std, worked out by hand.
  const std::vector<uint8_t> grey(static_cast<size_t>(w) * h * 3, 128);
  const std::vector<uint8_t> flat = Decode(dec, EncodeJpeg(grey, w, h, 95, TJSAMP_444), fhwc, rng);
  std::vector<float> px(size * size * 3);
  std::memcpy(px.data(), flat.data(), flat.size());
  const float expected[3] = {0.0740f, 0.2052f, 0.4265f};
  for (uint32_t i : {0u, size * size / 2, size * size - 1}) {
    for (int c = 0; c < 3; ++c) {
      INFO("pixel " << i << " channel " << c);
      CHECK(std::abs(px[i * 3 + c] - expected[c]) < 0.01f);  // < 0.6 grey levels
    }
  }
}

TEST_CASE("SampleDecoder: crop decoding matches a full decode for every subsampling",
          "[image][decoder]") {
  // Reference: libjpeg's own full decode (DecodeRgb) resampled in double precision; the partial
  // decode (crop columns, skipped rows, early stop) must agree closely, so offsets are right.
  SampleDecoder dec(DecodeLimits{});
  const int w = 403, h = 301;
  const std::vector<uint8_t> rgb = SmoothPattern(w, h);
  for (const int subsamp : {TJSAMP_444, TJSAMP_422, TJSAMP_420, TJSAMP_440, TJSAMP_GRAY}) {
    for (const bool progressive : {false, true}) {
      const std::vector<uint8_t> jpeg = EncodeJpeg(rgb, w, h, 90, subsamp, progressive);
      ImageInfo info;
      absl::StatusOr<std::vector<uint8_t>> full = dec.DecodeRgb(jpeg, "full.jpg", &info);
      REQUIRE(full.ok());
      CHECK(info.progressive == progressive);
      for (uint64_t index = 0; index < 6; ++index) {
        SampleRng rng(11, 0, index);
        SampleRng copy = rng;
        const CropBox box = DrawTrainCrop(w, h, copy);
        const std::vector<uint8_t> out = Decode(dec, jpeg, Spec(Augment::kTrain, 224), rng);
        const CropRect r{double(box.x), double(box.y), double(box.width), double(box.height)};
        const auto want = ReferenceResample(*full, w, h, r, box.x, box.y, box.x + box.width,
                                            box.y + box.height, 224, box.flip);
        INFO("subsamp " << subsamp << " progressive " << progressive << " index " << index);
        CHECK(Psnr(out, want) >= 40.0);
        CHECK(dec.last_scale_denom() == 1);
      }
    }
  }
}

TEST_CASE("SampleDecoder: grayscale input comes out as RGB with equal channels",
          "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  SyntheticImageOptions o;
  o.width = 250;
  o.height = 190;
  o.grayscale = true;
  absl::StatusOr<std::vector<uint8_t>> jpeg = MakeSyntheticJpeg(o);
  REQUIRE(jpeg.ok());
  absl::StatusOr<ImageInfo> info = dec.ReadInfo(*jpeg, "gray.jpg");
  REQUIRE(info.ok());
  CHECK(info->components == 1);
  for (const Augment a : {Augment::kTrain, Augment::kEval}) {
    const std::vector<uint8_t> out = Decode(dec, *jpeg, Spec(a, 64), SampleRng(1, 1, 1));
    int off = 0;
    for (size_t i = 0; i < out.size(); i += 3) {
      if (std::abs(out[i] - out[i + 1]) > 1 || std::abs(out[i] - out[i + 2]) > 1) ++off;
    }
    CHECK(off == 0);
  }
}

// A constant-colour CMYK JPEG. With `adobe`, TurboJPEG's encoder (YCCK with an Adobe marker,
// inverted CMYK); without, libjpeg's encoder writing plain CMYK and no Adobe marker.
std::vector<uint8_t> CmykJpeg(const std::array<uint8_t, 4>& cmyk, bool adobe) {
  const int w = 64, h = 48;
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 4);
  for (size_t i = 0; i < px.size(); i += 4) std::memcpy(&px[i], cmyk.data(), 4);
  if (adobe) {
    tjhandle t = tjInitCompress();
    unsigned char* buf = nullptr;
    unsigned long size = 0;
    REQUIRE(tjCompress2(t, px.data(), w, 0, h, TJPF_CMYK, &buf, &size, TJSAMP_444, 95, 0) == 0);
    std::vector<uint8_t> out(buf, buf + size);
    tjFree(buf);
    tjDestroy(t);
    return out;
  }
  return ringloader::testing::EncodeWithLibjpeg(px, w, h, 4, [](jpeg_compress_struct& c) {
    jpeg_set_colorspace(&c, JCS_CMYK);
    c.write_Adobe_marker = FALSE;
    jpeg_set_quality(&c, 95, TRUE);
  });
}

void CheckColour(SampleDecoder& dec, const std::vector<uint8_t>& jpeg,
                 const std::array<int, 3>& want) {
  absl::StatusOr<ImageInfo> info = dec.ReadInfo(jpeg, "cmyk.jpg");
  REQUIRE(info.ok());
  CHECK(info->components == 4);
  const std::vector<uint8_t> out = Decode(dec, jpeg, Spec(Augment::kEval, 16), SampleRng(0, 0, 0));
  for (int c = 0; c < 3; ++c) {
    INFO("channel " << c << " got " << int(out[c]) << " want " << want[c]);
    CHECK(std::abs(out[c] - want[c]) <= 3);
    CHECK(std::abs(out[out.size() - 3 + c] - want[c]) <= 3);
  }
  absl::StatusOr<std::vector<uint8_t>> full = dec.DecodeRgb(jpeg, "cmyk.jpg", nullptr);
  REQUIRE(full.ok());
  for (int c = 0; c < 3; ++c) CHECK(std::abs((*full)[c] - want[c]) <= 3);
}

TEST_CASE("SampleDecoder: CMYK input comes out as the expected RGB", "[image][decoder]") {
  SampleDecoder dec(DecodeLimits{});
  SECTION("Adobe inverted CMYK (YCCK): R = C * K / 255") {
    CheckColour(dec, CmykJpeg({255, 0, 255, 255}, true), {255, 0, 255});
    CheckColour(dec, CmykJpeg({128, 255, 255, 200}, true), {100, 200, 200});
  }
  SECTION("plain CMYK without an Adobe marker: R = (255 - C) * (255 - K) / 255") {
    CheckColour(dec, CmykJpeg({0, 255, 0, 0}, false), {255, 0, 255});
    CheckColour(dec, CmykJpeg({127, 0, 0, 55}, false), {100, 200, 200});
  }
  SECTION("synthetic CMYK photo decodes in both transforms") {
    SyntheticImageOptions o;
    o.cmyk = true;
    o.width = 200;
    o.height = 150;
    absl::StatusOr<std::vector<uint8_t>> jpeg = MakeSyntheticJpeg(o);
    REQUIRE(jpeg.ok());
    Decode(dec, *jpeg, Spec(Augment::kTrain, 64), SampleRng(0, 0, 1));
    Decode(dec, *jpeg, Spec(Augment::kEval, 64), SampleRng(0, 0, 1));
  }
}

TEST_CASE("SampleDecoder: the same rng inputs give identical bytes, another index differs",
          "[image][decoder]") {
  SyntheticImageOptions o;
  absl::StatusOr<std::vector<uint8_t>> jpeg = MakeSyntheticJpeg(o);
  REQUIRE(jpeg.ok());
  SampleDecoder a(DecodeLimits{}), b(DecodeLimits{});
  const TransformSpec spec = Spec(Augment::kTrain, 128);
  const std::vector<uint8_t> first = Decode(a, *jpeg, spec, SampleRng(5, 2, 10));
  Decode(a, *jpeg, spec, SampleRng(5, 2, 99));  // state reused in between
  CHECK(Decode(a, *jpeg, spec, SampleRng(5, 2, 10)) == first);
  CHECK(Decode(b, *jpeg, spec, SampleRng(5, 2, 10)) == first);
  CHECK(Decode(a, *jpeg, spec, SampleRng(5, 2, 11)) != first);
  CHECK(Decode(a, *jpeg, spec, SampleRng(5, 3, 10)) != first);
}

}  // namespace
}  // namespace ringloader::image
