// SPDX-License-Identifier: Apache-2.0
#pragma once
// The --state file of `ringloaderctl consume`. Two or three lines:
//
//   ringloader-state v1 dataset=... epoch=... sequence=... cursor=...   (client::FormatState)
//   samples_out_bytes=<N>
//   samples_out_path=<path, escaped as wire::EscapeBytes does>          (when there was one)
//
// samples_out_bytes is the length the --samples-out file had when this state was saved: lines
// after it belong to batches the saved position does not cover yet, so a resumed run into the
// same file truncates it there and delivers those batches again. A resumed run into another file
// starts that file afresh: it holds the rest of the run. Saved by writing "<file>.tmp" and renaming it
// over the file, so a killed consumer leaves either the old or the new state, never half of one.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"
#include "proto/resume_limits.h"

namespace ringloader::ctl {

struct ConsumeState {
  client::StreamOptions options;  // options.start = where to resume
  std::vector<uint64_t> world_cursors;  // a job's state (client::CombineStates); else empty
  uint64_t samples_out_bytes = 0;
  std::string samples_out_path;   // empty = the run had no --samples-out (or an older state)
};

std::string FormatConsumeState(const std::string& stream_state, uint64_t samples_out_bytes,
                               const std::string& samples_out_path);
// InvalidArgument naming the bad line or field.
absl::StatusOr<ConsumeState> ParseConsumeState(absl::string_view text);

// The longest --state file read: a state at its longest (wire::kMaxStateBytes) and the
// samples_out lines (a path of up to PATH_MAX bytes, escaped: at most 4 x 4,096 bytes).
inline constexpr uint64_t kMaxConsumeStateBytes = wire::kMaxStateBytes + (64 << 10);

// The file's contents, std::nullopt if it does not exist, an error if it cannot be read. Checked
// before it is read: FailedPrecondition for anything but a regular file (a FIFO, which would
// block; a device such as /dev/zero, which never ends) and for a file over `max_bytes`, naming
// the path, its kind or size, and the limit. Never reads more than `max_bytes` + 1 bytes (a file
// growing meanwhile is refused too).
absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path,
                                                            uint64_t max_bytes);

// OK if a run with `flags` continues the run that saved `saved`; otherwise InvalidArgument
// naming the first disagreeing option as its command-line flag, e.g.
// "--seed is 1 but the state file was saved with 0". --rank, --world-size, --batch-size and
// --drop-last may differ: the run then continues the saved epoch in the new world (elastic).
absl::Status CheckSameRun(const client::StreamOptions& saved, const client::StreamOptions& flags);

struct ConsumeOptions;
// The stream `consume` opens for `o` (also peek's, with its own start and client name).
// InvalidArgument naming the flag for a bad --augment, --dtype, --resize, --epochs, ...
absl::StatusOr<client::StreamOptions> ToStreamOptions(const ConsumeOptions& o);

}  // namespace ringloader::ctl
