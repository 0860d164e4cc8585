// SPDX-License-Identifier: Apache-2.0
// Test helper for hostile_client_test: a trainer that opens a stream, leases a few batches without
// releasing them, prints "holding N" and then sleeps until it is killed (the test SIGKILLs it to
// check that the daemon reclaims its slots).
//
//   hold_handles ENDPOINT DATASET BATCHES
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "client/client.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: hold_handles ENDPOINT DATASET BATCHES\n");
    return 2;
  }
  const int batches = std::atoi(argv[3]);
  try {
    ringloader::client::Client client(argv[1]);
    ringloader::client::StreamOptions options;
    options.dataset = argv[2];
    options.batch_size = 16;
    options.image_size = 48;
    options.ring_slots = 4;
    options.client_name = "hold_handles";
    auto stream = client.Open(options);
    std::vector<ringloader::client::Batch> held;
    for (int i = 0; i < batches; ++i) {
      std::optional<ringloader::client::Batch> batch = stream->Next();
      if (!batch) return 1;
      held.push_back(std::move(*batch));
    }
    std::printf("holding %d\n", batches);
    std::fflush(stdout);
    while (true) pause();
  } catch (const ringloader::client::Error& e) {
    std::fprintf(stderr, "hold_handles: %s\n", e.what());
    return 1;
  }
}
