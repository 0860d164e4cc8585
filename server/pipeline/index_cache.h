#pragma once
// The index cache of imagefolder, webdataset and tfrecord datasets: one file per dataset in the
// daemon's state dir, so a restart reopens a 1M-file tree (or 1,000 shards) without walking or
// scanning it. Internal to server/pipeline.
//
// File name: <state_dir>/<format>-<XXH3-64 of the absolute root or pattern, 16 hex digits>.index
// On-disk format (little-endian as written by this host; the cache is local and disposable):
//   header (32 bytes):
//     char     magic[8]       "RLINDEX\0"
//     uint32_t version        kIndexCacheVersion
//     uint32_t reserved       0
//     uint64_t payload_bytes
//     uint64_t payload_xxh3   XXH3-64 of the payload
//   payload:
//     string   key            (uint64 length + bytes; see ImageFolderKey)
//     uint64   class_count, then class_count strings
//     uint64   sample_count
//     string   path_blob
//     uint64   path_ends[sample_count]
//     int64    labels[sample_count]
//     uint64   file_count, then file_count strings          (container formats; else 0)
//     uint32   sample_files[sample_count or 0]
//     uint64   parts, then extents[sample_count * parts] as (uint64 offset, uint64 size)
//     uint64   tensor_count, then per tensor: string name, uint64 type, uint64 ragged,
//              uint64 rank, uint64 shape[rank]
//     uint64   problem_count, then per problem: string file, uint64 offset, string reason,
//              string message
//     uint64   ignored_count, uint64 example_count, then example_count strings (imagefolder)
// A file whose header, checksum, key or contents do not check out is ignored (and then replaced):
// the cache is never trusted beyond what it proves.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

inline constexpr uint32_t kIndexCacheVersion = 3;  // bump on ANY format change above

// `kind`: "imagefolder", "webdataset", "tfrecord"; `identity`: the absolute root or pattern.
std::string IndexCachePath(const std::string& state_dir, const std::string& kind,
                           const std::string& identity);

// The cached list if `path` holds a valid cache for exactly `key`, else nullopt.
std::optional<SampleList> LoadIndexCache(const std::string& path, const std::string& key);

// Writes the cache atomically (temp file in the same directory, fsync, rename), creating
// `state_dir` if needed. Errors are returned for the caller to ignore or report; a missing cache
// only costs a walk.
absl::Status SaveIndexCache(const std::string& path, const std::string& key,
                            const SampleList& list);

}  // namespace ringloader::pipeline
