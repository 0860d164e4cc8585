// SPDX-License-Identifier: Apache-2.0
// Issue 11: the container formats (webdataset, tfrecord, arrays) at the pipeline level: the same
// JPEG gives the same batch bytes whatever its container, named tensors land in their places,
// and every kind of damage costs only its own sample (or, for a header, the rest of its file).
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/image/sample_decoder.h"
#include "server/image/synthetic.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/npy.h"
#include "server/pipeline/sampler.h"
#include "server/pipeline/tar_shard.h"
#include "server/pipeline/tf_example.h"
#include "server/pipeline/tfrecord.h"
#include "server/pipeline/worker_pool.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

constexpr int kImages = 18;  // 3 classes

std::string Str(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

std::string TinyJpeg(uint64_t seed) {
  image::SyntheticImageOptions o;
  o.width = 40;
  o.height = 30;
  o.seed = seed;
  return Str(*image::MakeSyntheticJpeg(o));
}

// An imagefolder of small photo-like JPEGs of varied sizes (some progressive, some gray).
void WriteImageFolder(const std::string& root) {
  for (int i = 0; i < kImages; ++i) {
    image::SyntheticImageOptions o;
    o.seed = static_cast<uint64_t>(i) * 131;
    o.width = 60 + (i * 37) % 200;
    o.height = 50 + (i * 53) % 150;
    o.grayscale = i % 7 == 3;
    o.progressive = i % 5 == 2;
    auto jpeg = image::MakeSyntheticJpeg(o);
    REQUIRE(jpeg.ok());
    const std::string dir = root + "/class_" + std::to_string(i % 3);
    fs::create_directories(dir);
    testing::WriteFile(dir + "/img_" + std::to_string(100 + i) + ".jpg", Str(*jpeg));
  }
}

std::unique_ptr<Dataset> Open(DatasetSpec spec) {
  if (spec.name.empty()) spec.name = "t";
  auto ds = Dataset::Open(spec);
  INFO(ds.status().ToString());
  REQUIRE(ds.ok());
  return *std::move(ds);
}

// A float32 [8, 8] per sample, its values a function of the sample (like make-dataset's).
std::string DepthNpy(uint64_t i, uint64_t rows = 8) {
  std::string out = MakeNpyHeader(NpyType::kFloat32, {rows, 8});
  for (uint64_t y = 0; y < rows; ++y) {
    for (uint64_t x = 0; x < 8; ++x) {
      const float v = static_cast<float>(i) + 0.01f * static_cast<float>(y) + 0.001f * x;
      out.append(reinterpret_cast<const char*>(&v), 4);
    }
  }
  return out;
}

// The imagefolder's samples as WebDataset shards of `per_shard` samples (KEY.jpg, KEY.cls,
// KEY.depth.npy) and as TFRecord files; the same order.
void WriteContainers(const Dataset& folder, const std::string& wds, const std::string& tfr,
                     uint64_t per_shard) {
  fs::create_directories(wds);
  fs::create_directories(tfr);
  std::string tar;
  std::string records;
  for (uint64_t i = 0; i < folder.size(); ++i) {
    const std::string jpeg = testing::ReadFile(folder.AbsolutePath(i));
    std::string key(folder.relative_path(i));
    key = key.substr(0, key.rfind('.'));
    AppendTarMember(key + ".jpg", jpeg, tar);
    AppendTarMember(key + ".cls", std::to_string(folder.label(i)), tar);
    AppendTarMember(key + ".depth.npy", DepthNpy(i), tar);
    const std::string example = MakeExampleRecord(jpeg, folder.label(i), ExampleKeys{});
    AppendTfRecord({reinterpret_cast<const uint8_t*>(example.data()), example.size()}, records);
    if ((i + 1) % per_shard == 0 || i + 1 == folder.size()) {
      const std::string n = std::to_string(i / per_shard);
      AppendTarEnd(tar);
      testing::WriteFile(wds + "/shard-00" + n + ".tar", tar);
      testing::WriteFile(tfr + "/part-00" + n + ".tfrecord", records);
      tar.clear();
      records.clear();
    }
  }
}

struct Epoch {
  std::vector<uint8_t> bytes;  // every batch's payload, concatenated
  std::vector<int64_t> indices;
  std::vector<int64_t> labels;
  std::vector<SampleError> errors;
  BatchLayout layout;
};

// One unshuffled epoch in batches of 4 with the eval transform (no randomness in the pixels).
Epoch ReadEpoch(const Dataset& ds, OnError on_error = OnError::kSkip) {
  WorkerPool pool(2);
  BatchFiller filler(pool, image::DecodeLimits{});
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds.size(), s);
  FillRequest req;
  req.dataset = &ds;
  req.shard = &shard;
  req.batch_size = 4;
  req.transform.image_size = 24;
  req.transform.augment = image::Augment::kEval;
  req.on_error = on_error;
  Epoch e;
  e.layout = ComputeBatchLayout(req.batch_size, req.transform, &ds);
  std::vector<uint8_t> buf(e.layout.total_bytes);
  while (req.cursor < shard.size()) {
    auto filled = filler.Fill(req, buf, nullptr);
    REQUIRE(filled.ok());
    for (uint32_t i = 0; i < filled->count; ++i) {
      int64_t v = 0;
      std::memcpy(&v, buf.data() + e.layout.indices_offset + i * 8, 8);
      e.indices.push_back(v);
      std::memcpy(&v, buf.data() + e.layout.labels_offset + i * 8, 8);
      e.labels.push_back(v);
    }
    e.errors.insert(e.errors.end(), filled->errors.begin(), filled->errors.end());
    e.bytes.insert(e.bytes.end(), buf.begin(), buf.end());
    req.cursor = filled->next_cursor;
  }
  return e;
}

