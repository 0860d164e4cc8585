// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/batch_filler.h"

#include <atomic>
#include <optional>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "server/image/synthetic.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/read_pool.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

image::TransformSpec SmallTrain() {
  image::TransformSpec spec;
  spec.image_size = 32;
  spec.augment = image::Augment::kTrain;
  return spec;
}

std::unique_ptr<Dataset> OpenFolder(const std::string& root) {
  DatasetSpec spec;
  spec.name = "test";
  spec.root = root;
  auto ds = Dataset::Open(spec);
  REQUIRE(ds.ok());
  return *std::move(ds);
}

void WriteBytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  testing::WriteFile(path, std::string(bytes.begin(), bytes.end()));
}

std::vector<uint8_t> SmallJpeg(uint64_t seed) {
  image::SyntheticImageOptions o;
  o.width = 64 + static_cast<int32_t>(seed % 5) * 8;
  o.height = 48;
  o.seed = seed;
  auto jpeg = image::MakeSyntheticJpeg(o);
  REQUIRE(jpeg.ok());
  return *std::move(jpeg);
}

// An imagefolder of `count` photo-like JPEGs over 3 classes: sizes from 80x60 to ~400x300,
// portrait and landscape, some grayscale and some progressive. (MakeSyntheticJpeg per image.)
void WriteVariedDataset(const std::string& root, int count) {
  for (int i = 0; i < count; ++i) {
    image::SyntheticImageOptions o;
    o.seed = static_cast<uint64_t>(i) * 7919;
    o.width = 80 + (i * 37) % 320;
    o.height = 60 + (i * 53) % 240;
    o.quality = 75 + i % 20;
    o.grayscale = i % 10 == 3;
    o.progressive = i % 15 == 7;
    auto jpeg = image::MakeSyntheticJpeg(o);
    REQUIRE(jpeg.ok());
    const std::string cls = root + "/class_" + std::to_string(i % 3);
    fs::create_directories(cls);
    char name[32];
    std::snprintf(name, sizeof(name), "/img_%03d.jpg", i);
    WriteBytes(cls + name, *jpeg);
  }
}

int64_t I64At(const std::vector<uint8_t>& buf, uint64_t offset, uint64_t i) {
  int64_t v;
  std::memcpy(&v, buf.data() + offset + i * 8, 8);
  return v;
}

struct Filled {
  FilledBatch batch;
  std::vector<uint8_t> bytes;
};

// Fills one batch into a fresh buffer. No Catch assertions: safe to call from several threads.
absl::StatusOr<Filled> TryFill(BatchFiller& filler, const Dataset& ds, const EpochShard& shard,
                               uint64_t cursor, uint32_t batch_size,
                               OnError on_error = OnError::kSkip,
                               SampleObserver* observer = nullptr) {
  FillRequest req;
  req.dataset = &ds;
  req.shard = &shard;
  req.cursor = cursor;
  req.batch_size = batch_size;
  req.transform = SmallTrain();
  req.on_error = on_error;
  req.seed = shard.spec().seed;
  req.epoch = shard.spec().epoch;
  Filled out;
  out.bytes.assign(ComputeBatchLayout(batch_size, req.transform).total_bytes, 0xAB);
  absl::StatusOr<FilledBatch> batch = filler.Fill(req, out.bytes, observer);
  if (!batch.ok()) return batch.status();
  out.batch = *std::move(batch);
  return out;
}

Filled FillOne(BatchFiller& filler, const Dataset& ds, const EpochShard& shard, uint64_t cursor,
               uint32_t batch_size, OnError on_error = OnError::kSkip,
               SampleObserver* observer = nullptr) {
  absl::StatusOr<Filled> filled =
      TryFill(filler, ds, shard, cursor, batch_size, on_error, observer);
  REQUIRE(filled.ok());
  return *std::move(filled);
}

TEST_CASE("ComputeBatchLayout: tensors are 256-byte aligned and named (pinned)", "[pipeline]") {
  image::TransformSpec spec = SmallTrain();  // 32x32x3 uint8 = 3072 bytes a sample
  const BatchLayout l = ComputeBatchLayout(3, spec);
  CHECK(l.images_offset == 0);
  CHECK(l.images_bytes == 9216);
  CHECK(l.labels_offset == 9216);
  CHECK(l.indices_offset == 9472);
  CHECK(l.total_bytes == 9728);
  REQUIRE(l.tensors.size() == 3);
  CHECK(l.tensors[0].name == "images");
  CHECK(l.tensors[0].sample_shape == std::vector<uint64_t>{32, 32, 3});
  CHECK(l.tensors[1].name == "labels");
  CHECK(l.tensors[2].name == "indices");
  CHECK(l.Find("labels") == &l.tensors[1]);
  CHECK(l.Find("depth") == nullptr);
  spec.dtype = image::DType::kFloat32;
  spec.layout = image::Layout::kNCHW;
  spec.image_size = 5;  // 300 bytes a sample
  const BatchLayout f = ComputeBatchLayout(1, spec);
  CHECK(f.tensors[0].sample_shape == std::vector<uint64_t>{3, 5, 5});
  CHECK(f.tensors[0].type == NpyType::kFloat32);
  CHECK(f.labels_offset == 512);
  CHECK(f.indices_offset == 768);
  CHECK(f.total_bytes == 1024);
}

