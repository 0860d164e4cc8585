// SPDX-License-Identifier: Apache-2.0
#pragma once
// How the daemon shares its open-file limit (RLIMIT_NOFILE): a reserve for what it always holds
// (sockets and clients' connections, rings, logs, the journal, indexes, WebDataset shards kept
// open, decode threads' files, probes), the /metrics endpoint's connections, and the rest for
// the reads ahead of every dataset (pipeline::FileBudget). Past the limit, EMFILE would fail
// reads (skipped as io_error) and refuse connections: read-ahead shrinks instead, and the plan
// is said at start.

#include <cstdint>
#include <string>

#include "server/daemon/config.h"

namespace ringloader::server {

struct OpenFilesPlan {
  uint64_t limit = 0;                // the soft RLIMIT_NOFILE the daemon runs with
  uint64_t reserve = 0;              // kept for everything but reads ahead and /metrics
  uint64_t metrics_connections = 0;  // /metrics connections at once (0 without metrics_listen)
  uint64_t read_files = 0;           // files the reads ahead may hold, all datasets together
  uint64_t wanted = 0;               // what they would hold with no limit: max_streams x io_depth
  uint64_t window = 0;               // each stream's reads ahead: io_depth, or its share
  uint64_t stream_files = 0;         // the most one stream's reads may hold: its share
  bool short_of_wanted() const { return read_files < wanted; }
  // One line for the log: the numbers, and what to raise when reads are short.
  std::string Describe() const;
};

// The plan for `limit` (the soft RLIMIT_NOFILE) and `config`. REQUIRES: server.io_depth > 0 for
// a read budget (with 0 there are no reads ahead: read_files and window are 0).
OpenFilesPlan PlanOpenFiles(uint64_t limit, const DaemonConfig& config);

}  // namespace ringloader::server