std::vector<uint8_t> Images(const Epoch& e) {
  // The images tensor of each batch, without the other tensors.
  std::vector<uint8_t> out;
  const uint64_t stride = e.layout.total_bytes;
  for (uint64_t b = 0; b < e.bytes.size(); b += stride) {
    out.insert(out.end(), e.bytes.begin() + static_cast<int64_t>(b + e.layout.images_offset),
               e.bytes.begin() + static_cast<int64_t>(b + e.layout.images_offset + e.layout.images_bytes));
  }
  return out;
}

TEST_CASE("11: the same JPEGs give byte-identical batches from an imagefolder, WebDataset "
          "shards and TFRecord files", "[formats]") {
  TempDir dir;
  WriteImageFolder(dir.Join("folder"));
  DatasetSpec folder_spec;
  folder_spec.root = dir.Join("folder");
  auto folder = Open(folder_spec);
  REQUIRE(folder->size() == kImages);
  WriteContainers(*folder, dir.Join("wds"), dir.Join("tfr"), 5);

  DatasetSpec wds_spec;
  wds_spec.format = DatasetFormat::kWebDataset;
  wds_spec.root = dir.Join("wds");
  auto wds = Open(wds_spec);
  DatasetSpec tfr_spec;
  tfr_spec.format = DatasetFormat::kTfRecord;
  tfr_spec.root = dir.Join("tfr") + "/part-{000..003}.tfrecord";  // a brace pattern
  auto tfr = Open(tfr_spec);

  REQUIRE(wds->size() == folder->size());
  REQUIRE(tfr->size() == folder->size());
  CHECK(wds->relative_path(0) == "shard-000.tar#class_0/img_100");
  CHECK(wds->relative_path(5) == "shard-001.tar#" +
                                     std::string(folder->relative_path(5).substr(0, 15)));
  CHECK(tfr->relative_path(6) == "part-001.tfrecord#1");
  CHECK(tfr->root() == dir.Join("tfr"));
  REQUIRE(wds->tensors().size() == 1);
  CHECK(wds->tensors()[0].name == "depth");
  CHECK(wds->tensors()[0].Describe() == "float32 [8, 8]");
  CHECK(tfr->tensors().empty());

  const Epoch a = ReadEpoch(*folder);
  const Epoch b = ReadEpoch(*wds);
  const Epoch c = ReadEpoch(*tfr);
  CHECK(a.errors.empty());
  CHECK(b.errors.empty());
  CHECK(c.errors.empty());
  // Exactly once each, in order, with the folder's labels.
  std::vector<int64_t> all(kImages);
  for (int i = 0; i < kImages; ++i) all[i] = i;
  CHECK(a.indices == all);
  CHECK(b.indices == all);
  CHECK(c.indices == all);
  CHECK(b.labels == a.labels);
  CHECK(c.labels == a.labels);
  CHECK(Images(b) == Images(a));
  CHECK(Images(c) == Images(a));
  CHECK(c.bytes == a.bytes);  // same tensors: the whole payload is the same

  // The WebDataset's extra tensor: sample i's depth in slot i, 256-byte aligned.
  const TensorPlacement* depth = b.layout.Find("depth");
  REQUIRE(depth != nullptr);
  CHECK(depth->offset % 256 == 0);
  CHECK(depth->sample_shape == std::vector<uint64_t>{8, 8});
  const std::string expected = DepthNpy(6).substr(128);  // sample 6 = batch 1, slot 2
  CHECK(std::memcmp(b.bytes.data() + b.layout.total_bytes + depth->offset + 2 * 256,
                    expected.data(), 256) == 0);
}