TEST_CASE("BatchFiller: batches are identical byte for byte with 1, 2 and 4 threads",
          "[pipeline]") {
  TempDir dir;
  WriteVariedDataset(dir.path(), 60);
  auto ds = OpenFolder(dir.path());
  REQUIRE(ds->size() == 60);

  constexpr uint32_t kBatch = 16;               // 4 batches an epoch, the last one short
  std::vector<std::vector<uint8_t>> reference;  // all batches of 2 epochs, 1 thread
  for (uint32_t threads : {1u, 2u, 4u}) {
    WorkerPool pool(threads);
    BatchFiller filler(pool, image::DecodeLimits{});
    std::vector<std::vector<uint8_t>> got;
    for (uint64_t epoch : {0u, 1u}) {
      ShardSpec s;
      s.seed = 99;
      s.epoch = epoch;
      EpochShard shard(ds->size(), s);
      uint64_t cursor = 0;
      while (cursor < shard.size()) {
        Filled f = FillOne(filler, *ds, shard, cursor, kBatch);
        for (const SampleError& e : f.batch.errors) UNSCOPED_INFO(e.reason << ": " << e.message);
        REQUIRE(f.batch.errors.empty());
        CHECK(f.batch.count == std::min<uint64_t>(kBatch, shard.size() - cursor));
        const BatchLayout l = ComputeBatchLayout(kBatch, SmallTrain());
        for (uint32_t i = 0; i < f.batch.count; ++i) {
          const uint32_t index = shard.at(cursor + i);
          CHECK(I64At(f.bytes, l.indices_offset, i) == index);
          CHECK(I64At(f.bytes, l.labels_offset, i) == ds->label(index));
        }
        cursor = f.batch.next_cursor;
        got.push_back(std::move(f.bytes));
      }
    }
    REQUIRE(got.size() == 8);
    if (reference.empty()) {
      reference = got;
      CHECK(reference[0] != reference[4]);  // epoch 1 is ordered and augmented differently
      CHECK(std::count(reference[0].begin(), reference[0].end(), 0) <
            static_cast<long>(reference[0].size() / 2));  // real pixels, not an empty buffer
    } else {
      INFO("threads = " << threads);
      for (size_t b = 0; b < got.size(); ++b) CHECK(got[b] == reference[b]);
    }
  }
}

// root/a/00.jpg .. : good or broken by name, in a known order (shuffle off).
struct CorruptCorpus {
  TempDir dir;
  std::vector<std::string> names;  // sorted = shard order
  std::vector<bool> good;
  std::vector<std::string> reason;  // expected reason for bad ones ("" = any decode reason)

  CorruptCorpus() {
    fs::create_directories(dir.Join("a"));
    std::mt19937 rng(5);
    for (int i = 0; i < 14; ++i) {
      char name[32];
      std::snprintf(name, sizeof(name), "a/%02d.jpg", i);
      names.push_back(name);
      std::vector<uint8_t> jpeg = SmallJpeg(static_cast<uint64_t>(i));
      bool ok = true;
      std::string why;
      if (i == 2) {  // truncated
        jpeg.resize(jpeg.size() / 2);
        ok = false;
      } else if (i == 3) {  // zero bytes, next to another bad one
        jpeg.clear();
        ok = false;
        why = "empty";
      } else if (i == 9) {  // random bytes
        for (uint8_t& b : jpeg) b = static_cast<uint8_t>(rng());
        jpeg.resize(300);
        ok = false;
      }
      WriteBytes(dir.Join(name), jpeg);
      good.push_back(ok);
      reason.push_back(why);
    }
  }
};

TEST_CASE("BatchFiller: with on_error = skip each batch holds only good samples in shard order",
          "[pipeline]") {
  CorruptCorpus corpus;
  auto ds = OpenFolder(corpus.dir.path());
  REQUIRE(ds->size() == corpus.names.size());
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  constexpr uint32_t kBatch = 4;
  const BatchLayout l = ComputeBatchLayout(kBatch, SmallTrain());

  std::vector<int64_t> delivered;
  std::vector<uint64_t> skipped;
  uint64_t cursor = 0;
  std::vector<Filled> batches;
  while (cursor < shard.size()) {
    Filled f = FillOne(filler, *ds, shard, cursor, kBatch);
    for (uint32_t i = 0; i < f.batch.count; ++i)
      delivered.push_back(I64At(f.bytes, l.indices_offset, i));
    for (const SampleError& e : f.batch.errors) {
      skipped.push_back(e.sample_index);
      CHECK(e.relative_path == corpus.names[e.sample_index]);
      CHECK_THAT(e.message, Catch::StartsWith(ds->AbsolutePath(e.sample_index)));
      CHECK_FALSE(e.reason.empty());
      if (!corpus.reason[e.sample_index].empty()) CHECK(e.reason == corpus.reason[e.sample_index]);
    }
    CHECK(f.batch.next_cursor > cursor);
    cursor = f.batch.next_cursor;
    batches.push_back(std::move(f));
  }
  CHECK(cursor == shard.size());
  CHECK(skipped == std::vector<uint64_t>{2, 3, 9});
  CHECK(delivered == std::vector<int64_t>{0, 1, 4, 5, 6, 7, 8, 10, 11, 12, 13});
  // Batch 0: 0 1 [2 3 bad] 4 5 -> consumed 6; batch 1: 6 7 8 [9 bad] 10 -> 11; batch 2: 11 12 13.
  REQUIRE(batches.size() == 3);
  CHECK(batches[0].batch.next_cursor == 6);
  CHECK(batches[1].batch.next_cursor == 11);
  CHECK(batches[2].batch.count == 3);
  CHECK(batches[2].batch.errors.empty());

  // Compaction moved the right bytes: each delivered sample equals a batch of just that sample.
  const uint64_t sample_bytes = SmallTrain().SampleBytes();
  for (uint32_t i = 0; i < batches[0].batch.count; ++i) {
    const uint64_t index = static_cast<uint64_t>(I64At(batches[0].bytes, l.indices_offset, i));
    Filled single = FillOne(filler, *ds, shard, /*cursor=*/index, 1);
    REQUIRE(single.batch.count == 1);
    CHECK(std::memcmp(single.bytes.data(), batches[0].bytes.data() + i * sample_bytes,
                      sample_bytes) == 0);
  }
}

TEST_CASE("BatchFiller: with on_error = fail the first bad sample ends it as DataLoss",
          "[pipeline]") {
  CorruptCorpus corpus;
  auto ds = OpenFolder(corpus.dir.path());
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  FillRequest req;
  req.dataset = ds.get();
  req.shard = &shard;
  req.batch_size = 8;
  req.transform = SmallTrain();
  req.on_error = OnError::kFail;
  std::vector<uint8_t> buf(ComputeBatchLayout(8, req.transform).total_bytes);
  auto r = filler.Fill(req, buf, nullptr);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().code() == absl::StatusCode::kDataLoss);
  CHECK_THAT(std::string(r.status().message()), Catch::Contains(ds->AbsolutePath(2)));
  CHECK_FALSE(image::ErrorReason(r.status()).empty());
}

