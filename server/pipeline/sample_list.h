// SPDX-License-Identifier: Apache-2.0
#pragma once
// The raw material of a Dataset while it is being built: relative paths packed into one blob plus
// end offsets (no std::string per sample, so a million samples cost ~1 allocation each array),
// labels and class names; for the container formats (webdataset, tfrecord) also where each
// sample's bytes are. Internal to server/pipeline.

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "server/pipeline/tensor_schema.h"

namespace ringloader::pipeline {

// A byte range of a file; a part a sample does not have (a WebDataset sample without a label
// member) is kMissing.
struct Extent {
  uint64_t offset = 0;
  uint64_t size = 0;
  static constexpr uint64_t kMissingOffset = ~uint64_t{0};
  bool missing() const { return offset == kMissingOffset; }
  bool operator==(const Extent&) const = default;
};

// Damage found while indexing a container file: the rest of that file is not in the index, or
// (rest_unread false) one member is not served or its sample fails when read.
struct IndexProblem {
  std::string file;  // relative to the root
  uint64_t offset = 0;
  std::string reason;   // image::ErrorReason
  std::string message;  // "<path>: offset N: <what>"
  bool rest_unread = true;
  bool operator==(const IndexProblem&) const = default;
};

// What a vector (or string) of `count` items of `item_bytes` each, with `capacity`, may hold once
// `more` items are added: its capacity, or the doubled one the additions could grow it to. For
// the memory holds of indexing (SampleList::CheckMemory, the shard scans).
inline uint64_t BytesAfterGrowth(uint64_t count, uint64_t more, uint64_t capacity,
                                 uint64_t item_bytes) {
  const uint64_t needed = count + more;
  return (needed > capacity ? 2 * needed : capacity) * item_bytes;
}

// Told what an index being built may hold (SampleList::CheckMemory); a non-OK status stops the
// indexing with it. The daemon's draws on its memory budget, so memory_limit bounds indexing too.
using IndexMemoryHold = std::function<absl::Status(uint64_t bytes)>;

struct SampleList {
  std::string path_blob;                 // all relative paths, concatenated
  std::vector<uint64_t> path_ends;       // end offset of sample i's path in path_blob
  std::vector<int64_t> labels;           // label of sample i
  std::vector<std::string> class_names;  // imagefolder only
  // Container formats (labels are then read with each sample, and `labels` holds -1):
  std::vector<std::string> files;     // shards / record files, relative to the root
  std::vector<uint32_t> sample_files;  // index into `files` of sample i
  uint32_t parts = 0;                  // extents per sample (see Dataset::part)
  std::vector<Extent> extents;         // sample i's parts: [i * parts, (i + 1) * parts)
  std::vector<TensorSchema> tensors;   // the extra tensors every sample has (see Dataset)
  std::vector<IndexProblem> problems;  // container formats: damage met while indexing
  // What the operator should know that is no sample's fault (a ragged tensor padded far beyond
  // its typical length): logged at start-up, printed by validate.
  std::vector<std::string> notes;
  // imagefolder: files in class folders without an image extension, and the first few of them
  // (relative paths, in listing order).
  static constexpr size_t kIgnoredExamples = 5;
  uint64_t ignored_count = 0;
  std::vector<std::string> ignored_examples;

  uint64_t size() const { return labels.size(); }
  // Every kMemoryCheckEvery samples (call it after each Add): tells `hold` what the list may hold
  // until the next check, its vectors' capacities doubled where the next kMemoryCheckEvery
  // samples could grow them. So the list never holds more than `hold` last agreed to.
  static constexpr uint64_t kMemoryCheckEvery = 4096;
  // `also_held`: what the indexer holds beside the list.
  absl::Status CheckMemory(const IndexMemoryHold& hold, uint64_t also_held = 0) const {
    if (!hold || size() % kMemoryCheckEvery != 0) return absl::OkStatus();
    return hold(HeapBytesAhead() + also_held);
  }
  uint64_t HeapBytesAhead() const;
  void Add(std::string_view relative_path, int64_t label) {
    path_blob.append(relative_path);
    path_ends.push_back(path_blob.size());
    labels.push_back(label);
  }
  std::string_view path(uint64_t i) const {
    const uint64_t begin = i == 0 ? 0 : path_ends[i - 1];
    return std::string_view(path_blob).substr(begin, path_ends[i] - begin);
  }
  // Drops spare capacity (vectors grow by doubling while listing).
  void Shrink() {
    path_blob.shrink_to_fit();
    path_ends.shrink_to_fit();
    labels.shrink_to_fit();
    sample_files.shrink_to_fit();
    extents.shrink_to_fit();
  }
};

// The per-sample arrays of a Dataset, immutable: views into storage they keep alive, either a
// SampleList's vectors (Adopt) or an index cache file mapped and used in place (index_cache.h),
// so a restart does not copy or parse a million entries. Cheap to copy; safe to share.
class SampleIndex {
 public:
  SampleIndex() = default;
  // Takes `list`'s per-sample arrays (path_blob, path_ends, labels, sample_files, extents) and
  // leaves the rest of it (classes, files, tensors, problems, ...) for the caller.
  static SampleIndex Adopt(SampleList& list);
  // Views over bytes `storage` keeps alive (a mapping). The caller has checked the invariants:
  // path_ends ascending, the last equal to path_blob.size(); sample_files empty or one per
  // sample; extents `parts` per sample.
  static SampleIndex View(std::shared_ptr<const void> storage, std::string_view path_blob,
                          std::span<const uint64_t> path_ends, std::span<const int64_t> labels,
                          std::span<const uint32_t> sample_files, uint32_t parts,
                          std::span<const Extent> extents, bool mapped);

  uint64_t size() const { return labels_.size(); }
  std::string_view path(uint64_t i) const {
    const uint64_t begin = i == 0 ? 0 : path_ends_[i - 1];
    return path_blob_.substr(begin, path_ends_[i] - begin);
  }
  int64_t label(uint64_t i) const { return labels_[i]; }
  uint32_t sample_file(uint64_t i) const { return sample_files_[i]; }
  uint32_t parts() const { return parts_; }
  Extent part(uint64_t i, uint32_t k) const { return extents_[i * parts_ + k]; }
  // The arrays as stored (index_cache.h writes them as they are).
  std::string_view path_blob() const { return path_blob_; }
  std::span<const uint64_t> path_ends() const { return path_ends_; }
  std::span<const int64_t> labels() const { return labels_; }
  std::span<const Extent> extents() const { return extents_; }
  std::span<const uint32_t> sample_files() const { return sample_files_; }
  // True when the arrays are a mapped index cache file (page cache, not heap).
  bool mapped() const { return mapped_; }
  // Bytes of the arrays (heap for an adopted list; mapped file pages otherwise).
  uint64_t Bytes() const;

 private:
  std::shared_ptr<const void> storage_;
  std::string_view path_blob_;
  std::span<const uint64_t> path_ends_;
  std::span<const int64_t> labels_;
  std::span<const uint32_t> sample_files_;
  uint32_t parts_ = 0;
  std::span<const Extent> extents_;
  bool mapped_ = false;
};

}  // namespace ringloader::pipeline
