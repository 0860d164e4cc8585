// SPDX-License-Identifier: Apache-2.0
// Issue 11 end to end: WebDataset, TFRecord and arrays datasets made by `ringloaderctl
// make-dataset` and `convert`, served by the real daemon, read through the C++ client and
// `ringloaderctl consume`, checked by `validate`.
#include <catch2/catch.hpp>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

constexpr int kSamples = 40;

// Every format of the same synthetic samples (seed 11), written by the real ringloaderctl.
class Formats {
 public:
  Formats() {
    for (const char* format : {"imagefolder", "webdataset", "tfrecord", "arrays"}) {
      Make(format);
    }
    const CommandResult converted =
        RunCommand({CtlPath(), "convert", "--from", "imagefolder", "--to", "webdataset", "--path",
                    Path("imagefolder"), "--out", Path("converted"), "--shard-size", "16"});
    INFO(converted.output);
    REQUIRE(converted.exit_code == 0);
    CHECK_THAT(converted.output, Catch::Contains("converted 40 samples") &&
                                     Catch::Contains("(3 shards)"));
  }
  std::string Path(const std::string& name) const { return data_.Join(name); }
  // [[datasets]] tables for DaemonFixtureOptions::config_extra.
  std::string Config() const {
    return "[[datasets]]\nname = \"if\"\nformat = \"imagefolder\"\npath = \"" +
           Path("imagefolder") + "\"\n" +
           "[[datasets]]\nname = \"wds\"\nformat = \"webdataset\"\npath = \"" +
           Path("webdataset") + "/shard-{000000..000002}.tar\"\nlabel_key = \"json:label\"\n" +
           "[[datasets]]\nname = \"converted\"\nformat = \"webdataset\"\npath = \"" +
           Path("converted") + "\"\n" +
           "[[datasets]]\nname = \"tfr\"\nformat = \"tfrecord\"\npath = \"" + Path("tfrecord") +
           "/*.tfrecord\"\nlabel_offset = -1\n" +
           "[[datasets]]\nname = \"arr\"\nformat = \"arrays\"\npath = \"" + Path("arrays") +
           "\"\nlabel = \"labels\"\n";
  }

 private:
  void Make(const std::string& format) {
    std::vector<std::string> args = {CtlPath(), "make-dataset", "--out", Path(format),
                                     "--count", std::to_string(kSamples), "--classes", "4",
                                     "--seed", "11", "--format", format, "--shard-size", "16"};
    if (format == "tfrecord") args.insert(args.end(), {"--label-base", "1"});
    const CommandResult made = RunCommand(args);
    INFO(made.output);
    REQUIRE(made.exit_code == 0);
  }
  TempDir data_;
};

std::vector<SampleLine> Consume(const DaemonFixture& d, const std::string& dataset,
                                const std::string& out) {
  const CommandResult r = d.Ctl({"consume", "--dataset", dataset, "--batch-size", "6",
                                 "--epochs", "2", "--seed", "5", "--augment", "eval",
                                 "--image-size", "32", "--samples-out", out});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return ReadSamplesOut(out);
}

// epoch -> sample index -> line, checking each sample comes exactly once per epoch.
std::map<uint64_t, std::map<uint64_t, SampleLine>> ExactlyOnce(
    const std::vector<SampleLine>& lines) {
  std::map<uint64_t, std::map<uint64_t, SampleLine>> by_epoch;
  for (const SampleLine& l : lines) {
    INFO("epoch " << l.epoch << " sample " << l.sample_index);
    CHECK(by_epoch[l.epoch].emplace(l.sample_index, l).second);
  }
  REQUIRE(by_epoch.size() == 2);
  for (const auto& [epoch, samples] : by_epoch) CHECK(samples.size() == kSamples);
  return by_epoch;
}