TEST_CASE("BatchFiller: a batch past hundreds of bad samples keeps the first few whole and "
          "counts every one by reason",
          "[pipeline]") {
  // Issue 38.3: what skipped samples keep is bounded, however many lie between good ones.
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  WriteBytes(dir.Join("c/a_good.jpg"), SmallJpeg(1));
  for (int i = 0; i < 300; ++i) WriteBytes(dir.Join("c/b_empty_" + std::to_string(1000 + i) + ".jpg"), {});
  for (int i = 0; i < 3; ++i) WriteBytes(dir.Join("c/c_good_" + std::to_string(i) + ".jpg"), SmallJpeg(i));
  auto ds = OpenFolder(dir.path());
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  Filled f = FillOne(filler, *ds, shard, 0, 4);
  CHECK(f.batch.count == 4);
  CHECK(f.batch.next_cursor == ds->size());
  CHECK(f.batch.errors.size() == FilledBatch::kMaxErrorsKept);
  CHECK(f.batch.errors.front().relative_path == "c/b_empty_1000.jpg");  // the first, in order
  CHECK(f.batch.skipped_by_reason == std::map<std::string, uint64_t>{{"empty", 300}});
  CHECK(f.batch.skipped() == 300);
}

TEST_CASE("BatchFiller: a file deleted after Open fails only that sample", "[pipeline]") {
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  for (int i = 0; i < 6; ++i) WriteBytes(dir.Join("c/" + std::to_string(i) + ".jpg"), SmallJpeg(i));
  auto ds = OpenFolder(dir.path());
  fs::remove(dir.Join("c/3.jpg"));
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  Filled f = FillOne(filler, *ds, shard, 0, 6);
  for (const SampleError& e : f.batch.errors) UNSCOPED_INFO(e.reason << ": " << e.message);
  CHECK(f.batch.count == 5);
  CHECK(f.batch.next_cursor == 6);
  REQUIRE(f.batch.errors.size() == 1);
  CHECK(f.batch.errors[0].sample_index == 3);
  CHECK(f.batch.errors[0].relative_path == "c/3.jpg");
  CHECK(f.batch.errors[0].reason == "read_error");
  CHECK_THAT(f.batch.errors[0].message, Catch::Contains(dir.Join("c/3.jpg")));
  // The short batch's unused tail is zeroed, so the whole buffer is deterministic.
  const BatchLayout l = ComputeBatchLayout(6, SmallTrain());
  CHECK(I64At(f.bytes, l.indices_offset, 5) == 0);
  CHECK(f.bytes[l.images_offset + 5 * SmallTrain().SampleBytes()] == 0);
}

TEST_CASE("BatchFiller: each request's decode limits apply to it alone (datasets differ)",
          "[pipeline]") {
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  uint64_t small_max = 0;
  for (int i = 0; i < 5; ++i) {
    const std::vector<uint8_t> jpeg = SmallJpeg(i);
    small_max = std::max<uint64_t>(small_max, jpeg.size());
    WriteBytes(dir.Join("c/" + std::to_string(i) + ".jpg"), jpeg);
  }
  image::SyntheticImageOptions big;
  big.width = 400;
  big.height = 300;
  auto big_jpeg = image::MakeSyntheticJpeg(big);
  REQUIRE(big_jpeg.ok());
  REQUIRE(big_jpeg->size() > small_max);
  WriteBytes(dir.Join("c/5.jpg"), *big_jpeg);
  auto ds = OpenFolder(dir.path());
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  auto fill = [&](std::optional<image::DecodeLimits> limits) {
    FillRequest req;
    req.dataset = ds.get();
    req.shard = &shard;
    req.batch_size = 6;
    req.transform = SmallTrain();
    req.limits = limits;
    std::vector<uint8_t> out(ComputeBatchLayout(6, req.transform).total_bytes);
    absl::StatusOr<FilledBatch> batch = filler.Fill(req, out, nullptr);
    REQUIRE(batch.ok());
    return *batch;
  };

  image::DecodeLimits small_files;
  small_files.max_file_bytes = small_max;
  FilledBatch by_size = fill(small_files);
  CHECK(by_size.count == 5);
  REQUIRE(by_size.errors.size() == 1);
  CHECK(by_size.errors[0].relative_path == "c/5.jpg");
  CHECK(by_size.errors[0].reason == "too_large");
  CHECK_THAT(by_size.errors[0].message, Catch::Contains("max_file_bytes"));

  image::DecodeLimits few_pixels;
  few_pixels.max_pixels = 100;
  FilledBatch by_pixels = fill(few_pixels);
  CHECK(by_pixels.count == 0);
  CHECK(by_pixels.errors.size() == 6);
  for (const SampleError& e : by_pixels.errors) CHECK(e.reason == "too_large");

  // Limits do not stick to the worker's decoder: a request without its own gets the defaults.
  FilledBatch defaults = fill(std::nullopt);
  CHECK(defaults.count == 6);
  CHECK(defaults.errors.empty());
}

class CountingObserver : public SampleObserver {
 public:
  explicit CountingObserver(uint64_t refuse) : refuse_(refuse) {}
  absl::Status BeforeDecode(const Dataset&, uint64_t index, uint32_t) override {
    before_++;
    if (index == refuse_)
      return image::WithReason(absl::UnavailableError("quarantined"), "quarantined");
    return absl::OkStatus();
  }
  void AfterDecode(const Dataset&, uint64_t, uint32_t) override { after_++; }
  std::atomic<int> before_{0};
  std::atomic<int> after_{0};

 private:
  uint64_t refuse_;
};

TEST_CASE("BatchFiller: an observer can refuse a sample and sees every decode", "[pipeline]") {
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  for (int i = 0; i < 5; ++i) WriteBytes(dir.Join("c/" + std::to_string(i) + ".jpg"), SmallJpeg(i));
  auto ds = OpenFolder(dir.path());
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  CountingObserver observer(/*refuse=*/1);
  Filled f = FillOne(filler, *ds, shard, 0, 4, OnError::kSkip, &observer);
  CHECK(f.batch.count == 4);
  CHECK(f.batch.next_cursor == 5);
  CHECK(observer.before_.load() == 5);
  CHECK(observer.after_.load() == 5);
  REQUIRE(f.batch.errors.size() == 1);
  CHECK(f.batch.errors[0].reason == "quarantined");
  CHECK_THAT(f.batch.errors[0].message, Catch::StartsWith(ds->AbsolutePath(1)));
}

