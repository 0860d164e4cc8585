#pragma once
// Listing of an imagefolder tree (internal to server/pipeline; see dataset.h for the semantics).
//
// Rules, on purpose:
// - Classes are the non-hidden real directories directly under the root, sorted bytewise; a class
//   folder without images keeps its label (labels never shift because one folder is empty).
// - Samples are regular files under a class folder (any depth) whose name ends in .jpg or .jpeg,
//   case-insensitively (a superset of .jpg/.jpeg/.JPEG, like torchvision's lower() check), sorted
//   bytewise by relative path within their class.
// - Names starting with '.' (files and folders) are skipped.
// - Symbolic links: a symlinked file is listed only if its target is a regular file inside the
//   (canonical) root; symlinked directories are never entered (no escape from the root, no
//   cycles).

#include <string>

#include "absl/status/statusor.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

// Walks `root` (an absolute, existing directory). Errors name the path that could not be read.
absl::StatusOr<SampleList> ListImageFolder(const std::string& root);

// The index cache key of `root`: the root path and the mtimes (ns) of the root and of every class
// folder, as an opaque byte string. Adding or removing a class, or a file directly inside a class
// folder, changes it. (Changes only inside nested sub-folders of a class do not: delete the cache
// file or touch the class folder after editing those.)
// `newest_mtime_ns` receives the newest mtime seen (see SaveIndexCache's racy-write rule).
absl::StatusOr<std::string> ImageFolderKey(const std::string& root, int64_t* newest_mtime_ns);

}  // namespace ringloader::pipeline