TEST_CASE("11: imagefolder, WebDataset and TFRecord copies of the same images give exactly-once "
          "epochs and byte-identical eval output, through the daemon and consume",
          "[integration][formats]") {
  Formats formats;
  DaemonFixtureOptions options;
  options.images = 4;
  options.config_extra = formats.Config();
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), Catch::Contains("dataset wds: webdataset") &&
                               Catch::Contains("tensors depth float32 [8, 8]"));

  const auto folder = ExactlyOnce(Consume(daemon, "if", daemon.dir() + "/if.tsv"));
  const auto wds = ExactlyOnce(Consume(daemon, "wds", daemon.dir() + "/wds.tsv"));
  const auto converted = ExactlyOnce(Consume(daemon, "converted", daemon.dir() + "/conv.tsv"));
  const auto tfr = ExactlyOnce(Consume(daemon, "tfr", daemon.dir() + "/tfr.tsv"));
  for (const auto& [epoch, samples] : folder) {
    for (const auto& [index, line] : samples) {
      const SampleLine& c = converted.at(epoch).at(index);
      const SampleLine& t = tfr.at(epoch).at(index);
      const SampleLine& w = wds.at(epoch).at(index);
      INFO(line.path);
      // Same order (the shuffle is over the same index), same labels, same bytes.
      CHECK(c.sequence == line.sequence);
      CHECK(t.sequence == line.sequence);
      CHECK(c.label == line.label);
      CHECK(t.label == line.label);  // written 1-based, label_offset = -1
      CHECK(w.label == line.label);  // from the .json member's "label"
      CHECK(c.digest == line.digest);
      CHECK(t.digest == line.digest);
      CHECK(w.digest != line.digest);  // its digest also covers the depth tensor
      const std::string key = line.path.substr(0, line.path.rfind('.'));
      CHECK(c.path == "shard-00000" + std::to_string(index / 16) + ".tar#" + key);
      CHECK(t.path == "shard-00000" + std::to_string(index / 16) + ".tfrecord#" +
                          std::to_string(index % 16));
    }
  }

  // `validate` reads every format as the daemon does.
  for (const char* ds : {"if", "wds", "converted", "tfr", "arr"}) {
    const CommandResult v =
        RunCommand({CtlPath(), "validate", "--config", daemon.config_path(), "--dataset", ds});
    INFO(ds << ": " << v.output);
    CHECK(v.exit_code == 0);
    CHECK_THAT(v.output, Catch::Contains("40 good, 0 bad"));
  }
}

TEST_CASE("11: named tensors reach the C++ client: batch.tensor(\"depth\") of a WebDataset, every "
          ".npy of an arrays dataset", "[integration][formats]") {
  Formats formats;
  DaemonFixtureOptions options;
  options.images = 4;
  options.config_extra = formats.Config();
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  client::Client client(daemon.endpoint());

  client::StreamOptions o;
  o.dataset = "wds";
  o.batch_size = 8;
  o.image_size = 32;
  o.augment = client::Augment::kEval;
  o.end_epoch = 1;
  auto wds = client.Open(o);
  o.dataset = "if";
  auto folder = client.Open(o);
  o.dataset = "arr";
  auto arr = client.Open(o);
  std::set<int64_t> seen;
  while (auto batch = wds->Next()) {
    auto reference = folder->Next();
    auto rows = arr->Next();
    REQUIRE(reference.has_value());
    REQUIRE(rows.has_value());
    std::vector<std::string> names;
    for (const client::TensorView& t : batch->tensors()) names.push_back(t.name());
    CHECK(names == std::vector<std::string>{"images", "labels", "indices", "depth"});
    const client::TensorView& depth = batch->tensor("depth");
    CHECK(depth.dtype() == client::DType::kFloat32);
    CHECK(depth.shape() == std::vector<int64_t>{batch->size(), 8, 8});
    CHECK(reinterpret_cast<uintptr_t>(depth.raw()) % 256 == 0);
    const int64_t* indices = batch->indices().data<int64_t>();
    for (uint32_t i = 0; i < batch->size(); ++i) {
      seen.insert(indices[i]);
      // make-dataset's depth: value (y, x) = i % 97 + 0.01 y + 0.001 x.
      const float* d = depth.data<float>() + i * 64;
      CHECK(d[0] == Approx(static_cast<float>(indices[i] % 97)));
      CHECK(d[63] == Approx(static_cast<float>(indices[i] % 97) + 0.07f + 0.007f));
    }
    CHECK(std::memcmp(batch->images().raw(), reference->images().raw(),
                      batch->images().bytes()) == 0);
    CHECK_THROWS_WITH(batch->tensor("nope"),
                      Catch::Contains("no tensor 'nope' (it has: images, labels, indices, depth)"));

    // arrays: no decoded images; its "images" column was written by make-dataset as the eval
    // decode at 32 px, so it equals the imagefolder stream's images, row for row.
    names.clear();
    for (const client::TensorView& t : rows->tensors()) names.push_back(t.name());
    CHECK(names == std::vector<std::string>{"labels", "indices", "depth", "images"});
    const client::TensorView& pixels = rows->tensor("images");
    CHECK(pixels.dtype() == client::DType::kUint8);
    CHECK(pixels.shape() == std::vector<int64_t>{rows->size(), 32, 32, 3});
    CHECK(std::memcmp(pixels.raw(), reference->images().raw(), pixels.bytes()) == 0);
    CHECK(std::memcmp(rows->labels().raw(), reference->labels().raw(),
                      reference->labels().bytes()) == 0);
  }
  CHECK(seen.size() == kSamples);
}