TEST_CASE("11: an arrays dataset reads one row of every .npy per sample, the label column as "
          "labels", "[formats]") {
  TempDir dir;
  constexpr uint64_t kRows = 10;
  std::string features = MakeNpyHeader(NpyType::kInt16, {kRows, 3});
  std::string labels = MakeNpyHeader(NpyType::kInt32, {kRows});
  std::string mask = MakeNpyHeader(NpyType::kBool, {kRows, 2});
  for (uint64_t i = 0; i < kRows; ++i) {
    for (int16_t k = 0; k < 3; ++k) {
      const int16_t v = static_cast<int16_t>(i * 10 + k);
      features.append(reinterpret_cast<const char*>(&v), 2);
    }
    const int32_t label = static_cast<int32_t>(i % 4);
    labels.append(reinterpret_cast<const char*>(&label), 4);
    mask += static_cast<char>(i % 2);
    mask += static_cast<char>(1);
  }
  testing::WriteFile(dir.Join("features.npy"), features);
  testing::WriteFile(dir.Join("y.npy"), labels);
  testing::WriteFile(dir.Join("mask.npy"), mask);
  DatasetSpec spec;
  spec.format = DatasetFormat::kArrays;
  spec.root = dir.path();
  spec.label_array = "y";
  auto ds = Open(spec);
  CHECK(ds->size() == kRows);
  CHECK_FALSE(ds->has_images());
  CHECK(ds->relative_path(7) == "#7");
  REQUIRE(ds->tensors().size() == 2);
  CHECK(ds->tensors()[0].name == "features");
  CHECK(ds->tensors()[1].name == "mask");

  const Epoch e = ReadEpoch(*ds);
  CHECK(e.errors.empty());
  CHECK(e.layout.Find("images") == nullptr);
  CHECK(e.layout.Find("y") == nullptr);  // it became "labels"
  const TensorPlacement* f = e.layout.Find("features");
  REQUIRE(f != nullptr);
  for (uint64_t i = 0; i < kRows; ++i) {
    CHECK(e.indices[i] == static_cast<int64_t>(i));
    CHECK(e.labels[i] == static_cast<int64_t>(i % 4));
    const uint8_t* batch = e.bytes.data() + (i / 4) * e.layout.total_bytes;
    int16_t v[3];
    std::memcpy(v, batch + f->offset + (i % 4) * 6, 6);
    CHECK(v[0] == static_cast<int16_t>(i * 10));
    CHECK(v[2] == static_cast<int16_t>(i * 10 + 2));
  }

  // Rows that disagree, an unsupported dtype, a label column that is not integers: the dataset
  // is refused naming the file.
  testing::WriteFile(dir.Join("short.npy"), MakeNpyHeader(NpyType::kUint8, {kRows - 1}) +
                                                std::string(kRows - 1, 'x'));
  auto bad = Dataset::Open(spec);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("short.npy has 9 rows but") && Catch::Contains("has 10"));
  fs::remove(dir.Join("short.npy"));
  std::string big_endian = MakeNpyHeader(NpyType::kInt32, {kRows});
  big_endian.replace(big_endian.find("<i4"), 3, ">i4");
  testing::WriteFile(dir.Join("be.npy"), big_endian + std::string(kRows * 4, '\0'));
  bad = Dataset::Open(spec);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()),
             Catch::Contains("be.npy") && Catch::Contains("'>i4' is not supported"));
  fs::remove(dir.Join("be.npy"));
  spec.label_array = "mask";
  bad = Dataset::Open(spec);
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("needs one integer per row"));
}

