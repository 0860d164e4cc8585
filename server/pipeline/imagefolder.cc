// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/imagefolder.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/image/image_format.h"
#include "server/pipeline/dataset.h"
#include "shm/base/clock.h"

namespace ringloader::pipeline {
namespace fs = std::filesystem;
namespace {

bool IsDotOrDotDot(std::string_view name) { return name == "." || name == ".."; }

absl::Status FsError(const fs::path& path, const std::error_code& ec, std::string_view what) {
  return absl::UnavailableError(path.string() + ": " + std::string(what) + ": " + ec.message());
}

// The directories directly under root (following symlinks; hidden ones too), sorted.
absl::StatusOr<std::vector<std::string>> ClassFolders(const fs::path& root) {
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) return FsError(root, ec, "cannot list dataset root");
  std::vector<std::string> classes;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (!fs::is_directory(it->path(), type_ec)) continue;  // follows a symlink
    classes.push_back(std::move(name));
  }
  if (ec) return FsError(root, ec, "cannot list dataset root");
  std::sort(classes.begin(), classes.end());
  return classes;
}

struct DirId {
  dev_t dev;
  ino_t ino;
  bool operator==(const DirId&) const = default;
};

// One folder of a class tree and the image names directly in it (unsorted).
struct FolderFiles {
  std::string path;  // the folder's path, the sort key (as os.walk's `root`)
  std::string relative;  // relative to the dataset root, with a trailing '/' (or "<class>/")
  std::vector<std::string> files;
  std::vector<std::string> ignored;  // names without an image extension (not directories)
};

