#include "server/pipeline/imagefolder.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringloader::pipeline {
namespace fs = std::filesystem;
namespace {

bool IsHidden(std::string_view name) { return !name.empty() && name.front() == '.'; }

bool EndsWithIgnoreCase(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  s = s.substr(s.size() - suffix.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (absl::ascii_tolower(static_cast<unsigned char>(s[i])) != suffix[i]) return false;
  }
  return true;
}

bool HasJpegExtension(std::string_view name) {
  return EndsWithIgnoreCase(name, ".jpg") || EndsWithIgnoreCase(name, ".jpeg");
}

absl::Status FsError(const fs::path& path, const std::error_code& ec, std::string_view what) {
  return absl::UnavailableError(path.string() + ": " + std::string(what) + ": " + ec.message());
}

// True when `target` (canonical) is `root` (canonical) or lies below it.
bool IsInside(const fs::path& target, const fs::path& root) {
  auto [r, t] = std::mismatch(root.begin(), root.end(), target.begin(), target.end());
  return r == root.end();
}

// Non-hidden real directories directly under root, sorted.
absl::StatusOr<std::vector<std::string>> ClassFolders(const fs::path& root) {
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) return FsError(root, ec, "cannot list dataset root");
  std::vector<std::string> classes;
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    if (IsHidden(name)) continue;
    std::error_code type_ec;
    if (it->is_symlink(type_ec) || !it->is_directory(type_ec)) continue;
    classes.push_back(std::move(name));
  }
  if (ec) return FsError(root, ec, "cannot list dataset root");
  std::sort(classes.begin(), classes.end());
  return classes;
}

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

absl::StatusOr<SampleList> ListImageFolder(const std::string& root_str) {
  const fs::path root(root_str);
  std::error_code ec;
  const fs::path canonical_root = fs::canonical(root, ec);
  if (ec) return FsError(root, ec, "cannot resolve dataset root");
  absl::StatusOr<std::vector<std::string>> classes = ClassFolders(root);
  if (!classes.ok()) return classes.status();

  SampleList list;
  std::vector<std::string> files;  // relative paths of one class, sorted before adding
  for (size_t label = 0; label < classes->size(); ++label) {
    const std::string& cls = (*classes)[label];
    const fs::path class_dir = root / cls;
    files.clear();
    fs::recursive_directory_iterator it(class_dir, fs::directory_options::none, ec);
    if (ec) return FsError(class_dir, ec, "cannot list class folder");
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) break;
      const fs::directory_entry& entry = *it;
      const std::string name = entry.path().filename().string();
      std::error_code type_ec;
      if (IsHidden(name)) {
        if (entry.is_directory(type_ec) && !entry.is_symlink(type_ec))
          it.disable_recursion_pending();
        continue;
      }
      if (!HasJpegExtension(name)) continue;
      if (entry.is_symlink(type_ec)) {
        const fs::path target = fs::canonical(entry.path(), type_ec);
        if (type_ec || !IsInside(target, canonical_root) || !fs::is_regular_file(target, type_ec)) {
          continue;
        }
      } else if (!entry.is_regular_file(type_ec)) {
        continue;
      }
      files.push_back(entry.path().lexically_relative(root).string());
    }
    if (ec) return FsError(class_dir, ec, "cannot list class folder");
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) list.Add(f, static_cast<int64_t>(label));
  }
  list.class_names = *std::move(classes);
  list.Shrink();
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
