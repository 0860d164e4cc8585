// SPDX-License-Identifier: Apache-2.0
// Issue 6, "Bad data": a real ringloaderd over a dataset that mixes good JPEGs with one file of
// each broken kind (and files that vanish mid-epoch). Bad samples cost only themselves: every
// good sample is delivered exactly once per epoch, stats list each bad file with its reason, and
// the daemon stays SERVING throughout. With on_error = "fail" the stream ends with DATA_LOSS
// naming the file; `ringloaderctl validate` names every bad file.
#include <catch2/catch.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include "client/client.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"
#include "proto/ringloader.pb.h"
#include "server/image/sample_decoder.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/sampler.h"
#include "tests/integration/bad_images.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

constexpr uint32_t kGoodImages = 60;
constexpr uint32_t kClasses = 4;
constexpr uint32_t kBatch = 8;
constexpr uint64_t kSeed = 5;

constexpr uint32_t kIoDepth = 4;

DaemonFixtureOptions CorpusOptions(const std::string& on_error) {
  DaemonFixtureOptions o;
  o.images = kGoodImages;
  o.classes = kClasses;
  o.on_error = on_error;
  // Reads run at most 2 x io_depth files ahead of the decodes: a file deleted mid-epoch must lie
  // beyond that to fail in the epoch it vanished in (a file read before it vanished is served).
  o.server_extra = "io_depth = " + std::to_string(kIoDepth);
  return o;
}

// Writes one of each bad kind into the class folders (round robin). Returns relative path ->
// expected reason for each file that must fail (the arithmetic-coded file is included only when
// this build of libjpeg-turbo refuses it).
std::map<std::string, std::string> WriteBadFiles(const std::string& root) {
  std::map<std::string, std::string> bad;
  std::vector<BadImage> images = AllBadImages();
  for (size_t i = 0; i < images.size(); ++i) {
    const std::string relative = "class_0" + std::to_string(i % kClasses) + "/" + images[i].name;
    WriteFile(root + "/" + relative, std::string(images[i].bytes.begin(), images[i].bytes.end()));
    std::string reason = images[i].reason;
    if (reason.empty()) {  // decided by this libjpeg-turbo: decoded, or "unsupported"
      image::SampleDecoder decoder(image::DecodeLimits{});
      absl::StatusOr<std::vector<uint8_t>> rgb =
          decoder.DecodeRgb(images[i].bytes, relative, nullptr);
      if (rgb.ok()) continue;
      reason = std::string(image::ErrorReason(rgb.status()));
      CHECK(reason == "unsupported");
    }
    bad[relative] = reason;
  }
  return bad;
}

std::unique_ptr<pipeline::Dataset> OpenDataset(const std::string& root) {
  pipeline::DatasetSpec spec;
  spec.name = "synth";
  spec.root = root;
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> ds = pipeline::Dataset::Open(spec);
  REQUIRE(ds.ok());
  return std::move(*ds);
}

client::StreamOptions CorpusStream() {
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = kBatch;
  o.image_size = 32;
  o.seed = kSeed;
  o.end_epoch = 2;
  o.client_name = "corrupt_corpus_test";
  return o;
}

