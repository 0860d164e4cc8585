// SPDX-License-Identifier: Apache-2.0
#pragma once
// The --samples-out format of `ringloaderctl consume` (a contract: tests compare these files to
// check exactly-once delivery and byte-determinism). One line per delivered sample, in delivery
// order, fields separated by one tab:
//
//   epoch <TAB> sequence <TAB> sample_index <TAB> label <TAB> relative_path <TAB> digest <LF>
//
// epoch and sequence are the batch's position (sequence = batch index within the epoch for this
// rank), sample_index the dataset index, label the int64 label, relative_path the path under the
// dataset root ("-" when the daemon did not send paths; "SHARD#KEY" for WebDataset, "FILE#N"
// for TFRecord, "#ROW" for arrays), digest = 16 lowercase hex digits of XXH64 (seed 0) of the
// sample's bytes in every tensor of the batch but labels and indices, in the batch's tensor
// order (for an image dataset without extra tensors: of its output image bytes).

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "client/client.h"

namespace ringloader::ctl {

// XXH64 with seed 0 of `bytes`.
uint64_t SampleDigest(std::span<const uint8_t> bytes);
// The digest of sample `i` of `batch` (see the top of this file).
uint64_t SampleDigest(const client::Batch& batch, uint32_t i);

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