TEST_CASE("11: a uint64 label above int64's range fails its sample, as JSON and TFRecord labels "
          "out of range do: never served negative", "[formats]") {
  TempDir dir;
  // 2^64 - 1 would be served as -1, the batch's "no label" value; 2^63 as INT64_MIN.
  const std::vector<uint64_t> values = {3, uint64_t{INT64_MAX}, uint64_t{1} << 63, ~uint64_t{0}};
  std::string labels = MakeNpyHeader(NpyType::kUint64, {values.size()});
  std::string x = MakeNpyHeader(NpyType::kUint8, {values.size()});
  for (uint64_t v : values) {
    labels.append(reinterpret_cast<const char*>(&v), 8);
    x += 'x';
  }
  testing::WriteFile(dir.Join("labels.npy"), labels);
  testing::WriteFile(dir.Join("x.npy"), x);
  DatasetSpec spec;
  spec.format = DatasetFormat::kArrays;
  spec.root = dir.path();
  spec.label_array = "labels";
  auto ds = Open(spec);
  const Epoch e = ReadEpoch(*ds);
  CHECK(e.indices == std::vector<int64_t>{0, 1});
  CHECK(e.labels == std::vector<int64_t>{3, INT64_MAX});
  REQUIRE(e.errors.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    CHECK(e.errors[i].sample_index == i + 2);
    CHECK(e.errors[i].reason == "corrupt");
    CHECK_THAT(e.errors[i].message,
               Catch::Contains(absl::StrCat("labels.npy: row ", i + 2, ": label ", values[i + 2],
                                            " (uint64) is out of int64's range")));
  }
}

// Shards of 3 samples each: KEY.jpg, KEY.cls, KEY.depth.npy.
std::string Shard(int first, int count, const std::vector<std::string>& jpegs) {
  std::string tar;
  for (int i = first; i < first + count; ++i) {
    const std::string key = "s" + std::to_string(i);
    AppendTarMember(key + ".jpg", jpegs[i], tar);
    AppendTarMember(key + ".cls", std::to_string(i), tar);
    AppendTarMember(key + ".depth.npy", DepthNpy(i, i == 4 ? 5 : 8), tar);
  }
  AppendTarEnd(tar);
  return tar;
}

TEST_CASE("11: damaged WebDataset shards cost only their own samples, or the rest of a shard "
          "whose header is bad, each named with reason, file and offset", "[formats]") {
  TempDir dir;
  std::vector<std::string> jpegs;
  for (uint64_t i = 0; i < 9; ++i) jpegs.push_back(TinyJpeg(i));
  // shard 0: fine, except sample 1's label is not an integer and sample 2 has no depth.
  std::string a;
  for (int i = 0; i < 3; ++i) {
    const std::string key = "s" + std::to_string(i);
    AppendTarMember(key + ".jpg", jpegs[i], a);
    AppendTarMember(key + ".cls", i == 1 ? "cat" : std::to_string(i), a);
    if (i != 2) AppendTarMember(key + ".depth.npy", DepthNpy(i), a);
  }
  AppendTarEnd(a);
  testing::WriteFile(dir.Join("a.tar"), a);
  // shard 1: sample 4's depth has 5 rows instead of 8; sample 5's header checksum is broken.
  std::string b = Shard(3, 3, jpegs);
  const size_t s5 = b.find("s5.jpg");
  REQUIRE(s5 != std::string::npos);
  b[s5 + 1] = 'X';  // the name changes; the stored checksum no longer adds up
  testing::WriteFile(dir.Join("b.tar"), b);
  // shard 2: its last member cut short.
  std::string c = Shard(6, 3, jpegs);
  c.resize(c.rfind("s8.depth.npy") + 512 + 40);
  testing::WriteFile(dir.Join("c.tar"), c);

  DatasetSpec spec;
  spec.format = DatasetFormat::kWebDataset;
  spec.root = dir.path();
  auto ds = Open(spec);
  // s5 and everything after it in b.tar is gone; s8's truncated depth member too; s4's odd depth
  // is named (the batch's shape is the other samples').
  REQUIRE(ds->index_problems().size() == 3);
  const IndexProblem& odd = ds->index_problems()[2];
  CHECK(odd.file == "b.tar");
  CHECK(odd.reason == "corrupt");
  CHECK_FALSE(odd.rest_unread);
  CHECK_THAT(odd.message, Catch::Contains("b.tar#s4.depth.npy is float32 [5, 8] but"));
  CHECK(ds->index_problems()[0].file == "b.tar");
  CHECK(ds->index_problems()[0].reason == "corrupt");
  CHECK(ds->index_problems()[0].offset == s5);
  CHECK(ds->index_problems()[1].file == "c.tar");
  CHECK(ds->index_problems()[1].reason == "truncated");
  CHECK_THAT(ds->index_problems()[1].message, Catch::Contains("c.tar: offset "));
  CHECK(ds->size() == 8);  // s0-s4, s6-s8

  const Epoch e = ReadEpoch(*ds);
  std::map<std::string, std::string> failed;  // relative path -> reason
  for (const SampleError& err : e.errors) failed[err.relative_path] = err.reason;
  CHECK(failed == std::map<std::string, std::string>{{"a.tar#s1", "corrupt"},
                                                     {"a.tar#s2", "corrupt"},
                                                     {"b.tar#s4", "corrupt"},
                                                     {"c.tar#s8", "corrupt"}});
  for (const SampleError& err : e.errors) {
    if (err.relative_path == "a.tar#s1") {
      CHECK_THAT(err.message, Catch::Contains("a.tar#s1: corrupt: the 'cls' member is not an "
                                              "integer: \"cat\""));
    }
    if (err.relative_path == "b.tar#s4") {
      CHECK_THAT(err.message, Catch::Contains("tensor 'depth' is float32 [5, 8], the batch's is "
                                              "float32 [8, 8]"));
    }
    if (err.relative_path == "a.tar#s2") {
      CHECK_THAT(err.message, Catch::Contains("no 'depth.npy' member"));
    }
  }
  CHECK(e.indices.size() == 4);
  CHECK(e.labels == std::vector<int64_t>{0, 3, 6, 7});

  // Ragged: sample 4's 5 rows are padded to 8, and depth_lengths says 5.
  spec.ragged = {"depth"};
  auto ragged = Open(spec);
  const Epoch r = ReadEpoch(*ragged);
  const TensorPlacement* lengths = r.layout.Find("depth_lengths");
  REQUIRE(lengths != nullptr);
  std::map<int64_t, int64_t> rows;  // sample index -> rows
  for (uint64_t i = 0; i < r.indices.size(); ++i) {
    int64_t v = 0;
    std::memcpy(&v, r.bytes.data() + (i / 4) * r.layout.total_bytes + lengths->offset + (i % 4) * 8,
                8);
    rows[r.indices[i]] = v;
  }
  CHECK(rows.at(4) == 5);
  CHECK(rows.at(3) == 8);
  spec.ragged = {"nope"};
  CHECK_FALSE(Dataset::Open(spec).ok());
}