TEST_CASE("BatchFiller: concurrent fills on one pool give the same bytes as sequential ones",
          "[pipeline]") {
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  for (int i = 0; i < 12; ++i)
    WriteBytes(dir.Join("c/" + std::to_string(i) + ".jpg"), SmallJpeg(i));
  auto ds = OpenFolder(dir.path());
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  ShardSpec s0;
  ShardSpec s1;
  s1.epoch = 1;
  EpochShard shard0(ds->size(), s0);
  EpochShard shard1(ds->size(), s1);
  const Filled seq0 = FillOne(filler, *ds, shard0, 0, 6);
  const Filled seq1 = FillOne(filler, *ds, shard1, 3, 6);
  absl::StatusOr<Filled> par0, par1;
  std::thread t0([&] { par0 = TryFill(filler, *ds, shard0, 0, 6); });
  std::thread t1([&] { par1 = TryFill(filler, *ds, shard1, 3, 6); });
  t0.join();
  t1.join();
  REQUIRE(par0.ok());
  REQUIRE(par1.ok());
  CHECK(par0->bytes == seq0.bytes);
  CHECK(par1->bytes == seq1.bytes);
}

TEST_CASE("BatchFiller: bad requests are refused, a cursor at the end gives an empty batch",
          "[pipeline]") {
  TempDir dir;
  fs::create_directories(dir.Join("c"));
  WriteBytes(dir.Join("c/0.jpg"), SmallJpeg(0));
  auto ds = OpenFolder(dir.path());
  EpochShard shard(ds->size(), ShardSpec{});
  WorkerPool pool(1);
  BatchFiller filler(pool, image::DecodeLimits{});
  FillRequest req;
  req.dataset = ds.get();
  req.shard = &shard;
  req.batch_size = 2;
  req.transform = SmallTrain();
  std::vector<uint8_t> small(ComputeBatchLayout(2, req.transform).total_bytes - 1);
  CHECK(filler.Fill(req, small, nullptr).status().code() == absl::StatusCode::kInvalidArgument);
  std::vector<uint8_t> buf(small.size() + 1);
  req.cursor = 2;
  CHECK(filler.Fill(req, buf, nullptr).status().code() == absl::StatusCode::kOutOfRange);
  req.cursor = 1;
  auto end = filler.Fill(req, buf, nullptr);
  REQUIRE(end.ok());
  CHECK(end->count == 0);
  CHECK(end->next_cursor == 1);
}

// A stand-in for the daemon's feeders (the seam a unit test cannot otherwise reach): it decodes
// what it is leased with its own BatchFiller, as a feeder does, then answers honestly or not.
class FakeRemote final : public RemoteDecode {
 public:
  enum class Answer { kHonest, kFails, kDropsHalf, kStranger, kWrongSize, kWrongLabel };
  FakeRemote(BatchFiller& filler, const Dataset& ds, Answer answer, bool all)
      : filler_(filler), ds_(ds), answer_(answer), all_(all) {}

  uint64_t Share(uint64_t k) override { return std::min(k, (all_ ? k : k / 2) + share_bonus); }
  std::vector<std::unique_ptr<RemoteCall>> Start(uint64_t epoch,
                                                 std::span<const uint64_t> indices) override;
  void LocalDone(uint64_t samples, std::chrono::nanoseconds) override { local += samples; }
  // Calls started ahead are kept whole and handed back when a round holds any of their samples
  // (the daemon's feeders keep them the same way).
  void Ahead(uint64_t epoch, std::span<const uint64_t> indices) override {
    const std::vector<uint64_t> fresh = ahead_.Fresh(epoch, indices, 4);
    if (!fresh.empty()) asked_ahead.push_back(fresh);
    for (auto& call : Start(epoch, fresh)) ahead_.Add(epoch, std::move(call));
  }
  std::vector<std::unique_ptr<RemoteCall>> Claim(uint64_t epoch, std::span<const uint64_t> indices,
                                                 bool batch_begins) override {
    return ahead_.Claim(epoch, indices, batch_begins);
  }
  void Keep(uint64_t epoch, std::unique_ptr<RemoteCall> call) override {
    kept += call->indices().size();
    ahead_.Add(epoch, std::move(call));
  }
  std::vector<uint64_t> Unheld(uint64_t epoch, std::span<const uint64_t> indices) const override {
    return ahead_.Fresh(epoch, indices, 0);
  }
  size_t held_ahead() const { return ahead_.size(); }

  std::vector<std::vector<uint64_t>> asked_ahead;  // each call started ahead, in order
  uint64_t leased = 0, accepted = 0, rejected = 0, local = 0;
  uint64_t kept = 0;  // samples decoded ahead on the filler's side (Keep)
  // Each call reads as unanswered this many times (Answered) before it is: a late feeder.
  int late_polls = 0;
  uint64_t seed = 0;
  uint64_t share_bonus = 0;  // samples of each round leased beyond half (a share that grew)

 private:
  class Call;
  BatchFiller& filler_;
  const Dataset& ds_;
  const Answer answer_;
  const bool all_;
  AheadCalls ahead_;
};

class FakeRemote::Call final : public RemoteCall {
 public:
  Call(FakeRemote& owner, std::vector<uint64_t> indices) : owner_(owner), indices_(indices) {}
  const std::vector<uint64_t>& indices() const override { return indices_; }
  std::optional<absl::Status> Wait(std::chrono::milliseconds) override { return status; }
  bool Answered() const override { return polls_++ >= owner_.late_polls; }
  uint32_t count() const override { return count_; }
  // In pieces of 997 bytes, as a feeder's answer comes in gRPC's slices: samples and int64s
  // straddle them.
  AnswerView payload() const override {
    std::vector<std::span<const uint8_t>> pieces;
    for (size_t at = 0; at < payload_.size(); at += 997) {
      pieces.emplace_back(payload_.data() + at, std::min<size_t>(997, payload_.size() - at));
    }
    return AnswerView(std::move(pieces));
  }
  void Accept(uint32_t used) override { owner_.accepted += used; }
  void Reject(const absl::Status&) override { ++owner_.rejected; }

  absl::Status status;
  uint32_t count_ = 0;
  std::vector<uint8_t> payload_;

 private:
  FakeRemote& owner_;
  std::vector<uint64_t> indices_;
  mutable int polls_ = 0;
};

