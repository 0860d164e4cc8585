// SPDX-License-Identifier: Apache-2.0
#pragma once
// A dataset: an ordered list of samples, each a relative path (a name for logs and reports) and a
// label (or where to read them). A sample is its index in that order.
//
// imagefolder: root/<class>/.../*.jpg|.jpeg|.JPEG; classes are the sub-folder names sorted, labels
//   their index; samples sorted by (class, relative path), like torchvision's ImageFolder.
//   Listing happens once; the list is cached in an index file under `state_dir` keyed by the root
//   path and the mtimes of the root and class folders, so a restart reopens it without a walk.
// manifest: a CSV or TSV file of `relative_path,label` lines (an optional header line is detected
//   when its label field is not an integer), paths relative to the root.
// webdataset: tar shards (a directory searched recursively for *.tar, a glob, or a brace pattern
//   "/data/train-{000000..000146}.tar"); a sample is a run of members with one key (see
//   tar_shard.h); its image is the member whose extension is one of `image_keys`, its label the
//   `label_key` member (an integer as text, or "json:FIELD": an integer field of the .json
//   member); every "NAME.npy" member is an extra tensor NAME. relative_path = "SHARD#KEY".
// tfrecord: TFRecord files (a directory, glob or brace pattern) of tf.train.Example records;
//   image and label are features of each record (see tf_example.h). relative_path = "FILE#N",
//   N the record's number in its file.
// arrays: a directory of NAME.npy files sharing their first dimension; sample i is row i of every
//   file, each file a tensor NAME; `label_array` names the one whose rows are the labels.
//   relative_path = "#ROW". No images.
// Container formats (webdataset, tfrecord) are indexed once (one small read per member or
// record), the index cached in `state_dir` keyed by every file's size and mtime; their labels are
// read with each sample (label(i) is -1). Damage found while indexing (a bad tar header, a record
// length whose CRC fails) ends that file's index there: it is kept in index_problems() with the
// file, the offset and the reason.
//
// Listing rules (hidden names, symlinks, extensions), the index cache format and the manifest
// syntax are documented in imagefolder.h, index_cache.h and manifest.h.
//
// Thread-safety: immutable after Open(); safe to share.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pipeline/container_file.h"
#include "server/pipeline/npy.h"
#include "server/pipeline/sample_list.h"
#include "server/pipeline/tensor_schema.h"

namespace ringloader::pipeline {

enum class DatasetFormat { kImageFolder, kManifest, kWebDataset, kTfRecord, kArrays };
const char* DatasetFormatName(DatasetFormat format);  // the config's word: "webdataset", ...

struct DatasetSpec {
  std::string name;
  DatasetFormat format = DatasetFormat::kImageFolder;
  // imagefolder, manifest, arrays: the root directory. webdataset, tfrecord: a directory, a glob
  // or a brace pattern of the files (root() is then the pattern's directory).
  std::string root;
  std::string manifest_path;  // kManifest only
  std::string state_dir;      // index cache directory; empty = no cache
  // webdataset: the image member's extensions, first match wins; the label member ("cls": an
  // integer as text; "json:FIELD": an integer field of the .json member; "" = no labels).
  std::vector<std::string> image_keys = {"jpg"};
  std::string label_key = "cls";
  // tfrecord: the Example features (see tf_example.h).
  std::string image_feature = "image/encoded";
  std::string label_feature = "image/class/label";
  int64_t label_offset = 0;
  // arrays: the tensor whose rows are the labels ("" = none).
  std::string label_array;
  // Extra tensors whose samples may differ in their first dimension (padded, NAME_lengths).
  std::vector<std::string> ragged;
  // A ragged tensor's samples are padded to at most this many rows; longer ones fail as
  // too_large. 0 = the longest sample's.
  uint64_t ragged_max_rows = 0;
  // Transient errors reading a file while indexing are retried for this long (per file; see
  // IoRetryBudget); a file still unreadable is left out of this index, which is then not cached.
  std::chrono::milliseconds io_retry{30'000};
  // Called now and then while indexing, with a line for the log ("indexed 40/147 shards ...").
  std::function<void(const std::string&)> progress;
  // Asked between class folders and files while indexing: true stops Open() with Cancelled (a
  // daemon told to stop during a long start-up walk).
  std::function<bool()> cancelled;
  // Told what the index being built may hold (see SampleList::CheckMemory); unset = unbounded.
  IndexMemoryHold hold_memory;
};

// One NAME.npy file of an arrays dataset.
struct ArrayColumn {
  std::string name;
  std::string path;  // absolute
  NpyHeader header;
};

class Dataset {
 public:
  // Errors name the dataset, the path and what is wrong (missing root, no images, bad manifest
  // line N: "...", label not an integer, path escaping the root).
  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const DatasetSpec& spec);