TEST_CASE("11: damaged TFRecord files: a bad data CRC costs one record, a bad length CRC or a "
          "length past the end the rest of the file", "[formats]") {
  TempDir dir;
  std::vector<std::string> records;
  for (int i = 0; i < 3; ++i) {
    const std::string example =
        MakeExampleRecord(TinyJpeg(static_cast<uint64_t>(i)), i + 1, ExampleKeys{});
    std::string framed;
    AppendTfRecord({reinterpret_cast<const uint8_t*>(example.data()), example.size()}, framed);
    records.push_back(framed);
  }
  std::string bad_data = records[1];
  bad_data[bad_data.size() / 2] ^= 0x40;
  testing::WriteFile(dir.Join("a.tfrecord"), records[0] + bad_data + records[2]);
  std::string bad_length = records[1];
  bad_length[9] ^= 0x01;  // inside the length's CRC
  testing::WriteFile(dir.Join("b.tfrecord"), records[0] + bad_length + records[2]);
  testing::WriteFile(dir.Join("c.tfrecord"), records[0] + records[1].substr(0, 100));

  DatasetSpec spec;
  spec.format = DatasetFormat::kTfRecord;
  spec.root = dir.Join("*.tfrecord");
  spec.label_offset = -1;
  auto ds = Open(spec);
  REQUIRE(ds->index_problems().size() == 2);
  CHECK(ds->index_problems()[0].file == "b.tfrecord");
  CHECK(ds->index_problems()[0].reason == "crc_mismatch");
  CHECK(ds->index_problems()[0].offset == records[0].size());
  CHECK(ds->index_problems()[1].file == "c.tfrecord");
  CHECK(ds->index_problems()[1].reason == "truncated");
  CHECK(ds->size() == 5);  // a: 3, b: 1, c: 1

  const Epoch e = ReadEpoch(*ds);
  REQUIRE(e.errors.size() == 1);
  CHECK(e.errors[0].relative_path == "a.tfrecord#1");
  CHECK(e.errors[0].reason == "crc_mismatch");
  CHECK_THAT(e.errors[0].message, Catch::Contains("a.tfrecord: offset " +
                                                  std::to_string(records[0].size())));
  CHECK(e.labels == std::vector<int64_t>{0, 2, 0, 0});  // label_offset -1 applied

  // on_error = fail: the batch fails naming the record.
  WorkerPool pool(1);
  BatchFiller filler(pool, image::DecodeLimits{});
  ShardSpec s;
  s.shuffle = false;
  EpochShard shard(ds->size(), s);
  FillRequest req;
  req.dataset = ds.get();
  req.shard = &shard;
  req.batch_size = 4;
  req.transform.image_size = 16;
  req.on_error = OnError::kFail;
  std::vector<uint8_t> buf(ComputeBatchLayout(4, req.transform, ds.get()).total_bytes);
  auto failed = filler.Fill(req, buf, nullptr);
  REQUIRE_FALSE(failed.ok());
  CHECK(image::ErrorReason(failed.status()) == "crc_mismatch");
}