std::vector<std::unique_ptr<RemoteCall>> FakeRemote::Start(uint64_t epoch,
                                                           std::span<const uint64_t> indices) {
  std::vector<std::unique_ptr<RemoteCall>> calls;
  if (indices.empty()) return calls;
  leased += indices.size();
  auto call = std::make_unique<Call>(*this, std::vector<uint64_t>(indices.begin(), indices.end()));
  ShardSpec spec;
  spec.seed = seed;
  spec.epoch = epoch;
  const EpochShard shard(spec, std::vector<uint32_t>(indices.begin(), indices.end()));
  const uint32_t n = static_cast<uint32_t>(indices.size());
  const BatchLayout layout = ComputeBatchLayout(n, SmallTrain(), &ds_);
  call->payload_.assign(layout.total_bytes, 0);
  FillRequest req;
  req.dataset = &ds_;
  req.shard = &shard;
  req.batch_size = n;
  req.transform = SmallTrain();
  req.seed = seed;
  req.epoch = epoch;
  absl::StatusOr<FilledBatch> filled = filler_.Fill(req, call->payload_, nullptr);
  REQUIRE(filled.ok());
  call->count_ = filled->count;
  switch (answer_) {
    case Answer::kHonest:
      break;
    case Answer::kFails:
      call->status = absl::UnavailableError("the feeder went away");
      break;
    case Answer::kDropsHalf:
      call->count_ /= 2;  // the rest reads as samples it could not decode
      break;
    case Answer::kStranger:
      if (call->count_ > 0) {
        const int64_t stranger = static_cast<int64_t>(ds_.size()) + 3;
        std::memcpy(call->payload_.data() + layout.indices_offset, &stranger, 8);
      }
      break;
    case Answer::kWrongSize:
      call->payload_.pop_back();
      break;
    case Answer::kWrongLabel:  // a checksum over a wrong label is still a right checksum
      if (call->count_ > 0) {
        int64_t label = 0;
        std::memcpy(&label, call->payload_.data() + layout.labels_offset, 8);
        ++label;
        std::memcpy(call->payload_.data() + layout.labels_offset, &label, 8);
      }
      break;
  }
  calls.push_back(std::move(call));
  return calls;
}

TEST_CASE("BatchFiller: samples leased elsewhere (RemoteDecode) give the same batches byte for "
          "byte, whatever the other side answers",
          "[pipeline][feeder]") {
  CorruptCorpus corpus;
  auto ds = OpenFolder(corpus.dir.path());
  ShardSpec s;
  s.seed = 11;
  s.epoch = 2;
  EpochShard shard(ds->size(), s);
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  constexpr uint32_t kBatch = 4;
  const uint64_t bytes = ComputeBatchLayout(kBatch, SmallTrain()).total_bytes;
  // Every batch of the epoch, decoded here alone.
  const auto epoch = [&](RemoteDecode* remote) {
    std::vector<Filled> out;
    for (uint64_t cursor = 0; cursor < shard.size();) {
      FillRequest req;
      req.dataset = ds.get();
      req.shard = &shard;
      req.cursor = cursor;
      req.batch_size = kBatch;
      req.transform = SmallTrain();
      req.seed = s.seed;
      req.epoch = s.epoch;
      req.remote = remote;
      Filled f;
      f.bytes.assign(bytes, 0xAB);
      absl::StatusOr<FilledBatch> batch = filler.Fill(req, f.bytes, nullptr);
      REQUIRE(batch.ok());
      f.batch = *std::move(batch);
      cursor = f.batch.next_cursor;
      out.push_back(std::move(f));
    }
    return out;
  };
  const std::vector<Filled> alone = epoch(nullptr);
  using Answer = FakeRemote::Answer;
  for (const auto& [answer, all] :
       std::vector<std::pair<Answer, bool>>{{Answer::kHonest, true},
                                            {Answer::kHonest, false},
                                            {Answer::kFails, true},
                                            {Answer::kDropsHalf, true},
                                            {Answer::kStranger, false},
                                            {Answer::kWrongSize, true},
                                            {Answer::kWrongLabel, true}}) {
    INFO("answer " << static_cast<int>(answer) << ", all leased " << all);
    FakeRemote remote(filler, *ds, answer, all);
    remote.seed = s.seed;
    const std::vector<Filled> leased = epoch(&remote);
    REQUIRE(leased.size() == alone.size());
    uint32_t from_remote = 0;
    for (size_t b = 0; b < alone.size(); ++b) {
      CHECK(leased[b].bytes == alone[b].bytes);
      CHECK(leased[b].batch.count == alone[b].batch.count);
      CHECK(leased[b].batch.next_cursor == alone[b].batch.next_cursor);
      CHECK(leased[b].batch.skipped_by_reason == alone[b].batch.skipped_by_reason);
      from_remote += leased[b].batch.remote_samples;
    }
    CHECK(remote.leased > 0);
    CHECK(from_remote == remote.accepted);
    switch (answer) {
      case Answer::kHonest:
        // Every good sample leased came from the other side; bad ones were judged here.
        CHECK(remote.accepted > 0);
        CHECK(remote.rejected == 0);
        if (all) CHECK(remote.local == 0);
        if (!all) CHECK(remote.local > 0);
        break;
      case Answer::kDropsHalf:
        CHECK(remote.accepted > 0);
        CHECK(remote.accepted < remote.leased);
        break;
      case Answer::kFails:
        CHECK(remote.accepted == 0);
        break;
      case Answer::kStranger:
      case Answer::kWrongSize:
      case Answer::kWrongLabel:
        CHECK(remote.accepted == 0);
        CHECK(remote.rejected > 0);
        break;
    }
  }
}

// `images` small JPEGs in one class, shuffled with seed 5, filled `batch` at a time, with half
// of each round leased to `remote`: the rounds' leasing ahead, seen through FakeRemote.
// memory_limit as the filler sees it. Decodes are not counted; read-ahead holds are, and those
// of `few_bytes` (samples decoded ahead: a few's buffer) only while `few_room` has room.
class CountedMemory final : public DecodeMemory {
 public:
  CountedMemory(uint64_t few_bytes, uint64_t few_room) : few_bytes_(few_bytes), room_(few_room) {}
  absl::Status Acquire(uint64_t) override { return absl::OkStatus(); }
  void Release(uint64_t) override {}
  uint64_t TryAcquireReadAhead(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (bytes == few_bytes_ && few_held_ + bytes > room_) return 0;
    if (bytes == few_bytes_) few_held_ += bytes;
    holds_[next_] = Hold{bytes, nullptr};
    return next_++;
  }
  void ArmEviction(uint64_t id, std::function<void()> evict) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (holds_.count(id) != 0) holds_[id].evict = std::move(evict);
  }
  bool Pin(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (holds_.count(id) == 0) return false;
    holds_[id].evict = nullptr;
    return true;
  }
  void ReleaseReadAhead(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu_);
    Drop(id);
  }
  // A decode short of memory: every few's hold not pinned is taken back.
  int TakeBackFews() {
    std::vector<std::function<void()>> evicts;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto it = holds_.begin(); it != holds_.end();) {
        const uint64_t id = (it++)->first;
        if (holds_[id].bytes != few_bytes_ || !holds_[id].evict) continue;
        evicts.push_back(std::move(holds_[id].evict));
        Drop(id);
      }
    }
    for (auto& evict : evicts) evict();
    return static_cast<int>(evicts.size());
  }
  uint64_t few_held() const {
    std::lock_guard<std::mutex> lock(mu_);
    return few_held_;
  }

 private:
  struct Hold {
    uint64_t bytes;
    std::function<void()> evict;
  };
  void Drop(uint64_t id) {
    auto it = holds_.find(id);
    if (it == holds_.end()) return;
    if (it->second.bytes == few_bytes_) few_held_ -= it->second.bytes;
    holds_.erase(it);
  }
  const uint64_t few_bytes_, room_;
  mutable std::mutex mu_;
  std::map<uint64_t, Hold> holds_;
  uint64_t next_ = 1;
  uint64_t few_held_ = 0;
};

