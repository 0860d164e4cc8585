// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/dataset.h"

#include "proto/wire_text.h"

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>

#include <xxhash.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/pipeline/container_index.h"
#include "server/pipeline/imagefolder.h"
#include "server/pipeline/index_cache.h"
#include "server/pipeline/manifest.h"
#include "server/pipeline/sample_list.h"
#include "shm/base/clock.h"

namespace ringloader::pipeline {
namespace {

// A cache written while the tree may still be changing within the filesystem's timestamp
// granularity could miss a file added in the same tick yet match the key later ("racy git").
// So the cache is only written when every key mtime is at least this old.
constexpr int64_t kRacyWindowNs = 2'000'000'000;

absl::Status Prefixed(const DatasetSpec& spec, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("dataset '", spec.name, "': ", status.message()));
}

// What a format's loader found: a fresh list, or a valid index cache.
struct Loaded {
  SampleList list;  // fresh; or, from the cache, all but the per-sample arrays
  std::optional<SampleIndex> cached_samples;
  uint64_t cached_fingerprint = 0;
  // Fresh lists of cached formats: where to write the cache once the fingerprint is known (empty
  // path: do not write it, e.g. the tree changed too recently).
  std::string cache_path;
  std::string cache_key;
};

// The cache at `cache_path` if it is valid for `key`; else the `list()` it is to be written from.
template <typename ListFn>
absl::StatusOr<Loaded> CachedOrListed(const std::string& cache_path, std::string key,
                                      int64_t newest_mtime_ns, const ListFn& list) {
  Loaded loaded;
  if (std::optional<CachedIndex> cached = LoadIndexCache(cache_path, key)) {
    loaded.list = std::move(cached->description);
    loaded.cached_samples = std::move(cached->samples);
    loaded.cached_fingerprint = cached->fingerprint;
    return loaded;
  }
  absl::StatusOr<SampleList> listed = list();
  if (!listed.ok()) return listed.status();
  loaded.list = *std::move(listed);
  // A list that lost files to read errors (a flaky mount, a permission fixed later) is not the
  // dataset: the next start indexes again rather than keep them lost.
  const bool lost_files = std::any_of(
      loaded.list.problems.begin(), loaded.list.problems.end(), [](const IndexProblem& p) {
        return p.reason == "read_error" || p.reason == "io_error";
      });
  if (loaded.list.size() > 0 && !lost_files &&
      newest_mtime_ns < base::WallNowNs() - kRacyWindowNs) {
    loaded.cache_path = cache_path;
    loaded.cache_key = std::move(key);
  }
  return loaded;
}

absl::StatusOr<Loaded> Fresh(absl::StatusOr<SampleList> list) {
  if (!list.ok()) return list.status();
  Loaded loaded;
  loaded.list = *std::move(list);
  return loaded;
}

absl::StatusOr<Loaded> LoadImageFolder(const DatasetSpec& spec) {
  if (spec.state_dir.empty()) return Fresh(ListImageFolder(spec.root, &spec));
  int64_t newest_mtime_ns = 0;
  absl::StatusOr<std::string> key = ImageFolderKey(spec.root, &newest_mtime_ns);
  if (!key.ok()) return key.status();
  return CachedOrListed(IndexCachePath(spec.state_dir, "imagefolder", spec.root), *std::move(key),
                        newest_mtime_ns, [&] { return ListImageFolder(spec.root, &spec); });
}

// webdataset and tfrecord: resolve the files, then the cached index or a scan of every file.
// `spec.root` becomes the files' root.
absl::StatusOr<Loaded> LoadContainers(DatasetSpec& spec) {
  const bool tar = spec.format == DatasetFormat::kWebDataset;
  const std::string pattern = spec.root;
  absl::StatusOr<ShardFiles> files = ResolveShardFiles(pattern, tar ? ".tar" : "");
  if (!files.ok()) return files.status();
  spec.root = files->root;
  const auto index = [&]() {
    return tar ? IndexWebDataset(spec, *files) : IndexTfRecords(spec, *files);
  };
  if (spec.state_dir.empty()) return Fresh(index());
  int64_t newest_mtime_ns = 0;
  absl::StatusOr<std::string> key = ContainerIndexKey(spec, *files, &newest_mtime_ns);
  if (!key.ok()) return key.status();
  return CachedOrListed(IndexCachePath(spec.state_dir, DatasetFormatName(spec.format), pattern),
                        *std::move(key), newest_mtime_ns, index);
}

}  // namespace