TEST_CASE("11: a container index is cached by the files' sizes and mtimes, with its problems",
          "[formats]") {
  TempDir dir;
  TempDir state;
  WriteImageFolder(dir.Join("folder"));
  DatasetSpec folder_spec;
  folder_spec.root = dir.Join("folder");
  auto folder = Open(folder_spec);
  WriteContainers(*folder, dir.Join("wds"), dir.Join("tfr"), 7);
  std::string broken = testing::ReadFile(dir.Join("tfr/part-002.tfrecord"));
  testing::WriteFile(dir.Join("tfr/part-002.tfrecord"), broken.substr(0, broken.size() - 3));
  // Old enough for the cache to be written (see the racy-write rule).
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& e : fs::recursive_directory_iterator(dir.path())) fs::last_write_time(e, old);

  for (DatasetFormat format : {DatasetFormat::kWebDataset, DatasetFormat::kTfRecord}) {
    DatasetSpec spec;
    spec.format = format;
    spec.root = format == DatasetFormat::kWebDataset ? dir.Join("wds") : dir.Join("tfr");
    spec.state_dir = state.path();
    auto first = Open(spec);
    CHECK_FALSE(first->loaded_from_cache());
    auto second = Open(spec);
    CHECK(second->loaded_from_cache());
    CHECK(second->fingerprint() == first->fingerprint());
    CHECK(second->size() == first->size());
    CHECK(second->tensors() == first->tensors());
    CHECK(second->index_problems() == first->index_problems());
    CHECK(ReadEpoch(*second).bytes == ReadEpoch(*first).bytes);
  }
  // A shard that changes (size and mtime) is indexed again.
  std::string tar = testing::ReadFile(dir.Join("wds/shard-000.tar"));
  testing::WriteFile(dir.Join("wds/shard-000.tar"), tar + std::string(1024, '\0'));
  DatasetSpec spec;
  spec.format = DatasetFormat::kWebDataset;
  spec.root = dir.Join("wds");
  spec.state_dir = state.path();
  CHECK_FALSE(Open(spec)->loaded_from_cache());
}

TEST_CASE("27: a dataset's tensor name may not be one the batch already uses, nor odd",
          "[pipeline][formats]") {
  constexpr auto kMember = TensorSource::kWebDatasetMember;
  constexpr auto kArrays = TensorSource::kArraysFile;
  for (const char* good : {"depth", "seg.mask", "boxes_2", "a-b", "lengths"}) {
    INFO(good);
    CHECK(CheckTensorName(good, kMember).ok());
    CHECK(CheckTensorName(good, kArrays).ok());
  }
  for (const char* taken : {"images", "labels", "indices", "boxes_lengths"}) {
    INFO(taken);
    CHECK(absl::IsInvalidArgument(CheckTensorName(taken, kMember)));
  }
  CHECK_THAT(std::string(CheckTensorName("images", kMember).message()),
             Catch::Contains("own images"));
  // An arrays batch has no decoded images (and no ragged tensors): those names are its own.
  CHECK(CheckTensorName("images", kArrays).ok());
  CHECK(CheckTensorName("boxes_lengths", kArrays).ok());
  CHECK_FALSE(CheckTensorName("labels", kArrays).ok());
  CHECK_FALSE(CheckTensorName("indices", kArrays).ok());
  CHECK_FALSE(CheckTensorName("", kMember).ok());
  CHECK_FALSE(CheckTensorName("a/b", kMember).ok());
  CHECK_FALSE(CheckTensorName(std::string("x\0y", 3), kMember).ok());
  CHECK_FALSE(CheckTensorName(std::string(kMaxTensorNameBytes + 1, 'x'), kArrays).ok());
  CHECK(CheckTensorName(std::string(kMaxTensorNameBytes, 'x'), kArrays).ok());
}

}  // namespace
}  // namespace ringloader::pipeline