// Two decode threads decode ahead two samples at a time: a few's buffer.
const uint64_t kFewBytes = ComputeBatchLayout(2, SmallTrain()).total_bytes;

struct LeasingRig {
  // `few_room`: memory_limit's room for samples decoded ahead (CountedMemory).
  // `window`: the read-ahead's, in samples.
  LeasingRig(int images, uint32_t batch, uint64_t few_room = uint64_t{1} << 40,
             uint64_t window = 16)
      : batch(batch), memory(kFewBytes, few_room),
        filler(pool, image::DecodeLimits{}, FillerOptions{&memory}),
        ahead(reads, window, &memory, nullptr, std::chrono::milliseconds(0)) {
    fs::create_directories(dir.Join("c"));
    for (int i = 0; i < images; ++i)
      WriteBytes(dir.Join("c/" + std::to_string(i) + ".jpg"), SmallJpeg(i));
    ds = OpenFolder(dir.path());
    spec.seed = 5;
    shard = std::make_unique<EpochShard>(ds->size(), spec);
    remote = std::make_unique<FakeRemote>(filler, *ds, FakeRemote::Answer::kHonest, false);
    remote->seed = spec.seed;
  }
  // The batch at `cursor`, leasing to `with` (null: decoded here alone).
  std::vector<uint8_t> Fill(uint64_t cursor, RemoteDecode* with) {
    FillRequest req;
    req.dataset = ds.get();
    req.shard = shard.get();
    req.cursor = cursor;
    req.batch_size = batch;
    req.transform = SmallTrain();
    req.seed = spec.seed;
    req.remote = with;
    if (with != nullptr) {
      // Every read the window holds is done first: what may be decoded ahead does not depend
      // on how fast the reads were.
      // The stream ends with epoch 0, as the rounds' leases do without a read-ahead.
      ahead.Advance(*ds, *shard, 0, cursor, 1, uint64_t{1} << 30, nullptr, "");
      testing::WaitFor([&] { return reads.running() == 0 && reads.queued() == 0; },
                       std::chrono::seconds(30));
      req.read_ahead = &ahead;
      req.end_epoch = 1;
    }
    std::vector<uint8_t> bytes(ComputeBatchLayout(batch, SmallTrain()).total_bytes);
    absl::StatusOr<FilledBatch> filled = filler.Fill(req, bytes, nullptr);
    REQUIRE(filled.ok());
    last = *std::move(filled);
    return bytes;
  }
  // Leased (to `remote`) and alone, the same bytes.
  bool Same(uint64_t cursor) { return Fill(cursor, remote.get()) == Fill(cursor, nullptr); }

  const uint32_t batch;
  TempDir dir;
  std::unique_ptr<Dataset> ds;
  ShardSpec spec;
  std::unique_ptr<EpochShard> shard;
  CountedMemory memory;
  WorkerPool pool{2};
  BatchFiller filler;
  ReadPool reads{2};
  ReadAhead ahead;
  std::unique_ptr<FakeRemote> remote;
  FilledBatch last;  // of the latest Fill
};

TEST_CASE("BatchFiller: rounds lease the tails of the next two rounds ahead, each once",
          "[pipeline][feeder]") {
  // With one round ahead only, a feeder idled from its answer until the next round began (a
  // fifth of its time in feeder_bench).
  LeasingRig rig(12, 4);
  const EpochShard& shard = *rig.shard;
  FakeRemote& remote = *rig.remote;
  const auto tail = [&](uint64_t first) {  // the last two samples of the round at `first`
    return std::vector<uint64_t>{shard.at(first + 2), shard.at(first + 3)};
  };
  CHECK(rig.Same(0));
  // Round 0 leased its own tail, and those of rounds 1 and 2 ahead.
  REQUIRE(remote.asked_ahead.size() == 2);
  CHECK(remote.asked_ahead[0] == tail(4));
  CHECK(remote.asked_ahead[1] == tail(8));
  CHECK(remote.held_ahead() == 2);
  CHECK(remote.leased == 6);
  CHECK(rig.Same(4));
  // Round 1 took its call; round 2's was not asked again; the epoch has no round 3.
  CHECK(remote.asked_ahead.size() == 2);
  CHECK(remote.held_ahead() == 1);
  CHECK(rig.Same(8));
  CHECK(remote.held_ahead() == 0);
  CHECK(remote.leased == 6);  // rounds 1 and 2 leased nothing of their own
  CHECK(remote.accepted == 6);
  CHECK(remote.kept == 0);  // the answers were in when the rounds wanted them: nothing ahead
}

TEST_CASE("BatchFiller: while a round's calls are late, this host decodes the samples of the next "
          "two rounds no call holds, and those rounds take them as answered",
          "[pipeline][feeder]") {
  LeasingRig rig(12, 4);
  FakeRemote& remote = *rig.remote;
  remote.late_polls = 1000;  // every call unanswered while the filler has something to decode
  CHECK(rig.Same(0));
  // Round 0 leased its tail and rounds 1 and 2's, decoded its head, then (two decode threads,
  // two samples at a time) the heads of rounds 1 and 2, and only then waited.
  CHECK(remote.leased == 6);
  CHECK(remote.kept == 4);
  CHECK(remote.local == 2 + 4);
  CHECK(remote.held_ahead() == 4);  // two calls started ahead, two decoded here
  CHECK(rig.last.ahead_samples == 0);
  CHECK(rig.Same(4));
  // Round 1 decoded nothing of its own: its head was decoded ahead, its tail leased ahead.
  CHECK(remote.local == 2 + 4);
  CHECK(rig.last.ahead_samples == 2);
  CHECK(rig.last.remote_samples == 2);
  CHECK(rig.Same(8));
  CHECK(rig.last.ahead_samples == 2);
  CHECK(remote.held_ahead() == 0);
  CHECK(remote.kept == 4);  // each sample decoded once
  CHECK(remote.local == 2 + 4);
  CHECK(remote.accepted == 6);  // a feeder's count: not what was decoded here
}

