#pragma once
// The --state file of `ringloaderctl consume`. Two lines:
//
//   ringloader-state v1 dataset=... epoch=... sequence=... cursor=...   (client::FormatState)
//   samples_out_bytes=<N>
//
// samples_out_bytes is the length the --samples-out file had when this state was saved: lines
// after it belong to batches the saved position does not cover yet, so a resumed run truncates
// the file there and delivers those batches again. Saved by writing "<file>.tmp" and renaming it
// over the file, so a killed consumer leaves either the old or the new state, never half of one.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/client.h"

namespace ringloader::ctl {

struct ConsumeState {
  client::StreamOptions options;  // options.start = where to resume
  uint64_t samples_out_bytes = 0;
};

std::string FormatConsumeState(const std::string& stream_state, uint64_t samples_out_bytes);
// InvalidArgument naming the bad line or field.
absl::StatusOr<ConsumeState> ParseConsumeState(absl::string_view text);

// Writes `contents` to path + ".tmp", then renames it over `path`.
absl::Status SaveFileAtomically(const std::string& path, absl::string_view contents);
// The file's contents, std::nullopt if it does not exist, an error if it cannot be read.
absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path);

// OK if a run with `flags` continues the run that saved `saved`; otherwise InvalidArgument
// naming the first disagreeing option as its command-line flag, e.g.
// "--seed is 1 but the state file was saved with 0".
absl::Status CheckSameRun(const client::StreamOptions& saved, const client::StreamOptions& flags);

}  // namespace ringloader::ctl