// Polls grpc.health.v1.Health/Check on its own channel until stopped; counts answers other
// than SERVING (including failed calls).
class HealthPoller {
 public:
  explicit HealthPoller(const std::string& endpoint)
      : stub_(grpc::health::v1::Health::NewStub(
            grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()))),
        thread_([this] { Loop(); }) {}
  ~HealthPoller() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  int polls() const { return polls_; }
  int not_serving() const { return not_serving_; }

 private:
  void Loop() {
    while (!stop_) {
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
      grpc::health::v1::HealthCheckResponse response;
      grpc::Status s = stub_->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
      ++polls_;
      if (!s.ok() || response.status() != grpc::health::v1::HealthCheckResponse::SERVING) {
        ++not_serving_;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
  std::atomic<bool> stop_{false};
  std::atomic<int> polls_{0};
  std::atomic<int> not_serving_{0};
  std::thread thread_;
};

v1::GetStatsResponse Stats(const DaemonFixture& daemon) {
  CommandResult r = daemon.Ctl({"stats", "--json"});
  REQUIRE(r.exit_code == 0);
  v1::GetStatsResponse stats;
  google::protobuf::util::JsonParseOptions parse;
  parse.ignore_unknown_fields = true;
  REQUIRE(google::protobuf::util::JsonStringToMessage(r.output, &stats, parse).ok());
  return stats;
}

// Shard position (epoch 0, kSeed) of the first sample whose path is in `bad`.
uint64_t FirstBadPosition(const pipeline::Dataset& ds,
                          const std::map<std::string, std::string>& bad) {
  pipeline::ShardSpec spec;
  spec.seed = kSeed;
  spec.epoch = 0;
  pipeline::EpochShard shard(ds.size(), spec);
  for (uint64_t pos = 0; pos < shard.size(); ++pos) {
    if (bad.count(std::string(ds.relative_path(shard.at(pos))))) return pos;
  }
  FAIL("no bad sample in the shard");
  return 0;
}

}  // namespace

TEST_CASE("corrupt corpus, on_error=skip: 2 epochs deliver every good sample exactly once, "
          "stats list every bad file, health stays SERVING",
          "[integration][bad_data]") {
  DaemonFixture daemon(CorpusOptions("skip"));
  std::map<std::string, std::string> bad = WriteBadFiles(daemon.dataset_root());
  REQUIRE(bad.size() >= 9);
  REQUIRE(daemon.Start());
  std::unique_ptr<pipeline::Dataset> ds = OpenDataset(daemon.dataset_root());
  REQUIRE(ds->size() == kGoodImages + AllBadImages().size());

  // Two good files that will vanish mid-epoch 0: the last good ones in epoch 0's shard order,
  // far beyond what the producer can have decoded or read ahead after one batch (4 ring slots x
  // 8 samples, plus the bad files it may have skipped, plus 2 x io_depth read ahead).
  pipeline::ShardSpec shard_spec;
  shard_spec.seed = kSeed;
  pipeline::EpochShard shard(ds->size(), shard_spec);
  std::vector<std::string> victims;
  uint64_t victims_from = shard.size();
  for (uint64_t pos = shard.size(); pos-- > 0 && victims.size() < 2;) {
    std::string path(ds->relative_path(shard.at(pos)));
    if (!bad.count(path)) {
      victims.push_back(path);
      victims_from = pos;
    }
  }
  REQUIRE(victims.size() == 2);
  REQUIRE(victims_from > 4 * kBatch + bad.size() + 2 * kIoDepth);

  std::set<std::string> good;
  for (uint64_t i = 0; i < ds->size(); ++i) {
    std::string path(ds->relative_path(i));
    if (!bad.count(path) && path != victims[0] && path != victims[1]) good.insert(path);
  }

  HealthPoller health(daemon.endpoint());
  std::map<uint64_t, std::multiset<std::string>> delivered;  // epoch -> paths
  auto record = [&](const client::Batch& batch) {
    const int64_t* labels = batch.labels().data<int64_t>();
    for (uint32_t i = 0; i < batch.size(); ++i) {
      const std::string path(batch.relative_path(i));
      delivered[batch.position().epoch].insert(path);
      CHECK(labels[i] == DaemonFixture::LabelOfPath(path));
    }
  };
  {
    client::Client c(daemon.endpoint());
    auto stream = c.Open(CorpusStream());
    std::optional<client::Batch> first = stream->Next();
    REQUIRE(first.has_value());
    REQUIRE(first->position().epoch == 0);
    record(*first);
    // Mid-epoch: one victim is deleted, the other replaced by a directory of the same name
    // (chmod 000 would not stop root, which runs these tests).
    const std::string root = daemon.dataset_root();
    REQUIRE(std::filesystem::remove(root + "/" + victims[0]));
    REQUIRE(std::filesystem::remove(root + "/" + victims[1]));
    REQUIRE(std::filesystem::create_directory(root + "/" + victims[1]));
    first.reset();
    while (std::optional<client::Batch> batch = stream->Next()) record(*batch);
  }
  health.Stop();
  bad[victims[0]] = "read_error";
  bad[victims[1]] = "not_regular_file";

  REQUIRE(delivered.size() == 2);
  for (const auto& [epoch, paths] : delivered) {
    INFO("epoch " << epoch);
    CHECK(paths.size() == good.size());  // no repeats ...
    CHECK(std::set<std::string>(paths.begin(), paths.end()) == good);  // ... and none missing
  }

  v1::GetStatsResponse stats = Stats(daemon);
  std::map<std::string, const v1::BadFile*> listed;
  for (const v1::BadFile& b : stats.recent_bad_files()) {
    CHECK(b.dataset() == "synth");
    CHECK(listed.emplace(b.path(), &b).second);  // each bad file listed once
  }
  std::map<std::string, uint64_t> per_reason;
  for (const auto& [path, reason] : bad) {
    INFO(path << " expected " << reason);
    ++per_reason[reason];
    auto it = listed.find(path);
    REQUIRE(it != listed.end());
    CHECK(it->second->reason() == reason);
    CHECK_THAT(it->second->message(), Catch::Contains(path));
  }
  CHECK(listed.size() == bad.size());
  // Each bad file fails once per epoch, and is counted by reason.
  CHECK(stats.decode_errors() == 2 * bad.size());
  for (const auto& [reason, count] : per_reason) {
    INFO(reason);
    CHECK(stats.decode_errors_by_reason().at(reason) == 2 * count);
  }
  // Logged once per file, with its path and reason.
  const std::string log = daemon.Log();
  for (const auto& [path, reason] : bad) {
    INFO(path);
    const std::string needle = "(" + reason + "): ";
    size_t count = 0;
    for (size_t at = log.find(path); at != std::string::npos; at = log.find(path, at + 1)) {
      const size_t line_start = log.rfind('\n', at) + 1;
      const std::string line = log.substr(line_start, log.find('\n', at) - line_start);
      if (line.find("skipping sample") != std::string::npos) {
        ++count;
        CHECK_THAT(line, Catch::Contains(needle));
        at = line_start + line.size();
      }
    }
    CHECK(count == 1);
  }
  CHECK(health.polls() > 0);
  CHECK(health.not_serving() == 0);
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("corrupt corpus through ringloaderctl consume: samples-out holds every good sample "
          "once per epoch",
          "[integration][bad_data]") {
  DaemonFixture daemon(CorpusOptions("skip"));
  const std::map<std::string, std::string> bad = WriteBadFiles(daemon.dataset_root());
  REQUIRE(daemon.Start());
  HealthPoller health(daemon.endpoint());
  const std::string out = daemon.dir() + "/samples.tsv";
  CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--epochs", "2", "--batch-size",
                                "8", "--image-size", "32", "--seed", "9", "--samples-out", out});
  health.Stop();
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const uint64_t good = kGoodImages + AllBadImages().size() - bad.size();
  CHECK_THAT(r.output, Catch::Contains("consumed " + std::to_string(2 * good) + " samples"));
  std::map<uint64_t, std::set<std::string>> per_epoch;
  for (const SampleLine& s : ReadSamplesOut(out)) {
    CHECK(bad.count(s.path) == 0);
    CHECK(per_epoch[s.epoch].insert(s.path).second);
  }
  CHECK(per_epoch[0].size() == good);
  CHECK(per_epoch[1].size() == good);
  CHECK(health.not_serving() == 0);
}

