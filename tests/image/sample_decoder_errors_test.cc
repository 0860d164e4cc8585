// SPDX-License-Identifier: Apache-2.0
// Broken inputs: every kind is an error value naming the file and the reason, never a crash, and
// the decoder stays usable afterwards.

#include <turbojpeg.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

// jpeglib.h needs size_t and FILE first.
#include <jpeglib.h>

#include "server/image/sample_decoder.h"
#include "server/image/synthetic.h"
#include "tests/image/image_test_util.h"
#include "tests/support/libjpeg_encode.h"
#include "tests/support/test_support.h"

namespace ringloader::image {
namespace {

using testing::EncodeJpeg;
using testing::FindMarker;
using testing::SmoothPattern;

std::vector<uint8_t> GoodJpeg(bool progressive = false) {
  SyntheticImageOptions o;
  o.progressive = progressive;
  absl::StatusOr<std::vector<uint8_t>> jpeg = MakeSyntheticJpeg(o);
  REQUIRE(jpeg.ok());
  return *jpeg;
}

absl::Status DecodeStatus(SampleDecoder& dec, const std::vector<uint8_t>& jpeg,
                          const std::string& path, Augment augment = Augment::kEval,
                          uint64_t index = 0) {
  TransformSpec spec;
  spec.image_size = 64;
  spec.augment = augment;
  std::vector<uint8_t> out(spec.SampleBytes());
  SampleRng rng(1, 0, index);
  return dec.DecodeInto(jpeg, path, spec, rng, out);
}

void ExpectError(const absl::Status& s, const std::string& path, std::string_view reason) {
  INFO(s.ToString());
  REQUIRE_FALSE(s.ok());
  CHECK(ErrorReason(s) == reason);
  const std::string msg(s.message());
  CHECK(msg.rfind(path + ": " + std::string(reason) + ": ", 0) == 0);
}

void ExpectStillWorks(SampleDecoder& dec) {
  const absl::Status s = DecodeStatus(dec, GoodJpeg(), "good.jpg", Augment::kTrain);
  INFO(s.ToString());
  CHECK(s.ok());
}

TEST_CASE("SampleDecoder: a truncated JPEG is 'truncated' whatever crop is drawn",
          "[image][decoder][errors]") {
  SampleDecoder dec(DecodeLimits{});
  for (const bool progressive : {false, true}) {
    std::vector<uint8_t> jpeg = GoodJpeg(progressive);
    jpeg.resize(jpeg.size() / 2);
    ExpectError(DecodeStatus(dec, jpeg, "cut.jpg"), "cut.jpg", "truncated");
    for (uint64_t i = 0; i < 20; ++i) {  // includes crops entirely in the first half
      ExpectError(DecodeStatus(dec, jpeg, "cut.jpg", Augment::kTrain, i), "cut.jpg", "truncated");
    }
    ExpectError(dec.DecodeRgb(jpeg, "cut.jpg", nullptr).status(), "cut.jpg", "truncated");
  }
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: with warnings allowed, a truncated JPEG decodes (grey fill)",
          "[image][decoder][errors]") {
  DecodeLimits limits;
  limits.warnings_are_errors = false;
  SampleDecoder dec(limits);
  std::vector<uint8_t> jpeg = GoodJpeg();
  jpeg.resize(jpeg.size() / 2);
  CHECK(DecodeStatus(dec, jpeg, "cut.jpg").ok());
}

TEST_CASE("SampleDecoder: zero bytes, random bytes and a PNG signature over garbage are refused",
          "[image][decoder][errors]") {
  SampleDecoder dec(DecodeLimits{});
  ExpectError(DecodeStatus(dec, {}, "zero.jpg"), "zero.jpg", "empty");
  ExpectError(dec.ReadInfo({}, "zero.jpg").status(), "zero.jpg", "empty");

  std::vector<uint8_t> random(4096);
  uint64_t x = 0x1234567;
  for (uint8_t& b : random) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(x >> 56);
  }
  random[0] = 0x42;  // not 0xFF
  // The content, not the name, says what a file is: no known signature is "not_image".
  const absl::Status r = DecodeStatus(dec, random, "random.jpg");
  ExpectError(r, "random.jpg", "not_image");
  CHECK(std::string(r.message()).find("match no JPEG, PNG, WebP, BMP or PPM/PGM") !=
        std::string::npos);

