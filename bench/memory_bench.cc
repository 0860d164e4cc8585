// SPDX-License-Identifier: Apache-2.0
// memory_bench: does the daemon's RSS stay under memory_limit for a 10-epoch run, with 1,000
// samples and with 50,000 samples alike? (issue 6)
//
// For each of two datasets it starts a fresh, real `ringloaderd` (no supervisor, so the pid we
// start is the process we measure) with the given memory_limit, consumes `--epochs` epochs
// through the C++ client, and samples /proc/<pid>/status every 100 ms:
//   (a) imagefolder: `--images` synthetic JPEGs (default 1,000);
//   (b) manifest: the same files, each listed `--repeat` times under different manifest lines
//       (default 50: 50,000 entries; the index really holds them all, only the files repeat).
// Prints peak RSS (the kernel's VmHWM, and the largest sampled VmRSS split into RssAnon, RssFile
// and RssShmem: ring segments live in /dev/shm and count as shared memory), memory_limit and the
// largest memory_reserved the daemon reported in GetStats. A figure, never pass/fail.
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
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "client/client.h"
#include "grpcpp/grpcpp.h"
#include "proto/ringloader.grpc.pb.h"
#include "bench/proc_memory.h"
#include "server/image/synthetic.h"

namespace {

using ringloader::bench::MiB;
using ringloader::bench::ParseSize;
using ringloader::bench::ProcMemory;
using ringloader::bench::ReadProcMemory;
using Clock = std::chrono::steady_clock;

struct Options {
  uint32_t images = 1000;
  uint32_t repeat = 50;
  uint32_t epochs = 10;
  uint32_t batch_size = 64;
  uint32_t image_size = 224;
  uint32_t decode_threads = 2;
  uint32_t width = 500;
  uint32_t height = 375;
  std::string memory_limit = "512MiB";
  std::string daemon_path = RINGLOADERD_PATH;
};

// Writes `count` JPEGs of about width x height into dir/class_XX/, returns their relative paths.
std::vector<std::string> WriteImages(const std::string& dir, const Options& o) {
  std::vector<std::string> paths;
  for (uint32_t i = 0; i < o.images; ++i) {
    ringloader::image::SyntheticImageOptions image;
    image.width = static_cast<int32_t>(o.width + (i % 7) * 8);
    image.height = static_cast<int32_t>(o.height + (i % 5) * 8);
    image.seed = i;
    absl::StatusOr<std::vector<uint8_t>> jpeg = ringloader::image::MakeSyntheticJpeg(image);
    if (!jpeg.ok()) {
      std::fprintf(stderr, "memory_bench: %s\n", jpeg.status().ToString().c_str());
      std::exit(1);
    }
    char rel[64];
    std::snprintf(rel, sizeof rel, "class_%02u/img_%06u.jpg", i % 10, i);
    std::filesystem::create_directories(std::filesystem::path(dir + "/" + rel).parent_path());
    std::ofstream out(dir + "/" + rel, std::ios::binary);
    out.write(reinterpret_cast<const char*>(jpeg->data()),
              static_cast<std::streamsize>(jpeg->size()));
    paths.push_back(rel);
  }
  return paths;
}

struct CaseResult {
  std::string name;
  uint64_t dataset_size = 0;
  uint64_t consumed = 0;
  uint64_t batches = 0;
  uint64_t epochs_seen = 0;
  double seconds = 0;
  ProcMemory peak;            // at the sample with the largest VmRSS
  uint64_t vm_hwm = 0;        // last VmHWM read before exit: the kernel's own peak
  uint64_t max_rss_anon = 0;  // largest of each component over all samples
  uint64_t max_rss_shmem = 0;
  uint64_t memory_limit = 0;  // from GetStats
  uint64_t max_reserved = 0;  // largest memory_reserved_bytes seen in GetStats
  uint64_t stats_rss = 0;     // largest rss_bytes the daemon reported in GetStats
  int samples_taken = 0;
};

CaseResult RunCase(const std::string& name, uint64_t dataset_size, const std::string& dir,
                   const std::string& dataset_toml, const Options& o) {
  CaseResult r;
  r.name = name;
  r.dataset_size = dataset_size;
  const std::string endpoint = "unix:" + dir + "/" + name + ".sock";
  const std::string config = dir + "/" + name + ".toml";
  std::filesystem::create_directories(dir + "/state-" + name);
  {
    std::ofstream out(config);
    out << "[server]\nlisten = \"" << endpoint << "\"\nstate_dir = \"" << dir << "/state-" << name
        << "\"\nlog_level = \"warn\"\ndecode_threads = " << o.decode_threads
        << "\nmemory_limit = \"" << o.memory_limit << "\"\n\n[[datasets]]\nname = \"" << name
        << "\"\n"
        << dataset_toml;
  }
  const std::string log = dir + "/" + name + ".log";
  pid_t daemon = fork();
  if (daemon == 0) {
    FILE* f = std::fopen(log.c_str(), "w");
    if (f != nullptr) dup2(fileno(f), 2);
    execl(o.daemon_path.c_str(), o.daemon_path.c_str(), "--config", config.c_str(), nullptr);
    _exit(127);
  }

  // Sampler: /proc/<pid>/status every 100 ms.
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::thread sampler([&] {
    while (!stop.load()) {
      ProcMemory m;
      if (!ReadProcMemory(daemon, &m)) break;
      {
        std::lock_guard<std::mutex> lock(mu);
        ++r.samples_taken;
        if (m.vm_rss > r.peak.vm_rss) r.peak = m;
        r.vm_hwm = std::max(r.vm_hwm, m.vm_hwm);
        r.max_rss_anon = std::max(r.max_rss_anon, m.rss_anon);
        r.max_rss_shmem = std::max(r.max_rss_shmem, m.rss_shmem);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  // GetStats while the stream is open: at the first batch of every epoch.
  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  auto stub = ringloader::v1::Loader::NewStub(channel);
  auto get_stats = [&] {
    ringloader::v1::GetStatsResponse stats;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    if (!stub->GetStats(&context, {}, &stats).ok()) return;
    std::lock_guard<std::mutex> lock(mu);
    r.memory_limit = stats.memory_limit_bytes();
    r.max_reserved = std::max(r.max_reserved, stats.memory_reserved_bytes());
    r.stats_rss = std::max(r.stats_rss, stats.rss_bytes());
  };

  const Clock::time_point start = Clock::now();
  try {
    ringloader::Client client(endpoint);
    ringloader::StreamOptions options;
    options.dataset = name;
    options.batch_size = o.batch_size;
    options.image_size = o.image_size;
    options.end_epoch = o.epochs;
    options.client_name = "memory_bench";
    auto stream = client.Open(options);  // retries until the daemon is up
    uint64_t last_epoch = UINT64_MAX;
    uint64_t checksum = 0;
    while (auto batch = stream->Next()) {
      r.consumed += batch->size();
      ++r.batches;
      if (batch->position().epoch != last_epoch) {
        last_epoch = batch->position().epoch;
        ++r.epochs_seen;
        get_stats();
      }
      checksum += batch->images().data<uint8_t>()[0];  // touch the batch like a trainer would
    }
    if (checksum == 1) std::printf(" ");  // keeps the reads
  } catch (const ringloader::Error& e) {
    std::fprintf(stderr, "memory_bench: %s: %s (daemon log: %s)\n", name.c_str(), e.what(),
                 log.c_str());
  }
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // One last /proc read while the daemon still lives: VmHWM covers the whole run.
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  stop = true;
  sampler.join();
  if (ProcMemory m; ReadProcMemory(daemon, &m)) r.vm_hwm = std::max(r.vm_hwm, m.vm_hwm);
  kill(daemon, SIGTERM);
  waitpid(daemon, nullptr, 0);
  return r;
}

void Print(const CaseResult& r, const Options& o, uint64_t limit) {
  const uint64_t peak = std::max(r.vm_hwm, r.peak.vm_rss);
  std::printf(
      "\n[%s] samples %llu  epochs %llu  batches %llu  consumed %llu in %.1f s "
      "(%.0f images/s)\n",
      r.name.c_str(), static_cast<unsigned long long>(r.dataset_size),
      static_cast<unsigned long long>(r.epochs_seen), static_cast<unsigned long long>(r.batches),
      static_cast<unsigned long long>(r.consumed), r.seconds,
      r.seconds > 0 ? static_cast<double>(r.consumed) / r.seconds : 0.0);
  std::printf("  memory_limit            %8.1f MiB (GetStats: %.1f MiB)\n", MiB(limit),
              MiB(r.memory_limit));
  std::printf(
      "  memory_reserved (max)   %8.1f MiB (GetStats at each epoch's first batch; its "
      "rss_bytes max %.1f MiB)\n",
      MiB(r.max_reserved), MiB(r.stats_rss));
  std::printf("  peak RSS (VmHWM)        %8.1f MiB\n", MiB(r.vm_hwm));
  std::printf(
      "  max sampled VmRSS       %8.1f MiB = RssAnon %.1f + RssFile %.1f + RssShmem %.1f "
      "MiB (%d samples, every 100 ms)\n",
      MiB(r.peak.vm_rss), MiB(r.peak.rss_anon), MiB(r.peak.rss_file), MiB(r.peak.rss_shmem),
      r.samples_taken);
  std::printf("  max RssAnon / RssShmem  %8.1f / %.1f MiB\n", MiB(r.max_rss_anon),
              MiB(r.max_rss_shmem));
  const bool complete = r.consumed == r.dataset_size * o.epochs;
  std::printf("  all %u epochs delivered: %s\n", o.epochs, complete ? "yes" : "NO");
  std::printf("  peak RSS under limit: %s (%.1f%% of memory_limit)\n", peak < limit ? "yes" : "no",
              100.0 * static_cast<double>(peak) / static_cast<double>(limit));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"memory_bench: ringloaderd RSS vs memory_limit over a multi-epoch run"};
  app.add_option("--images", o.images, "distinct JPEG files (the imagefolder dataset's size)");
  app.add_option("--repeat", o.repeat, "manifest dataset: times each file is listed");
  app.add_option("--epochs", o.epochs);
  app.add_option("--batch-size", o.batch_size);
  app.add_option("--image-size", o.image_size, "output side in pixels");
  app.add_option("--decode-threads", o.decode_threads);
  app.add_option("--width", o.width, "source JPEG width (varies by up to +48)");
  app.add_option("--height", o.height, "source JPEG height (varies by up to +32)");
  app.add_option("--memory-limit", o.memory_limit, "server.memory_limit, e.g. 512MiB");
  app.add_option("--ringloaderd", o.daemon_path, "path of the ringloaderd binary");
  CLI11_PARSE(app, argc, argv);
  const uint64_t limit = ParseSize(o.memory_limit);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each case's figures as soon as it ends

  char tmpl[] = "/tmp/ringloader-memory-XXXXXX";
  const std::string dir = mkdtemp(tmpl);
  const std::string data = dir + "/data";
  const std::vector<std::string> paths = WriteImages(data, o);
  {
    std::ofstream manifest(dir + "/manifest.csv");
    manifest << "path,label\n";
    // Line k lists file k % images: every entry is its own sample, files repeat.
    for (uint64_t k = 0; k < uint64_t{o.images} * o.repeat; ++k) {
      manifest << paths[k % paths.size()] << "," << (k % 10) << "\n";
    }
  }
  std::printf("memory_bench: ringloaderd %s\n", o.daemon_path.c_str());
  std::printf(
      "  memory_limit %s, decode_threads %u, batch %u, image_size %u (uint8 NHWC, train "
      "augmentation), %u epochs,\n  %u source JPEGs of ~%ux%u px, manifest lists each "
      "%u times; RSS sampled from /proc/<pid>/status every 100 ms\n",
      o.memory_limit.c_str(), o.decode_threads, o.batch_size, o.image_size, o.epochs, o.images,
      o.width, o.height, o.repeat);

  Print(RunCase("folder", o.images, dir, "format = \"imagefolder\"\npath = \"" + data + "\"\n", o),
        o, limit);
  Print(RunCase("manifest", uint64_t{o.images} * o.repeat, dir,
                "format = \"manifest\"\npath = \"" + data + "\"\nmanifest = \"" + dir +
                    "/manifest.csv\"\n",
                o),
        o, limit);
  std::filesystem::remove_all(dir);
  return 0;
}
