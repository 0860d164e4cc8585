// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: decode + augment of one sample, as a decode worker does it.
//
// Input: one control byte, then the bytes of the file (any format: the decoder tells JPEG, PNG,
// WebP, BMP and PPM/PGM by content). The control byte picks
//   bit 0     augment: 0 train (random crop + flip), 1 eval (resize + center crop)
//   bit 1     dtype: 0 uint8, 1 float32 (normalised)
//   bit 2     layout: 0 NHWC, 1 NCHW
//   bits 3-4  image_size: 32, 24, 9 or 1
//   bit 5     warnings_are_errors: 0 true (the default), 1 false (libjpeg's grey fill goes on)
//   bit 6     also run DecodeRgb (the full-size decode `ringloaderctl validate` uses)
//   bit 7     the seed of the sample's random stream (the train crop)
// Seed files in corpus/decode are such inputs (make_corpus.cc writes the JPEGs,
// make_raster_corpus.py the other formats).
//
// Besides "no crash, no leak, no undefined behaviour", each input checks the decoder's contract:
//   - a failure is DataLoss (bad data) or ResourceExhausted, its message starts with the path,
//     and it carries one of the documented reasons;
//   - a sample's bytes do not depend on what the decoder decoded before nor on the CPU: a
//     long-lived decoder (state reused across inputs, as in a worker thread) using the best
//     resampling kernels and a fresh one using the kernels picked by the input's length mod 3
//     (scalar, SSE2, SSSE3; they are bit-exact by contract) give the same status and bytes;
//   - float32 output is finite.
// Limits are small (max_pixels 4,000,000, max_scans 64) so one input cannot allocate gigabytes or
// spin for long.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "server/image/resample.h"
#include "server/image/sample_decoder.h"
#include "server/image/transform.h"

namespace {

using ringloader::image::Augment;
using ringloader::image::DecodeLimits;
using ringloader::image::DType;
using ringloader::image::ErrorReason;
using ringloader::image::Layout;
using ringloader::image::SampleDecoder;
using ringloader::image::SampleRng;
using ringloader::image::TransformSpec;

constexpr std::string_view kPath = "fuzz.jpg";
constexpr uint32_t kImageSizes[] = {32, 24, 9, 1};

DecodeLimits Limits(bool warnings_are_errors) {
  DecodeLimits limits;
  limits.max_pixels = 4'000'000;
  limits.max_scans = 64;
  limits.warnings_are_errors = warnings_are_errors;
  return limits;
}

[[noreturn]] void Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "decode_fuzzer: contract violated: %s (status: %s)\n", what,
               status.ToString().c_str());
  std::abort();
}

void CheckError(const absl::Status& status) {
  if (status.ok()) return;
  if (status.code() != absl::StatusCode::kDataLoss &&
      status.code() != absl::StatusCode::kResourceExhausted) {
    Fail("a bad file must be DataLoss (or ResourceExhausted)", status);
  }
  const std::string_view message(status.message().data(), status.message().size());
  if (message.substr(0, kPath.size()) != kPath)
    Fail("error message must start with the path", status);
  if (status.code() == absl::StatusCode::kDataLoss && ErrorReason(status) == "other" &&
      message.find(": other: ") == std::string_view::npos) {
    Fail("DataLoss without a documented reason payload", status);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t control = data[0];
  const std::span<const uint8_t> jpeg(data + 1, size - 1);

  TransformSpec spec;
  spec.augment = (control & 1) ? Augment::kEval : Augment::kTrain;
  spec.dtype = (control & 2) ? DType::kFloat32 : DType::kUint8;
  spec.layout = (control & 4) ? Layout::kNCHW : Layout::kNHWC;
  spec.image_size = kImageSizes[(control >> 3) & 3];
  const bool warnings_are_errors = (control & 32) == 0;
  const bool decode_rgb = (control & 64) != 0;
  const uint64_t seed = control >> 7;

  // One long-lived decoder per setting, like a worker thread's, plus a fresh one per input.
  static SampleDecoder* reused[2] = {new SampleDecoder(Limits(true)),
                                     new SampleDecoder(Limits(false))};
  SampleDecoder& warm = *reused[warnings_are_errors ? 0 : 1];
  SampleDecoder fresh(Limits(warnings_are_errors));

  // Exactly SampleBytes(), each in its own heap block, so ASan sees any write past the sample.
  std::vector<uint8_t> out_warm(spec.SampleBytes(), 0xA5);
  std::vector<uint8_t> out_fresh(spec.SampleBytes(), 0x5A);
  SampleRng rng_warm(seed, 0, 0);
  SampleRng rng_fresh(seed, 0, 0);
  const int best_isa = ringloader::image::SetResampleIsaForTesting(2);
  const absl::Status s_warm = warm.DecodeInto(jpeg, kPath, spec, rng_warm, out_warm);
  ringloader::image::SetResampleIsaForTesting(static_cast<int>(size % 3));
  const absl::Status s_fresh = fresh.DecodeInto(jpeg, kPath, spec, rng_fresh, out_fresh);
  ringloader::image::SetResampleIsaForTesting(best_isa);
  CheckError(s_warm);
  CheckError(s_fresh);
  if (s_warm != s_fresh) {
    std::fprintf(stderr, "decode_fuzzer: fresh decoder: %s\n", s_fresh.ToString().c_str());
    Fail("a reused decoder and a fresh one disagree on the status", s_warm);
  }
  if (s_warm.ok()) {
    if (out_warm != out_fresh) {
      Fail("a reused decoder and a fresh one wrote different bytes", s_warm);
    }
    if (spec.dtype == DType::kFloat32) {
      for (size_t i = 0; i < out_warm.size(); i += sizeof(float)) {
        float v;
        std::memcpy(&v, out_warm.data() + i, sizeof v);
        if (!std::isfinite(v)) Fail("float32 output is not finite", s_warm);
      }
    }
  }

  auto info = warm.ReadInfo(jpeg, kPath);
  CheckError(info.status());
  if (info.ok() && (info->width <= 0 || info->height <= 0 ||
                    uint64_t(info->width) * uint64_t(info->height) > Limits(true).max_pixels)) {
    Fail("ReadInfo accepted an image outside the limits", info.status());
  }

  if (decode_rgb) {
    ringloader::image::ImageInfo rgb_info;
    auto rgb = warm.DecodeRgb(jpeg, kPath, &rgb_info);
    CheckError(rgb.status());
    if (rgb.ok() && rgb->size() != size_t(rgb_info.width) * size_t(rgb_info.height) * 3) {
      Fail("DecodeRgb returned the wrong number of bytes", rgb.status());
    }
  }
  return 0;
}