TEST_CASE("BatchFiller: while calls are late, this host decodes up to four rounds ahead: past "
          "the two leased ahead only their heads, and each round takes its own",
          "[pipeline][feeder]") {
  // Within two rounds only, a feeder late by more than their heads idled the host: in
  // feeder_bench 40-75 ms about once an epoch.
  LeasingRig rig(24, 4, uint64_t{1} << 40, /*window=*/24);
  const EpochShard& shard = *rig.shard;
  FakeRemote& remote = *rig.remote;
  remote.late_polls = 1000;
  const auto tail = [&](uint64_t first) {
    return std::vector<uint64_t>{shard.at(first + 2), shard.at(first + 3)};
  };
  CHECK(rig.Same(0));
  // Its own head, then the heads of rounds 1 to 4; the tails of rounds 3 and 4 are left.
  CHECK(remote.kept == 4 * 2);
  CHECK(remote.local == 2 + 4 * 2);
  REQUIRE(remote.asked_ahead.size() == 2);
  CHECK(rig.Same(4));
  CHECK(rig.last.ahead_samples == 2);
  // Round 3's tail went to the feeder, as it would have without this host's lead.
  REQUIRE(remote.asked_ahead.size() == 3);
  CHECK(remote.asked_ahead[2] == tail(12));
  for (uint64_t cursor : {8, 12, 16, 20}) {
    CHECK(rig.Same(cursor));
    // Each round took the head decoded for it, rounds 3 and 4's kept three and four batches.
    CHECK(rig.last.ahead_samples == 2);
    CHECK(rig.last.remote_samples == 2);
  }
  CHECK(remote.held_ahead() == 0);
  CHECK(remote.kept == 5 * 2);  // each sample decoded once: round 5's head too, ahead
  CHECK(remote.local == 2 + 5 * 2);
  CHECK(remote.leased == 6 * 2);
  CHECK(remote.accepted == 6 * 2);
}

TEST_CASE("BatchFiller: samples decoded ahead are read-ahead holds of memory_limit: none without "
          "room, given back with their stream, and taken back by a decode that would wait",
          "[pipeline][feeder]") {
  SECTION("room for two few") {
    LeasingRig rig(12, 4, 2 * kFewBytes);
    rig.remote->late_polls = 1000;
    CHECK(rig.Same(0));
    CHECK(rig.remote->kept == 4);  // the heads of rounds 1 and 2
    CHECK(rig.memory.few_held() == 2 * kFewBytes);
    CHECK(rig.Same(4));  // round 1 took its head and let it go
    CHECK(rig.memory.few_held() == kFewBytes);
    rig.remote.reset();  // the stream goes, with round 2's head unclaimed
    CHECK(rig.memory.few_held() == 0);
  }
  SECTION("room for one few") {
    LeasingRig rig(12, 4, kFewBytes);
    rig.remote->late_polls = 1000;
    CHECK(rig.Same(0));
    CHECK(rig.remote->kept == 2);  // round 1's head; round 2's found no room
    CHECK(rig.Same(4));  // no room either while round 1 held its own
    CHECK(rig.remote->kept == 2);
    CHECK(rig.remote->local == 2 + 2);
    CHECK(rig.memory.few_held() == 0);
  }
  SECTION("no room") {
    LeasingRig rig(12, 4, kFewBytes - 1);
    rig.remote->late_polls = 1000;
    for (uint64_t cursor : {0, 4, 8}) CHECK(rig.Same(cursor));
    CHECK(rig.remote->kept == 0);
    CHECK(rig.remote->local == 6);  // each round's head, in its round
  }
  SECTION("taken back by a decode") {
    LeasingRig rig(12, 4);
    rig.remote->late_polls = 1000;
    CHECK(rig.Same(0));
    CHECK(rig.remote->kept == 4);
    CHECK(rig.memory.TakeBackFews() == 2);
    CHECK(rig.memory.few_held() == 0);
    // Rounds 1 and 2 decode their heads themselves, to the same bytes.
    CHECK(rig.Same(4));
    CHECK(rig.last.ahead_samples == 0);
    CHECK(rig.Same(8));
    CHECK(rig.last.ahead_samples == 0);
    CHECK(rig.last.remote_samples == 2);  // its tail, from the feeder
    CHECK(rig.remote->kept == 4);         // nothing decoded ahead twice
  }
}

TEST_CASE("BatchFiller: a round whose share grew since its calls were started ahead leases none "
          "of its own: a feeder fills them in order, behind the next rounds' calls",
          "[pipeline][feeder]") {
  LeasingRig rig(48, 16);
  FakeRemote& remote = *rig.remote;
  CHECK(rig.Same(0));
  CHECK(remote.leased == 3 * 8);  // its own tail and rounds 1 and 2's ahead
  remote.share_bonus = 5;         // 13 of 16 from now on
  CHECK(rig.Same(16));
  // Round 1 took its call of 8 and leased none of the 5 more: only round 2's 5 more, ahead.
  CHECK(remote.leased == 3 * 8 + 5);
  CHECK(remote.local == 8 + 8);
  CHECK(rig.Same(32));
  CHECK(remote.leased == 3 * 8 + 5);
  CHECK(remote.accepted == remote.leased);
}

TEST_CASE("BatchFiller: the read-ahead leaves the rounds' leased tails to the feeders: the host "
          "reads what it decodes, and the bytes are a host alone's",
          "[pipeline][feeder][read_ahead]") {
  // Before, a host read every file ahead, those its feeders decoded too: its mount served the
  // dataset once to it and the feeders' share again to them.
  LeasingRig rig(64, 16);  // a read-ahead window of 16
  FakeRemote& remote = *rig.remote;
  for (uint64_t cursor = 0; cursor < 64; cursor += 16) CHECK(rig.Same(cursor));
  // Batch 0's 16 were read before any share was known; of each later batch, the local half and
  // the 2 of its leased half next to it (the margin), not the other 6.
  CHECK(rig.ahead.started() == 16 + 3 * 10);
  CHECK(remote.leased == 4 * 8);
  CHECK(remote.accepted == remote.leased);
}