// Builds Datasets; a friend so Dataset keeps its fields private and its constructor hidden.
class DatasetLoader {
 public:
  // XXH3-64 over every (relative path, label) in order, each length-prefixed so that no two
  // different lists hash the same input; for container formats also every sample's extents (a
  // shard rewritten with other contents moves them), for arrays every column's header. The index
  // cache stores it: a change here needs a new kIndexCacheVersion.
  static uint64_t Fingerprint(const SampleIndex& samples, const std::vector<ArrayColumn>& columns) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (uint64_t i = 0; i < samples.size(); ++i) {
      const std::string_view path = samples.path(i);
      const uint64_t header[2] = {path.size(), static_cast<uint64_t>(samples.label(i))};
      XXH3_64bits_update(state, header, sizeof(header));
      XXH3_64bits_update(state, path.data(), path.size());
    }
    XXH3_64bits_update(state, samples.extents().data(), samples.extents().size_bytes());
    for (const ArrayColumn& c : columns) {
      const uint64_t words[3] = {static_cast<uint64_t>(c.header.type), c.header.data_offset,
                                 c.header.row_bytes};
      XXH3_64bits_update(state, c.name.data(), c.name.size() + 1);
      XXH3_64bits_update(state, words, sizeof(words));
      XXH3_64bits_update(state, c.header.shape.data(), c.header.shape.size() * 8);
    }
    const uint64_t hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return hash == 0 ? 1 : hash;  // 0 means "unknown" on the wire
  }

  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const DatasetSpec& spec_in) {
    DatasetSpec spec = spec_in;
    if (spec.root.empty()) return Prefixed(spec, absl::InvalidArgumentError("path is empty"));
    const bool containers = spec.format == DatasetFormat::kWebDataset ||
                            spec.format == DatasetFormat::kTfRecord;
    std::error_code ec;
    std::string root = std::filesystem::absolute(spec.root, ec).lexically_normal().string();
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    spec.root = root;
    struct stat st;
    if (!containers && (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))) {
      return Prefixed(spec, absl::NotFoundError(absl::StrCat(
                                "root '", root, "' does not exist or is not a directory")));
    }
    if (spec.image_keys.empty()) {
      return Prefixed(spec, absl::InvalidArgumentError("image_key names no extension"));
    }

    absl::StatusOr<Loaded> loaded;
    std::vector<ArrayColumn> columns;
    switch (spec.format) {
      case DatasetFormat::kImageFolder:
        loaded = LoadImageFolder(spec);
        break;
      case DatasetFormat::kManifest:
        if (spec.manifest_path.empty()) {
          return Prefixed(spec, absl::InvalidArgumentError("manifest_path is empty"));
        }
        loaded = Fresh(ParseManifest(spec.manifest_path, spec.hold_memory));
        break;
      case DatasetFormat::kWebDataset:
      case DatasetFormat::kTfRecord:
        loaded = LoadContainers(spec);
        break;
      case DatasetFormat::kArrays:
        // A labels.npy is the label column unless `label` names another (which IndexArrays
        // then refuses: the batch's labels cannot come from two columns).
        if (spec.label_array.empty() && ::stat((root + "/labels.npy").c_str(), &st) == 0) {
          spec.label_array = "labels";
        }
        loaded = Fresh(IndexArrays(spec, &columns));
        break;
    }
    if (!loaded.ok()) return Prefixed(spec, loaded.status());
    SampleList* const list = &loaded->list;
    const bool from_cache = loaded->cached_samples.has_value();
    const SampleIndex samples =
        from_cache ? *loaded->cached_samples : SampleIndex::Adopt(loaded->list);
    if (samples.size() == 0) {
      std::string where = spec.format == DatasetFormat::kManifest ? spec.manifest_path : root;
      if (!list->problems.empty()) {
        absl::StrAppend(&where, " (", list->problems.size(), " damaged files, the first: ",
                        list->problems[0].message, ")");
      }
      return Prefixed(spec, absl::InvalidArgumentError(absl::StrCat("no samples in ", where)));
    }
    if (samples.size() >= (uint64_t{1} << 32) - 1) {
      return Prefixed(spec, absl::InvalidArgumentError("more than 2^32-2 samples"));
    }
    for (const std::string& name : spec.ragged) {
      const auto& t = list->tensors;
      if (std::none_of(t.begin(), t.end(), [&](const TensorSchema& s) { return s.name == name; })) {
        return Prefixed(spec, absl::InvalidArgumentError(absl::StrCat(
                                  "ragged names '", name, "', which no sample has as a tensor")));
      }
    }

    const uint64_t fingerprint =
        from_cache ? loaded->cached_fingerprint : Fingerprint(samples, columns);
    std::string cache_warning;
    if (!loaded->cache_path.empty()) {
      // Best effort: without a cache the next Open walks again; the caller logs why.
      if (absl::Status s =
              SaveIndexCache(loaded->cache_path, loaded->cache_key, *list, samples, fingerprint);
          !s.ok()) {
        cache_warning = std::string(s.message());
      }
    }

    std::unique_ptr<Dataset> dataset(new Dataset());
    dataset->spec_ = std::move(spec);
    dataset->spec_.hold_memory = nullptr;  // what it refers to lives only while indexing
    dataset->samples_ = samples;
    dataset->class_names_ = std::move(list->class_names);
    dataset->files_ = std::move(list->files);
    dataset->tensors_ = std::move(list->tensors);
    dataset->columns_ = std::move(columns);
    dataset->index_problems_ = std::move(list->problems);
    dataset->ignored_count_ = list->ignored_count;
    dataset->index_notes_ = std::move(list->notes);
    dataset->ignored_examples_ = std::move(list->ignored_examples);
    dataset->loaded_from_cache_ = from_cache;
    dataset->cache_warning_ = std::move(cache_warning);
    dataset->fingerprint_ = fingerprint;
    return dataset;
  }
};

