// SPDX-License-Identifier: Apache-2.0
#pragma once
// Parsing of a manifest dataset file (internal to server/pipeline; see dataset.h).
//
// Format, on purpose strict:
// - One sample per line: `relative_path<sep>label`, where <sep> is a tab if the first non-empty
//   line contains one (TSV), else a comma (CSV). The label is the field after the LAST separator,
//   so paths may contain commas in either format. A path may be double-quoted (CSV style, "" for
//   a quote). CRLF line ends and blank lines are accepted.
// - The first non-empty line is a header when its label field is not an integer.
// - Labels are decimal integers >= 0 (surrounding spaces allowed).
// - Paths are relative and stay inside the root: not empty, not absolute, no ".." component,
//   no NUL byte.
// Errors are InvalidArgument "<manifest path>:<line>: <problem>".

#include <string>

#include "absl/status/statusor.h"
#include "server/pipeline/sample_list.h"

namespace ringloader::pipeline {

// `hold` (optional) bounds what the list may hold (SampleList::CheckMemory).
absl::StatusOr<SampleList> ParseManifest(const std::string& manifest_path,
                                         const IndexMemoryHold& hold = {});

}  // namespace ringloader::pipeline
