// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/container_index.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/image/sample_decoder.h"
#include "server/pipeline/container_file.h"
#include "server/pipeline/io_retry.h"
#include "server/pipeline/tar_shard.h"
#include "server/pipeline/tfrecord.h"
#include "shm/base/clock.h"

namespace ringloader::pipeline {
namespace {

namespace fs = std::filesystem;

bool HasWildcard(std::string_view s) { return s.find_first_of("*?[") != std::string_view::npos; }

// Expands the first "{...}" of `pattern` (recursively, so every brace is expanded).
absl::Status ExpandBraces(const std::string& pattern, std::vector<std::string>& out) {
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    out.push_back(pattern);
    return absl::OkStatus();
  }
  const size_t close = pattern.find('}', open);
  if (close == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", pattern, "': '{' without '}'"));
  }
  const std::string body = pattern.substr(open + 1, close - open - 1);
  const std::string head = pattern.substr(0, open);
  const std::string tail = pattern.substr(close + 1);
  std::vector<std::string> alternatives;
  if (const size_t dots = body.find(".."); dots != std::string::npos) {
    const std::string first = body.substr(0, dots);
    const std::string last = body.substr(dots + 2);
    uint64_t a = 0;
    uint64_t b = 0;
    if (!absl::SimpleAtoi(first, &a) || !absl::SimpleAtoi(last, &b) || a > b ||
        b - a > 10'000'000) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", pattern, "': {", body, "} is not a range {FIRST..LAST} of numbers"));
    }
    const size_t width = first.size() > 1 && first[0] == '0' ? first.size() : 0;
    for (uint64_t v = a; v <= b; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
      alternatives.push_back(std::move(digits));
    }
  } else {
    alternatives = absl::StrSplit(body, ',');
  }
  for (const std::string& alt : alternatives) {
    if (absl::Status s = ExpandBraces(head + alt + tail, out); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsHidden(const fs::path& relative) {
  for (const fs::path& part : relative) {
    if (!part.empty() && part.native()[0] == '.') return true;
  }
  return false;
}

absl::StatusOr<std::vector<std::string>> WalkDirectory(const std::string& root,
                                                       const std::string& extension) {
  std::vector<std::string> files;
  std::error_code ec;
  fs::recursive_directory_iterator it(root, fs::directory_options::follow_directory_symlink, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path relative = it->path().lexically_relative(root);
    if (IsHidden(relative)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file(ec)) continue;
    if (!extension.empty() && !absl::EndsWith(relative.native(), extension)) continue;
    files.push_back(relative.native());
  }
  if (ec) return absl::UnavailableError(absl::StrCat(root, ": ", ec.message()));
  std::sort(files.begin(), files.end());  // the directory's order is the filesystem's whim
  return files;
}

// The longest directory of `pattern` before any wildcard or brace.
std::string FixedDirectory(const std::string& pattern) {
  const size_t special = pattern.find_first_of("*?[{");
  const size_t slash = pattern.rfind('/', special == std::string::npos ? pattern.size() : special);
  if (slash == 0) return "/";
  return slash == std::string::npos ? "." : pattern.substr(0, slash);
}

std::string Join(const std::string& root, const std::string& relative) {
  return root == "/" ? "/" + relative : root + "/" + relative;
}

absl::Status CancelledIndexing(const DatasetSpec& spec) {
  return absl::CancelledError(absl::StrCat("indexing dataset '", spec.name, "' was cancelled"));
}

bool Cancelled(const DatasetSpec& spec) { return spec.cancelled && spec.cancelled(); }

void ReportProgress(const DatasetSpec& spec, int64_t& last_ns, size_t done, size_t total,
                    uint64_t samples, const char* what) {
  const int64_t now = base::SteadyNowNs();
  if (!spec.progress || (now - last_ns < 2'000'000'000 && done != total)) return;
  last_ns = now;
  spec.progress(absl::StrCat("dataset '", spec.name, "': indexed ", done, "/", total, " ", what,
                             ", ", samples, " samples"));
}

// `rest_unread` false: the problem is one member's, and the file's other members are indexed.
void AddProblem(SampleList& list, const std::string& file, const absl::Status& status,
                uint64_t offset, bool rest_unread = true) {
  list.problems.push_back({file, offset, std::string(image::ErrorReason(status)),
                           std::string(status.message()), rest_unread});
}

// A file that could not be read: "read_error", or "io_error" when retrying did not help.
absl::Status ReadErrorOf(const absl::Status& status) {
  return image::ErrorReason(status) == "io_error" ? status
                                                  : image::WithReason(status, "read_error");
}

// The offset a container::Damaged message names ("<path>: offset N: ...").
uint64_t DamageOffset(const absl::Status& status, const std::string& path) {
  absl::string_view m = status.message();
  if (!absl::ConsumePrefix(&m, path) || !absl::ConsumePrefix(&m, ": offset ")) return 0;
  uint64_t offset = 0;
  (void)absl::SimpleAtoi(m.substr(0, m.find(':')), &offset);
  return offset;
}

// Reads the .npy header at the start of a member.
absl::StatusOr<NpyHeader> MemberNpyHeader(int fd, const std::string& where, Extent member) {
  std::string head(std::min<uint64_t>(member.size, 64 << 10), '\0');
  const int64_t got = container::ReadAt(fd, head.data(), head.size(), member.offset);
  if (got < 0) return container::IoError(where, static_cast<int>(-got));
  head.resize(static_cast<size_t>(got));
  return ParseNpyHeader(head, member.size, where, /*allow_scalar=*/true);
}

// A WebDataset sample as found, before the tensor names (the union over all samples) are known.
struct FoundSample {
  Extent image{Extent::kMissingOffset, 0};
  Extent label{Extent::kMissingOffset, 0};
  std::vector<std::pair<std::string, Extent>> tensors;  // NAME (of KEY.NAME.npy), member
};
// What one entry of FoundSample::tensors holds, its name's heap bytes included (names are at
// most kMaxTensorNameBytes).
constexpr uint64_t kFoundTensorBytes =
    sizeof(std::pair<std::string, Extent>) + kMaxTensorNameBytes;

// What the samples found so far hold (until the schemas are known), with the vector's next
// doubling counted once it is near.
uint64_t FoundBytes(const std::vector<FoundSample>& found, uint64_t tensor_members) {
  return BytesAfterGrowth(found.size(), SampleList::kMemoryCheckEvery, found.capacity(),
                          sizeof(FoundSample)) +
         tensor_members * kFoundTensorBytes;
}

// One dtype and shape (ragged: shape[1:]) that members of a tensor have, and how many do.
struct ShapeVote {
  NpyType type;
  std::vector<uint64_t> shape;  // ragged: without the first dimension
  uint64_t count = 0;
  uint64_t first_sample = 0;  // where it first occurs
  std::string Describe(bool ragged) const {
    std::string text = ShapeText(shape);
    if (ragged) text.insert(1, shape.empty() ? "*" : "*, ");
    return absl::StrCat(NpyTypeName(type), " ", text);
  }
};

// A ragged tensor's length: the longest member of the winning shape up to `cap` (0 = none).
// Leaves a note when that length is far above the typical one: every batch pads every sample to
// it, so one sample with 300,000 boxes costs the whole dataset.
uint64_t RaggedRows(const std::string& name, const TensorSchema& rest,
                    std::vector<std::pair<uint64_t, uint64_t>> rows, uint64_t cap,
                    SampleList& list) {
  uint64_t longest = 0;
  uint64_t longest_sample = 0;
  uint64_t above_cap = 0;
  for (const auto& [sample, n] : rows) {
    if (n > longest) longest = n, longest_sample = sample;
    if (cap != 0 && n > cap) ++above_cap;
  }
  if (rows.empty()) return 0;
  auto middle = rows.begin() + static_cast<ptrdiff_t>(rows.size() / 2);
  std::nth_element(rows.begin(), middle, rows.end(),
                   [](const auto& x, const auto& y) { return x.second < y.second; });
  const uint64_t median = middle->second;
  const uint64_t row_bytes = rest.SampleBytes();  // `rest` is one row's schema
  if (above_cap != 0) {
    list.notes.push_back(absl::StrCat(
        "ragged tensor '", name, "': ", above_cap, " samples have more than ragged_max_rows = ",
        cap, " rows (the longest: ", std::string(list.path(longest_sample)), ", ", longest,
        " rows); they fail as too_large"));
    return cap;
  }
  constexpr uint64_t kNotedPaddingBytes = 64 << 10;
  if (longest > 4 * std::max<uint64_t>(median, 1) && longest * row_bytes >= kNotedPaddingBytes) {
    list.notes.push_back(absl::StrCat(
        "ragged tensor '", name, "': every sample is padded to ", longest, " rows (",
        longest * row_bytes, " bytes per sample in every batch) because of ",
        std::string(list.path(longest_sample)), ", while half the samples have at most ", median,
        " rows; set ragged_max_rows to cap it (longer samples then fail)"));
  }
  return longest;
}

// The schema of every extra tensor: the union of member names; each one's dtype and shape are
// what most of its members have (ties: the first seen), so an odd sample fails alone when read
// and is named here as the shard's problem, instead of setting the shape every other sample is
// held to. Ragged tensors: see RaggedRows. Reads every member's .npy header (one small read
// each, one open per shard); a header that cannot be read is that sample's error when read.
absl::StatusOr<std::vector<TensorSchema>> WebDatasetSchemas(const DatasetSpec& spec,
                                                            const ShardFiles& files,
                                                            const std::vector<FoundSample>& found,
                                                            SampleList& list) {
  struct Tensor {
    bool ragged = false;
    std::vector<ShapeVote> votes;
    struct RaggedMember {
      uint64_t sample;
      size_t vote;
      uint64_t rows;
    };
    std::vector<RaggedMember> ragged_members;
  };
  std::map<std::string, Tensor> tensors;
  std::optional<container::File> file;
  uint32_t file_index = UINT32_MAX;
  int64_t last_report = base::SteadyNowNs();
  for (uint64_t i = 0; i < found.size(); ++i) {
    if (found[i].tensors.empty()) continue;
    if (list.sample_files[i] != file_index) {
      if (Cancelled(spec)) return CancelledIndexing(spec);
      ReportProgress(spec, last_report, list.sample_files[i], files.files.size(), list.size(),
                     "shards' tensor headers read");
      file_index = list.sample_files[i];
      absl::StatusOr<container::File> opened =
          container::File::Open(Join(files.root, files.files[file_index]));
      file.reset();
      if (opened.ok()) file.emplace(*std::move(opened));
    }
    for (const auto& [name, extent] : found[i].tensors) {
      Tensor& t = tensors[name];
      t.ragged = std::find(spec.ragged.begin(), spec.ragged.end(), name) != spec.ragged.end();
      if (!file) continue;
      absl::StatusOr<NpyHeader> header =
          MemberNpyHeader(file->fd(), std::string(list.path(i)), extent);
      // Unreadable, or a scalar where rows are expected: that sample fails when read.
      if (!header.ok() || (t.ragged && header->shape.empty())) continue;
      std::vector<uint64_t> shape = header->shape;
      if (t.ragged) shape.erase(shape.begin());
      auto vote = std::find_if(t.votes.begin(), t.votes.end(), [&](const ShapeVote& v) {
        return v.type == header->type && v.shape == shape;
      });
      if (vote == t.votes.end()) {
        vote = t.votes.insert(t.votes.end(), ShapeVote{header->type, std::move(shape), 0, i});
      }
      ++vote->count;
      if (t.ragged) {
        t.ragged_members.push_back(
            {i, static_cast<size_t>(vote - t.votes.begin()), header->shape[0]});
      }
    }
  }

  std::vector<TensorSchema> schemas;
  for (auto& [name, t] : tensors) {
    if (t.votes.empty()) continue;  // no member could be read: each fails with its sample
    const auto winner = std::max_element(
        t.votes.begin(), t.votes.end(),
        [](const ShapeVote& x, const ShapeVote& y) { return x.count < y.count; });
    const size_t w = static_cast<size_t>(winner - t.votes.begin());
    uint64_t members = 0;
    for (const ShapeVote& v : t.votes) members += v.count;
    TensorSchema schema{name, winner->type, winner->shape, t.ragged};
    if (t.ragged) {
      std::vector<std::pair<uint64_t, uint64_t>> rows;
      for (const auto& m : t.ragged_members) {
        if (m.vote == w) {
          rows.emplace_back(m.sample, m.rows);
        }
      }
      schema.shape.insert(schema.shape.begin(),
                          RaggedRows(name, TensorSchema{name, winner->type, winner->shape, false},
                                     std::move(rows), spec.ragged_max_rows, list));
    }
    for (const ShapeVote& v : t.votes) {
      if (&v == &*winner) continue;
      const uint64_t at = v.first_sample;
      Extent extent{};
      for (const auto& [n, e] : found[at].tensors) {
        if (n == name) extent = e;
      }
      AddProblem(list, files.files[list.sample_files[at]],
                 image::WithReason(
                     absl::DataLossError(absl::StrCat(
                         std::string(list.path(at)), ".", name, ".npy is ", v.Describe(t.ragged),
                         " but ",
                         winner->count, " of ", members, " samples' '", name, "' are ",
                         winner->Describe(t.ragged), ": it", v.count > 1 ? " and " : "",
                         v.count > 1 ? absl::StrCat(v.count - 1, " more like it") : "",
                         v.count > 1 ? " fail" : " fails", " when read")),
                     "corrupt"),
                 extent.offset, /*rest_unread=*/false);
    }
    schemas.push_back(std::move(schema));
  }
  return schemas;
}

}  // namespace

absl::StatusOr<ShardFiles> ResolveShardFiles(const std::string& pattern,
                                             const std::string& extension) {
  ShardFiles result;
  struct stat st;
  if (pattern.find_first_of("*?[{") == std::string::npos) {
    if (::stat(pattern.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("'", pattern, "' does not exist"));
    }
    if (S_ISDIR(st.st_mode)) {
      result.root = pattern;
      absl::StatusOr<std::vector<std::string>> files = WalkDirectory(pattern, extension);
      if (!files.ok()) return files.status();
      result.files = *std::move(files);
    } else {
      result.root = FixedDirectory(pattern);
      result.files.push_back(fs::path(pattern).lexically_relative(result.root).native());
    }
  } else {
    result.root = FixedDirectory(pattern);
    std::vector<std::string> expanded;
    if (absl::Status s = ExpandBraces(pattern, expanded); !s.ok()) return s;
    for (const std::string& path : expanded) {
      if (!HasWildcard(path)) {
        if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
          return absl::NotFoundError(
              absl::StrCat("'", path, "' (from '", pattern, "') is not a readable file"));
        }
        result.files.push_back(fs::path(path).lexically_relative(result.root).native());
        continue;
      }
      glob_t g{};
      const int rc = ::glob(path.c_str(), 0, nullptr, &g);
      for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) {
        if (::stat(g.gl_pathv[i], &st) == 0 && S_ISREG(st.st_mode)) {
          result.files.push_back(fs::path(g.gl_pathv[i]).lexically_relative(result.root).native());
        }
      }
      ::globfree(&g);
    }
  }
  std::sort(result.files.begin(), result.files.end());
  result.files.erase(std::unique(result.files.begin(), result.files.end()), result.files.end());
  if (result.files.empty()) {
    return absl::NotFoundError(absl::StrCat("no ", extension.empty() ? "" : extension + " ",
                                            "files match '", pattern, "'"));
  }
  return result;
}

absl::StatusOr<std::string> ContainerIndexKey(const DatasetSpec& spec, const ShardFiles& files,
                                              int64_t* newest_mtime_ns) {
  std::string key = absl::StrCat(DatasetFormatName(spec.format), "\n", files.root, "\n",
                                 absl::StrJoin(spec.image_keys, ";"), "\n", spec.label_key, "\n",
                                 absl::StrJoin(spec.ragged, ";"), "\n", spec.ragged_max_rows, "\n");
  *newest_mtime_ns = 0;
  for (const std::string& file : files.files) {
    struct stat st;
    const std::string path = Join(files.root, file);
    if (::stat(path.c_str(), &st) != 0) return container::IoError(path, errno);
    const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1'000'000'000 + st.st_mtim.tv_nsec;
    *newest_mtime_ns = std::max(*newest_mtime_ns, mtime);
    absl::StrAppend(&key, file, "\t", st.st_size, "\t", mtime, "\n");
  }
  return key;
}

absl::StatusOr<SampleList> IndexWebDataset(const DatasetSpec& spec, const ShardFiles& files) {
  std::vector<FoundSample> found;
  uint64_t tensor_members = 0;
  SampleList list;
  list.files = files.files;
  int64_t last_report = base::SteadyNowNs();
  const bool json_label = absl::StartsWith(spec.label_key, "json:");
  const std::string label_ext = json_label ? "json" : spec.label_key;
  for (uint32_t f = 0; f < files.files.size(); ++f) {
    if (Cancelled(spec)) return CancelledIndexing(spec);
    const std::string path = Join(files.root, files.files[f]);
    IoRetryBudget budget(spec.io_retry, [&] { return Cancelled(spec); });
    absl::Status refused;  // by the memory hold: ends the indexing, not just this shard
    const auto hold = [&](uint64_t scan_bytes) {
      if (!spec.hold_memory) return absl::OkStatus();
      refused = spec.hold_memory(list.HeapBytesAhead() + FoundBytes(found, tensor_members) +
                                 scan_bytes);
      return refused;
    };
    absl::StatusOr<TarScan> scan = budget.Run<TarScan>([&] { return ScanTarShard(path, hold); });
    if (!refused.ok()) return refused;
    if (!scan.ok()) {
      AddProblem(list, files.files[f], ReadErrorOf(scan.status()), 0);
      continue;
    }
    if (!scan->stopped.ok()) {
      AddProblem(list, files.files[f], scan->stopped, DamageOffset(scan->stopped, path));
    }
    for (const WebDatasetSample& sample : GroupWebDatasetSamples(scan->members)) {
      FoundSample s;
      for (const auto& [ext, member] : sample.members) {
        const Extent extent{scan->members[member].offset, scan->members[member].size};
        if (s.image.missing()) {
          for (const std::string& key : spec.image_keys) {
            if (ext == key) s.image = extent;
          }
        }
        if (!label_ext.empty() && ext == label_ext) s.label = extent;
        if (absl::EndsWith(ext, ".npy") && ext.size() > 4) {
          const std::string name = ext.substr(0, ext.size() - 4);
          // A member that would take a name the batch already uses (KEY.images.npy) would
          // overwrite that tensor: it is not served, and the shard's problems say why.
          if (absl::Status named = CheckTensorName(name, TensorSource::kWebDatasetMember);
              !named.ok()) {
            AddProblem(list, files.files[f],
                       image::WithReason(absl::InvalidArgumentError(absl::StrCat(
                                             files.files[f], "#", sample.key, ".", ext, ": ",
                                             named.message(), "; the member is not served")),
                                         "unsupported"),
                       extent.offset, /*rest_unread=*/false);
            continue;
          }
          s.tensors.emplace_back(name, extent);
        }
      }
      tensor_members += s.tensors.size();
      list.Add(absl::StrCat(files.files[f], "#", sample.key), -1);
      list.sample_files.push_back(f);
      found.push_back(std::move(s));
      // The members found so far are held beside the list until the schemas are known.
      if (absl::Status held =
              list.CheckMemory(spec.hold_memory, FoundBytes(found, tensor_members));
          !held.ok()) {
        return held;
      }
    }
    ReportProgress(spec, last_report, f + 1, files.files.size(), list.size(), "shards");
  }

  absl::StatusOr<std::vector<TensorSchema>> schemas = WebDatasetSchemas(spec, files, found, list);
  if (!schemas.ok()) return schemas.status();
  list.tensors = *std::move(schemas);

  list.parts = 2 + static_cast<uint32_t>(list.tensors.size());
  list.extents.reserve(found.size() * list.parts);
  for (FoundSample& s : found) {
    list.extents.push_back(s.image);
    list.extents.push_back(s.label);
    for (const TensorSchema& t : list.tensors) {
      Extent e{Extent::kMissingOffset, 0};
      for (const auto& [name, extent] : s.tensors) {
        if (name == t.name) e = extent;
      }
      list.extents.push_back(e);
    }
  }
  return list;
}

absl::StatusOr<SampleList> IndexTfRecords(const DatasetSpec& spec, const ShardFiles& files) {
  SampleList list;
  list.files = files.files;
  list.parts = 1;
  int64_t last_report = base::SteadyNowNs();
  for (uint32_t f = 0; f < files.files.size(); ++f) {
    if (Cancelled(spec)) return CancelledIndexing(spec);
    const std::string path = Join(files.root, files.files[f]);
    IoRetryBudget budget(spec.io_retry, [&] { return Cancelled(spec); });
    absl::Status refused;  // by the memory hold: ends the indexing, not just this file
    const auto hold = [&](uint64_t scan_bytes) {
      if (!spec.hold_memory) return absl::OkStatus();
      refused = spec.hold_memory(list.HeapBytesAhead() + scan_bytes);
      return refused;
    };
    absl::StatusOr<TfRecordScan> scan =
        budget.Run<TfRecordScan>([&] { return ScanTfRecordFile(path, hold); });
    if (!refused.ok()) return refused;
    if (!scan.ok()) {
      AddProblem(list, files.files[f], ReadErrorOf(scan.status()), 0);
      continue;
    }
    if (!scan->stopped.ok()) {
      AddProblem(list, files.files[f], scan->stopped, DamageOffset(scan->stopped, path));
    }
    for (uint64_t r = 0; r < scan->records.size(); ++r) {
      list.Add(absl::StrCat(files.files[f], "#", r), -1);
      list.sample_files.push_back(f);
      list.extents.push_back({scan->records[r].offset, scan->records[r].length});
      if (absl::Status held = list.CheckMemory(spec.hold_memory); !held.ok()) return held;
    }
    ReportProgress(spec, last_report, f + 1, files.files.size(), list.size(), "files");
  }
  return list;
}

absl::StatusOr<SampleList> IndexArrays(const DatasetSpec& spec, std::vector<ArrayColumn>* columns) {
  absl::StatusOr<std::vector<std::string>> names = WalkDirectory(spec.root, ".npy");
  if (!names.ok()) return names.status();
  std::vector<ArrayColumn> found;
  for (const std::string& name : *names) {
    if (name.find('/') != std::string::npos) continue;  // only the directory's own files
    ArrayColumn column;
    column.name = name.substr(0, name.size() - 4);
    column.path = Join(spec.root, name);
    // The label column is read as labels, so only the others become tensors of their name.
    if (column.name != spec.label_array) {
      if (absl::Status named = CheckTensorName(column.name, TensorSource::kArraysFile);
          !named.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            column.path, ": ", named.message(),
            column.name == "labels" ? " (to read it as the labels, set label = \"labels\")"
                                    : "; rename the file"));
      }
    }
    absl::StatusOr<NpyHeader> header = ReadNpyHeader(column.path);
    if (!header.ok()) return header.status();
    column.header = *std::move(header);
    if (column.header.row_bytes == 0) {
      // Its first dimension would be the sample count, with nothing in any sample: a 128-byte
      // file could claim 10^12 samples.
      return absl::InvalidArgumentError(absl::StrCat(
          column.path, ": ", NpyTypeName(column.header.type), " ",
          ShapeText(column.header.shape), " has rows of 0 bytes: an array of the dataset needs ",
          "one non-empty row per sample"));
    }
    if (!found.empty() && column.header.shape[0] != found[0].header.shape[0]) {
      return absl::InvalidArgumentError(absl::StrCat(
          column.path, " has ", column.header.shape[0], " rows but ", found[0].path, " has ",
          found[0].header.shape[0], ": every array of the dataset must have one row per sample"));
    }
    found.push_back(std::move(column));
  }
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat("no .npy files in '", spec.root, "'"));
  }
  const uint64_t rows = found[0].header.shape[0];
  SampleList list;
  std::optional<ArrayColumn> label;
  for (ArrayColumn& column : found) {
    if (column.name == spec.label_array) {
      const NpyType t = column.header.type;
      const bool integer = t != NpyType::kFloat16 && t != NpyType::kFloat32 &&
                           t != NpyType::kFloat64 && t != NpyType::kBool;
      if (!integer || column.header.row_bytes != NpyTypeBytes(t)) {
        return absl::InvalidArgumentError(absl::StrCat(
            column.path, ": label = \"", spec.label_array, "\" needs one integer per row; it is ",
            NpyTypeName(t), " ", ShapeText(column.header.shape)));
      }
      label = std::move(column);
      continue;
    }
    list.tensors.push_back(TensorSchema{
        column.name, column.header.type,
        std::vector<uint64_t>(column.header.shape.begin() + 1, column.header.shape.end()), false});
    columns->push_back(std::move(column));
  }
  if (!spec.label_array.empty() && !label) {
    return absl::NotFoundError(absl::StrCat("label = \"", spec.label_array, "\": no ",
                                            spec.label_array, ".npy in '", spec.root, "'"));
  }
  if (label) columns->push_back(*std::move(label));
  for (uint64_t i = 0; i < rows; ++i) {
    list.Add(absl::StrCat("#", i), -1);
    if (absl::Status held = list.CheckMemory(spec.hold_memory); !held.ok()) return held;
  }
  return list;
}

}  // namespace ringloader::pipeline
