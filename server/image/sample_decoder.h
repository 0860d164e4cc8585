// SPDX-License-Identifier: Apache-2.0
#pragma once
// Decodes one image and writes one transformed sample straight into its place in a batch. The
// format is told by the file's content (image_format.h): JPEG as below; PNG, WebP, BMP and
// PPM/PGM decoded whole by their libraries (raster_codec.h), then through the same crop, resize
// and output code.
//
// One SampleDecoder per worker thread (decoder state is not shared; no locks on the hot path).
// Decoding reads only what the output needs: the header first (dimensions checked against
// max_pixels before any allocation), then libjpeg's DCT scaling by 1/2, 1/4 or 1/8 where the
// scaled crop still covers the output resolution, and only the crop's rows and columns
// (jpeg_crop_scanline / jpeg_skip_scanlines). Grayscale, CMYK/YCCK (Adobe-inverted or not) and
// progressive JPEGs all come out as RGB. Resampling is antialiased (triangle filter widened by the
// scale factor when downscaling, as PIL does).
//
// Errors belong to the sample: every failure is a Status whose message starts with the sample's
// path and carries libjpeg's message, "<path>: <reason>: <libjpeg message>", with the reason also
// attached as a payload (ErrorReason). Bad image data is DataLoss whatever the reason;
// a caller's mistake (wrong output size, image_size 0) is InvalidArgument with reason "other".
// libjpeg's default error handler (which calls exit()) is never used. Nothing throws.
//
// Truncation: a decode that stops after the crop's last row still reports a file whose JPEG data
// has no EOI marker as "truncated" (when warnings_are_errors), so a cut file fails the same way
// whatever crop was drawn.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/image/sample_file.h"
#include "server/image/transform.h"

namespace ringloader::image {

struct DecodeLimits {
  // The defaults of the daemon's [[datasets]] keys and of `ringloaderctl validate` (one set).
  uint64_t max_pixels = 40'000'000;   // width x height above this is refused before decoding
  uint64_t max_file_bytes = kDefaultMaxFileBytes;  // larger files are refused unread
  bool warnings_are_errors = true;    // libjpeg warnings (e.g. truncated data, grey fill) fail
  uint32_t max_scans = 500;           // progressive scan bound (a crafted file cannot spin)
};

// A short machine-readable reason for a failed sample; the Status message carries the details.
// Reasons: "read_error", "empty", "not_image" (content of no format we read), "not_jpeg" (a
// JPEG signature libjpeg refuses), "too_large", "truncated", "corrupt",
// "unsupported", "too_many_scans", "quarantined", "not_regular_file", "deadline_exceeded",
// "crc_mismatch" (a container's checksum), "io_error" (an I/O error that may pass, still failing
// after server.io_retry_ms of retries), "other".
// The reason is attached to failed Statuses as the payload "ringloader.reason".
std::string_view ErrorReason(const absl::Status& status);
// Every reason above, for reports that list each one even at 0 (metrics).
inline constexpr std::string_view kErrorReasons[] = {
    "read_error",       "empty",           "not_image",        "not_jpeg",         "too_large",
    "truncated",        "corrupt",         "unsupported",      "too_many_scans",
    "quarantined",      "not_regular_file", "deadline_exceeded", "crc_mismatch",
    "io_error",         "other"};
absl::Status WithReason(absl::Status status, std::string_view reason);

// I/O errors that may pass (a flaky disk or network mount, a process or system out of file
// descriptors or memory): EIO, EMFILE, ENFILE, ENOMEM, EAGAIN, ESTALE, ETIMEDOUT, ENOBUFS, and
// a buffer that could not be allocated. Readers mark them (payload "ringloader.transient"); the
// pipeline retries them with backoff before it calls the sample bad (pipeline::SampleReader).
bool IsTransientErrno(int err);
absl::Status MarkTransient(absl::Status status);
// MarkTransient when `err` may pass; EIO, ESTALE and ETIMEDOUT are marked as the storage's
// failures (IsStorageFailure), the others (out of descriptors or memory) as this process's.
absl::Status MarkTransientErrno(absl::Status status, int err);
bool IsTransient(const absl::Status& status);
// A transient error the storage gave (EIO, ESTALE, ETIMEDOUT: a soft mount whose server is gone),
// not this process running short: only those can be an outage to wait out (IoRetryBudget).
bool IsStorageFailure(const absl::Status& status);

// What the last DecodeInto did, for tests and benchmarks (not part of the data contract).
struct DecodeStats {
  int32_t scale_denom = 0;   // DCT scaling used: 1, 2, 4 or 8
  int32_t scaled_width = 0;  // libjpeg's output size at that scale
  int32_t scaled_height = 0;
  int32_t decoded_x = 0;              // first decoded column (scaled; after jpeg_crop_scanline)
  int32_t decoded_width = 0;          // columns decoded per row
  int32_t decoded_y = 0;              // rows skipped before the first decoded row
  int32_t decoded_rows = 0;           // rows decoded
  bool full_decode_fallback = false;  // crop/skip refused by libjpeg; decoded the whole image
};

// What decoding one image into a sample needs beyond its file bytes, known from its header before
// any pixel is decoded (the daemon reserves it from memory_limit first; see PlanDecode).
struct DecodePlan {
  // libjpeg's own allocations: the whole-image coefficient buffers of progressive and multi-scan
  // images (2 bytes per pixel per component), row buffers, tables. DecodeInto caps libjpeg here.
  uint64_t libjpeg_bytes = 0;
  uint64_t scratch_bytes = 0;  // the decoder's own row buffers for this image
  uint64_t bytes() const { return libjpeg_bytes + scratch_bytes; }
};

struct ImageInfo {
  int32_t width = 0;
  int32_t height = 0;
  int32_t components = 0;  // 1 gray, 3 YCbCr/RGB, 4 CMYK/YCCK
  bool progressive = false;
};

class SampleDecoder {
 public:
  explicit SampleDecoder(DecodeLimits limits);
  // Limits for the following samples (datasets may differ; see pipeline::FillRequest::limits).
  void set_limits(const DecodeLimits& limits);
  const DecodeLimits& limits() const { return limits_; }
  ~SampleDecoder();
  SampleDecoder(const SampleDecoder&) = delete;
  SampleDecoder& operator=(const SampleDecoder&) = delete;

