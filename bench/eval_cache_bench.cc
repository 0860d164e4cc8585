// SPDX-License-Identifier: Apache-2.0
// eval_cache_bench: validation epochs with cache = "memory" (issue 13 item 2).
//
// Starts a daemon over a synthetic dataset whose [[datasets]] table says cache = "memory" and
// reads --epochs eval epochs (resize + center crop) through the C++ client, timing each. The first
// epoch decodes and fills the cache; later ones copy from it. Prints images/s per epoch and the
// ratio of the second to the first (goal >= 10x). Figures only, never pass/fail.
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_daemon.h"
#include "client/client.h"

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  int images = 1000;
  int epochs = 3;
  uint32_t batch_size = 64;
  uint32_t image_size = 224;
  std::string daemon_path = RINGLOADERD_PATH;
  CLI::App app{"eval_cache_bench: eval epochs with and without the cache"};
  app.add_option("--images", images, "synthetic dataset size");
  app.add_option("--epochs", epochs);
  app.add_option("--batch-size", batch_size);
  app.add_option("--image-size", image_size);
  app.add_option("--ringloaderd", daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);

  const ringloader::bench::BenchDaemon daemon = ringloader::bench::StartBenchDaemon(
      daemon_path, "eval-cache", images, "2GiB", /*supervise=*/false, 0, "cache = \"memory\"");
  if (daemon.pid < 0) return 1;
  ringloader::Client client(daemon.endpoint);
  ringloader::StreamOptions options;
  options.dataset = "bench";
  options.batch_size = batch_size;
  options.image_size = image_size;
  options.augment = ringloader::client::Augment::kEval;
  options.end_epoch = static_cast<uint64_t>(epochs);
  options.client_name = "eval_cache_bench";
  auto stream = client.Open(options);
  std::vector<double> rates;
  uint64_t in_epoch = 0;
  Clock::time_point start = Clock::now();
  while (auto batch = stream->Next()) {
    in_epoch += batch->size();
    if (batch->last_in_epoch()) {
      rates.push_back(static_cast<double>(in_epoch) /
                      std::chrono::duration<double>(Clock::now() - start).count());
      in_epoch = 0;
      start = Clock::now();
    }
  }
  kill(daemon.pid, SIGTERM);
  waitpid(daemon.pid, nullptr, 0);
  std::filesystem::remove_all(daemon.dir);
  std::printf("eval_cache_bench: %d images, eval %u px, batch %u, cache = \"memory\"\n", images,
              image_size, batch_size);
  for (size_t e = 0; e < rates.size(); ++e) {
    std::printf("epoch %zu: %.0f images/s%s\n", e, rates[e], e == 0 ? " (decoding, filling)" : "");
  }
  if (rates.size() >= 2) {
    std::printf("second epoch / first: %.1fx (goal >= 10x)\n", rates[1] / rates[0]);
  }
  return 0;
}
