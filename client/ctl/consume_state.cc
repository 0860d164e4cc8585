// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/consume_state.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "proto/wire_text.h"

namespace ringloader::ctl {
namespace {

constexpr absl::string_view kBytesKey = "samples_out_bytes=";
constexpr absl::string_view kPathKey = "samples_out_path=";

template <typename T>
absl::Status Compare(absl::string_view flag, const T& saved, const T& now) {
  if (saved == now) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(flag, " is ", now, " but the state file was saved with ", saved));
}

// What a file that is not a regular one is, for a message.
const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "of another kind";
}

}  // namespace

std::string FormatConsumeState(const std::string& stream_state, uint64_t samples_out_bytes,
                               const std::string& samples_out_path) {
  std::string text = absl::StrCat(stream_state, "\n", kBytesKey, samples_out_bytes, "\n");
  if (!samples_out_path.empty()) {
    absl::StrAppend(&text, kPathKey, wire::EscapeBytes(samples_out_path), "\n");
  }
  return text;
}

absl::StatusOr<ConsumeState> ParseConsumeState(absl::string_view text) {
  std::vector<absl::string_view> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(text), '\n');
  if (lines.size() != 2 && lines.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected 2 or 3 lines (stream state, samples_out_bytes=N[, samples_out_path=P]), found ",
        lines.size()));
  }
  ConsumeState state;
  try {
    client::ResumeState resume = client::ParseState(std::string(lines[0]));
    state.options = std::move(resume.options);
    state.world_cursors = std::move(resume.world_cursors);
  } catch (const client::Error& e) {
    return absl::InvalidArgumentError(absl::StrCat("line 1: ", e.what()));
  }
  absl::string_view bytes = absl::StripAsciiWhitespace(lines[1]);
  if (!absl::ConsumePrefix(&bytes, kBytesKey) || bytes.empty() ||
      !std::all_of(bytes.begin(), bytes.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      !absl::SimpleAtoi(bytes, &state.samples_out_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("line 2: expected samples_out_bytes=<N>, got '", lines[1], "'"));
  }
  if (lines.size() == 3) {
    absl::string_view path = lines[2];
    std::optional<std::string> unescaped;
    if (!absl::ConsumePrefix(&path, kPathKey) ||
        !(unescaped = wire::UnescapeBytes(std::string_view(path.data(), path.size())))) {
      return absl::InvalidArgumentError(
          absl::StrCat("line 3: expected samples_out_path=<path>, got '", lines[2], "'"));
    }
    state.samples_out_path = *std::move(unescaped);
  }
  return state;
}

absl::StatusOr<std::optional<std::string>> ReadFileIfExists(const std::string& path,
                                                            uint64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer; it is refused below instead.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd < 0) {
    if (errno == ENOENT) return std::optional<std::string>();
    return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file (", KindOf(st.st_mode),
                     "): a state file is one written by --state"));
  }
  const auto too_large = [&](uint64_t bytes) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has ", bytes, " bytes or more, more than the ", max_bytes,
                     " a state file can have (not a state file?)"));
  };
  if (static_cast<uint64_t>(st.st_size) > max_bytes) return too_large(st.st_size);
  // To the end, whatever fstat said (the file may change meanwhile), never past max_bytes + 1.
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got <= max_bytes) {
    if (got == text.size()) text.resize(std::min<uint64_t>(got + (64 << 10), max_bytes + 1));
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  if (got > max_bytes) return too_large(got);
  text.resize(got);
  return std::optional<std::string>(std::move(text));
}

absl::Status CheckSameRun(const client::StreamOptions& saved, const client::StreamOptions& flags) {
  using client::Augment;
  using client::DType;
  const auto augment = [](Augment a) { return a == Augment::kEval ? "eval" : "train"; };
  for (absl::Status s : {
           Compare("--dataset", saved.dataset, flags.dataset),
           Compare("--epochs", saved.end_epoch, flags.end_epoch),
           Compare("--seed", saved.seed, flags.seed),
           Compare("--image-size", saved.image_size, flags.image_size),
           Compare<std::string>("--augment", augment(saved.augment), augment(flags.augment)),
           Compare<std::string>("--dtype", client::DTypeName(saved.dtype),
                                client::DTypeName(flags.dtype)),
           Compare<std::string>("--no-shuffle", saved.shuffle ? "off" : "on",
                                flags.shuffle ? "off" : "on"),
           Compare<std::string>("--resize", saved.resize == client::Resize::kExact ? "exact" : "fast",
                                flags.resize == client::Resize::kExact ? "exact" : "fast"),
       }) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ringloader::ctl
