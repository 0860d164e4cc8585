// SPDX-License-Identifier: Apache-2.0
#pragma once
// A ringloaderd of a benchmark's own: a synthetic dataset named "bench" in a fresh /tmp
// directory, a config for it, and the daemon started (under --supervise when asked) with its log
// beside them. Shared by the benchmarks that measure through the real client and daemon.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/image/synthetic.h"

namespace ringloader::bench {

struct BenchDaemon {
  std::string dir;       // everything lives here
  std::string endpoint;  // "unix:<dir>/rl.sock"
  std::string log;       // the daemon's stderr
  pid_t pid = -1;        // the daemon (or its supervisor); -1 if it could not be started
};

// Grows the imagefolder at `root` (its `images` JPEGs) to `samples` samples in 1,000 more class
// folders of hard links to those files: an ImageNet-sized tree in seconds, for what scales with
// the number of samples (indexing, restarts), not with their bytes.
inline bool AddHardLinkedSamples(const std::string& root, int images, uint64_t samples) {
  std::vector<std::string> sources;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) sources.push_back(e.path().string());
  }
  if (sources.empty()) return false;
  constexpr uint64_t kClasses = 1000;
  char name[64];
  for (uint64_t c = 0; c < kClasses; ++c) {
    std::snprintf(name, sizeof(name), "/n%04llu", static_cast<unsigned long long>(c));
    std::filesystem::create_directories(root + name);
  }
  for (uint64_t i = static_cast<uint64_t>(images); i < samples; ++i) {
    std::snprintf(name, sizeof(name), "/n%04llu/link_%08llu.jpg",
                  static_cast<unsigned long long>(i % kClasses), static_cast<unsigned long long>(i));
    if (::link(sources[i % sources.size()].c_str(), (root + name).c_str()) != 0) {
      std::perror("link");
      return false;
    }
  }
  return true;
}

// Prints the reason and returns pid -1 when the dataset cannot be written. `samples` > images:
// AddHardLinkedSamples makes the dataset that large. `dataset_extra`: more keys of its
// [[datasets]] table (e.g. cache = "memory"). `large_fraction`: the share of images above 2 MP.
inline BenchDaemon StartBenchDaemon(const std::string& binary, const std::string& name, int images,
                                    const std::string& memory_limit, bool supervise,
                                    uint64_t samples = 0, const std::string& dataset_extra = "",
                                    double large_fraction = 0.01) {
  BenchDaemon d;
  std::string tmpl = "/tmp/ringloader-" + name + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("mkdtemp");
    return d;
  }
  d.dir = tmpl;
  d.endpoint = "unix:" + d.dir + "/rl.sock";
  d.log = d.dir + "/ringloaderd.log";
  image::SyntheticDatasetOptions dataset;
  dataset.out_dir = d.dir + "/data";
  dataset.count = images;
  dataset.large_fraction = large_fraction;
  if (auto written = image::WriteSyntheticDataset(dataset); !written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    return d;
  }
  if (samples > static_cast<uint64_t>(images) &&
      !AddHardLinkedSamples(dataset.out_dir, images, samples)) {
    return d;
  }
  const std::string config = d.dir + "/rl.toml";
  std::ofstream(config) << "[server]\nlisten = \"" << d.endpoint << "\"\nstate_dir = \"" << d.dir
                        << "/state\"\nmemory_limit = \"" << memory_limit
                        << "\"\n[[datasets]]\nname = \"bench\"\nformat = \"imagefolder\"\npath = \""
                        << dataset.out_dir << "\"\n"
                        << dataset_extra << "\n";
  d.pid = fork();
  if (d.pid == 0) {
    FILE* f = std::fopen(d.log.c_str(), "w");
    if (f != nullptr) dup2(fileno(f), 2);
    execl(binary.c_str(), binary.c_str(), "--config", config.c_str(),
          supervise ? "--supervise" : nullptr, nullptr);
    _exit(127);
  }
  return d;
}

}  // namespace ringloader::bench
