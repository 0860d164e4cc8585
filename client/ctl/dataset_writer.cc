// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/dataset_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/image/sample_decoder.h"
#include "server/image/sample_file.h"
#include "server/image/transform.h"
#include "server/pipeline/npy.h"
#include "server/pipeline/tar_shard.h"
#include "server/pipeline/tf_example.h"
#include "server/pipeline/tfrecord.h"
#include "shm/base/text.h"

namespace ringloader::ctl {
namespace {

static_assert(std::endian::native == std::endian::little,
              "labels and depth are copied as they are in memory; .npy says little-endian");

constexpr uint32_t kDepthSide = 8;
constexpr size_t kMaxTarPath = 100;  // pipeline::AppendTarMember writes plain ustar names

// An output file written front to back into "PATH.tmp.<pid>" and renamed to PATH by Commit().
// Destroyed uncommitted, it removes the temporary. Appends are buffered up to kFlushBytes, so a
// writer holds at most that plus one sample.
class PendingFile {
 public:
  explicit PendingFile(std::string path)
      : path_(std::move(path)), temp_(absl::StrCat(path_, ".tmp.", ::getpid())) {}
  ~PendingFile() {
    if (fd_ >= 0) ::close(fd_);
    if (created_ && !committed_) ::unlink(temp_.c_str());
  }
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

  const std::string& path() const { return path_; }

  absl::Status Create() {
    // O_TRUNC, not O_EXCL: a leftover with our pid is from a dead process, never a live writer.
    fd_ = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) {
      const int err = errno;  // before StrCat allocates
      return Error(absl::StrCat("cannot create ", temp_), err);
    }
    created_ = true;
    return absl::OkStatus();
  }

  absl::Status Append(std::string_view bytes) {
    buffer_.append(bytes);
    return buffer_.size() >= kFlushBytes ? Flush() : absl::OkStatus();
  }