  // A PNG signature with garbage after it goes to the PNG decoder, which refuses it.
  std::vector<uint8_t> png = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  png.insert(png.end(), random.begin(), random.begin() + 200);
  const absl::Status s = DecodeStatus(dec, png, "x.jpg");
  REQUIRE_FALSE(s.ok());
  CHECK((ErrorReason(s) == "corrupt" || ErrorReason(s) == "truncated"));
  CHECK(std::string(s.message()).find("libspng") != std::string::npos);

  // A JPEG header followed by garbage instead of entropy-coded data.
  std::vector<uint8_t> jpeg = GoodJpeg();
  const long sos = FindMarker(jpeg, 0xDA);
  REQUIRE(sos > 0);
  for (size_t i = static_cast<size_t>(sos) + 20; i < jpeg.size(); ++i) jpeg[i] = random[i % 4096];
  const absl::Status garbage = DecodeStatus(dec, jpeg, "garbage.jpg");
  REQUIRE_FALSE(garbage.ok());
  CHECK((ErrorReason(garbage) == "corrupt" || ErrorReason(garbage) == "truncated"));
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: a header claiming 60000x60000 is too_large before decoding",
          "[image][decoder][errors]") {
  std::vector<uint8_t> jpeg = EncodeJpeg(SmoothPattern(32, 24), 32, 24, 90, TJSAMP_420);
  const long sof = FindMarker(jpeg, 0xC0);
  REQUIRE(sof > 0);
  // SOF0: FF C0, length(2), precision(1), height(2), width(2).
  jpeg[sof + 5] = 0xEA;
  jpeg[sof + 6] = 0x60;  // 60000
  jpeg[sof + 7] = 0xEA;
  jpeg[sof + 8] = 0x60;
  SampleDecoder dec(DecodeLimits{});
  ExpectError(DecodeStatus(dec, jpeg, "bomb.jpg"), "bomb.jpg", "too_large");
  ExpectError(dec.ReadInfo(jpeg, "bomb.jpg").status(), "bomb.jpg", "too_large");
  ExpectError(dec.DecodeRgb(jpeg, "bomb.jpg", nullptr).status(), "bomb.jpg", "too_large");
  // Also against a small configured limit.
  DecodeLimits small;
  small.max_pixels = 1000;
  SampleDecoder strict(small);
  ExpectError(DecodeStatus(strict, GoodJpeg(), "big.jpg"), "big.jpg", "too_large");
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: progressive scans beyond max_scans are too_many_scans",
          "[image][decoder][errors]") {
  // A normal progressive colour JPEG has ~10 scans; a bound of 3 trips the same check that
  // stops a crafted file with thousands of scans.
  DecodeLimits limits;
  limits.max_scans = 3;
  SampleDecoder dec(limits);
  const std::vector<uint8_t> jpeg = GoodJpeg(/*progressive=*/true);
  ExpectError(DecodeStatus(dec, jpeg, "scans.jpg"), "scans.jpg", "too_many_scans");
  ExpectError(dec.DecodeRgb(jpeg, "scans.jpg", nullptr).status(), "scans.jpg", "too_many_scans");
  SampleDecoder normal(DecodeLimits{});
  CHECK(DecodeStatus(normal, jpeg, "scans.jpg").ok());
}

TEST_CASE("SampleDecoder: a bad Huffman table is corrupt", "[image][decoder][errors]") {
  std::vector<uint8_t> jpeg = GoodJpeg();
  const long dht = FindMarker(jpeg, 0xC4);
  REQUIRE(dht > 0);
  // FF C4, length(2), class/id(1), then 16 code-length counts: claim far more than 256 codes.
  for (int i = 0; i < 16; ++i) jpeg[dht + 5 + i] = 0xFF;
  SampleDecoder dec(DecodeLimits{});
  const absl::Status s = DecodeStatus(dec, jpeg, "huff.jpg");
  ExpectError(s, "huff.jpg", "corrupt");
  CHECK(std::string(s.message()).find("Huffman") != std::string::npos);
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: 12-bit and lossless JPEGs are unsupported", "[image][decoder][errors]") {
  SampleDecoder dec(DecodeLimits{});
  const std::vector<uint8_t> good = EncodeJpeg(SmoothPattern(32, 24), 32, 24, 90, TJSAMP_444);
  const long sof = FindMarker(good, 0xC0);
  REQUIRE(sof > 0);
  std::vector<uint8_t> twelve = good;
  twelve[sof + 4] = 12;  // precision byte; libjpeg-turbo 2.1 (8-bit build) refuses it
  ExpectError(DecodeStatus(dec, twelve, "12bit.jpg"), "12bit.jpg", "unsupported");
  std::vector<uint8_t> lossless = good;
  lossless[sof + 1] = 0xC3;  // SOF3 (lossless)
  ExpectError(DecodeStatus(dec, lossless, "lossless.jpg"), "lossless.jpg", "unsupported");
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: arithmetic-coded JPEGs decode, or are refused as unsupported",
          "[image][decoder][errors]") {
  const int w = 96, h = 64;
  // Debian's libjpeg-turbo is built with arithmetic encode and decode.
  const std::vector<uint8_t> jpeg = ringloader::testing::EncodeWithLibjpeg(
      SmoothPattern(w, h), w, h, 3, [](jpeg_compress_struct& c) { c.arith_code = TRUE; });
  REQUIRE(FindMarker(jpeg, 0xC9) > 0);  // SOF9: arithmetic, sequential
  SampleDecoder dec(DecodeLimits{});
  const absl::Status s = DecodeStatus(dec, jpeg, "arith.jpg");
  if (!s.ok()) ExpectError(s, "arith.jpg", "unsupported");
}

TEST_CASE("SampleDecoder: randomly damaged JPEGs never crash the decoder",
          "[image][decoder][errors]") {
  SampleDecoder dec(DecodeLimits{});
  const std::vector<uint8_t> good = EncodeJpeg(SmoothPattern(120, 90), 120, 90, 85, TJSAMP_420);
  const std::vector<uint8_t> prog =
      EncodeJpeg(SmoothPattern(120, 90), 120, 90, 85, TJSAMP_420, true);
  uint64_t x = 42;
  auto next = [&] {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return x >> 33;
  };
  int failures = 0;
  for (int i = 0; i < 300; ++i) {
    std::vector<uint8_t> bad = (i % 2) ? prog : good;
    for (int k = 0; k < 1 + i % 5; ++k) bad[next() % bad.size()] = static_cast<uint8_t>(next());
    if (i % 7 == 0) bad.resize(next() % bad.size());
    const absl::Status s = DecodeStatus(dec, bad, "fuzz.jpg", Augment::kTrain, i);
    if (!s.ok()) {
      ++failures;
      CHECK(ErrorReason(s) != "other");
      CHECK(std::string(s.message()).rfind("fuzz.jpg: ", 0) == 0);
    }
  }
  CHECK(failures > 0);
  ExpectStillWorks(dec);
}

TEST_CASE("SampleDecoder: caller mistakes are InvalidArgument", "[image][decoder][errors]") {
  SampleDecoder dec(DecodeLimits{});
  TransformSpec spec;
  spec.image_size = 32;
  std::vector<uint8_t> out(spec.SampleBytes() - 1);
  SampleRng rng(0, 0, 0);
  CHECK(absl::IsInvalidArgument(dec.DecodeInto(GoodJpeg(), "a.jpg", spec, rng, out)));
  spec.image_size = 0;
  std::vector<uint8_t> none;
  CHECK(absl::IsInvalidArgument(dec.DecodeInto(GoodJpeg(), "a.jpg", spec, rng, none)));
}

TEST_CASE("ReadFileBytes: missing, empty and readable files", "[image][decoder][errors]") {
  ringloader::testing::TempDir dir;
  const absl::StatusOr<std::vector<uint8_t>> missing = ReadFileBytes(dir.Join("nope.jpg"));
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(ErrorReason(missing.status()) == "read_error");
  CHECK(std::string(missing.status().message()).find("nope.jpg") != std::string::npos);

  ringloader::testing::WriteFile(dir.Join("empty.jpg"), "");
  const absl::StatusOr<std::vector<uint8_t>> empty = ReadFileBytes(dir.Join("empty.jpg"));
  REQUIRE_FALSE(empty.ok());
  CHECK(ErrorReason(empty.status()) == "empty");

  const std::vector<uint8_t> jpeg = GoodJpeg();
  ringloader::testing::WriteFile(dir.Join("a.jpg"), std::string(jpeg.begin(), jpeg.end()));
  const absl::StatusOr<std::vector<uint8_t>> bytes = ReadFileBytes(dir.Join("a.jpg"));
  REQUIRE(bytes.ok());
  CHECK(*bytes == jpeg);
}

// `jpeg` without its header segments of marker FF <marker> (e.g. 0xDB: DQT, 0xC4: DHT) before the
// first SOS.
std::vector<uint8_t> WithoutSegments(const std::vector<uint8_t>& jpeg, uint8_t marker) {
  std::vector<uint8_t> out(jpeg.begin(), jpeg.begin() + 2);  // SOI
  size_t i = 2;
  while (i + 4 <= jpeg.size() && jpeg[i] == 0xFF && jpeg[i + 1] != 0xDA) {
    const size_t len = size_t{jpeg[i + 2]} << 8 | jpeg[i + 3];
    if (jpeg[i + 1] != marker) out.insert(out.end(), jpeg.begin() + i, jpeg.begin() + i + 2 + len);
    i += 2 + len;
  }
  out.insert(out.end(), jpeg.begin() + i, jpeg.end());
  return out;
}

struct Decoded {
  absl::Status status;
  std::vector<uint8_t> bytes;
};
Decoded DecodeSample(SampleDecoder& dec, const std::vector<uint8_t>& jpeg) {
  TransformSpec spec;
  spec.image_size = 32;
  Decoded d;
  d.bytes.resize(spec.SampleBytes());
  SampleRng rng(7, 0, 0);
  d.status = dec.DecodeInto(jpeg, "x.jpg", spec, rng, d.bytes);
  return d;
}

// Found by tests/fuzz: libjpeg keeps DQT/DHT tables across the images of one decompressor, so a
// file lacking a table decoded with the previous file's table on a worker's warm decoder.
TEST_CASE("SampleDecoder: a file lacking DQT or DHT tables never borrows the previous file's",
          "[image][decoder][errors]") {
  const std::vector<uint8_t> rgb = SmoothPattern(96, 64);
  const std::vector<uint8_t> q30 = EncodeJpeg(rgb, 96, 64, 30, TJSAMP_420);
  const std::vector<uint8_t> progressive = EncodeJpeg(rgb, 96, 64, 90, TJSAMP_420, true);
  const std::vector<uint8_t> q95 = EncodeJpeg(rgb, 96, 64, 95, TJSAMP_420);
  const std::vector<uint8_t> no_dqt = WithoutSegments(q95, 0xDB);
  const std::vector<uint8_t> no_dht = WithoutSegments(q95, 0xC4);
  REQUIRE(FindMarker(no_dqt, 0xDB) < 0);
  REQUIRE(FindMarker(no_dht, 0xC4) < 0);

  for (const std::vector<uint8_t>* lacking : {&no_dqt, &no_dht}) {
    SampleDecoder fresh_dec(DecodeLimits{});
    const Decoded fresh = DecodeSample(fresh_dec, *lacking);
    for (const std::vector<uint8_t>* before : {&q30, &progressive}) {
      SampleDecoder warm_dec(DecodeLimits{});
      REQUIRE(DecodeSample(warm_dec, *before).status.ok());
      const Decoded warm = DecodeSample(warm_dec, *lacking);
      INFO("fresh: " << fresh.status.ToString() << " warm: " << warm.status.ToString());
      CHECK(warm.status == fresh.status);
      if (fresh.status.ok()) CHECK(warm.bytes == fresh.bytes);
    }
  }
  // No DQT: an error of the file itself. No DHT: libjpeg's standard tables (what q95 used).
  SampleDecoder dec(DecodeLimits{});
  ExpectError(DecodeSample(dec, no_dqt).status, "x.jpg", "corrupt");
  const Decoded standard = DecodeSample(dec, q95);
  const Decoded implied = DecodeSample(dec, no_dht);
  REQUIRE(implied.status.ok());
  CHECK(implied.bytes == standard.bytes);
}

TEST_CASE("ErrorReason: reads the payload, 'other' when absent", "[image][decoder]") {
  CHECK(ErrorReason(absl::DataLossError("x")) == "other");
  CHECK(ErrorReason(WithReason(absl::DataLossError("x"), "corrupt")) == "corrupt");
  CHECK(ErrorReason(WithReason(absl::DataLossError("x"), "made_up")) == "other");
  CHECK(WithReason(absl::OkStatus(), "corrupt").ok());
}

}  // namespace
}  // namespace ringloader::image