  // Header only. `path` is used in error messages.
  absl::StatusOr<ImageInfo> ReadInfo(std::span<const uint8_t> jpeg, std::string_view path);

  // The plan for decoding the image whose header is in `head` (the file's first bytes or all of
  // them) into a sample of `spec`. Fails like DecodeInto for a bad header (or one cut off by the
  // end of `head`: the caller then falls back to WorstCasePlan). Uses a decompressor of its own,
  // so it may run on any thread.
  static absl::StatusOr<DecodePlan> PlanFromHeader(std::span<const uint8_t> head,
                                                   std::string_view path,
                                                   const DecodeLimits& limits,
                                                   const TransformSpec& spec);
  // An upper bound for any image the limits admit (max_pixels, 4 components, multi-scan).
  static DecodePlan WorstCasePlan(const DecodeLimits& limits, const TransformSpec& spec);

  // Caps libjpeg's memory in the following decodes (0 = no cap): an image that needs more fails
  // ("too_large") instead of growing the process. The daemon passes DecodePlan::libjpeg_bytes.
  void set_memory_cap(uint64_t libjpeg_bytes) { memory_cap_ = libjpeg_bytes; }
  // Decodes running past `deadline` fail with reason "deadline_exceeded" (checked by libjpeg's
  // progress monitor, between scans and row groups). time_point::max() = none.
  void set_deadline(std::chrono::steady_clock::time_point deadline);

  // Decodes `jpeg`, applies `spec` with randomness from `rng` (train crop + flip), and writes
  // exactly spec.SampleBytes() bytes into `out` (HWC or CHW for this one sample).
  // REQUIRES: out.size() == spec.SampleBytes().
  absl::Status DecodeInto(std::span<const uint8_t> jpeg, std::string_view path,
                          const TransformSpec& spec, SampleRng& rng, std::span<uint8_t> out);

  // Full-size RGB decode (tests, validate): returns width*height*3 bytes. `info` may be null.
  absl::StatusOr<std::vector<uint8_t>> DecodeRgb(std::span<const uint8_t> jpeg,
                                                 std::string_view path, ImageInfo* info);

  // For tests and benchmarks: what the last successful DecodeInto decoded.
  const DecodeStats& last_decode() const { return last_decode_; }
  int32_t last_scale_denom() const { return last_decode_.scale_denom; }

 private:
  struct State;  // libjpeg decompressor, error manager, scratch buffers (reused across samples)
  std::unique_ptr<State> state_;
  DecodeLimits limits_;
  DecodeStats last_decode_;
  uint64_t memory_cap_ = 0;
};

}  // namespace ringloader::image
