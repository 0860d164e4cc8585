#pragma once
// The raw material of a Dataset while it is being built: relative paths packed into one blob plus
// end offsets (no std::string per sample, so a million samples cost ~1 allocation each array),
// labels and class names. Internal to server/pipeline.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ringloader::pipeline {

struct SampleList {
  std::string path_blob;                 // all relative paths, concatenated
  std::vector<uint64_t> path_ends;       // end offset of sample i's path in path_blob
  std::vector<int64_t> labels;           // label of sample i
  std::vector<std::string> class_names;  // imagefolder only

  uint64_t size() const { return labels.size(); }
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
  }
};

}  // namespace ringloader::pipeline
