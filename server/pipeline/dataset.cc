#include "server/pipeline/dataset.h"

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <optional>
#include <utility>

#include <xxhash.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
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

absl::StatusOr<SampleList> LoadImageFolder(const DatasetSpec& spec, bool* from_cache) {
  *from_cache = false;
  if (spec.state_dir.empty()) return ListImageFolder(spec.root);
  int64_t newest_mtime_ns = 0;
  absl::StatusOr<std::string> key = ImageFolderKey(spec.root, &newest_mtime_ns);
  if (!key.ok()) return key.status();
  const std::string cache_path = IndexCachePath(spec.state_dir, spec.root);
  if (std::optional<SampleList> cached = LoadIndexCache(cache_path, *key)) {
    *from_cache = true;
    return *std::move(cached);
  }
  absl::StatusOr<SampleList> list = ListImageFolder(spec.root);
  if (list.ok() && list->size() > 0 && newest_mtime_ns < base::WallNowNs() - kRacyWindowNs) {
    // Best effort: without a cache the next Open walks again. (Libraries do not log.)
    (void)SaveIndexCache(cache_path, *key, *list);
  }
  return list;
}

}  // namespace

// Builds Datasets; a friend so Dataset keeps its fields private and its constructor hidden.
class DatasetLoader {
 public:
  // XXH3-64 over every (relative path, label) in order, each length-prefixed so that no two
  // different lists hash the same input.
  static uint64_t Fingerprint(const Dataset& d) {
    XXH3_state_t* state = XXH3_createState();
    XXH3_64bits_reset(state);
    for (uint64_t i = 0; i < d.size(); ++i) {
      const std::string_view path = d.relative_path(i);
      const uint64_t header[2] = {path.size(), static_cast<uint64_t>(d.label(i))};
      XXH3_64bits_update(state, header, sizeof(header));
      XXH3_64bits_update(state, path.data(), path.size());
    }
    const uint64_t hash = XXH3_64bits_digest(state);
    XXH3_freeState(state);
    return hash == 0 ? 1 : hash;  // 0 means "unknown" on the wire
  }

  static absl::StatusOr<std::unique_ptr<Dataset>> Open(const DatasetSpec& spec_in) {
    DatasetSpec spec = spec_in;
    if (spec.root.empty()) return Prefixed(spec, absl::InvalidArgumentError("root is empty"));
    std::error_code ec;
    std::string root = std::filesystem::absolute(spec.root, ec).lexically_normal().string();
    while (root.size() > 1 && root.back() == '/') root.pop_back();
    spec.root = root;
    struct stat st;
    if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return Prefixed(spec, absl::NotFoundError(absl::StrCat(
                                "root '", root, "' does not exist or is not a directory")));
    }

    bool from_cache = false;
    absl::StatusOr<SampleList> list;
    switch (spec.format) {
      case DatasetFormat::kImageFolder:
        list = LoadImageFolder(spec, &from_cache);
        break;
      case DatasetFormat::kManifest:
        if (spec.manifest_path.empty()) {
          return Prefixed(spec, absl::InvalidArgumentError("manifest_path is empty"));
        }
        list = ParseManifest(spec.manifest_path);
        break;
    }
    if (!list.ok()) return Prefixed(spec, list.status());
    if (list->size() == 0) {
      return Prefixed(spec,
                      absl::InvalidArgumentError(absl::StrCat(
                          "no samples in ",
                          spec.format == DatasetFormat::kManifest ? spec.manifest_path : root)));
    }
    if (list->size() >= (uint64_t{1} << 32) - 1) {
      return Prefixed(spec, absl::InvalidArgumentError("more than 2^32-2 samples"));
    }

    std::unique_ptr<Dataset> dataset(new Dataset());
    dataset->spec_ = std::move(spec);
    dataset->path_blob_ = std::move(list->path_blob);
    dataset->path_ends_ = std::move(list->path_ends);
    dataset->labels_ = std::move(list->labels);
    dataset->class_names_ = std::move(list->class_names);
    dataset->loaded_from_cache_ = from_cache;
    dataset->fingerprint_ = Fingerprint(*dataset);
    return dataset;
  }
};

absl::StatusOr<std::unique_ptr<Dataset>> Dataset::Open(const DatasetSpec& spec) {
  return DatasetLoader::Open(spec);
}

std::string_view Dataset::relative_path(uint64_t index) const {
  const uint64_t begin = index == 0 ? 0 : path_ends_[index - 1];
  return std::string_view(path_blob_).substr(begin, path_ends_[index] - begin);
}

std::string Dataset::AbsolutePath(uint64_t index) const {
  std::string path;
  const std::string_view rel = relative_path(index);
  path.reserve(spec_.root.size() + 1 + rel.size());
  path.append(spec_.root).append("/").append(rel);
  return path;
}

uint64_t Dataset::MemoryBytes() const {
  uint64_t bytes = sizeof(Dataset) + path_blob_.capacity() +
                   path_ends_.capacity() * sizeof(uint64_t) + labels_.capacity() * sizeof(int64_t);
  for (const std::string& c : class_names_) bytes += sizeof(std::string) + c.capacity();
  return bytes;
}

}  // namespace ringloader::pipeline
