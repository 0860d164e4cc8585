// SPDX-License-Identifier: Apache-2.0
// rss_bench: does ringloaderd's RSS stay flat over many epochs, with one trainer and with
// several? (issue 38: per-file read buffers fragmented the heap, 105 MiB after 5 epochs of one
// stream and 202 MiB after 120 epochs of two.)
//
// For each stream count in --streams it starts a fresh, real `ringloaderd` on an ImageNet-like
// synthetic imagefolder (sizes around 500x375, a few large and progressive), opens that many
// streams (seeds 0..N-1, so each shuffles its own way) and consumes --epochs epochs on each, one
// thread per stream, while it samples /proc/<pid>/status every 100 ms. Prints, at the epochs in
// --report, the largest RSS seen while the slowest stream was in that epoch, and the growth from
// epoch 5 to the last. A figure, never pass/fail.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench/bench_daemon.h"
#include "bench/proc_memory.h"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "proto/ringloader.grpc.pb.h"

namespace {

using ringloader::bench::MiB;
using ringloader::bench::ProcMemory;
using ringloader::bench::ReadProcMemory;

struct Options {
  int images = 200;
  uint32_t epochs = 120;
  std::string streams = "1,2,4,8";
  std::string report = "1,5,10,20,40,60,80,100,120";
  uint32_t batch_size = 32;
  uint32_t image_size = 224;
  double large = 0.02;
  std::string memory_limit = "256MiB";
  std::string daemon_path = RINGLOADERD_PATH;
};

std::vector<uint32_t> ParseList(const std::string& text) {
  std::vector<uint32_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) out.push_back(static_cast<uint32_t>(std::stoul(item)));
  }
  return out;
}

struct CaseResult {
  std::vector<uint64_t> rss_by_epoch;   // [e]: largest VmRSS while the slowest stream was in e
  std::vector<uint64_t> anon_by_epoch;  // [e]: largest RssAnon then (the heap; rings are shmem)
  uint64_t vm_hwm = 0;
  uint64_t consumed = 0;
  uint64_t expected = 0;
  uint64_t memory_reserved_max = 0;
  double seconds = 0;
};

