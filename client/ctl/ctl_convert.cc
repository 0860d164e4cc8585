// SPDX-License-Identifier: Apache-2.0
// ringloaderctl convert: an imagefolder rewritten as WebDataset or TFRecord shards.
#include <filesystem>
#include <ostream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "client/ctl/ctl.h"
#include "client/ctl/dataset_writer.h"
#include "server/pipeline/dataset.h"

namespace ringloader::ctl {

int RunConvert(const ConvertOptions& options, std::ostream& out, std::ostream& err) {
  const auto fail = [&](absl::string_view message, int code) {
    err << "ringloaderctl convert: " << message << "\n";
    return code;
  };
  if (options.from != "imagefolder") {
    return fail(absl::StrCat("--from must be imagefolder, got '", options.from, "'"), kExitUsage);
  }
  if (options.to != "webdataset" && options.to != "tfrecord") {
    return fail(absl::StrCat("--to must be webdataset or tfrecord, got '", options.to, "'"),
                kExitUsage);
  }
  if (options.path.empty() || options.out_dir.empty()) {
    return fail("--path and --out must be set", kExitUsage);
  }
  if (options.shard_size == 0) return fail("--shard-size must be > 0", kExitUsage);

  // No state_dir: converting never writes an index cache.
  pipeline::DatasetSpec spec;
  spec.name = options.path;
  spec.format = pipeline::DatasetFormat::kImageFolder;
  spec.root = options.path;
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> dataset = pipeline::Dataset::Open(spec);
  if (!dataset.ok()) return fail(dataset.status().message(), kExitUsage);

  // Shards of an earlier run past our last one would silently join the dataset.
  absl::StatusOr<std::string> existing = FindShardFile(options.out_dir);
  if (!existing.ok()) return fail(existing.status().message(), kExitUsage);
  if (!existing->empty()) {
    return fail(absl::StrCat(options.out_dir, " already holds shards (", *existing,
                             "): give an --out without shard-* files"),
                kExitUsage);
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) return fail(absl::StrCat(options.out_dir, ": ", ec.message()), kExitFailure);

  ShardWriteOptions shards;
  shards.format = options.to == "webdataset" ? ShardFormat::kWebDataset : ShardFormat::kTfRecord;
  shards.out_dir = options.out_dir;
  shards.shard_size = options.shard_size;
  // Errors name the file: "<path>: read_error: ...".
  absl::StatusOr<uint64_t> shard_count = WriteShards(**dataset, shards);
  if (!shard_count.ok()) return fail(shard_count.status().message(), kExitFailure);
  out << "converted " << (*dataset)->size() << " samples from " << options.path << " to "
      << options.out_dir << " as " << options.to << " (" << *shard_count << " shards)\n";
  return kExitOk;
}

}  // namespace ringloader::ctl
