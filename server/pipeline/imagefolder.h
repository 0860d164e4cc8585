#pragma once
// Listing of an imagefolder tree (internal to server/pipeline; see dataset.h for the semantics).
//
// Rules, on purpose:
// - Classes are the non-hidden directories directly under the root, symlinks to directories
//   included (torchvision's scandir is_dir()), sorted bytewise; a class folder without images
//   keeps its label (labels never shift because one folder is empty).
// - Samples are the non-directory entries under a class folder (any depth) whose name ends in .jpg
//   or .jpeg, case-insensitively (torchvision's lower() check). Like torchvision's
//   os.walk(followlinks=True), symlinked files and folders are followed wherever they point, and
//   a FIFO, socket or dangling link with an image name is listed too (reading it fails for that
//   sample, with its reason in stats, instead of the file vanishing silently).
// - Order: torchvision's sorted(os.walk(class_dir)): folders sorted bytewise by their path, the
//   files of each folder sorted bytewise by name.
// - Names starting with '.' (files and folders) are skipped.
// - Loops: a folder that is its own ancestor on the current path (by device and inode) is not
//   entered again.

#include <string>

#include "absl/status/statusor.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

// Walks `root` (an absolute, existing directory). Errors name the path that could not be read.
// `spec` (optional): its progress callback hears how many class folders are done, every two
// seconds; its cancelled callback is asked before each class folder.
struct DatasetSpec;
absl::StatusOr<SampleList> ListImageFolder(const std::string& root,
                                           const DatasetSpec* spec = nullptr);

// The index cache key of `root`: the root path and the mtimes (ns) of the root and of every class
// folder, as an opaque byte string. Adding or removing a class, or a file directly inside a class
// folder, changes it. (Changes only inside nested sub-folders of a class do not: delete the cache
// file or touch the class folder after editing those.)
// `newest_mtime_ns` receives the newest mtime seen (see SaveIndexCache's racy-write rule).
absl::StatusOr<std::string> ImageFolderKey(const std::string& root, int64_t* newest_mtime_ns);

}  // namespace ringloader::pipeline
