// SPDX-License-Identifier: Apache-2.0
#include "tests/integration/storage_data.h"

#include <catch2/catch.hpp>
#include <string_view>

#include "server/image/synthetic.h"

namespace ringloader::testing {

void WriteDataset(const std::string& dir, uint32_t count) {
  image::SyntheticDatasetOptions ds;
  ds.out_dir = dir;
  ds.count = count;
  ds.classes = 4;
  ds.seed = 3;
  ds.large_fraction = 0;
  REQUIRE(image::WriteSyntheticDataset(ds).ok());
}

std::string DatasetTable(const std::string& name, const std::string& path,
                         const std::string& extra) {
  return "[[datasets]]\nname = \"" + name + "\"\nformat = \"imagefolder\"\npath = \"" + path +
         "\"\nmax_file_bytes = \"64MiB\"\n" + extra;
}

client::StreamOptions Options(const std::string& dataset, uint64_t epochs) {
  client::StreamOptions o;
  o.dataset = dataset;
  o.batch_size = 8;
  o.seed = 11;
  o.image_size = 32;
  o.end_epoch = epochs;
  o.reconnect_deadline = std::chrono::seconds(60);
  return o;
}

std::vector<std::string> Lines(client::Stream& stream, const std::function<void()>& each) {
  std::vector<std::string> lines;
  while (std::optional<client::Batch> b = stream.Next()) {
    for (uint32_t i = 0; i < b->size(); ++i) {
      const size_t digest = std::hash<std::string_view>{}(std::string_view(
          reinterpret_cast<const char*>(b->sample_image(i)), b->sample_image_bytes()));
      lines.push_back(std::to_string(b->position().epoch) + " " +
                      std::to_string(b->indices().data<int64_t>()[i]) + " " +
                      std::to_string(b->labels().data<int64_t>()[i]) + " " +
                      std::to_string(digest));
    }
    if (each) each();
  }
  return lines;
}

}  // namespace ringloader::testing