  absl::Status Commit() {
    absl::Status flushed = Flush();
    if (!flushed.ok()) return flushed;
    if (::fsync(fd_) != 0) return Error("cannot write", errno);
    if (::close(std::exchange(fd_, -1)) != 0) return Error("cannot write", errno);
    if (std::rename(temp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      return Error(absl::StrCat("cannot rename ", temp_, " to it"), err);
    }
    committed_ = true;
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kFlushBytes = size_t{1} << 20;

  absl::Status Flush() {
    std::string_view rest = buffer_;
    while (!rest.empty()) {
      const ssize_t n = ::write(fd_, rest.data(), rest.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Error("cannot write", n < 0 ? errno : EIO);
      rest.remove_prefix(static_cast<size_t>(n));
    }
    buffer_.clear();
    return absl::OkStatus();
  }

  absl::Status Error(absl::string_view what, int err) const {
    return absl::UnavailableError(absl::StrCat(path_, ": ", what, ": ", std::strerror(err)));
  }

  std::string path_;
  std::string temp_;
  std::string buffer_;
  int fd_ = -1;
  bool created_ = false;
  bool committed_ = false;
};

std::string JoinPath(const std::string& dir, std::string_view name) {
  return absl::StrCat(dir, "/", base::Sv(name));
}

std::string_view AsChars(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

// A JSON string literal. Bytes >= 0x80 pass through: imagefolder names are UTF-8 in practice.
std::string JsonString(std::string_view text) {
  std::string quoted = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      quoted += '\\';
      quoted += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      quoted += absl::StrFormat("\\u%04x", static_cast<unsigned>(c));
    } else {
      quoted += c;
    }
  }
  return quoted + "\"";
}

// The WebDataset key of sample `index`: its relative path without the extension. Readers end a
// key at the first '.' of the member's file name, so a name with a '.' before its extension
// would come back as another key; and AppendTarMember keeps only 100 bytes of a member path.
absl::StatusOr<std::string> WebDatasetKey(const pipeline::Dataset& dataset, uint64_t index,
                                          size_t longest_suffix) {
  const std::string_view relative = dataset.relative_path(index);
  const size_t slash = relative.rfind('/');
  const size_t name_start = slash == std::string_view::npos ? 0 : slash + 1;
  const size_t dot = relative.find('.', name_start);
  if (dot == std::string_view::npos || dot != relative.rfind('.')) {
    return absl::InvalidArgumentError(absl::StrCat(
        dataset.AbsolutePath(index),
        ": a '.' in the file name before its extension: WebDataset keys end at the first '.'"));
  }
  std::string key(relative.substr(0, dot));
  if (key.size() + longest_suffix > kMaxTarPath) {
    return absl::InvalidArgumentError(
        absl::StrCat(dataset.AbsolutePath(index), ": the tar member name \"", key, "...\" is over ",
                     kMaxTarPath, " bytes"));
  }
  return key;
}

// Appends sample `index` (its members, or its record) to `out`.
absl::Status AppendSample(const pipeline::Dataset& dataset, uint64_t index,
                          const ShardWriteOptions& options, std::string& out) {
  const std::string path = dataset.AbsolutePath(index);
  absl::StatusOr<std::vector<uint8_t>> bytes = image::ReadFileBytes(path);
  if (!bytes.ok()) return bytes.status();
  const std::string jpeg(AsChars(*bytes));
  bytes->clear();
  bytes->shrink_to_fit();
  const int64_t label = dataset.label(index);
  if (options.format == ShardFormat::kTfRecord) {
    const std::string record =
        pipeline::MakeExampleRecord(jpeg, label + options.label_base, pipeline::ExampleKeys{});
    pipeline::AppendTfRecord(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(record.data()), record.size()),
        out);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> key =
      WebDatasetKey(dataset, index, options.depth ? sizeof(".depth.npy") - 1 : sizeof(".json") - 1);
  if (!key.ok()) return key.status();
  pipeline::AppendTarMember(*key + ".jpg", jpeg, out);
  pipeline::AppendTarMember(*key + ".cls", absl::StrCat(label), out);
  pipeline::AppendTarMember(
      *key + ".json",
      absl::StrCat("{\"label\": ", label, ", \"path\": ",
                   JsonString(dataset.relative_path(index)), "}"),
      out);
  if (options.depth) {
    pipeline::AppendTarMember(
        *key + ".depth.npy",
        pipeline::MakeNpyHeader(pipeline::NpyType::kFloat32, {kDepthSide, kDepthSide}) +
            DepthBytes(index),
        out);
  }
  return absl::OkStatus();
}

absl::Status FinishShard(PendingFile& shard, ShardFormat format) {
  if (format == ShardFormat::kWebDataset) {
    std::string end;
    pipeline::AppendTarEnd(end);
    absl::Status appended = shard.Append(end);
    if (!appended.ok()) return appended;
  }
  return shard.Commit();
}

// WriteShards without the clean-up: `written` receives each shard once it is complete.
absl::Status WriteEveryShard(const pipeline::Dataset& dataset, const ShardWriteOptions& options,
                             std::vector<std::string>& written) {
  std::unique_ptr<PendingFile> shard;
  std::string sample;
  for (uint64_t i = 0; i < dataset.size(); ++i) {
    if (i % options.shard_size == 0) {
      if (shard != nullptr) {
        absl::Status finished = FinishShard(*shard, options.format);
        if (!finished.ok()) return finished;
        written.push_back(shard->path());
      }
      shard = std::make_unique<PendingFile>(
          JoinPath(options.out_dir, ShardFileName(options.format, i / options.shard_size)));
      absl::Status created = shard->Create();
      if (!created.ok()) return created;
    }
    sample.clear();
    absl::Status s = AppendSample(dataset, i, options, sample);
    if (s.ok()) s = shard->Append(sample);
    if (!s.ok()) return s;
  }
  if (shard != nullptr) {
    absl::Status finished = FinishShard(*shard, options.format);
    if (!finished.ok()) return finished;
    written.push_back(shard->path());
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShardFileName(ShardFormat format, uint64_t shard) {
  return absl::StrFormat("shard-%06u.%s", shard,
                         format == ShardFormat::kWebDataset ? "tar" : "tfrecord");
}

absl::StatusOr<uint64_t> WriteShards(const pipeline::Dataset& dataset,
                                     const ShardWriteOptions& options) {
  if (options.shard_size == 0) return absl::InvalidArgumentError("shard size must be > 0");
  std::vector<std::string> written;
  absl::Status s = WriteEveryShard(dataset, options, written);
  if (!s.ok()) {
    for (const std::string& path : written) ::unlink(path.c_str());
    return s;
  }
  return written.size();
}

absl::StatusOr<std::string> FindShardFile(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return std::string();
  std::string first;
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!absl::StartsWith(name, "shard-") ||
        !(absl::EndsWith(name, ".tar") || absl::EndsWith(name, ".tfrecord"))) {
      continue;
    }
    if (first.empty() || name < first) first = name;
  }
  if (ec) return absl::UnavailableError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  return first.empty() ? first : JoinPath(dir, first);
}

absl::Status WriteArrays(const pipeline::Dataset& dataset, const ArraysWriteOptions& options) {
  if (options.image_size == 0) return absl::InvalidArgumentError("image size must be > 0");
  const uint64_t n = dataset.size();
  const uint64_t side = options.image_size;
  image::TransformSpec spec;
  spec.image_size = options.image_size;
  spec.augment = image::Augment::kEval;
  spec.dtype = image::DType::kUint8;
  spec.layout = image::Layout::kNHWC;
  spec.exact_resize = false;

  PendingFile images(JoinPath(options.out_dir, "images.npy"));
  PendingFile labels(JoinPath(options.out_dir, "labels.npy"));
  PendingFile depth(JoinPath(options.out_dir, "depth.npy"));
  const std::pair<PendingFile*, std::string> headers[] = {
      {&images, pipeline::MakeNpyHeader(pipeline::NpyType::kUint8, {n, side, side, 3})},
      {&labels, pipeline::MakeNpyHeader(pipeline::NpyType::kInt64, {n})},
      {&depth, pipeline::MakeNpyHeader(pipeline::NpyType::kFloat32, {n, kDepthSide, kDepthSide})},
  };
  for (const auto& [file, header] : headers) {
    absl::Status s = file->Create();
    if (s.ok()) s = file->Append(header);
    if (!s.ok()) return s;
  }

  image::SampleDecoder decoder{image::DecodeLimits{}};
  std::vector<uint8_t> row(spec.SampleBytes());
  for (uint64_t i = 0; i < n; ++i) {
    const std::string path = dataset.AbsolutePath(i);
    absl::StatusOr<std::vector<uint8_t>> bytes =
        image::ReadFileBytes(path, decoder.limits().max_file_bytes);
    if (!bytes.ok()) return bytes.status();
    image::SampleRng rng(/*seed=*/0, /*epoch=*/0, i);
    absl::Status s = decoder.DecodeInto(*bytes, path, spec, rng, row);
    if (s.ok()) s = images.Append(AsChars(row));
    const int64_t label = dataset.label(i);
    if (s.ok()) s = labels.Append(std::string_view(reinterpret_cast<const char*>(&label), 8));
    if (s.ok()) s = depth.Append(DepthBytes(i));
    if (!s.ok()) return s;
  }
  // images.npy last: whenever it is there, this run's labels.npy and depth.npy are too.
  for (PendingFile* file : {&labels, &depth, &images}) {
    absl::Status s = file->Commit();
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string DepthBytes(uint64_t index) {
  std::string bytes(kDepthSide * kDepthSide * sizeof(float), '\0');
  const float first = static_cast<float>(index % 97);
  for (uint32_t y = 0; y < kDepthSide; ++y) {
    for (uint32_t x = 0; x < kDepthSide; ++x) {
      const float v = first + 0.01f * static_cast<float>(y) + 0.001f * static_cast<float>(x);
      std::memcpy(bytes.data() + (y * kDepthSide + x) * sizeof(float), &v, sizeof(float));
    }
  }
  return bytes;
}

}  // namespace ringloader::ctl