std::string Dataset::IgnoredText() const {
  if (ignored_count_ == 0) return "";
  std::string text = absl::StrCat("ignored ", ignored_count_, ignored_count_ == 1 ? " file" : " files",
                                  " without an image extension");
  if (!ignored_examples_.empty()) {
    absl::StrAppend(&text, ", e.g. ", wire::EscapeBytes(ignored_examples_.front()));
  }
  return text;
}

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetSpec& spec) {
  return DatasetLoader::Open(spec);
}

std::string Dataset::AbsolutePath(uint64_t index) const {
  std::string path;
  const std::string_view rel = relative_path(index);
  path.reserve(spec_.root.size() + 1 + rel.size());
  path.append(spec_.root).append("/").append(rel);
  return path;
}

const char* DatasetFormatName(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::kImageFolder:
      return "imagefolder";
    case DatasetFormat::kManifest:
      return "manifest";
    case DatasetFormat::kWebDataset:
      return "webdataset";
    case DatasetFormat::kTfRecord:
      return "tfrecord";
    case DatasetFormat::kArrays:
      return "arrays";
  }
  return "unknown";
}

bool Dataset::has_labels() const {
  switch (spec_.format) {
    case DatasetFormat::kWebDataset:
      return !spec_.label_key.empty();
    case DatasetFormat::kArrays:
      return !spec_.label_array.empty();
    case DatasetFormat::kTfRecord:
      return !spec_.label_feature.empty();
    default:
      return true;
  }
}

std::string Dataset::SampleFilePath(uint64_t index) const {
  const std::string& file = files_[samples_.sample_file(index)];
  return spec_.root == "/" ? "/" + file : absl::StrCat(spec_.root, "/", file);
}

uint64_t Dataset::MemoryBytes() const {
  // A mapped index is page cache rather than heap, but its pages are charged to the daemon's
  // cgroup as they are read: counted the same.
  uint64_t bytes = sizeof(Dataset) + samples_.Bytes();
  for (const std::string& f : files_) bytes += sizeof(std::string) + f.capacity();
  for (const std::string& c : class_names_) bytes += sizeof(std::string) + c.capacity();
  return bytes;
}

}  // namespace ringloader::pipeline