// Walks `dir` like os.walk(followlinks=True), appending every folder with its image names.
// `ancestors` holds the folders on the current path (loop protection).
absl::Status WalkClassFolder(const std::string& dir, const std::string& relative,
                             std::vector<DirId>& ancestors, std::vector<FolderFiles>& out) {
  std::unique_ptr<DIR, int (*)(DIR*)> handle(::opendir(dir.c_str()), &::closedir);
  if (handle == nullptr) {
    return absl::UnavailableError(
        absl::StrCat(dir, ": cannot list class folder: ", std::strerror(errno)));
  }
  FolderFiles folder{dir, relative, {}, {}};
  std::vector<std::string> subdirs;
  while (true) {
    errno = 0;
    const dirent* entry = ::readdir(handle.get());
    if (entry == nullptr) {
      if (errno != 0) {
        return absl::UnavailableError(
            absl::StrCat(dir, ": cannot list class folder: ", std::strerror(errno)));
      }
      break;
    }
    const std::string_view name = entry->d_name;
    if (IsDotOrDotDot(name)) continue;
    const std::string path = absl::StrCat(dir, "/", std::string(name));
    struct stat st;
    const bool is_dir = ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
    if (is_dir) {
      subdirs.emplace_back(name);
    } else if (image::HasImageFolderExtension(name)) {
      folder.files.emplace_back(name);
    } else {
      folder.ignored.emplace_back(name);
    }
  }
  handle.reset();
  out.push_back(std::move(folder));
  for (const std::string& name : subdirs) {
    const std::string path = absl::StrCat(dir, "/", name);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;  // vanished meanwhile
    const DirId id{st.st_dev, st.st_ino};
    if (std::find(ancestors.begin(), ancestors.end(), id) != ancestors.end()) continue;  // a loop
    ancestors.push_back(id);
    absl::Status s = WalkClassFolder(path, absl::StrCat(relative, name, "/"), ancestors, out);
    ancestors.pop_back();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::StatusOr<SampleList> ListImageFolder(const std::string& root_str, const DatasetSpec* spec) {
  const fs::path root(root_str);
  absl::StatusOr<std::vector<std::string>> classes = ClassFolders(root);
  if (!classes.ok()) return classes.status();

  SampleList list;
  const IndexMemoryHold no_hold;
  const IndexMemoryHold& hold = spec != nullptr ? spec->hold_memory : no_hold;
  std::vector<std::string> empty_classes;
  struct stat root_st;
  const bool have_root = ::stat(root_str.c_str(), &root_st) == 0;
  // Class folders are listed kWalkers at a time (a network mount costs a round trip per
  // directory: a 1,000-class tree must not cost 1,000 in a row), a window of them at once so
  // that what is held is bounded; then added in label order, as one walk would.
  constexpr size_t kWalkers = 32;
  int64_t last_report = base::SteadyNowNs();
  for (size_t first = 0; first < classes->size(); first += kWalkers) {
    if (spec != nullptr && spec->cancelled && spec->cancelled()) {
      return absl::CancelledError(absl::StrCat("indexing ", root_str, " was cancelled"));
    }
    if (spec != nullptr && spec->progress && base::SteadyNowNs() - last_report > 2'000'000'000) {
      last_report = base::SteadyNowNs();
      spec->progress(absl::StrCat("dataset '", spec->name, "': indexed ", first, "/",
                                  classes->size(), " class folders, ", list.size(), " samples"));
    }
    const size_t count = std::min(kWalkers, classes->size() - first);
    std::vector<std::vector<FolderFiles>> walked(count);
    std::vector<absl::Status> statuses(count);
    const auto walk = [&](size_t k) {
      const std::string& cls = (*classes)[first + k];
      const std::string class_dir = absl::StrCat(root_str, "/", cls);
      std::vector<DirId> ancestors;
      if (have_root) ancestors.push_back(DirId{root_st.st_dev, root_st.st_ino});
      struct stat st;
      if (::stat(class_dir.c_str(), &st) == 0) ancestors.push_back(DirId{st.st_dev, st.st_ino});
      statuses[k] = WalkClassFolder(class_dir, absl::StrCat(cls, "/"), ancestors, walked[k]);
    };
    if (count == 1) {
      walk(0);
    } else {
      std::vector<std::thread> walkers;
      walkers.reserve(count);
      size_t k = 0;
      try {
        for (; k < count; ++k) walkers.emplace_back(walk, k);
      } catch (const std::system_error&) {
        for (; k < count; ++k) walk(k);  // no thread to be had (a pids limit): walked here
      }
      for (std::thread& t : walkers) t.join();
    }
    for (size_t k = 0; k < count; ++k) {
      if (!statuses[k].ok()) return statuses[k];
      const size_t label = first + k;
      std::vector<FolderFiles>& folders = walked[k];
      std::sort(folders.begin(), folders.end(),
                [](const FolderFiles& a, const FolderFiles& b) { return a.path < b.path; });
      const uint64_t before = list.size();
      for (FolderFiles& folder : folders) {
        std::sort(folder.files.begin(), folder.files.end());
        for (const std::string& f : folder.files) {
          list.Add(absl::StrCat(folder.relative, f), static_cast<int64_t>(label));
          if (absl::Status held = list.CheckMemory(hold); !held.ok()) return held;
        }
        std::sort(folder.ignored.begin(), folder.ignored.end());
        for (const std::string& f : folder.ignored) {
          if (list.ignored_examples.size() < SampleList::kIgnoredExamples) {
            list.ignored_examples.push_back(absl::StrCat(folder.relative, f));
          }
          ++list.ignored_count;
        }
      }
      if (list.size() == before) empty_classes.push_back((*classes)[label]);
    }
  }
  if (!empty_classes.empty()) {
    // As torchvision's ImageFolder: a class without samples is a mistake, not a label to keep.
    return absl::FailedPreconditionError(absl::StrCat(
        root_str, ": no file with an image extension in the class folder",
        empty_classes.size() == 1 ? " " : "s ", absl::StrJoin(empty_classes, ", "),
        " (extensions, in any case: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp; torchvision's "
        "ImageFolder refuses such a folder too: remove it, or add its images)"));
  }
  list.class_names = *std::move(classes);
  return list;
}

absl::StatusOr<std::string> ImageFolderKey(const std::string& root_str, int64_t* newest_mtime_ns) {
  const fs::path root(root_str);
  absl::StatusOr<std::vector<std::string>> classes = ClassFolders(root);
  if (!classes.ok()) return classes.status();
  std::string key = absl::StrCat("root=", root_str, "\n");
  int64_t newest = 0;
  auto add = [&](const fs::path& dir, std::string_view label) -> absl::Status {
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      return absl::UnavailableError(
          absl::StrCat(dir.string(), ": cannot stat: ", std::strerror(errno)));
    }
    const int64_t mtime = MtimeNs(st);
    newest = std::max(newest, mtime);
    // Length-prefixed so no folder name can make two different trees produce the same key.
    absl::StrAppend(&key, label.size(), ":", std::string(label), "=", mtime, "\n");
    return absl::OkStatus();
  };
  if (absl::Status s = add(root, "."); !s.ok()) return s;
  for (const std::string& cls : *classes) {
    if (absl::Status s = add(root / cls, cls); !s.ok()) return s;
  }
  if (newest_mtime_ns != nullptr) *newest_mtime_ns = newest;
  return key;
}

}  // namespace ringloader::pipeline
