// SPDX-License-Identifier: Apache-2.0
#pragma once
// Listing of an imagefolder tree (internal to server/pipeline; see dataset.h for the semantics).
//
// Rules: exactly torchvision's ImageFolder (its find_classes and make_dataset), so that a
// dataset lists the same samples, in the same order, with the same labels:
// - Classes are the directories directly under the root (hidden ones too), symlinks to
//   directories included (scandir is_dir()), sorted bytewise (UTF-8: as Python sorts str).
// - Samples are the non-directory entries under a class folder (any depth, hidden names too)
//   whose name ends in one of torchvision's IMG_EXTENSIONS (.jpg .jpeg .png .ppm .bmp .pgm .tif
//   .tiff .webp), case-insensitively (its lower() check). Like os.walk(followlinks=True),
//   symlinked files and folders are followed wherever they point, and a FIFO, socket or dangling
//   link with an image name is listed too (reading it fails for that sample, with its reason in
//   stats, instead of the file vanishing silently).
// - Every other file in a class tree is counted as ignored, and the first few are named
//   (SampleList::ignored_count / ignored_examples): never dropped without a word.
// - A class folder with no sample is an error naming it (torchvision raises too).
// - Order: sorted(os.walk(class_dir)): folders sorted bytewise by their path, the files of each
//   folder sorted bytewise by name.
// - Loops: a folder that is its own ancestor on the current path (by device and inode) is not
//   entered again (os.walk would recurse until it fails).

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
