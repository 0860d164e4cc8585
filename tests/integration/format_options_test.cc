// SPDX-License-Identifier: Apache-2.0
// Issue 27 item 4: every dataset format with every dataset option, through the real daemon and the
// C++ client, and index-time read errors (retried; a list that lost files is never cached).
//
// The same 40 synthetic samples (make-dataset, seed 11) as imagefolder, manifest, WebDataset,
// TFRecord and arrays; each served with cache none/memory, labels or none, on_error skip/fail,
// for two eval epochs and a train epoch. Every epoch has each sample exactly once, with the label
// its file says (-1 without labels), and the same bytes as every other variant of the sample.
#include <catch2/catch.hpp>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
constexpr int kSamples = 40;

struct Variant {
  std::string format;  // as in the config
  bool cache = false;
  bool labels = true;
  std::string on_error = "skip";
  std::string Name() const {
    return format + (cache ? "_cache" : "_nocache") + (labels ? "_labels" : "_nolabels") + "_" +
           on_error;
  }
};

// The datasets on disk and the [[datasets]] table of each variant.
class Data {
 public:
  Data() {
    for (const char* format : {"imagefolder", "webdataset", "tfrecord", "arrays"}) {
      std::vector<std::string> args = {CtlPath(),      "make-dataset",
                                       "--out",        Path(format),
                                       "--count",      std::to_string(kSamples),
                                       "--classes",    "4",
                                       "--seed",       "11",
                                       "--format",     format,
                                       "--shard-size", "16"};
      const CommandResult made = RunCommand(args);
      INFO(made.output);
      REQUIRE(made.exit_code == 0);
    }
    // A manifest over the imagefolder, in its sample order.
    std::vector<std::string> files;
    for (const auto& e : fs::recursive_directory_iterator(Path("imagefolder"))) {
      if (e.is_regular_file()) files.push_back(fs::relative(e.path(), Path("imagefolder")));
    }
    std::sort(files.begin(), files.end());
    std::string manifest = "path\tlabel\n";
    for (const std::string& f : files) {
      manifest += f + "\t" + std::to_string(DaemonFixture::LabelOfPath(f)) + "\n";
    }
    WriteFile(Path("manifest.tsv"), manifest);
    // The arrays without their label column.
    fs::create_directory(Path("arrays_nolabels"));
    for (const char* column : {"images.npy", "depth.npy"}) {
      fs::copy_file(Path("arrays/") + column, Path("arrays_nolabels/") + column);
    }
  }

  std::string Path(const std::string& name) const { return dir_.Join(name); }

  std::string Table(const Variant& v) const {
    std::string t = "[[datasets]]\nname = \"" + v.Name() + "\"\nformat = \"" + v.format + "\"\n";
    if (v.format == "imagefolder") t += "path = \"" + Path("imagefolder") + "\"\n";
    if (v.format == "manifest") {
      t += "path = \"" + Path("imagefolder") + "\"\nmanifest = \"" + Path("manifest.tsv") + "\"\n";
    }
    if (v.format == "webdataset") {
      t += "path = \"" + Path("webdataset") + "\"\n";
      if (!v.labels) t += "label_key = \"\"\n";
    }
    if (v.format == "tfrecord") {
      t += "path = \"" + Path("tfrecord") + "/*.tfrecord\"\n";
      if (!v.labels) t += "label_feature = \"\"\n";
    }
    if (v.format == "arrays")
      t += "path = \"" + Path(v.labels ? "arrays" : "arrays_nolabels") + "\"\n";
    if (v.cache) t += "cache = \"memory\"\n";
    t += "on_error = \"" + v.on_error + "\"\n";
    return t;
  }

 private:
  TempDir dir_;
};

std::vector<Variant> AllVariants() {
  std::vector<Variant> all;
  for (const char* format : {"imagefolder", "manifest", "webdataset", "tfrecord", "arrays"}) {
    const bool labels_optional =
        std::string(format) != "imagefolder" && std::string(format) != "manifest";
    for (bool cache : {false, true}) {
      for (bool labels : {true, false}) {
        if (!labels && !labels_optional) continue;
        for (const char* on_error : {"skip", "fail"})
          all.push_back({format, cache, labels, on_error});
      }
    }
  }
  return all;
}

// What a stream served of one sample.
struct Served {
  int64_t label = 0;
  size_t digest = 0;  // of the sample's image (or, for arrays, of every column's row)
};
// epoch -> sample index -> what was served.
using Epochs = std::map<uint64_t, std::map<uint64_t, Served>>;

size_t RowDigest(const client::TensorView& t, uint32_t row, uint32_t rows) {
  const size_t bytes = t.bytes() / rows;
  return std::hash<std::string_view>{}(
      std::string_view(reinterpret_cast<const char*>(t.data<uint8_t>()) + row * bytes, bytes));
}

Epochs Read(const DaemonFixture& daemon, const std::string& dataset, client::Augment augment,
            uint64_t epochs) {
  client::Client c(daemon.endpoint());
  client::StreamOptions o;
  o.dataset = dataset;
  o.batch_size = 8;
  o.seed = 5;
  o.image_size = 32;
  o.augment = augment;
  o.end_epoch = epochs;
  auto stream = c.Open(o);
  Epochs out;
  while (std::optional<client::Batch> batch = stream->Next()) {
    const int64_t* labels = batch->labels().data<int64_t>();
    const int64_t* indices = batch->indices().data<int64_t>();
    for (uint32_t i = 0; i < batch->size(); ++i) {
      size_t digest = 0;
      for (const client::TensorView& t : batch->tensors()) {
        if (t.name() == "labels" || t.name() == "indices" || t.name() == "depth") continue;
        digest = digest * 31 + RowDigest(t, i, batch->size());
      }
      INFO(dataset << " epoch " << batch->position().epoch << " sample " << indices[i]);
      CHECK(out[batch->position().epoch]
                .emplace(static_cast<uint64_t>(indices[i]), Served{labels[i], digest})
                .second);
    }
  }
  return out;
}

