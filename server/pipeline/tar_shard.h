// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tar shards, as WebDataset writes them (POSIX ustar, with GNU long names and pax headers read):
// a sequence of 512-byte headers, each followed by its member's data padded to 512 bytes, ended
// by two zero blocks. Scanning reads only the headers (seeking past the data), so indexing a
// shard costs one small read per member; members are then read by offset.
//
// WebDataset groups members into samples by key: the member's path up to the first '.' of its
// basename ("a/b/0001.seg.png" has key "a/b/0001" and extension "seg.png"). A sample is the run
// of consecutive members with one key.
//
// Damage is reported like TFRecord's: DataLoss "<path>: offset <N>: <what>" with reason
// "corrupt" (a header checksum that does not add up: the rest of the shard cannot be trusted)
// or "truncated" (a member cut short by the end of the file).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace ringloader::pipeline {

struct TarMember {
  std::string path;     // as stored (a pax "path" or GNU long name when present)
  uint64_t offset = 0;  // of the data
  uint64_t size = 0;
};

struct TarScan {
  std::vector<TarMember> members;  // regular files only, in shard order
  absl::Status stopped;            // why the scan ended before the end marker; OK otherwise
};

// Fails only when the file cannot be opened or read; damage inside is reported in `stopped`.
// A member of any size whose header is intact and whose data lies inside the file is listed (its
// data is never read here; a sample's reader bounds what it reads: max_file_bytes and the like).
// `hold` (optional) is told, every 4,096 members, what the member list may hold by the next
// time; its error stops the scan with it (a shard of millions of empty members against the
// daemon's memory_limit).
absl::StatusOr<TarScan> ScanTarShard(
    const std::string& path, const std::function<absl::Status(uint64_t bytes)>& hold = {});

// One WebDataset sample: its key and its members (indices into TarScan::members) by extension.
struct WebDatasetSample {
  std::string key;
  std::vector<std::pair<std::string, uint32_t>> members;  // (extension, member index)
};
// Groups consecutive members by key. A key that comes back after another key is a new sample
// (as webdataset does).
std::vector<WebDatasetSample> GroupWebDatasetSamples(const std::vector<TarMember>& members);

// Appends one member (a ustar header, the data, padding) to `out`; AppendTarEnd the end marker.
// For writers (make-dataset, convert) and tests. Paths up to 100 bytes.
void AppendTarMember(const std::string& path, const std::string& data, std::string& out);
void AppendTarEnd(std::string& out);

}  // namespace ringloader::pipeline
