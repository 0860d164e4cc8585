// SPDX-License-Identifier: Apache-2.0
#pragma once
// Writes an imagefolder (a pipeline::Dataset) out in the other formats the daemon reads, for
// `ringloaderctl make-dataset` and `ringloaderctl convert`. The daemon's readers rely on exactly
// these conventions; sample i of every format is sample i of the imagefolder (Dataset order:
// class, then path).
//
// webdataset: DIR/shard-000000.tar, shard-000001.tar, ..., `shard_size` samples each, each ended
//   by the tar end marker. A sample's members, in this order: KEY.jpg (the file's exact bytes),
//   KEY.cls (the label in decimal, no newline), KEY.json ({"label": N, "path": "<relative
//   path>"}) and, with `depth`, KEY.depth.npy (DepthBytes(i) as a float32 [8, 8] .npy).
//   KEY = the relative path without its extension ("class_03/img_000012").
// tfrecord: DIR/shard-000000.tfrecord, ..., `shard_size` records each; record i is a
//   tf.train.Example (pipeline::MakeExampleRecord, default ExampleKeys) of (the file's bytes,
//   label + label_base).
// arrays: DIR/images.npy uint8 [N, S, S, 3] (each JPEG through SampleDecoder::DecodeInto: eval
//   transform, uint8, NHWC, fast resize, SampleRng(0, 0, i)), DIR/labels.npy int64 [N],
//   DIR/depth.npy float32 [N, 8, 8] (DepthBytes(i) per row).
//
// Files are read one at a time and every output file is streamed into a temporary beside its
// final name ("NAME.tmp.<pid>"), then fsynced and renamed: memory stays bounded by about one
// sample, and a crash never leaves a partial file under a final name. Errors name the file.

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/pipeline/dataset.h"

namespace ringloader::ctl {

enum class ShardFormat { kWebDataset, kTfRecord };

// "shard-000003.tar" / "shard-000003.tfrecord".
std::string ShardFileName(ShardFormat format, uint64_t shard);

struct ShardWriteOptions {
  ShardFormat format = ShardFormat::kWebDataset;
  std::string out_dir;          // must exist
  uint32_t shard_size = 1000;   // samples per shard; > 0
  int64_t label_base = 0;       // tfrecord only: added to every label
  bool depth = false;           // webdataset only: also write KEY.depth.npy (make-dataset)
};

// Returns the number of shards written. Fails (naming the file) when a source file cannot be
// read, when a webdataset key would not survive the tar format (a '.' in the file name before
// its extension, a member path over 100 bytes), or on a write error; then the shards this call
// wrote are removed again, so a failed run leaves no dataset that looks complete.
absl::StatusOr<uint64_t> WriteShards(const pipeline::Dataset& dataset,
                                     const ShardWriteOptions& options);

// The first (by name) shard-*.tar or shard-*.tfrecord file in `dir`, as a path; empty when there
// is none or `dir` does not exist. Writers refuse such a directory: old shards past the new last
// one would silently join the dataset.
absl::StatusOr<std::string> FindShardFile(const std::string& dir);

struct ArraysWriteOptions {
  std::string out_dir;       // must exist
  uint32_t image_size = 32;  // S; > 0
};
// Writes images.npy, labels.npy and depth.npy, each atomically, images.npy renamed last. Fails
// naming the file when a source file cannot be read or decoded, or on a write error.
absl::Status WriteArrays(const pipeline::Dataset& dataset, const ArraysWriteOptions& options);

// Sample `index`'s depth map: float32 [8, 8] little-endian, element (y, x) =
// float(index % 97) + 0.01f * y + 0.001f * x (a known value per sample for the daemon's tests).
std::string DepthBytes(uint64_t index);

}  // namespace ringloader::ctl
