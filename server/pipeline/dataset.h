#pragma once
// A dataset: an ordered list of (relative path, label). A sample is its index in that order.
//
// imagefolder: root/<class>/.../*.jpg|.jpeg|.JPEG; classes are the sub-folder names sorted, labels
//   their index; samples sorted by (class, relative path), like torchvision's ImageFolder.
//   Listing happens once; the list is cached in an index file under `state_dir` keyed by the root
//   path and the mtimes of the root and class folders, so a restart reopens it without a walk.
// manifest: a CSV or TSV file of `relative_path,label` lines (an optional header line is detected
//   when its label field is not an integer), paths relative to the root.
//
// Listing rules (hidden names, symlinks, extensions), the index cache format and the manifest
// syntax are documented in imagefolder.h, index_cache.h and manifest.h.
//
// Thread-safety: immutable after Open(); safe to share.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace ringloader::pipeline {

enum class DatasetFormat { kImageFolder, kManifest };

struct DatasetSpec {
  std::string name;
  DatasetFormat format = DatasetFormat::kImageFolder;
  std::string root;           // images live under here
  std::string manifest_path;  // kManifest only
  std::string state_dir;      // index cache directory; empty = no cache
};

class Dataset {
 public:
  // Errors name the dataset, the path and what is wrong (missing root, no images, bad manifest
  // line N: "...", label not an integer, path escaping the root).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const DatasetSpec& spec);

  const std::string& name() const { return spec_.name; }
  // The root as an absolute, lexically normalised path without a trailing '/' (Open() makes it so).
  const std::string& root() const { return spec_.root; }
  uint64_t size() const { return labels_.size(); }
  std::string_view relative_path(uint64_t index) const;  // REQUIRES: index < size()
  std::string AbsolutePath(uint64_t index) const;
  int64_t label(uint64_t index) const { return labels_[index]; }
  // imagefolder: class names in label order; manifest: empty.
  const std::vector<std::string>& class_names() const { return class_names_; }
  // XXH3-64 of the sample list (every relative path and label, in order); never 0. Equal for
  // equal lists: a resume compares it to tell that the dataset changed under a saved position.
  uint64_t fingerprint() const { return fingerprint_; }
  // True when Open() used the index cache instead of walking the tree.
  bool loaded_from_cache() const { return loaded_from_cache_; }
  // Approximate heap bytes held (for memory accounting).
  uint64_t MemoryBytes() const;

 private:
  Dataset() = default;
  friend class DatasetLoader;
  DatasetSpec spec_;
  std::string path_blob_;            // all relative paths, concatenated
  std::vector<uint64_t> path_ends_;  // end offset of each path in path_blob_
  std::vector<int64_t> labels_;
  std::vector<std::string> class_names_;
  bool loaded_from_cache_ = false;
  uint64_t fingerprint_ = 0;
};

}  // namespace ringloader::pipeline
