// SPDX-License-Identifier: Apache-2.0
// Issue 18 item 3: `ringloaderctl peek` shows one batch exactly as a trainer receives it.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/client.h"
#include "server/image/sample_decoder.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST_CASE("18.3: peek writes a PNG contact sheet holding the very bytes a trainer receives, tile k "
          "= sample k, with a legend of indices, labels and paths",
          "[integration][peek]") {
  DaemonFixtureOptions options;
  options.images = 40;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string sheet = daemon.dir() + "/sheet.png";
  const CommandResult r =
      daemon.Ctl({"peek", "--dataset", "synth", "--epoch", "1", "--batch", "2", "--seed", "7",
                  "--batch-size", "6", "--image-size", "32", "--columns", "4", "--out", sheet});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("wrote " + sheet + " (6 tiles of 32 px, 4 per row: batch 2 "
                                       "of epoch 1) and " + daemon.dir() + "/sheet.tsv"));

  // The same batch as a trainer with those options reads it.
  client::Client client(daemon.endpoint());
  client::StreamOptions s;
  s.dataset = "synth";
  s.seed = 7;
  s.batch_size = 6;
  s.image_size = 32;
  s.start = client::Position{1, 0, 0};
  std::unique_ptr<client::Stream> stream = client.Open(s);
  std::optional<client::Batch> batch;
  for (int b = 0; b < 3; ++b) batch = stream->Next();
  REQUIRE(batch.has_value());
  REQUIRE(batch->size() == 6);
  CHECK(batch->position().epoch == 1);
  CHECK(batch->position().sequence == 2);

  const std::string png = ReadFile(sheet);
  image::SampleDecoder decoder(image::DecodeLimits{});
  image::ImageInfo info;
  absl::StatusOr<std::vector<uint8_t>> rgb = decoder.DecodeRgb(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(png.data()), png.size()), sheet,
      &info);
  REQUIRE(rgb.ok());
  REQUIRE(info.width == 4 * 32);
  REQUIRE(info.height == 2 * 32);
  const uint8_t* images = batch->images().data<uint8_t>();
  for (uint32_t k = 0; k < 8; ++k) {
    INFO("tile " << k);
    const size_t x = (k % 4) * 32, y = (k / 4) * 32;
    bool same = true, black = true;
    for (size_t row = 0; row < 32; ++row) {
      const uint8_t* got = rgb->data() + ((y + row) * 128 + x) * 3;
      if (k < 6) same = same && std::memcmp(got, images + (k * 32 + row) * 32 * 3, 32 * 3) == 0;
      for (size_t i = 0; i < 32 * 3; ++i) black = black && got[i] == 0;
    }
    if (k < 6) {
      CHECK(same);
    } else {
      CHECK(black);  // no sample: an empty tile
    }
  }
  const std::vector<std::string> legend = Lines(ReadFile(daemon.dir() + "/sheet.tsv"));
  REQUIRE(legend.size() == 7);
  CHECK(legend[0] == "tile\tsample_index\tlabel\tpath");
  for (uint32_t k = 0; k < 6; ++k) {
    const int64_t index = batch->indices().data<int64_t>()[k];
    const int64_t label = batch->labels().data<int64_t>()[k];
    CHECK(legend[k + 1] == std::to_string(k) + "\t" + std::to_string(index) + "\t" +
                               std::to_string(label) + "\t" +
                               std::string(batch->relative_path(k)));
    CHECK(DaemonFixture::LabelOfPath(std::string(batch->relative_path(k))) == label);
  }

  // A JPEG sheet for a quick look; a batch the epoch does not have; a format we do not write.
  const std::string jpg = daemon.dir() + "/sheet.jpg";
  REQUIRE(daemon.Ctl({"peek", "--dataset", "synth", "--augment", "eval", "--image-size", "24",
                      "--batch-size", "5", "--out", jpg})
              .exit_code == 0);
  const std::string jpeg = ReadFile(jpg);
  absl::StatusOr<image::ImageInfo> jpeg_info = decoder.ReadInfo(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size()), jpg);
  REQUIRE(jpeg_info.ok());
  CHECK(jpeg_info->width == 5 * 24);
  CHECK(jpeg_info->height == 24);
  const CommandResult past = daemon.Ctl({"peek", "--dataset", "synth", "--batch", "99",
                                         "--batch-size", "10", "--out", sheet});
  CHECK(past.exit_code == 2);
  CHECK_THAT(past.output, Catch::Contains("epoch 0 has 4 batches: there is no batch 99"));
  const CommandResult gif = daemon.Ctl({"peek", "--dataset", "synth", "--out", "x.gif"});
  CHECK(gif.exit_code == 2);
  CHECK_THAT(gif.output, Catch::Contains("must end in .png"));
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace ringloader::testing
