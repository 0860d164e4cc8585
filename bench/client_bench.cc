// SPDX-License-Identifier: Apache-2.0
// client_bench: what a trainer pays on its own path, through the real client and a real daemon.
//
//  1. Next() of a batch that is already in the ring (the handoff a trainer waits for: NextBatch
//     over the Unix socket, handle checks, the slot's mapping), p50 and p99.
//  2. Reading a batch's bytes for the first time after Next(): read-only batches vs
//     writable_batches (copy-on-write mappings: their pages are dropped at every release, so every
//     batch faults them in again), and writing every byte of a writable batch.
//  3. Next() of a ready batch while holding every batch (each call copies the oldest out).
//  4. images/s into the loop over 2 epochs: holding nothing, holding every batch, writable.
// Not a test: it prints, never fails.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "bench/bench_daemon.h"

namespace {

using Clock = std::chrono::steady_clock;
using ringloader::Batch;
using ringloader::StreamOptions;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

uint64_t SumBytes(const Batch& b) {
  const auto* p = b.images().data<uint8_t>();
  uint64_t sum = 0;
  for (uint64_t i = 0; i < b.images().bytes(); i += 64) sum += p[i];  // one read per cache line
  return sum;
}

struct Figures {
  std::vector<double> next_ms, read_ms, write_ms;
};

// `samples` batches, each taken after the ring has had time to fill again (`settle`).
Figures ReadyBatches(ringloader::Client& client, StreamOptions options, int samples,
                     std::chrono::milliseconds settle, bool keep_all, bool write) {
  auto stream = client.Open(options);
  std::vector<Batch> kept;
  Figures f;
  uint64_t sink = 0;
  for (int i = 0; i < samples + 2; ++i) {
    std::this_thread::sleep_for(settle);
    const auto t0 = Clock::now();
    std::optional<Batch> b = stream->Next();
    const auto t1 = Clock::now();
    sink += SumBytes(*b);
    const auto t2 = Clock::now();
    if (write) std::memset(const_cast<void*>(b->images().raw()), 1, b->images().bytes());
    const auto t3 = Clock::now();
    if (i >= 2) {  // the first batches map each slot for the first time
      f.next_ms.push_back(Ms(t1 - t0));
      f.read_ms.push_back(Ms(t2 - t1));
      f.write_ms.push_back(Ms(t3 - t2));
    }
    if (keep_all) kept.push_back(std::move(*b));
  }
  if (sink == 42) std::printf(" ");
  return f;
}

double ImagesPerSecond(ringloader::Client& client, StreamOptions options, bool keep_all,
                       uint64_t* copies) {
  options.end_epoch = 2;
  auto stream = client.Open(options);
  std::vector<Batch> kept;
  uint64_t images = 0, sink = 0;
  const auto t0 = Clock::now();
  while (auto b = stream->Next()) {
    images += b->size();
    sink += SumBytes(*b);
    if (keep_all) kept.push_back(std::move(*b));
  }
  *copies = stream->copies();
  if (sink == 42) std::printf(" ");
  return static_cast<double>(images) / std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

int main(int argc, char** argv) {
  int images = 384;
  uint32_t image_size = 224;
  uint32_t batch_size = 32;
  int samples = 40;
  int settle_ms = 0;
  std::string daemon_path = RINGLOADERD_PATH;
  CLI::App app{"client_bench: the trainer's path through the real client and daemon"};
  app.add_option("--images", images, "synthetic dataset size");
  app.add_option("--image-size", image_size);
  app.add_option("--batch-size", batch_size);
  app.add_option("--samples", samples, "ready batches timed per figure");
  app.add_option("--settle-ms", settle_ms, "pause before each timed Next() (0: 1.5 batches' time)");
  app.add_option("--ringloaderd", daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);

  const ringloader::bench::BenchDaemon bench_daemon = ringloader::bench::StartBenchDaemon(
      daemon_path, "client-bench", images, "2GiB", /*supervise=*/false);
  if (bench_daemon.pid < 0) return 1;
  const std::string& dir = bench_daemon.dir;
  const std::string& endpoint = bench_daemon.endpoint;
  const pid_t daemon = bench_daemon.pid;
  int rc = 0;
  try {
    ringloader::Client client(endpoint);
    StreamOptions options;
    options.dataset = "bench";
    options.batch_size = batch_size;
    options.image_size = image_size;
    options.ring_slots = 4;
    options.client_name = "client_bench";
    const double batch_mib =
        static_cast<double>(batch_size) * image_size * image_size * 3 / (1 << 20);
    // Long enough for the daemon to refill the slot just taken (measured below as images/s).
    uint64_t copies = 0;
    const double rate = ImagesPerSecond(client, options, false, &copies);
    const auto settle = std::chrono::milliseconds(
        settle_ms > 0 ? settle_ms
                      : static_cast<int64_t>(1.5 * 1000.0 * batch_size / std::max(rate, 1.0)) + 5);
    std::printf("client_bench: %d synthetic JPEGs, batches of %u x %ux%u uint8 (%.1f MiB), "
                "4-slot ring, Unix socket\n",
                images, batch_size, image_size, image_size, batch_mib);

    {
      // For scale: the cheapest call there is, on the same socket, while no stream decodes.
      auto stub = ringloader::v1::Loader::NewStub(
          *ringloader::client::MakeChannel(*ringloader::client::GrpcTarget(endpoint)));
      std::vector<double> ms;
      for (int i = 0; i < 200; ++i) {
        grpc::ClientContext context;
        ringloader::v1::ListQuarantineResponse response;
        const auto t0 = Clock::now();
        (void)stub->ListQuarantine(&context, ringloader::v1::ListQuarantineRequest(), &response);
        ms.push_back(Ms(Clock::now() - t0));
      }
      std::printf("0. an empty gRPC call (ListQuarantine):    p50 %7.3f ms   p99 %7.3f ms\n",
                  Percentile(ms, 0.5), Percentile(ms, 0.99));
    }
    const Figures ro = ReadyBatches(client, options, samples, settle, false, false);
    std::printf("1. Next() of a ready batch:                p50 %7.3f ms   p99 %7.3f ms\n",
                Percentile(ro.next_ms, 0.5), Percentile(ro.next_ms, 0.99));
    StreamOptions writable = options;
    writable.writable_batches = true;
    const Figures cow = ReadyBatches(client, writable, samples, settle, false, true);
    std::printf("2. first read of a batch, read-only:       p50 %7.3f ms (%.2f GB/s)\n",
                Percentile(ro.read_ms, 0.5), batch_mib * 1.048576 / Percentile(ro.read_ms, 0.5));
    std::printf("   first read of a batch, writable (COW):  p50 %7.3f ms (%.2f GB/s)\n",
                Percentile(cow.read_ms, 0.5),
                batch_mib * 1.048576 / Percentile(cow.read_ms, 0.5));
    std::printf("   writing every byte of a writable batch: p50 %7.3f ms (%.2f GB/s)\n",
                Percentile(cow.write_ms, 0.5),
                batch_mib * 1.048576 / Percentile(cow.write_ms, 0.5));
    std::printf("   Next() of a ready writable batch:       p50 %7.3f ms\n",
                Percentile(cow.next_ms, 0.5));
    const Figures held = ReadyBatches(client, options, samples, settle, true, false);
    std::printf("3. Next() holding every batch (1 copy-out): p50 %7.3f ms   p99 %7.3f ms\n",
                Percentile(held.next_ms, 0.5), Percentile(held.next_ms, 0.99));

    const double none = ImagesPerSecond(client, options, false, &copies);
    std::printf("4. images/s, 2 epochs, holding nothing:    %8.1f   copies %llu\n", none,
                static_cast<unsigned long long>(copies));
    const double all = ImagesPerSecond(client, options, true, &copies);
    std::printf("   images/s, 2 epochs, holding every batch:%8.1f   copies %llu\n", all,
                static_cast<unsigned long long>(copies));
    const double w = ImagesPerSecond(client, writable, false, &copies);
    std::printf("   images/s, 2 epochs, writable batches:   %8.1f   copies %llu\n", w,
                static_cast<unsigned long long>(copies));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "client_bench: %s (daemon log: %s/ringloaderd.log)\n", e.what(),
                 dir.c_str());
    rc = 1;
  }
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
  if (rc == 0) std::filesystem::remove_all(dir);
  return rc;
}
