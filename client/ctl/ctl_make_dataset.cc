// SPDX-License-Identifier: Apache-2.0
// ringloaderctl make-dataset: a synthetic dataset for demos and tests: an imagefolder, or one
// written from it in another format (dataset_writer.h).
#include <unistd.h>

#include <filesystem>
#include <ostream>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "client/ctl/ctl.h"
#include "client/ctl/dataset_writer.h"
#include "server/image/synthetic.h"
#include "server/pipeline/dataset.h"

namespace ringloader::ctl {
namespace {

// Generates the imagefolder in `temp_dir`, writes options.format from it into out_dir and returns
// the summary line.
absl::StatusOr<std::string> MakeVia(const MakeDatasetOptions& options,
                                    const std::string& temp_dir) {
  image::SyntheticDatasetOptions synthetic;
  synthetic.out_dir = temp_dir;
  synthetic.count = options.count;
  synthetic.classes = options.classes;
  synthetic.seed = options.seed;
  absl::StatusOr<uint32_t> generated = image::WriteSyntheticDataset(synthetic);
  if (!generated.ok()) return generated.status();
  pipeline::DatasetSpec spec;
  spec.name = options.out_dir;
  spec.format = pipeline::DatasetFormat::kImageFolder;
  spec.root = temp_dir;
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> dataset = pipeline::Dataset::Open(spec);
  if (!dataset.ok()) return dataset.status();
  const std::string summary = absl::StrCat("wrote ", (*dataset)->size(), " samples in ",
                                           options.classes, " classes to ", options.out_dir,
                                           " as ", options.format);
  if (options.format == "arrays") {
    absl::Status written = WriteArrays(**dataset, {options.out_dir, options.image_size});
    if (!written.ok()) return written;
    return summary;
  }
  ShardWriteOptions shards;
  shards.format =
      options.format == "webdataset" ? ShardFormat::kWebDataset : ShardFormat::kTfRecord;
  shards.out_dir = options.out_dir;
  shards.shard_size = options.shard_size;
  shards.label_base = options.label_base;
  shards.depth = shards.format == ShardFormat::kWebDataset;
  absl::StatusOr<uint64_t> shard_count = WriteShards(**dataset, shards);
  if (!shard_count.ok()) return shard_count.status();
  return absl::StrCat(summary, " (", *shard_count, " shards)");
}

}  // namespace

int RunMakeDataset(const MakeDatasetOptions& options, std::ostream& out, std::ostream& err) {
  const auto usage = [&](absl::string_view message) {
    err << "ringloaderctl make-dataset: " << message << "\n";
    return kExitUsage;
  };
  if (options.out_dir.empty() || options.count == 0 || options.classes == 0) {
    return usage("--out must be set and --count, --classes must be > 0");
  }
  if (options.count < options.classes) {
    return usage(absl::StrCat("--count ", options.count, " is less than --classes ",
                              options.classes,
                              ": every class folder needs an image (an empty one is an error, "
                              "as in torchvision's ImageFolder)"));
  }
  const bool sharded = options.format == "webdataset" || options.format == "tfrecord";
  if (!sharded && options.format != "imagefolder" && options.format != "arrays") {
    return usage(absl::StrCat("--format must be imagefolder, webdataset, tfrecord or arrays, got '",
                              options.format, "'"));
  }
  if (options.shard_size == 0 || options.image_size == 0) {
    return usage("--shard-size and --image-size must be > 0");
  }
  // Refused rather than ignored: labels that silently stay 0-based would mislead a test.
  if (options.label_base != 0 && options.format != "tfrecord") {
    return usage("--label-base applies to --format tfrecord only");
  }

  if (options.format == "imagefolder") {
    image::SyntheticDatasetOptions synthetic;
    synthetic.out_dir = options.out_dir;
    synthetic.count = options.count;
    synthetic.classes = options.classes;
    synthetic.seed = options.seed;
    absl::StatusOr<uint32_t> written = image::WriteSyntheticDataset(synthetic);
    if (!written.ok()) {
      err << "ringloaderctl make-dataset: " << written.status().message() << "\n";
      return kExitFailure;
    }
    out << "wrote " << *written << " images in " << options.classes << " classes to "
        << options.out_dir << "\n";
    return kExitOk;
  }

  if (sharded) {
    absl::StatusOr<std::string> existing = FindShardFile(options.out_dir);
    if (!existing.ok()) return usage(existing.status().message());
    if (!existing->empty()) {
      return usage(absl::StrCat(options.out_dir, " already holds shards (", *existing,
                                "): give an --out without shard-* files"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    err << "ringloaderctl make-dataset: " << options.out_dir << ": " << ec.message() << "\n";
    return kExitFailure;
  }
  // Inside out_dir, so it is on the same filesystem; hidden, so no dataset listing sees it.
  const std::string temp_dir = absl::StrCat(options.out_dir, "/.imagefolder-tmp-", ::getpid());
  std::filesystem::remove_all(temp_dir, ec);  // a leftover of a dead process with our pid
  absl::StatusOr<std::string> summary = MakeVia(options, temp_dir);
  std::filesystem::remove_all(temp_dir, ec);
  if (ec) {
    err << "ringloaderctl make-dataset: cannot remove " << temp_dir << ": " << ec.message()
        << "\n";
  }
  if (!summary.ok()) {
    err << "ringloaderctl make-dataset: " << summary.status().message() << "\n";
    return kExitFailure;
  }
  out << *summary << "\n";
  return kExitOk;
}

}  // namespace ringloader::ctl