  const std::string& name() const { return spec_.name; }
  // The root as an absolute, lexically normalised path without a trailing '/' (Open() makes it so).
  const std::string& root() const { return spec_.root; }
  uint64_t size() const { return samples_.size(); }
  // REQUIRES: index < size()
  std::string_view relative_path(uint64_t index) const { return samples_.path(index); }
  std::string AbsolutePath(uint64_t index) const;
  int64_t label(uint64_t index) const { return samples_.label(index); }
  // imagefolder: class names in label order; manifest: empty.
  const std::vector<std::string>& class_names() const { return class_names_; }
  // XXH3-64 of the sample list (every relative path and label, in order); never 0. Equal for
  // equal lists: a resume compares it to tell that the dataset changed under a saved position.
  uint64_t fingerprint() const { return fingerprint_; }
  // True when Open() used the index cache instead of walking the tree; its per-sample arrays are
  // then the mapped cache file itself.
  bool loaded_from_cache() const { return loaded_from_cache_; }
  // Empty, or why the index cache could not be written ("<path>: cannot write: <errno text>"):
  // the dataset works, the next start walks again. For the log (libraries do not log).
  const std::string& cache_warning() const { return cache_warning_; }
  // Approximate heap bytes held (for memory accounting).
  uint64_t MemoryBytes() const;

  DatasetFormat format() const { return spec_.format; }
  const DatasetSpec& spec() const { return spec_; }
  // False for arrays: their samples are tensors only.
  bool has_images() const { return spec_.format != DatasetFormat::kArrays; }
  // True when labels come from the sample's bytes (webdataset, tfrecord), not from label(i).
  bool labels_in_samples() const {
    return spec_.format == DatasetFormat::kWebDataset || spec_.format == DatasetFormat::kTfRecord;
  }
  // True when every sample has a label (imagefolder, manifest; webdataset with a label_key;
  // tfrecord; arrays with a label_array).
  bool has_labels() const;
  // The extra tensors every sample carries (webdataset .npy members, arrays columns other than
  // the label), sorted by name.
  const std::vector<TensorSchema>& tensors() const { return tensors_; }
  // Container formats: sample i's file (absolute path) and its parts. webdataset parts: 0 = the
  // image member, 1 = the label member, 2 + k = tensors()[k]'s member; tfrecord: 0 = the record.
  std::string SampleFilePath(uint64_t index) const;
  Extent part(uint64_t index, uint32_t k) const { return samples_.part(index, k); }
  // arrays: the columns, tensors() order, then the label column (if any) last.
  const std::vector<ArrayColumn>& columns() const { return columns_; }
  const std::vector<IndexProblem>& index_problems() const { return index_problems_; }
  // imagefolder: files in the class folders that are not listed (no image extension), and the
  // first few of them, relative to the root.
  uint64_t ignored_count() const { return ignored_count_; }
  // What indexing found that the operator should know and is no sample's fault (see SampleList).
  const std::vector<std::string>& index_notes() const { return index_notes_; }
  const std::vector<std::string>& ignored_examples() const { return ignored_examples_; }
  // "ignored 3 files, e.g. dattel/README.txt" (escaped for a log line); "" when none.
  std::string IgnoredText() const;
  // The container files (shards, record files) its samples are read from, kept open and shared.
  container::OpenFiles& open_files() const { return open_files_; }

 private:
  Dataset() = default;
  friend class DatasetLoader;
  DatasetSpec spec_;
  SampleIndex samples_;  // paths, labels, files and extents of every sample
  std::vector<std::string> class_names_;
  std::vector<std::string> files_;
  std::vector<TensorSchema> tensors_;
  std::vector<ArrayColumn> columns_;
  std::vector<IndexProblem> index_problems_;
  uint64_t ignored_count_ = 0;
  std::vector<std::string> index_notes_;
  std::vector<std::string> ignored_examples_;
  bool loaded_from_cache_ = false;
  std::string cache_warning_;
  uint64_t fingerprint_ = 0;
  mutable container::OpenFiles open_files_{64};
};

}  // namespace ringloader::pipeline
