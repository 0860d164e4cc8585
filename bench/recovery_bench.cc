// SPDX-License-Identifier: Apache-2.0
// recovery_bench: how long a trainer waits when the daemon dies.
//
// Starts `ringloaderd --supervise` over a synthetic dataset, reads batches through the C++ client
// on one thread, and SIGKILLs the serving daemon N times at random moments. For each kill it
// measures the time from the kill to the next batch the client delivers. Prints median and max.
// Goal: median under 250 ms with --supervise, also at ImageNet's size (--samples 1281000), so a
// restart costs the same whatever the dataset.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/client.h"
#include "bench/bench_daemon.h"

namespace {

using Clock = std::chrono::steady_clock;

pid_t ChildOf(pid_t parent) {
  std::ifstream in("/proc/" + std::to_string(parent) + "/task/" + std::to_string(parent) +
                   "/children");
  pid_t child = -1;
  in >> child;
  return child;
}

}  // namespace

int main(int argc, char** argv) {
  int kills = 20;
  int images = 400;
  uint32_t image_size = 64;
  uint32_t batch_size = 16;
  std::string daemon_path = RINGLOADERD_PATH;
  CLI::App app{"recovery_bench: kill-to-next-batch latency under ringloaderd --supervise"};
  app.add_option("--kills", kills, "how many times to SIGKILL the daemon");
  app.add_option("--images", images, "synthetic JPEGs written");
  uint64_t samples = 0;
  app.add_option("--samples", samples,
                 "dataset size: hard links to the JPEGs fill 1,000 more class folders up to it "
                 "(1281000: ImageNet's train set)");
  app.add_option("--image-size", image_size);
  app.add_option("--batch-size", batch_size);
  app.add_option("--ringloaderd", daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);

  const ringloader::bench::BenchDaemon bench_daemon = ringloader::bench::StartBenchDaemon(
      daemon_path, "recovery", images, "1GiB", /*supervise=*/true, samples);
  if (bench_daemon.pid < 0) return 1;
  const Clock::time_point launched = Clock::now();
  const std::string& dir = bench_daemon.dir;
  const std::string& endpoint = bench_daemon.endpoint;
  const pid_t supervisor = bench_daemon.pid;

  std::mutex mu;
  std::vector<Clock::time_point> delivered;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> reconnects{0};
  std::thread reader([&] {
    ringloader::Client client(endpoint);
    ringloader::StreamOptions options;
    options.dataset = "bench";
    options.batch_size = batch_size;
    options.image_size = image_size;
    options.client_name = "recovery_bench";
    auto stream = client.Open(options);
    while (!stop) {
      auto batch = stream->Next();
      std::lock_guard<std::mutex> lock(mu);
      delivered.push_back(Clock::now());
      reconnects = stream->reconnects();
    }
  });
  auto last_delivery = [&] {
    std::lock_guard<std::mutex> lock(mu);
    return delivered.empty() ? Clock::time_point{} : delivered.back();
  };
  while (last_delivery() == Clock::time_point{}) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::printf("first start (index built): %.0f ms to the first batch\n",
              std::chrono::duration<double, std::milli>(last_delivery() - launched).count());

  std::mt19937 rng(42);
  std::vector<double> latencies_ms;
  for (int k = 0; k < kills; ++k) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 300));
    pid_t serving = ChildOf(supervisor);
    if (serving <= 0) continue;
    const Clock::time_point killed = Clock::now();
    kill(serving, SIGKILL);
    while (last_delivery() <= killed) std::this_thread::sleep_for(std::chrono::microseconds(200));
    latencies_ms.push_back(
        std::chrono::duration<double, std::milli>(last_delivery() - killed).count());
  }
  stop = true;
  reader.join();
  kill(supervisor, SIGTERM);
  waitpid(supervisor, nullptr, 0);
  std::filesystem::remove_all(dir);

  std::sort(latencies_ms.begin(), latencies_ms.end());
  const double median = latencies_ms[latencies_ms.size() / 2];
  std::printf("recovery_bench: %zu SIGKILLs of the supervised daemon, %llu client reconnects, "
              "%llu samples\n",
              latencies_ms.size(), static_cast<unsigned long long>(reconnects.load()),
              static_cast<unsigned long long>(std::max<uint64_t>(samples, images)));
  std::printf("kill -> next delivered batch: median %.1f ms   max %.1f ms   (goal: median < "
              "250 ms: %s)\n",
              median, latencies_ms.back(), median < 250 ? "met" : "NOT met");
  return 0;
}
