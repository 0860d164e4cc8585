#pragma once
// The --samples-out format of `ringloaderctl consume` (a contract: tests compare these files to
// check exactly-once delivery and byte-determinism). One line per delivered sample, in delivery
// order, fields separated by one tab:
//
//   epoch <TAB> sequence <TAB> sample_index <TAB> label <TAB> relative_path <TAB> digest <LF>
//
// epoch and sequence are the batch's position (sequence = batch index within the epoch for this
// rank), sample_index the dataset index, label the int64 label, relative_path the path under the
// dataset root ("-" when the daemon did not send paths), digest = 16 lowercase hex digits of
// XXH64 (seed 0) of the sample's output image bytes.

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ringloader::ctl {

// XXH64 with seed 0 of `bytes`.
uint64_t SampleDigest(std::span<const uint8_t> bytes);

// `digest` as exactly 16 lowercase hex digits.
std::string FormatDigest(uint64_t digest);

struct SampleRecord {
  uint64_t epoch = 0;
  uint64_t sequence = 0;
  int64_t sample_index = 0;
  int64_t label = 0;
  std::string_view relative_path;
  uint64_t digest = 0;
};

// One line, with its trailing '\n'. The path is escaped as wire::EscapeBytes does (tabs, newlines,
// control bytes and bytes that are not UTF-8 as \t \n \xNN, a backslash as \\), so a line always
// has exactly six fields and the path's bytes can be recovered exactly.
std::string FormatSampleLine(const SampleRecord& record);

}  // namespace ringloader::ctl
