// SPDX-License-Identifier: Apache-2.0
#pragma once
// Trainers for the input-bound tests (issue 39): a stream read on a thread of its own, computing
// a fixed time a step, and a dataset of 12-megapixel photos that keeps a decode thread busy.

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include <catch2/catch.hpp>

#include "client/client.h"
#include "server/image/synthetic.h"

namespace ringloader::testing {

// `count` photo-like JPEGs of 12 megapixels (4000 x 3000) in `dir`/class_0.
inline void WriteLargePhotos(const std::string& dir, int count) {
  std::filesystem::create_directories(dir + "/class_0");
  for (int i = 0; i < count; ++i) {
    image::SyntheticImageOptions o;
    o.width = 4000;
    o.height = 3000;
    o.seed = static_cast<uint64_t>(i);
    absl::StatusOr<std::vector<uint8_t>> jpeg = image::MakeSyntheticJpeg(o);
    REQUIRE(jpeg.ok());
    std::ofstream(dir + "/class_0/photo_" + std::to_string(i) + ".jpg", std::ios::binary)
        .write(reinterpret_cast<const char*>(jpeg->data()),
               static_cast<std::streamsize>(jpeg->size()));
  }
}

// A trainer on its own thread: takes a batch, computes `step`, and again, until destroyed.
class BackgroundTrainer {
 public:
  BackgroundTrainer(const std::string& endpoint, client::StreamOptions options,
                    std::chrono::milliseconds step)
      : thread_([this, endpoint, options, step] {
          client::Client c(endpoint);
          std::unique_ptr<client::Stream> stream = c.Open(options);
          while (!stop_) {
            (void)stream->Next();
            std::this_thread::sleep_for(step);
          }
        }) {}
  ~BackgroundTrainer() {
    stop_ = true;
    thread_.join();
  }
  BackgroundTrainer(const BackgroundTrainer&) = delete;
  BackgroundTrainer& operator=(const BackgroundTrainer&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it starts once the rest is built
};

// Stream options of a trainer called `name` (its client name) on `dataset`.
inline client::StreamOptions TrainerOptions(const std::string& dataset, const std::string& name,
                                            uint32_t batch_size, uint32_t image_size) {
  client::StreamOptions o;
  o.dataset = dataset;
  o.client_name = name;
  o.batch_size = batch_size;
  o.image_size = image_size;
  o.seed = 3;
  return o;
}

}  // namespace ringloader::testing
