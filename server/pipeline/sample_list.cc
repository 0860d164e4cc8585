// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/sample_list.h"

#include <utility>

namespace ringloader::pipeline {
namespace {

// What an adopted SampleList's views point into.
struct AdoptedArrays {
  std::string path_blob;
  std::vector<uint64_t> path_ends;
  std::vector<int64_t> labels;
  std::vector<uint32_t> sample_files;
  std::vector<Extent> extents;
};

}  // namespace

SampleIndex SampleIndex::Adopt(SampleList& list) {
  list.Shrink();
  auto arrays = std::make_shared<AdoptedArrays>();
  arrays->path_blob = std::move(list.path_blob);
  arrays->path_ends = std::move(list.path_ends);
  arrays->labels = std::move(list.labels);
  arrays->sample_files = std::move(list.sample_files);
  arrays->extents = std::move(list.extents);
  list.path_blob.clear();
  list.path_ends.clear();
  list.labels.clear();
  list.sample_files.clear();
  list.extents.clear();
  const AdoptedArrays& a = *arrays;
  return View(std::move(arrays), a.path_blob, a.path_ends, a.labels, a.sample_files, list.parts,
              a.extents, /*mapped=*/false);
}

SampleIndex SampleIndex::View(std::shared_ptr<const void> storage, std::string_view path_blob,
                              std::span<const uint64_t> path_ends, std::span<const int64_t> labels,
                              std::span<const uint32_t> sample_files, uint32_t parts,
                              std::span<const Extent> extents, bool mapped) {
  SampleIndex index;
  index.storage_ = std::move(storage);
  index.path_blob_ = path_blob;
  index.path_ends_ = path_ends;
  index.labels_ = labels;
  index.sample_files_ = sample_files;
  index.parts_ = parts;
  index.extents_ = extents;
  index.mapped_ = mapped;
  return index;
}

uint64_t SampleList::HeapBytesAhead() const {
  const uint64_t n = size();
  const uint64_t ahead = kMemoryCheckEvery;
  const uint64_t path_bytes_each = n == 0 ? 64 : path_blob.size() / n + 1;
  return BytesAfterGrowth(path_blob.size(), ahead * path_bytes_each, path_blob.capacity(), 1) +
         BytesAfterGrowth(n, ahead, path_ends.capacity(), sizeof(uint64_t)) +
         BytesAfterGrowth(n, ahead, labels.capacity(), sizeof(int64_t)) +
         BytesAfterGrowth(sample_files.size(), sample_files.empty() ? 0 : ahead,
                          sample_files.capacity(), sizeof(uint32_t)) +
         BytesAfterGrowth(extents.size(), ahead * parts, extents.capacity(), sizeof(Extent));
}

uint64_t SampleIndex::Bytes() const {
  return path_blob_.size() + path_ends_.size_bytes() + labels_.size_bytes() +
         sample_files_.size_bytes() + extents_.size_bytes();
}

}  // namespace ringloader::pipeline