TEST_CASE("corrupt corpus, on_error=fail: the stream ends with DATA_LOSS naming the first bad "
          "file, after the batches before it",
          "[integration][bad_data]") {
  DaemonFixture daemon(CorpusOptions("fail"));
  const std::map<std::string, std::string> bad = WriteBadFiles(daemon.dataset_root());
  REQUIRE(daemon.Start());
  std::unique_ptr<pipeline::Dataset> ds = OpenDataset(daemon.dataset_root());
  const uint64_t first_bad = FirstBadPosition(*ds, bad);
  pipeline::ShardSpec shard_spec;
  shard_spec.seed = kSeed;
  const std::string first_bad_path(
      ds->relative_path(pipeline::EpochShard(ds->size(), shard_spec).at(first_bad)));

  HealthPoller health(daemon.endpoint());
  uint64_t delivered = 0;
  {
    client::Client c(daemon.endpoint());
    auto stream = c.Open(CorpusStream());
    try {
      while (std::optional<client::Batch> batch = stream->Next()) {
        for (uint32_t i = 0; i < batch->size(); ++i) {
          CHECK(bad.count(std::string(batch->relative_path(i))) == 0);
        }
        delivered += batch->size();
      }
      FAIL("the stream ended without an error");
    } catch (const client::Error& e) {
      CHECK(e.code() == client::ErrorCode::kDataLoss);
      CHECK_THAT(e.what(), Catch::Contains(first_bad_path) &&
                               Catch::Contains(bad.at(first_bad_path)));
    }
  }
  // Every full batch before the one holding the bad sample was delivered.
  CHECK(delivered == first_bad / kBatch * kBatch);

  CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--epochs", "2", "--batch-size",
                                "8", "--image-size", "32", "--seed", std::to_string(kSeed)});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains(first_bad_path));
  health.Stop();
  CHECK(health.not_serving() == 0);
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
}

TEST_CASE("ringloaderctl validate names every bad file with its reason and exits 1",
          "[integration][bad_data]") {
  DaemonFixture daemon(CorpusOptions("skip"));  // only its dataset: no daemon runs
  const std::map<std::string, std::string> bad = WriteBadFiles(daemon.dataset_root());
  const uint64_t total = kGoodImages + AllBadImages().size();
  CommandResult r = RunCommand({CtlPath(), "validate", "--format", "imagefolder", "--path",
                                daemon.dataset_root(), "--jobs", "2"});
  INFO(r.output);
  CHECK(r.exit_code == 1);
  for (const auto& [path, reason] : bad) {
    CHECK_THAT(r.output, Catch::Contains("BAD " + path + ": " + reason + ": "));
  }
  size_t bad_lines = 0;
  for (size_t at = r.output.find("BAD "); at != std::string::npos; at = r.output.find("BAD ", at + 1)) {
    ++bad_lines;
  }
  CHECK(bad_lines == bad.size());
  CHECK_THAT(r.output, Catch::Contains("checked " + std::to_string(total) + " files: " +
                                       std::to_string(total - bad.size()) + " good, " +
                                       std::to_string(bad.size()) + " bad"));
  // The same dataset without its bad files is clean.
  const std::vector<BadImage> images = AllBadImages();
  for (size_t i = 0; i < images.size(); ++i) {
    REQUIRE(std::filesystem::remove(daemon.dataset_root() + "/class_0" +
                                    std::to_string(i % kClasses) + "/" + images[i].name));
  }
  CommandResult clean = RunCommand({CtlPath(), "validate", "--path", daemon.dataset_root()});
  CHECK(clean.exit_code == 0);
}

}  // namespace ringloader::testing
