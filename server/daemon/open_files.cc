// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/open_files.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/daemon/http_endpoint.h"

namespace ringloader::server {
namespace {

// Always held whatever the load: listening sockets, epoll and event fds (gRPC, libmicrohttpd),
// the log, the journal and state files, /dev/shm and /proc files read now and then.
constexpr uint64_t kBaseFiles = 128;
// Per stream: the client's connection, its Attach call, the ring's segment while it is made.
constexpr uint64_t kFilesPerStream = 4;
// Per dataset: the WebDataset/TFRecord shards kept open (the 64 most recent), its lane's probes.
constexpr uint64_t kFilesPerDataset = 64 + 4;

}  // namespace

OpenFilesPlan PlanOpenFiles(uint64_t limit, const DaemonConfig& config) {
  const ServerConfig& s = config.server;
  OpenFilesPlan plan;
  plan.limit = limit;
  plan.reserve = kBaseFiles + kFilesPerStream * s.max_streams +
                 kFilesPerDataset * std::max<uint64_t>(config.datasets.size(), 1) +
                 (s.decode_threads == 0 ? 64 : s.decode_threads);
  // Scrapers are few: an eighth of the limit at most, so idle ones never take the reads' files.
  plan.metrics_connections =
      s.metrics_listen.empty()
          ? 0
          : std::clamp<uint64_t>(limit / 8, 8, HttpEndpoint::kMaxConnections);
  plan.wanted = uint64_t{s.max_streams} * s.io_depth;
  if (s.io_depth == 0) return plan;
  const uint64_t taken = plan.reserve + plan.metrics_connections;
  plan.read_files = limit > taken + s.max_streams ? limit - taken : s.max_streams;
  // Each stream's window: io_depth, or its share of half the files (the other half is for the
  // reads a batch starts when it needs them, so a stream whose client pauses cannot starve
  // the others).
  plan.stream_files = std::max<uint64_t>(plan.read_files / std::max<uint32_t>(s.max_streams, 1), 2);
  plan.window = std::clamp<uint64_t>(plan.read_files / (2 * std::max<uint32_t>(s.max_streams, 1)),
                                     1, s.io_depth);
  return plan;
}

std::string OpenFilesPlan::Describe() const {
  std::string text = absl::StrCat("open files: limit ", limit, ": ", reserve,
                                  " kept for sockets, rings, shards and decode threads");
  if (metrics_connections > 0) absl::StrAppend(&text, ", ", metrics_connections, " for /metrics");
  if (wanted == 0) return absl::StrCat(text, "; no reads ahead (io_depth = 0)");
  absl::StrAppend(&text, ", ", read_files, " for reads ahead (each stream's window ", window, ")");
  if (short_of_wanted()) {
    absl::StrAppend(&text, "; max_streams x io_depth would want ", wanted,
                    ": reads ahead shrink to fit (raise LimitNOFILE= / ulimit -n to ",
                    wanted + reserve + metrics_connections, " for the full depth)");
  }
  return text;
}

}  // namespace ringloader::server
