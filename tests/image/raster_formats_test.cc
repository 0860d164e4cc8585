// SPDX-License-Identifier: Apache-2.0
// Issue 18: PNG, WebP, BMP and PPM/PGM decode to exactly the pixels PIL's
// Image.open(f).convert("RGB") gives (what torchvision's ImageFolder trains on), chosen by
// content, through the same crop/resize path as JPEG; limits apply from the header; damage is
// reported per sample with a reason. Reference images and pixels come from Pillow itself
// (Debian's python3-pil, installed by scripts/setup).
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "server/image/image_format.h"
#include "server/image/sample_decoder.h"
#include "tests/support/test_support.h"

namespace ringloader::image {
namespace {

using testing::TempDir;

// Writes every case with Pillow (and the two PIL cannot write, 16-bit RGB PNG and a PGM with a
// comment, by hand), and beside each NAME.rgb: "W H\n" then PIL's convert("RGB") bytes.
constexpr char kMakeFixtures[] = R"PY(
import io, os, struct, sys, zlib
import numpy as np
from PIL import Image
os.chdir(sys.argv[1])
rng = np.random.default_rng(7)
def noise(h, w, c):
    # Smooth gradients plus noise: realistic, and every channel differs.
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([(x * 255 // max(w - 1, 1)), (y * 255 // max(h - 1, 1)), ((x + y) * 3) % 256], -1)
    a = (base[..., :c] if c <= 3 else np.concatenate([base, (x * 7 % 256)[..., None]], -1))
    return (a + rng.integers(0, 40, a.shape)).clip(0, 255).astype(np.uint8)
def save(name, im, fmt, **kw):
    im.save(name, format=fmt, **kw)
def png16(name, a):  # 16-bit RGB PNG, by the book (PIL cannot write one)
    h, w, _ = a.shape
    raw = b"".join(b"\0" + a[r].astype(">u2").tobytes() for r in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    with open(name, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
save("rgb8.png", Image.fromarray(noise(37, 53, 3)), "PNG")
save("rgba8.png", Image.fromarray(noise(40, 31, 4), "RGBA"), "PNG")
save("gray8.png", Image.fromarray(noise(33, 29, 1)[..., 0]), "PNG")
save("la8.png", Image.fromarray(noise(21, 26, 3)[..., :2], "LA"), "PNG")
save("bits1.png", Image.fromarray(noise(19, 23, 1)[..., 0]).convert("1"), "PNG")
pal = Image.fromarray(noise(30, 30, 3)).convert("P", palette=Image.ADAPTIVE, colors=50)
pal.info["transparency"] = 3
save("palette.png", pal, "PNG", transparency=3)
save("gray16.png", Image.fromarray((noise(25, 27, 1)[..., 0].astype(np.uint16) * 3)), "PNG")
png16("rgb16.png", noise(17, 19, 3).astype(np.uint16) * 257 + rng.integers(0, 255, (17, 19, 3)))
save("lossless.webp", Image.fromarray(noise(35, 45, 4), "RGBA"), "WEBP", lossless=True)
save("lossy.webp", Image.fromarray(noise(48, 64, 3)), "WEBP", quality=80)
save("rgb24.bmp", Image.fromarray(noise(29, 35, 3)), "BMP")
save("pal8.bmp", pal.convert("RGB").convert("P", palette=Image.ADAPTIVE, colors=16), "BMP")
save("rgba32.bmp", Image.fromarray(noise(22, 18, 4), "RGBA"), "BMP")
save("rgb.ppm", Image.fromarray(noise(31, 17, 3)), "PPM")
save("gray.pgm", Image.fromarray(noise(14, 41, 1)[..., 0]), "PPM")
with open("commented.pgm", "wb") as f:
    f.write(b"P5\n# a comment\n4 3\n255\n" + bytes(range(0, 240, 20)))
with open("png_named.jpg", "wb") as f:
    f.write(open("rgb8.png", "rb").read())
same = Image.open("rgb8.png").convert("RGB")  # the same pixels in every lossless format
same.save("same.bmp"); same.save("same.ppm"); same.save("same.webp", lossless=True)
for name in sorted(os.listdir(".")):
    if name.endswith(".rgb"):
        continue
    im = Image.open(name).convert("RGB")
    with open(name + ".rgb", "wb") as f:
        f.write(b"%d %d\n" % im.size + im.tobytes())
)PY";

struct Reference {
  int32_t width = 0;
  int32_t height = 0;
  std::vector<uint8_t> rgb;
};

class Fixtures {
 public:
  Fixtures() {
    const testing::CommandResult r =
        testing::RunCommand({"/usr/bin/python3", "-c", kMakeFixtures, dir_.path()});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
  }
  std::vector<uint8_t> Bytes(const std::string& name) const {
    const std::string text = testing::ReadFile(dir_.Join(name));
    return std::vector<uint8_t>(text.begin(), text.end());
  }
  Reference Pil(const std::string& name) const {
    const std::string text = testing::ReadFile(dir_.Join(name + ".rgb"));
    Reference ref;
    const size_t eol = text.find('\n');
    REQUIRE(eol != std::string::npos);
    REQUIRE(std::sscanf(text.c_str(), "%d %d", &ref.width, &ref.height) == 2);
    ref.rgb.assign(text.begin() + static_cast<long>(eol) + 1, text.end());
    return ref;
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(dir_.path())) {
      const std::string n = e.path().filename().string();
      if (n.size() < 4 || n.substr(n.size() - 4) != ".rgb") names.push_back(n);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  TempDir dir_;
};

const Fixtures& Shared() {
  static const Fixtures fixtures;
  return fixtures;
}

TEST_CASE("18.1: every PNG, WebP, BMP and PPM/PGM kind decodes to exactly PIL's convert(\"RGB\") "
          "pixels, told by content",
          "[image][formats]") {
  const Fixtures& f = Shared();
  SampleDecoder decoder(DecodeLimits{});
  std::map<std::string, std::string> formats;
  for (const std::string& name : f.Names()) {
    INFO(name);
    const std::vector<uint8_t> bytes = f.Bytes(name);
    formats[name] = std::string(FormatName(SniffFormat(bytes)));
    const Reference ref = f.Pil(name);
    ImageInfo info;
    absl::StatusOr<std::vector<uint8_t>> rgb = decoder.DecodeRgb(bytes, name, &info);
    INFO(rgb.status().ToString());
    REQUIRE(rgb.ok());
    CHECK(info.width == ref.width);
    CHECK(info.height == ref.height);
    absl::StatusOr<ImageInfo> header = decoder.ReadInfo(bytes, name);
    REQUIRE(header.ok());
    CHECK(header->width == ref.width);
    REQUIRE(rgb->size() == ref.rgb.size());
    size_t differing = 0;
    for (size_t i = 0; i < ref.rgb.size(); ++i) differing += (*rgb)[i] != ref.rgb[i];
    CHECK(differing == 0);
  }
  CHECK(formats.size() == 20);
  CHECK(formats["png_named.jpg"] == "png");
  CHECK(formats["lossy.webp"] == "webp");
  CHECK(formats["pal8.bmp"] == "bmp");
  CHECK(formats["gray.pgm"] == "pnm");
}

TEST_CASE("18.1: the same pixels in PNG, BMP, PPM and lossless WebP give byte-identical samples "
          "through the shared crop, resize and output path",
          "[image][formats]") {
  const Fixtures& f = Shared();
  SampleDecoder decoder(DecodeLimits{});
  for (const Augment augment : {Augment::kTrain, Augment::kEval}) {
    for (const DType dtype : {DType::kUint8, DType::kFloat32}) {
      TransformSpec spec;
      spec.image_size = 24;
      spec.augment = augment;
      spec.dtype = dtype;
      spec.layout = dtype == DType::kFloat32 ? Layout::kNCHW : Layout::kNHWC;
      // Several crops: odd and even offsets, boxes ending early and at the last row.
      for (uint64_t index = 0; index < 8; ++index) {
        std::vector<std::vector<uint8_t>> samples;
        for (const char* name : {"rgb8.png", "same.bmp", "same.ppm", "same.webp", "png_named.jpg"}) {
          INFO(name << " index " << index);
          std::vector<uint8_t> out(spec.SampleBytes());
          SampleRng rng(/*seed=*/5, /*epoch=*/1, index);
          const absl::Status s = decoder.DecodeInto(f.Bytes(name), name, spec, rng, out);
          INFO(s.ToString());
          REQUIRE(s.ok());
          CHECK(decoder.last_decode().scale_denom == 1);
          samples.push_back(std::move(out));
        }
        for (size_t i = 1; i < samples.size(); ++i) CHECK(samples[i] == samples[0]);
      }
    }
  }
}

TEST_CASE("18.1: limits apply from each format's header, before any pixel is decoded",
          "[image][formats]") {
  const Fixtures& f = Shared();
  DecodeLimits tight;
  tight.max_pixels = 100;  // every fixture is larger
  TransformSpec spec;
  spec.image_size = 16;
  for (const char* name : {"rgb8.png", "lossy.webp", "rgb24.bmp", "rgb.ppm"}) {
    INFO(name);
    const std::vector<uint8_t> bytes = f.Bytes(name);
    // The header alone (the first 64 bytes) is enough to refuse it and to plan it.
    const std::vector<uint8_t> head(bytes.begin(), bytes.begin() + 64);
    const absl::StatusOr<DecodePlan> refused =
        SampleDecoder::PlanFromHeader(head, name, tight, spec);
    REQUIRE_FALSE(refused.ok());
    CHECK(ErrorReason(refused.status()) == "too_large");
    const absl::StatusOr<DecodePlan> plan =
        SampleDecoder::PlanFromHeader(head, name, DecodeLimits{}, spec);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    const Reference ref = f.Pil(name);
    CHECK(plan->bytes() >= uint64_t(ref.width) * ref.height * 3);
    CHECK(plan->bytes() <= SampleDecoder::WorstCasePlan(DecodeLimits{}, spec).bytes());
    SampleDecoder decoder(tight);
    std::vector<uint8_t> out(spec.SampleBytes());
    SampleRng rng(1, 0, 0);
    CHECK(ErrorReason(decoder.DecodeInto(bytes, name, spec, rng, out)) == "too_large");
  }
}

TEST_CASE("18.1: damaged files of every format fail with a reason naming the file, and the "
          "decoder goes on",
          "[image][formats][errors]") {
  const Fixtures& f = Shared();
  SampleDecoder decoder(DecodeLimits{});
  TransformSpec spec;
  spec.image_size = 16;
  const auto decode = [&](const std::vector<uint8_t>& bytes, const std::string& name) {
    std::vector<uint8_t> out(spec.SampleBytes());
    SampleRng rng(1, 0, 0);
    return decoder.DecodeInto(bytes, name, spec, rng, out);
  };
  const auto cut = [&](const std::string& name) {
    std::vector<uint8_t> bytes = f.Bytes(name);
    bytes.resize(bytes.size() / 2);
    return bytes;
  };
  for (const char* name : {"rgb8.png", "lossy.webp", "lossless.webp", "rgb24.bmp", "rgb.ppm"}) {
    INFO(name);
    const absl::Status s = decode(cut(name), name);
    REQUIRE_FALSE(s.ok());
    CHECK_THAT(std::string(s.message()), Catch::StartsWith(std::string(name) + ": "));
    CHECK((ErrorReason(s) == "truncated" || ErrorReason(s) == "corrupt"));
  }
  CHECK(ErrorReason(decode(cut("rgb8.png"), "cut.png")) == "truncated");
  CHECK(ErrorReason(decode(cut("lossy.webp"), "cut.webp")) == "truncated");
  // A flipped byte in the last rows' data, or a file cut there: every crop fails alike, also
  // those whose box ends long before (the decode stops there, the integrity check does not).
  std::vector<uint8_t> png = f.Bytes("rgb8.png");
  png[png.size() - 20] ^= 0x40;
  std::vector<uint8_t> no_end = f.Bytes("rgb8.png");
  no_end.resize(no_end.size() - 12);  // the IEND chunk
  for (uint64_t index = 0; index < 16; ++index) {
    INFO("crop " << index);
    std::vector<uint8_t> out(spec.SampleBytes());
    SampleRng rng(9, 0, index);
    CHECK(ErrorReason(decoder.DecodeInto(png, "crc.png", spec, rng, out)) == "corrupt");
    SampleRng again(9, 0, index);
    CHECK(ErrorReason(decoder.DecodeInto(no_end, "cut.png", spec, again, out)) == "truncated");
  }
  // TIFF is recognised and refused; so are ASCII PNM files and content of no known format.
  const std::vector<uint8_t> tiff = {'I', 'I', '*', 0, 8, 0, 0, 0, 0, 0, 0, 0};
  const absl::Status t = decode(tiff, "scan.tif");
  CHECK(ErrorReason(t) == "unsupported");
  CHECK_THAT(std::string(t.message()), Catch::Contains("TIFF"));
  const std::string ascii = "P3\n2 1\n255\n0 0 0 255 255 255\n";
  CHECK(ErrorReason(decode(std::vector<uint8_t>(ascii.begin(), ascii.end()), "a.ppm")) ==
        "unsupported");
  const std::string text = "just some text, named like an image";
  CHECK(ErrorReason(decode(std::vector<uint8_t>(text.begin(), text.end()), "README.png")) ==
        "not_image");
  // After all that, a good file still decodes.
  CHECK(decode(f.Bytes("rgb8.png"), "rgb8.png").ok());
}

}  // namespace
}  // namespace ringloader::image
