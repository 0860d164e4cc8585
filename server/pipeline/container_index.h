// SPDX-License-Identifier: Apache-2.0
#pragma once
// Finding and indexing the files of the container formats (see dataset.h). Internal to
// server/pipeline.

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

struct ShardFiles {
  std::string root;                // absolute; relative names below are relative to it
  std::vector<std::string> files;  // sorted bytewise
};

// `pattern`: a directory (searched recursively; with `extension` only files ending in it,
// hidden names skipped), a glob ("*", "?", "[...]") or a brace pattern ("{000..146}" numeric
// ranges keeping the zero padding, "{a,b}" alternatives), expanded in that order. A brace
// expansion that names a missing file is NotFound naming it; no files at all is NotFound.
absl::StatusOr<ShardFiles> ResolveShardFiles(const std::string& pattern,
                                             const std::string& extension);

// The index cache key of `files`: the format's options, each file's name, size and mtime.
// `newest_mtime_ns` receives the newest mtime (see the racy-write rule in dataset.cc).
absl::StatusOr<std::string> ContainerIndexKey(const DatasetSpec& spec, const ShardFiles& files,
                                              int64_t* newest_mtime_ns);

// One small read per member (record) and, for .npy members, one per tensor header.
absl::StatusOr<SampleList> IndexWebDataset(const DatasetSpec& spec, const ShardFiles& files);
absl::StatusOr<SampleList> IndexTfRecords(const DatasetSpec& spec, const ShardFiles& files);

// The NAME.npy files of `root` (not recursive): one header read each. Errors name the file: an
// unsupported dtype, first dimensions that disagree (naming both files), a label column that is
// not an integer per row.
absl::StatusOr<SampleList> IndexArrays(const DatasetSpec& spec, std::vector<ArrayColumn>* columns);

}  // namespace ringloader::pipeline
