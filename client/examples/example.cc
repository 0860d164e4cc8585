// SPDX-License-Identifier: Apache-2.0
// The smallest useful ringloader client: read a few batches and look at them.
//
//   ringloader_example <dataset> [batches] [endpoint]
//
// Batches are views into the daemon's shared-memory ring: nothing is copied, and each batch gives
// its slot back when it goes out of scope. If ringloaderd restarts meanwhile, Next() reconnects
// and continues with exactly the next batch.
#include <cstdlib>
#include <iostream>
#include <string>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: ringloader_example <dataset> [batches] [endpoint]\n";
    return 2;
  }
  const int batches = argc > 2 ? std::atoi(argv[2]) : 3;
  const std::string endpoint = argc > 3 ? argv[3] : ringloader::client::DefaultEndpoint();

  try {
    ringloader::Client client(endpoint);
    ringloader::StreamOptions options;
    options.dataset = argv[1];
    options.batch_size = 32;
    options.image_size = 224;
    auto stream = client.Open(options);

    for (int b = 0; b < batches; ++b) {
      std::optional<ringloader::Batch> batch = stream->Next();
      if (!batch) break;  // end of stream (only when options.end_epoch is set)
      const auto& shape = batch->images().shape();  // [n, 224, 224, 3] uint8, NHWC
      const int64_t* labels = batch->labels().data<int64_t>();
      std::cout << "batch epoch " << batch->position().epoch << " #" << batch->position().sequence
                << ": images [" << shape[0] << ", " << shape[1] << ", " << shape[2] << ", "
                << shape[3] << "] " << ringloader::client::DTypeName(batch->images().dtype())
                << ", first labels";
      for (uint32_t i = 0; i < batch->size() && i < 5; ++i) std::cout << " " << labels[i];
      std::cout << "\n";
    }
    // Store this in a checkpoint; client.Resume(state) continues with the next batch.
    std::cout << "resume state: " << stream->State() << "\n";
  } catch (const ringloader::Error& e) {
    std::cerr << "ringloader_example: " << ringloader::client::ErrorCodeName(e.code()) << ": "
              << e.what() << "\n";
    return 1;
  }
  return 0;
}
