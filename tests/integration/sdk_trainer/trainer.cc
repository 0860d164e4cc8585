// SPDX-License-Identifier: Apache-2.0
// A trainer built out of tree against an installed ringloader SDK (tests/integration/sdk_test):
// reads one epoch of DATASET from ENDPOINT and prints what it read.
#include <ringloader/client.h>

#include <cstdint>
#include <iostream>
#include <set>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: trainer ENDPOINT DATASET\n";
    return 2;
  }
  try {
    ringloader::Client client(argv[1]);
    ringloader::StreamOptions options;
    options.dataset = argv[2];
    options.batch_size = 16;
    options.image_size = 32;
    options.end_epoch = 1;
    auto stream = client.Open(options);
    std::set<int64_t> seen;
    while (auto batch = stream->Next()) {
      const int64_t* indices = batch->indices().data<int64_t>();
      for (uint32_t i = 0; i < batch->size(); ++i) seen.insert(indices[i]);
    }
    std::cout << "sdk " << ringloader::client::Version() << " read " << seen.size()
              << " samples\n";
    return 0;
  } catch (const ringloader::Error& e) {
    std::cerr << "trainer: " << e.what() << "\n";
    return 1;
  }
}
