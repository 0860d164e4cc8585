// SPDX-License-Identifier: Apache-2.0
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
//   payload, first the description (strings are a uint64 length + bytes):
//     string   key            (see ImageFolderKey, ContainerIndexKey)
//     uint64   sample_count, fingerprint (Dataset::fingerprint), path_blob_bytes, parts,
//              has_sample_files (1 for container formats, else 0)
//     uint64   class_count, then class_count strings
//     uint64   file_count, then file_count strings          (container formats; else 0)
//     uint64   tensor_count, then per tensor: string name, uint64 type, uint64 ragged,
//              uint64 rank, uint64 shape[rank]
//     uint64   problem_count, then per problem: string file, uint64 offset, uint64 rest_unread,
//              string reason, string message
//     uint64   ignored_count, uint64 example_count, then example_count strings (imagefolder)
//     uint64   note_count, then note_count strings
//   zero bytes up to a file offset that is a multiple of 8, then the per-sample arrays, used in
//   place from a read-only mapping of the file (so a restart's cost does not grow with them):
//     uint64   path_ends[sample_count]       end of sample i's path in path_blob
//     int64    labels[sample_count]
//     Extent   extents[sample_count * parts] (uint64 offset, uint64 size)
//     uint32   sample_files[sample_count]    (only with has_sample_files)
//     char     path_blob[path_blob_bytes]    every relative path, concatenated
// A file whose header, checksum, key or contents do not check out is ignored (and then replaced):
// the cache is never trusted beyond what it proves. Loading maps the file, hashes it (XXH3, a
// few ms for ImageNet's 50 MB) and checks the arrays' invariants in one pass; the arrays are not
// copied (the description's strings are). The daemon replaces the file only by rename, so a
// mapping keeps its bytes; nothing else may write a state_dir file in place (a mapped file that
// shrinks would fault the reader), and state_dir belongs on a local disk.

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

inline constexpr uint32_t kIndexCacheVersion = 5;  // bump on ANY format change above

// `kind`: "imagefolder", "webdataset", "tfrecord"; `identity`: the absolute root or pattern.
std::string IndexCachePath(const std::string& state_dir, const std::string& kind,
                           const std::string& identity);

// A valid cache file, mapped.
struct CachedIndex {
  SampleList description;  // all but the per-sample arrays (which are empty here)
  SampleIndex samples;     // the per-sample arrays, in place in the mapped file
  uint64_t fingerprint = 0;
};

// The cached index if `path` holds a valid cache for exactly `key`, else nullopt.
std::optional<CachedIndex> LoadIndexCache(const std::string& path, const std::string& key);

// Writes the cache atomically (temp file in the same directory, fsync, rename), creating
// `state_dir` if needed. Errors are returned for the caller to ignore or report; a missing cache
// only costs a walk.
// `description` supplies everything but the per-sample arrays, which come from `samples`.
absl::Status SaveIndexCache(const std::string& path, const std::string& key,
                            const SampleList& description, const SampleIndex& samples,
                            uint64_t fingerprint);

}  // namespace ringloader::pipeline