void FlipByte(const std::string& path, size_t offset) {
  std::string bytes = ReadFile(path);
  REQUIRE(offset < bytes.size());
  bytes[offset] ^= 0x20;
  WriteFile(path, bytes);
}

TEST_CASE("11: a shard with a bad header and a record with a bad CRC are skipped, named with "
          "reason, file and offset in stats and the log, and the rest is served exactly once",
          "[integration][formats]") {
  Formats formats;
  FlipByte(formats.Path("webdataset/shard-000001.tar"), 3);  // a header's name: checksum fails
  FlipByte(formats.Path("tfrecord/shard-000000.tfrecord"), 12 + 200);  // record 0's data
  DaemonFixtureOptions options;
  options.images = 4;
  options.config_extra = formats.Config();
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Log(), Catch::Contains("shard-000001.tar: offset 0: tar header checksum "
                                           "mismatch") &&
                               Catch::Contains("reason corrupt"));

  const CommandResult w = daemon.Ctl({"consume", "--dataset", "wds", "--batch-size", "5",
                                      "--epochs", "1", "--samples-out", daemon.dir() + "/w.tsv"});
  REQUIRE(w.exit_code == 0);
  const CommandResult t = daemon.Ctl({"consume", "--dataset", "tfr", "--batch-size", "5",
                                      "--epochs", "1", "--samples-out", daemon.dir() + "/t.tsv"});
  REQUIRE(t.exit_code == 0);
  std::set<std::string> wds_paths;
  for (const SampleLine& l : ReadSamplesOut(daemon.dir() + "/w.tsv")) {
    CHECK(wds_paths.insert(l.path).second);
    CHECK(l.path.rfind("shard-000001.tar#", 0) != 0);
  }
  CHECK(wds_paths.size() == kSamples - 16);  // shards 0 and 2
  std::set<uint64_t> tfr_indices;
  for (const SampleLine& l : ReadSamplesOut(daemon.dir() + "/t.tsv")) {
    CHECK(tfr_indices.insert(l.sample_index).second);
  }
  CHECK(tfr_indices.size() == kSamples - 1);
  CHECK(tfr_indices.count(0) == 0);

  const CommandResult stats = daemon.Ctl({"stats"});
  INFO(stats.output);
  CHECK_THAT(stats.output, Catch::Contains("damaged files") &&
                               Catch::Contains("wds shard-000001.tar: corrupt:") &&
                               Catch::Contains("tfr shard-000000.tfrecord#0: crc_mismatch:") &&
                               Catch::Contains("shard-000000.tfrecord: offset 0: record data CRC"));
  CHECK_THAT(daemon.Log(), Catch::Contains("shard-000000.tfrecord#0") &&
                               Catch::Contains("crc_mismatch"));
  const CommandResult v = RunCommand(
      {CtlPath(), "validate", "--config", daemon.config_path(), "--dataset", "wds"});
  CHECK(v.exit_code == 1);
  CHECK_THAT(v.output, Catch::Contains("BAD shard-000001.tar: corrupt:") &&
                           Catch::Contains("24 good, 0 bad, 1 damaged files"));
}

}  // namespace
}  // namespace ringloader::testing