TEST_CASE("BatchFiller: a batch that refills a failed sample's slot keeps the calls held for the "
          "rounds to come: each sample is leased once",
          "[pipeline][feeder]") {
  LeasingRig rig(12, 4);
  FakeRemote& remote = *rig.remote;
  // The batch's first sample (decoded here: the round leases its tail) is no JPEG: the batch
  // refills its slot with a round of one, from the next batch's head.
  WriteBytes(rig.dir.Join(std::string(rig.ds->relative_path(rig.shard->at(0)))),
             std::vector<uint8_t>(64, 0x5a));
  CHECK(rig.Same(0));
  CHECK(rig.last.count == 4);
  CHECK(rig.last.next_cursor == 5);
  CHECK(remote.leased == 6);  // its tail, and rounds 1 and 2's tails ahead
  CHECK(remote.held_ahead() == 2);
  CHECK(rig.Same(5));
  CHECK(remote.held_ahead() == 1);  // the call for the last round, still held
  CHECK(rig.Same(9));
  CHECK(rig.last.count == 3);
  CHECK(remote.held_ahead() == 0);
  // Nothing leased again: the refilling round aged no call (it dropped the last round's, which
  // was leased a second time).
  CHECK(remote.leased == 6);
  CHECK(remote.accepted == 6);
}

TEST_CASE("AnswerView: bytes read by offset across the pieces an answer came in",
          "[pipeline][feeder]") {
  std::vector<uint8_t> bytes(64);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i);
  const std::span<const uint8_t> all(bytes);
  // Pieces of 5, 0, 1, 20 and 38 bytes.
  const AnswerView view({all.subspan(0, 5), all.subspan(5, 0), all.subspan(5, 1),
                         all.subspan(6, 20), all.subspan(26)});
  CHECK(view.size() == 64);
  for (uint64_t offset = 0; offset < 64; ++offset) {
    for (uint64_t n = 0; offset + n <= 64; n += 7) {
      std::vector<uint8_t> out(n, 0xEE);
      view.Copy(offset, out);
      CHECK(std::equal(out.begin(), out.end(), bytes.begin() + static_cast<long>(offset)));
    }
  }
  int64_t expected = 0;
  std::memcpy(&expected, bytes.data() + 3, 8);  // across three pieces, one of them empty
  CHECK(view.Int64At(3) == expected);
  CHECK(AnswerView(all).Int64At(56) == view.Int64At(56));
  CHECK(AnswerView().size() == 0);
}

TEST_CASE("AheadCalls: samples held ahead are not asked again, a few more are left to the round, "
          "and a call passed by kLeaseAheadRounds batches is dropped (kDecodeAheadRounds if "
          "decoded here)",
          "[pipeline][feeder]") {
  class Held final : public RemoteCall {
   public:
    explicit Held(std::vector<uint64_t> indices, bool here = false)
        : indices_(std::move(indices)), here_(here) {}
    const std::vector<uint64_t>& indices() const override { return indices_; }
    bool DecodedHere() const override { return here_; }
    std::optional<absl::Status> Wait(std::chrono::milliseconds) override {
      return absl::OkStatus();
    }
    bool Answered() const override { return true; }
    uint32_t count() const override { return 0; }
    AnswerView payload() const override { return {}; }
    void Accept(uint32_t) override {}
    void Reject(const absl::Status&) override {}

   private:
    std::vector<uint64_t> indices_;
    bool here_;
  };
  AheadCalls ahead;
  const std::vector<uint64_t> first{10, 11, 12, 13};
  ahead.Add(1, std::make_unique<Held>(first));
  ahead.Add(1, std::make_unique<Held>(std::vector<uint64_t>{20, 21}));
  const std::vector<uint64_t> grown{8, 9, 10, 11, 12, 13};
  CHECK(ahead.Fresh(1, grown, 4).empty());  // 2 more next to 4 held: the round's own
  CHECK(ahead.Fresh(1, grown, 2) == std::vector<uint64_t>{8, 9});
  CHECK(ahead.Fresh(2, first, 4) == first);  // another epoch's samples are other samples
  const std::vector<uint64_t> two{30, 31};
  CHECK(ahead.Fresh(1, two, 4) == two);  // none held: a call however small
  // A round holding 11 claims the first call; the second waits for a round to come.
  const std::vector<uint64_t> round{9, 11};
  std::vector<std::unique_ptr<RemoteCall>> claimed = ahead.Claim(1, round, true);
  REQUIRE(claimed.size() == 1);
  CHECK(claimed[0]->indices() == first);
  CHECK(ahead.size() == 1);
  // A batch's later rounds (refilling failed samples' slots) age nothing.
  for (int i = 0; i < 3; ++i) CHECK(ahead.Claim(1, std::vector<uint64_t>{40}, false).empty());
  CHECK(ahead.size() == 1);
  // A feeder's call is held while a round it was leased for can still come: kLeaseAheadRounds
  // batches (the claim of round {9, 11} began one). One decoded here, started as far as
  // kDecodeAheadRounds ahead, that many.
  ahead.Add(1, std::make_unique<Held>(std::vector<uint64_t>{50, 51}, /*here=*/true));
  for (int i = 1; i < kLeaseAheadRounds - 1; ++i) {
    CHECK(ahead.Claim(2, std::vector<uint64_t>{20}, true).empty());  // another epoch's 20
  }
  CHECK(ahead.size() == 2);
  CHECK(ahead.Claim(2, std::vector<uint64_t>{20}, true).empty());
  CHECK(ahead.size() == 1);  // the feeder's, passed by kLeaseAheadRounds batches: dropped
  for (int i = 2; i < kDecodeAheadRounds; ++i) {  // (the claim just above aged it once)
    CHECK(ahead.Claim(1, std::vector<uint64_t>{40}, true).empty());
    CHECK(ahead.size() == 1);
  }
  CHECK(ahead.Claim(1, std::vector<uint64_t>{40}, true).empty());
  CHECK(ahead.size() == 0);  // passed by that often: the rounds moved past it
}

}  // namespace
}  // namespace ringloader::pipeline