TEST_CASE(
    "27: every format with every dataset option (cache, labels or none, on_error, eval and "
    "train) serves each sample exactly once with its file's label and the same bytes",
    "[integration][formats]") {
  Data data;
  const std::vector<Variant> variants = AllVariants();
  DaemonFixtureOptions options;
  options.images = 4;
  for (const Variant& v : variants) options.config_extra += data.Table(v);
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());

  // The reference: the imagefolder's labels (from the class folders) and bytes.
  const Epochs eval_reference =
      Read(daemon, "imagefolder_nocache_labels_skip", client::Augment::kEval, 2);
  const Epochs train_reference =
      Read(daemon, "imagefolder_nocache_labels_skip", client::Augment::kTrain, 1);
  std::map<std::string, Epochs> arrays_eval;  // arrays have no images: compared among themselves
  for (const Variant& v : variants) {
    for (const client::Augment augment : {client::Augment::kEval, client::Augment::kTrain}) {
      const bool eval = augment == client::Augment::kEval;
      const Epochs got = Read(daemon, v.Name(), augment, eval ? 2 : 1);
      const Epochs& reference = eval ? eval_reference : train_reference;
      INFO(v.Name() << (eval ? " eval" : " train"));
      REQUIRE(got.size() == (eval ? 2u : 1u));
      for (const auto& [epoch, samples] : got) {
        INFO("epoch " << epoch);
        CHECK(samples.size() == kSamples);
        for (const auto& [index, served] : samples) {
          INFO("sample " << index);
          const Served& want = reference.at(epoch).at(index);
          CHECK(served.label == (v.labels ? want.label : -1));
          if (v.format != "arrays") CHECK(served.digest == want.digest);
        }
      }
      if (v.format == "arrays" && eval) {
        for (const auto& [name, other] : arrays_eval) {
          INFO("vs " << name);
          for (const auto& [epoch, samples] : got) {
            for (const auto& [index, served] : samples) {
              CHECK(served.digest == other.at(epoch).at(index).digest);
            }
          }
        }
        arrays_eval[v.Name()] = got;
      }
    }
  }
  const CommandResult stats = daemon.Ctl({"stats"});
  INFO(stats.output);
  CHECK_THAT(stats.output, !Catch::Contains("damaged files"));
}

std::string WebDatasetTable(const std::string& path) {
  return "[[datasets]]\nname = \"wds\"\nformat = \"webdataset\"\npath = \"" + path + "\"\n";
}

TEST_CASE(
    "27: a shard whose reads fail transiently while indexing is retried, and one that "
    "stays unreadable is left out but never cached as gone",
    "[integration][formats]") {
  Data data;
  // Old enough for the index cache to be written (its racy-write rule).
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& e : fs::recursive_directory_iterator(data.Path("webdataset"))) {
    fs::last_write_time(e, old);
  }
  const std::string failpoint = "[failpoints]\nio_fault_path = \"*/shard-000001.tar\"\n";

  SECTION("transient: retried until it reads") {
    DaemonFixtureOptions options;
    options.images = 4;
    options.config_extra = WebDatasetTable(data.Path("webdataset")) + failpoint +
                           "io_fault_errno = \"EIO\"\nio_fault_times = 3\n";
    DaemonFixture daemon(options);
    REQUIRE(daemon.Start());
    CHECK(Read(daemon, "wds", client::Augment::kEval, 1).at(0).size() == kSamples);
  }

  SECTION("persistent: left out with io_error, indexed again at the next start") {
    DaemonFixtureOptions options;
    options.images = 4;
    options.server_extra = "io_retry_ms = 300";
    options.config_extra = WebDatasetTable(data.Path("webdataset")) + failpoint +
                           "io_fault_errno = \"ESTALE\"\nio_fault_times = 1000000\n";
    DaemonFixture daemon(options);
    REQUIRE(daemon.Start());
    CHECK_THAT(daemon.Log(), Catch::Contains("shard-000001.tar") && Catch::Contains("io_error"));
    CHECK(Read(daemon, "wds", client::Augment::kEval, 1).at(0).size() == kSamples - 16);
    REQUIRE(daemon.Stop() == 0);

    // The mount recovers: the next start sees every shard.
    std::string config = ReadFile(daemon.config_path());
    config = config.substr(0, config.find("[failpoints]"));
    WriteFile(daemon.config_path(), config);
    REQUIRE(daemon.Start());
    CHECK(Read(daemon, "wds", client::Augment::kEval, 1).at(0).size() == kSamples);
    REQUIRE(daemon.Stop() == 0);
    // ... and that complete index is cached.
    REQUIRE(daemon.Start());
    CHECK_THAT(daemon.Log(), Catch::Contains("(index cache)"));
    CHECK(Read(daemon, "wds", client::Augment::kEval, 1).at(0).size() == kSamples);
  }
}

}  // namespace
}  // namespace ringloader::testing