CaseResult RunCase(uint32_t streams, const Options& o) {
  CaseResult r;
  r.rss_by_epoch.assign(o.epochs, 0);
  r.anon_by_epoch.assign(o.epochs, 0);
  ringloader::bench::BenchDaemon d = ringloader::bench::StartBenchDaemon(
      o.daemon_path, "rss", o.images, o.memory_limit, /*supervise=*/false, 0, "", o.large);
  if (d.pid < 0) std::exit(1);

  std::vector<std::atomic<uint32_t>> done(streams);  // epochs finished, per stream
  for (auto& e : done) e = 0;
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::thread sampler([&] {
    uint32_t last_slowest = 0;  // epochs passed between two samples get the later one's RSS
    while (!stop.load()) {
      ProcMemory m;
      if (!ReadProcMemory(d.pid, &m)) break;
      uint32_t slowest = UINT32_MAX;
      for (auto& e : done) slowest = std::min(slowest, e.load());
      {
        std::lock_guard<std::mutex> lock(mu);
        // Once every stream is done their rings are gone: that sample is no epoch's.
        for (uint32_t e = last_slowest; slowest < o.epochs && e <= slowest; ++e) {
          r.rss_by_epoch[e] = std::max(r.rss_by_epoch[e], m.vm_rss);
          r.anon_by_epoch[e] = std::max(r.anon_by_epoch[e], m.rss_anon);
        }
        last_slowest = slowest;
        r.vm_hwm = std::max(r.vm_hwm, m.vm_hwm);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  std::atomic<uint64_t> consumed{0};
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> trainers;
  for (uint32_t k = 0; k < streams; ++k) {
    trainers.emplace_back([&, k] {
      try {
        ringloader::Client client(d.endpoint);
        ringloader::StreamOptions options;
        options.dataset = "bench";
        options.batch_size = o.batch_size;
        options.image_size = o.image_size;
        options.seed = k;
        options.end_epoch = o.epochs;
        options.client_name = "rss_bench-" + std::to_string(k);
        auto stream = client.Open(options);  // retries until the daemon is up
        uint64_t epoch = 0;
        while (auto batch = stream->Next()) {
          consumed += batch->size();
          if (batch->position().epoch != epoch) {
            done[k] = static_cast<uint32_t>(batch->position().epoch);
            epoch = batch->position().epoch;
          }
        }
        done[k] = o.epochs;
      } catch (const ringloader::Error& e) {
        std::fprintf(stderr, "rss_bench: stream %u: %s (daemon log: %s)\n", k, e.what(),
                     d.log.c_str());
        done[k] = o.epochs;
      }
    });
  }
  // memory_reserved while the streams run, every 500 ms.
  auto channel = grpc::CreateChannel(d.endpoint, grpc::InsecureChannelCredentials());
  auto stub = ringloader::v1::Loader::NewStub(channel);
  for (;;) {
    uint32_t slowest = UINT32_MAX;
    for (auto& e : done) slowest = std::min(slowest, e.load());
    if (slowest >= o.epochs) break;
    ringloader::v1::GetStatsResponse stats;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (stub->GetStats(&context, {}, &stats).ok()) {
      r.memory_reserved_max = std::max(r.memory_reserved_max, stats.memory_reserved_bytes());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  for (auto& t : trainers) t.join();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.consumed = consumed;
  stop = true;
  sampler.join();
  // An epoch shorter than the sampling period has the RSS of the last sample before it.
  for (uint32_t e = 1; e < o.epochs; ++e) {
    if (r.rss_by_epoch[e] == 0) {
      r.rss_by_epoch[e] = r.rss_by_epoch[e - 1];
      r.anon_by_epoch[e] = r.anon_by_epoch[e - 1];
    }
  }
  kill(d.pid, SIGTERM);
  waitpid(d.pid, nullptr, 0);
  std::filesystem::remove_all(d.dir);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"rss_bench: ringloaderd's RSS over many epochs with 1..N trainers"};
  app.add_option("--images", o.images, "JPEGs in the dataset (one epoch)");
  app.add_option("--epochs", o.epochs, "epochs each stream consumes");
  app.add_option("--streams", o.streams, "stream counts to run, one daemon each (e.g. 1,2,4,8)");
  app.add_option("--report", o.report, "epochs whose RSS is printed");
  app.add_option("--large", o.large, "share of images above 2 MP (ImageNet: ~0.02)");
  app.add_option("--batch-size", o.batch_size);
  app.add_option("--image-size", o.image_size, "output side in pixels");
  app.add_option("--memory-limit", o.memory_limit, "server.memory_limit, e.g. 256MiB");
  app.add_option("--ringloaderd", o.daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (o.epochs == 0) return 2;
  std::vector<uint32_t> report = ParseList(o.report);
  report.erase(std::remove_if(report.begin(), report.end(),
                              [&](uint32_t e) { return e == 0 || e > o.epochs; }),
               report.end());

  std::printf(
      "rss_bench: ringloaderd %s\n  %d JPEGs (~500x375), batch %u at %u px, %u epochs per stream, "
      "memory_limit %s; VmRSS sampled every 100 ms\n",
      o.daemon_path.c_str(), o.images, o.batch_size, o.image_size, o.epochs,
      o.memory_limit.c_str());
  for (uint32_t streams : ParseList(o.streams)) {
    const CaseResult r = RunCase(streams, o);
    std::printf("\n[%u stream%s] %.0f s, %llu images (%s), memory_reserved max %.1f MiB\n", streams,
                streams == 1 ? "" : "s", r.seconds, static_cast<unsigned long long>(r.consumed),
                r.consumed == uint64_t{streams} * o.epochs * o.images ? "all" : "SHORT",
                MiB(r.memory_reserved_max));
    std::printf("  epoch   ");
    for (uint32_t e : report) std::printf("%7u", e);
    std::printf("\n  RSS MiB ");
    for (uint32_t e : report) std::printf("%7.1f", MiB(r.rss_by_epoch[e - 1]));
    std::printf("\n   of it anon");
    for (uint32_t e : report) std::printf("%7.1f", MiB(r.anon_by_epoch[e - 1]));
    const uint32_t early = std::min<uint32_t>(5, o.epochs) - 1;
    const uint32_t last = o.epochs - 1;
    const uint64_t later_max =
        *std::max_element(r.rss_by_epoch.begin() + early, r.rss_by_epoch.end());
    std::printf(
        "\n  growth epoch %u -> %u: %+.1f MiB (largest after epoch %u: %+.1f); peak (VmHWM) "
        "%.1f MiB, %.0f%% of memory_limit\n",
        early + 1, last + 1, MiB(r.rss_by_epoch[last]) - MiB(r.rss_by_epoch[early]), early + 1,
        MiB(later_max) - MiB(r.rss_by_epoch[early]), MiB(r.vm_hwm),
                100.0 * static_cast<double>(r.vm_hwm) /
                    static_cast<double>(ringloader::bench::ParseSize(o.memory_limit)));
  }
  return 0;
}
