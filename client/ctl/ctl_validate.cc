// SPDX-License-Identifier: Apache-2.0
// ringloaderctl validate: decode every sample of a dataset without a daemon.
#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/ctl/ctl.h"
#include "proto/wire_text.h"
#include "server/daemon/config.h"
#include "server/image/image_format.h"
#include "server/image/sample_decoder.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/sample_reader.h"
#include "server/pipeline/sampler.h"
#include "server/pipeline/worker_pool.h"

namespace ringloader::ctl {
namespace {

// Decoder messages start with the sample's path; the BAD line already names it.
absl::string_view WithoutPathPrefix(absl::string_view message, absl::string_view path) {
  if (absl::StartsWith(message, path) && absl::StartsWith(message.substr(path.size()), ": ")) {
    message.remove_prefix(path.size() + 2);
  }
  return message;
}

}  // namespace

int RunValidate(const ValidateOptions& options, std::ostream& out, std::ostream& err) {
  const auto usage = [&](absl::string_view message) {
    err << "ringloaderctl validate: " << message << "\n";
    return kExitUsage;
  };
  pipeline::DatasetSpec spec;
  image::DecodeLimits limits;
  if (!options.config.empty()) {
    if (options.dataset.empty()) return usage("--config needs --dataset NAME");
    if (!options.path.empty() || !options.manifest.empty()) {
      return usage("--path and --manifest come from --config; give one or the other");
    }
    absl::StatusOr<server::DaemonConfig> config = server::LoadConfig(options.config);
    if (!config.ok()) return usage(config.status().message());
    const server::DatasetConfig* dc = config->FindDataset(options.dataset);
    if (dc == nullptr) {
      std::vector<std::string> names;
      for (const server::DatasetConfig& d : config->datasets) names.push_back(d.name);
      return usage(absl::StrCat(options.config, ": no dataset \"", options.dataset, "\" (",
                                names.empty() ? "none configured"
                                              : "configured: " + absl::StrJoin(names, ", "),
                                ")"));
    }
    spec = server::DatasetSpecOf(*dc, /*state_dir=*/"");
    limits = server::DecodeLimitsOf(*dc);
  } else {
    if (!options.dataset.empty()) return usage("--dataset needs --config FILE");
    if (options.path.empty()) return usage("give --path DIR, or --config FILE --dataset NAME");
    spec.name = options.path;
    bool known = false;
    for (auto f : {pipeline::DatasetFormat::kImageFolder, pipeline::DatasetFormat::kManifest,
                   pipeline::DatasetFormat::kWebDataset, pipeline::DatasetFormat::kTfRecord,
                   pipeline::DatasetFormat::kArrays}) {
      if (options.format == pipeline::DatasetFormatName(f)) {
        spec.format = f;
        known = true;
      }
    }
    if (!known) {
      return usage(absl::StrCat("--format must be imagefolder, manifest, webdataset, tfrecord "
                                "or arrays, got '", options.format, "'"));
    }
    if (spec.format == pipeline::DatasetFormat::kManifest && options.manifest.empty()) {
      return usage("--format manifest needs --manifest FILE");
    }
    if (!options.label.empty() && spec.format != pipeline::DatasetFormat::kArrays) {
      return usage("--label applies to --format arrays only");
    }
    spec.root = options.path;
    spec.manifest_path = options.manifest;
    spec.label_array = options.label;
  }
  if (options.max_pixels.has_value()) {
    if (*options.max_pixels == 0) return usage("--max-pixels must be > 0");
    limits.max_pixels = *options.max_pixels;
  }
  // No state_dir: validation never writes an index cache.
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> dataset = pipeline::Dataset::Open(spec);
  if (!dataset.ok()) return usage(dataset.status().message());
  const pipeline::Dataset& ds = **dataset;

  pipeline::WorkerPool pool(options.jobs);
  std::vector<std::unique_ptr<image::SampleDecoder>> decoders;
  for (uint32_t i = 0; i < pool.size(); ++i) {
    decoders.push_back(std::make_unique<image::SampleDecoder>(limits));
  }
  // Each sample as the daemon reads it: its image decoded, its label, its extra tensors.
  std::vector<absl::Status> results(ds.size());
  std::vector<image::ImageFormat> formats(ds.size(), image::ImageFormat::kUnknown);
  // Files are opened --io-depth at a time ahead of the decodes, in index order (a network
  // mount costs a round trip per open); the decodes take them as they come.
  // A lane as the daemon's: an overdue read is BAD only when the storage answers others.
  pipeline::LaneOptions lane;
  lane.probe = pipeline::SampleProbe(ds);
  lane.on_stall_change = [&err](bool stalled, std::chrono::milliseconds stalled_for) {
    if (stalled) {
      err << "ringloaderctl validate: the storage does not answer (reads overdue, a probe too): "
             "waiting for it\n";
    } else {
      err << "ringloaderctl validate: the storage answers again after "
          << stalled_for.count() / 1000.0 << " s\n";
    }
  };
  pipeline::ReadPool read_pool(std::max<uint32_t>(options.io_depth, 1), std::move(lane));
  const std::chrono::milliseconds deadline(options.deadline_ms);
  const pipeline::EpochShard in_order(ds.size(), pipeline::ShardSpec{.shuffle = false});
  std::optional<pipeline::ReadAhead> ahead;
  if (options.io_depth > 0) {
    ahead.emplace(read_pool, options.io_depth, /*memory=*/nullptr, /*observer=*/nullptr,
                  std::chrono::seconds(30));
    ahead->Advance(ds, in_order, 0, 0, /*end_epoch=*/1, limits.max_file_bytes, nullptr, "");
  }
  pool.ParallelFor(ds.size(), [&](uint64_t i, uint32_t worker) {
    std::shared_ptr<pipeline::PrefetchedSample> read = ahead ? ahead->Take(0, i) : nullptr;
    while (read != nullptr &&
           !read->WaitSettledUntil(std::chrono::steady_clock::now() +
                                   std::chrono::milliseconds(20))) {
      if (deadline.count() > 0 &&
          ahead->Judge(*read, deadline) == pipeline::ReadPool::Verdict::kPoison) {
        ahead->WriteOff(*read);  // left behind: another read takes its thread
        results[i] = image::WithReason(
            absl::DeadlineExceededError(absl::StrCat(
                ds.AbsolutePath(i), ": reading the file took longer than ", deadline.count(),
                " ms (--deadline-ms) while the storage answered other reads; given up")),
            "deadline_exceeded");
        return;
      }
    }
    if (read != nullptr && read->done() && !read->status().ok()) {
      results[i] = read->status();
      return;
    }
    std::optional<pipeline::SampleReader> opened =
        read != nullptr && read->done() ? read->TakeReader() : std::nullopt;
    absl::StatusOr<pipeline::SampleReader> reader =
        opened ? absl::StatusOr<pipeline::SampleReader>(*std::move(opened))
               : pipeline::SampleReader::Open(ds, i, limits.max_file_bytes);
    if (!reader.ok()) {
      results[i] = reader.status();
      return;
    }
    if (ds.has_images()) {
      absl::StatusOr<pipeline::ImageBytes> bytes = reader->ReadImage();
      if (!bytes.ok()) {
        results[i] = bytes.status();
        return;
      }
      image::ImageInfo info;
      formats[i] = image::SniffFormat(bytes->image());
      results[i] = decoders[worker]->DecodeRgb(bytes->image(), reader->where(), &info).status();
      if (!results[i].ok()) return;
    }
    if (ds.has_labels()) results[i] = reader->ReadLabel().status();
    std::vector<uint8_t> scratch;
    for (uint32_t t = 0; results[i].ok() && t < ds.tensors().size(); ++t) {
      scratch.resize(ds.tensors()[t].SampleBytes());
      results[i] = reader->ReadTensor(t, scratch).status();
    }
  });

  std::map<std::string, uint64_t> by_reason;
  uint64_t bad = 0;
  // Damage that ended a container file's index: what follows it in that file was not checked.
  for (const pipeline::IndexProblem& p : ds.index_problems()) {
    ++by_reason[p.reason];
    out << "BAD " << wire::EscapeBytes(p.file) << ": " << p.reason << ": "
        << wire::EscapeBytes(p.message)
        << (p.rest_unread ? " (the rest of the file is not read)" : "") << "\n";
  }
  for (const std::string& note : ds.index_notes()) {
    out << "NOTE " << wire::EscapeBytes(note) << "\n";
  }
  const uint64_t damaged_files = ds.index_problems().size();
  for (uint64_t i = 0; i < ds.size(); ++i) {
    if (results[i].ok()) continue;
    ++bad;
    const std::string reason(image::ErrorReason(results[i]));
    ++by_reason[reason];
    const std::string relative(ds.relative_path(i));
    // Messages start with where the sample is (absolute or relative): the line names it.
    absl::string_view message = WithoutPathPrefix(results[i].message(), relative);
    message = WithoutPathPrefix(message, ds.AbsolutePath(i));
    message = WithoutPathPrefix(message, reason);  // the line says the reason once
    out << "BAD " << wire::EscapeBytes(relative) << ": " << reason << ": "
        << wire::EscapeBytes(std::string_view(message.data(), message.size())) << "\n";
  }
  out << "checked " << ds.size() << (ds.format() == pipeline::DatasetFormat::kImageFolder ||
                                              ds.format() == pipeline::DatasetFormat::kManifest
                                          ? " files: "
                                          : " samples: ")
      << ds.size() - bad << " good, " << bad << " bad";
  if (damaged_files > 0) out << ", " << damaged_files << " damaged files";
  if (!by_reason.empty()) {
    out << " (" << absl::StrJoin(by_reason, ", ", absl::PairFormatter(": ")) << ")";
  }
  out << "\n";
  if (ds.has_images() && ds.size() > 0) {
    // By content: a PNG named .jpg counts as png. Files that could not be read count as unknown.
    std::map<std::string, uint64_t> by_format;
    for (image::ImageFormat f : formats) ++by_format[std::string(image::FormatName(f))];
    out << "formats: " << absl::StrJoin(by_format, ", ", absl::PairFormatter(" ")) << "\n";
  }
  if (ds.ignored_count() > 0) out << ds.IgnoredText() << "\n";
  return bad == 0 && damaged_files == 0 ? kExitOk : kExitFailure;
}

}  // namespace ringloader::ctl
