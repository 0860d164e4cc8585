#pragma once
// A ringloaderd of a benchmark's own: a synthetic dataset named "bench" in a fresh /tmp
// directory, a config for it, and the daemon started (under --supervise when asked) with its log
// beside them. Shared by the benchmarks that measure through the real client and daemon.

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "server/image/synthetic.h"

namespace ringloader::bench {

struct BenchDaemon {
  std::string dir;       // everything lives here
  std::string endpoint;  // "unix:<dir>/rl.sock"
  std::string log;       // the daemon's stderr
  pid_t pid = -1;        // the daemon (or its supervisor); -1 if it could not be started
};

// Prints the reason and returns pid -1 when the dataset cannot be written.
inline BenchDaemon StartBenchDaemon(const std::string& binary, const std::string& name, int images,
                                    const std::string& memory_limit, bool supervise) {
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
  if (auto written = image::WriteSyntheticDataset(dataset); !written.ok()) {
    std::fprintf(stderr, "%s\n", written.status().ToString().c_str());
    return d;
  }
  const std::string config = d.dir + "/rl.toml";
  std::ofstream(config) << "[server]\nlisten = \"" << d.endpoint << "\"\nstate_dir = \"" << d.dir
                        << "/state\"\nmemory_limit = \"" << memory_limit
                        << "\"\n[[datasets]]\nname = \"bench\"\nformat = \"imagefolder\"\npath = \""
                        << dataset.out_dir << "\"\n";
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
