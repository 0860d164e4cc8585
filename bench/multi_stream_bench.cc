// SPDX-License-Identifier: Apache-2.0
// multi_stream_bench: do trainers sharing one daemon get the daemon's throughput between them?
//
// Starts a daemon over a synthetic dataset and measures images/s into the training loop for one
// trainer (one stream), then for --trainers trainers reading at once (a stream and a thread each,
// different seeds), each reading --epochs epochs. Prints both and their ratio (issue 13's goal:
// the trainers together >= 0.95x one trainer's images/s). Figures only, never pass/fail.
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_daemon.h"
#include "client/client.h"

namespace {

using Clock = std::chrono::steady_clock;

// Images delivered to `trainers` trainers reading `epochs` epochs each, per second of wall time.
double ImagesPerSecond(const std::string& endpoint, int trainers, int epochs, uint32_t batch_size,
                       uint32_t image_size) {
  std::atomic<uint64_t> images{0};
  std::vector<std::thread> threads;
  const Clock::time_point start = Clock::now();
  for (int t = 0; t < trainers; ++t) {
    threads.emplace_back([&, t] {
      ringloader::Client client(endpoint);
      ringloader::StreamOptions options;
      options.dataset = "bench";
      options.batch_size = batch_size;
      options.image_size = image_size;
      options.seed = static_cast<uint64_t>(t);
      options.end_epoch = static_cast<uint64_t>(epochs);
      options.client_name = "multi_stream_bench " + std::to_string(t);
      auto stream = client.Open(options);
      while (auto batch = stream->Next()) images += batch->size();
    });
  }
  for (std::thread& t : threads) t.join();
  return static_cast<double>(images) / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  int images = 800;
  int trainers = 4;
  int epochs = 2;
  uint32_t batch_size = 32;
  uint32_t image_size = 224;
  std::string daemon_path = RINGLOADERD_PATH;
  CLI::App app{"multi_stream_bench: one trainer vs several on one daemon"};
  app.add_option("--images", images, "synthetic dataset size");
  app.add_option("--trainers", trainers);
  app.add_option("--epochs", epochs, "epochs each trainer reads");
  app.add_option("--batch-size", batch_size);
  app.add_option("--image-size", image_size);
  app.add_option("--ringloaderd", daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);

  const ringloader::bench::BenchDaemon daemon = ringloader::bench::StartBenchDaemon(
      daemon_path, "multi-stream", images, "2GiB", /*supervise=*/false);
  if (daemon.pid < 0) return 1;
  // Warm: the daemon up, the files in the page cache.
  ImagesPerSecond(daemon.endpoint, 1, 1, batch_size, image_size);
  const double one = ImagesPerSecond(daemon.endpoint, 1, epochs * trainers, batch_size, image_size);
  const double many = ImagesPerSecond(daemon.endpoint, trainers, epochs, batch_size, image_size);
  kill(daemon.pid, SIGTERM);
  waitpid(daemon.pid, nullptr, 0);
  std::filesystem::remove_all(daemon.dir);
  std::printf("multi_stream_bench: %d images, batch %u at %u px\n", images, batch_size, image_size);
  std::printf("1 trainer: %.0f images/s   %d trainers together: %.0f images/s   ratio %.2fx "
              "(goal >= 0.95x)\n",
              one, trainers, many, many / one);
  return 0;
}
