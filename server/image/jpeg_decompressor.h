// SPDX-License-Identifier: Apache-2.0
#pragma once
// libjpeg's decompressor behind calls that return instead of jumping.
//
// libjpeg reports a fatal error by calling error_exit, which must not return; ours longjmps back
// to a setjmp. Every method below that calls libjpeg holds its own setjmp around exactly one
// libjpeg call sequence, with nothing in its frame that a longjmp could skip destroying, so the
// code that uses this class is ordinary C++ (vectors, Status, lambdas) with no jumps through it.
// Warnings (truncated data, grey fill) fail the same way when warnings_are_errors is set; the
// progress monitor fails a decode past its deadline or beyond max_scans.
//
// Internal to ringloader_image: SampleDecoder's building block.

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>

#include <jpeglib.h>  // after <cstddef> and <cstdio>: it needs size_t and FILE

namespace ringloader::image {

// Why the last call failed.
struct JpegFailure {
  const char* reason = "other";  // see ErrorReason (sample_decoder.h)
  int msg_code = 0;              // libjpeg's J_MESSAGE_CODE, 0 for our own limits
  char message[JMSG_LENGTH_MAX] = {};
  // libjpeg refused a partial-decode request (crop, skip) rather than the data: a full decode
  // is worth a try.
  bool IsApiRefusal() const;
};

class JpegDecompressor {
 public:
  JpegDecompressor(bool warnings_are_errors, uint32_t max_scans);
  ~JpegDecompressor();
  JpegDecompressor(const JpegDecompressor&) = delete;
  JpegDecompressor& operator=(const JpegDecompressor&) = delete;

  void set_warnings_are_errors(bool on) { err_.warnings_are_errors = on; }
  bool warnings_are_errors() const { return err_.warnings_are_errors; }
  void set_max_scans(uint32_t scans) { progress_.max_scans = scans; }
  // steady_clock nanoseconds; INT64_MAX = none.
  void set_deadline_ns(int64_t deadline_ns) { progress_.deadline_ns = deadline_ns; }

  // Each call below returns false when libjpeg failed or a limit fired: failure() says why, and
  // the decompressor has been aborted (the next file starts with ReadHeader).

  // A new decompressor reading the header of `jpeg` (which must outlive the decode). New for
  // every file: libjpeg keeps DQT/DHT tables across images in one decompressor (for abbreviated
  // datastreams), so a file lacking a table would decode with the previous file's on a warm
  // decoder and fail on a fresh one: a sample's bytes would depend on what the thread decoded
  // before (found by tests/fuzz). Costs a few small allocations.
  bool ReadHeader(std::span<const uint8_t> jpeg);
  // Caps libjpeg's allocations for the rest of this file (0 = no cap). After ReadHeader.
  void set_memory_cap(uint64_t bytes);
  // Sets output_width/height for DCT scaling by 1/scale_denom (1, 2, 4, 8).
  bool CalcOutputDimensions(unsigned scale_denom);
  // Whether the coefficients of the whole image are buffered (progressive or multi-scan).
  bool HasMultipleScans(bool* multiple);
  // Starts decompressing; decodes only columns [*xoff, *xoff + *xwidth) when narrower than the
  // output (libjpeg widens them to iMCU boundaries and says so through both pointers), and skips
  // the first `skip_rows` rows.
  bool Start(JDIMENSION* xoff, JDIMENSION* xwidth, JDIMENSION skip_rows);
  // Reads up to `max_rows` rows into `rows`; *got says how many.
  bool ReadScanlines(JSAMPROW* rows, JDIMENSION max_rows, JDIMENSION* got);
  // After the last row: checks the rest of the file.
  bool Finish();
  // Stops early (or after a header-only read). Safe in any state.
  void Abort();
  // After rows were read but before the last one: *missing is true if the file's data has no EOI
  // marker left to read, i.e. it was cut short where a full decode would say "truncated".
  bool FindEoi(bool* missing);

  const jpeg_decompress_struct& info() const { return cinfo_; }
  void set_out_color_space(J_COLOR_SPACE space) { cinfo_.out_color_space = space; }
  const JpegFailure& failure() const { return err_.failure; }

  // libjpeg's error manager, with the jump target and what failed. `pub` must stay first.
  struct ErrorManager {
    jpeg_error_mgr pub;
    std::jmp_buf jump;
    bool warnings_are_errors;
    JpegFailure failure;
  };
  // libjpeg's progress monitor with our limits. `pub` must stay first.
  struct ProgressMonitor {
    jpeg_progress_mgr pub;
    ErrorManager* err;
    uint32_t max_scans;
    int64_t deadline_ns;
  };

 private:
  void Arm();    // clears the failure before a guarded call
  bool Fail();   // after a longjmp: aborts, returns false
  void Recreate();

  jpeg_decompress_struct cinfo_{};
  ErrorManager err_{};
  ProgressMonitor progress_{};
  bool created_ = false;
  std::span<const uint8_t> jpeg_;
};

}  // namespace ringloader::image
