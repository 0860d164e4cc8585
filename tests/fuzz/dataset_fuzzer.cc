// SPDX-License-Identifier: Apache-2.0
// libFuzzer target: arbitrary bytes as a dataset file, through the real index and read path (not
// only the parsers): Dataset::Open indexes it as the daemon does, then every sample (at most 32)
// is read as a decode worker reads it (SampleReader: open, image head and bytes, label, every
// tensor into a buffer of its schema's size).
//
// Input: one control byte, then the bytes. The control byte (mod 6) says what they are:
//   0  a WebDataset tar shard (label_key "cls", ragged ["r"])
//   1  a TFRecord file
//   2  one tf.train.Example, framed as a TFRecord record with good CRCs
//   3  the KEY.x.npy member of a WebDataset sample (beside KEY.jpg and KEY.cls)
//   4  the x.npy file of an arrays dataset
//   5  the .json member of a WebDataset sample read with label_key "json:label"
// Seeds in corpus/dataset are such inputs, made from the tests' own files.
//
// Besides "no crash, no leak, no undefined behaviour", each input checks: a sample read never
// writes past its tensor's buffer (ASan), a failure is a Status, and no tensor takes a name the
// batch already uses (pipeline::CheckTensorName). Samples are read with max_file_bytes 1 MiB so
// that one input cannot ask for gigabytes.

#include <stdlib.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "server/pipeline/dataset.h"
#include "server/pipeline/sample_reader.h"
#include "server/pipeline/tar_shard.h"
#include "server/pipeline/tensor_schema.h"
#include "server/pipeline/tfrecord.h"

namespace {

using ringloader::pipeline::Dataset;
using ringloader::pipeline::DatasetFormat;
using ringloader::pipeline::DatasetSpec;
using ringloader::pipeline::SampleReader;

constexpr uint64_t kMaxSamples = 32;
constexpr uint64_t kMaxTensorBytes = 1 << 20;

// This process's own directory, emptied before each input.
const std::string& WorkDir() {
  static const std::string dir = [] {
    std::string path = "/tmp/ringloader-fuzz-dataset.XXXXXX";
    if (mkdtemp(path.data()) == nullptr) std::abort();
    return path;
  }();
  return dir;
}

std::string Write(const std::string& name, const std::string& bytes) {
  const std::string path = WorkDir() + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<long>(bytes.size()));
  return path;
}

std::string Shard(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string tar;
  for (const auto& [name, data] : members) ringloader::pipeline::AppendTarMember(name, data, tar);
  ringloader::pipeline::AppendTarEnd(tar);
  return tar;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "dataset_fuzzer: contract broken: %s\n", what);
    std::abort();
  }
}

void ReadEverySample(const Dataset& dataset) {
  for (const auto& t : dataset.tensors()) {
    const auto source = dataset.format() == DatasetFormat::kArrays
                            ? ringloader::pipeline::TensorSource::kArraysFile
                            : ringloader::pipeline::TensorSource::kWebDatasetMember;
    Check(ringloader::pipeline::CheckTensorName(t.name, source).ok(), "a tensor took a taken name");
  }
  for (uint64_t i = 0; i < dataset.size() && i < kMaxSamples; ++i) {
    auto reader =
        SampleReader::Open(dataset, i, /*max_image_bytes=*/1 << 20, std::chrono::milliseconds(0));
    if (!reader.ok()) continue;
    if (dataset.has_images()) {
      bool whole = false;
      (void)reader->ReadImageHead(64 << 10, &whole);
      (void)reader->ReadImage();
    }
    if (dataset.has_labels()) (void)reader->ReadLabel();
    for (uint32_t k = 0; k < dataset.tensors().size(); ++k) {
      const uint64_t bytes = dataset.tensors()[k].SampleBytes();
      if (bytes > kMaxTensorBytes) continue;  // the daemon's ring would refuse it first
      std::vector<uint8_t> out(bytes);
      (void)reader->ReadTensor(k, std::span<uint8_t>(out));
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  std::filesystem::remove_all(WorkDir());
  std::filesystem::create_directories(WorkDir());

  DatasetSpec spec;
  spec.name = "fuzz";
  switch (data[0] % 6) {
    case 0:
      spec.format = DatasetFormat::kWebDataset;
      spec.ragged = {"r"};
      spec.root = Write("shard.tar", bytes);
      break;
    case 1:
      spec.format = DatasetFormat::kTfRecord;
      spec.root = Write("data.tfrecord", bytes);
      break;
    case 2: {
      std::string file;
      ringloader::pipeline::AppendTfRecord(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()),
          file);
      spec.format = DatasetFormat::kTfRecord;
      spec.root = Write("data.tfrecord", file);
      break;
    }
    case 3:
      spec.format = DatasetFormat::kWebDataset;
      spec.root = Write("shard.tar", Shard({{"s.jpg", "x"},
                                            {"s.cls", "1"},
                                            {"s.x.npy", bytes},
                                            {"t.jpg", "y"},
                                            {"t.cls", "2"}}));
      break;
    case 4:
      spec.format = DatasetFormat::kArrays;
      Write("x.npy", bytes);
      spec.root = WorkDir();
      break;
    case 5:
      spec.format = DatasetFormat::kWebDataset;
      spec.label_key = "json:label";
      spec.root = Write("shard.tar", Shard({{"s.jpg", "x"}, {"s.json", bytes}}));
      break;
  }
  auto dataset = Dataset::Open(spec);
  if (dataset.ok()) ReadEverySample(**dataset);
  return 0;
}
