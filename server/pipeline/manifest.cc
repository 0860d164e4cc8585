// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace ringloader::pipeline {
namespace {

std::string_view Strip(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.front()))) {
    s.remove_prefix(1);
  }
  while (!s.empty() && absl::ascii_isspace(static_cast<unsigned char>(s.back()))) {
    s.remove_suffix(1);
  }
  return s;
}

// A decimal integer >= 0 fitting int64, with optional surrounding whitespace.
bool ParseLabel(std::string_view field, int64_t* label) {
  field = Strip(field);
  if (field.empty()) return false;
  const char* end = field.data() + field.size();
  auto [ptr, ec] = std::from_chars(field.data(), end, *label);
  return ec == std::errc() && ptr == end && *label >= 0;
}

// Removes CSV-style quotes: "a ""b"".jpg" -> a "b".jpg. Returns false on a malformed quote.
bool Unquote(std::string_view field, std::string* out) {
  out->clear();
  if (field.size() < 2 || field.front() != '"' || field.back() != '"') {
    out->assign(field);
    return field.empty() || field.front() != '"';
  }
  field = field.substr(1, field.size() - 2);
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '"') {
      if (i + 1 >= field.size() || field[i + 1] != '"') return false;
      ++i;
    }
    out->push_back(field[i]);
  }
  return true;
}

// Empty string if `path` is an acceptable relative path, else what is wrong with it.
std::string PathProblem(std::string_view path) {
  if (path.empty()) return "empty path";
  if (path.find('\0') != std::string_view::npos) return "path contains a NUL byte";
  const std::string quoted = "\"" + std::string(path) + "\"";
  if (path.front() == '/') return "path must be relative (got " + quoted + ")";
  size_t begin = 0;
  while (begin <= path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string_view::npos) end = path.size();
    if (path.substr(begin, end - begin) == "..")
      return "path escapes the root (got " + quoted + ")";
    begin = end + 1;
  }
  return "";
}

}  // namespace

absl::StatusOr<SampleList> ParseManifest(const std::string& manifest_path,
                                         const IndexMemoryHold& hold) {
  // A directory (or a FIFO) would make the stream read throw or block: refuse it by name.
  struct stat st {};
  if (::stat(manifest_path.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat(manifest_path, ": the manifest is not a regular file"));
  }
  std::ifstream in(manifest_path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat(manifest_path, ": cannot open manifest: ", std::strerror(errno)));
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return absl::UnavailableError(absl::StrCat(manifest_path, ": cannot read manifest"));
  }
  auto error = [&](uint64_t line_no, const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(manifest_path, ":", line_no, ": ", problem));
  };

  SampleList list;
  list.path_ends.reserve(text.size() / 16);
  list.labels.reserve(text.size() / 16);
  list.path_blob.reserve(text.size());
  char sep = 0;  // decided by the first non-empty line
  bool first = true;
  uint64_t line_no = 0;
  std::string path;
  for (size_t begin = 0; begin < text.size();) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    std::string_view line = std::string_view(text).substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (Strip(line).empty()) continue;
    if (sep == 0) sep = line.find('\t') != std::string_view::npos ? '\t' : ',';
    const size_t cut = line.rfind(sep);
    if (cut == std::string_view::npos) {
      if (first) {  // a one-column header line is still a header
        first = false;
        continue;
      }
      return error(line_no, absl::StrCat("expected \"relative_path", sep == '\t' ? "<TAB>" : ",",
                                         "label\""));
    }
    int64_t label = 0;
    if (!ParseLabel(line.substr(cut + 1), &label)) {
      if (first) {  // header line
        first = false;
        continue;
      }
      return error(line_no, "label must be an integer >= 0 (got \"" +
                                std::string(line.substr(cut + 1)) + "\")");
    }
    first = false;
    if (!Unquote(line.substr(0, cut), &path)) return error(line_no, "malformed quoted path");
    if (std::string problem = PathProblem(path); !problem.empty()) {
      return error(line_no, problem);
    }
    list.Add(path, label);
    if (absl::Status held = list.CheckMemory(hold); !held.ok()) return held;
  }
  return list;
}

}  // namespace ringloader::pipeline
