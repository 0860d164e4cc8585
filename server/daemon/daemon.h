// SPDX-License-Identifier: Apache-2.0
#pragma once
// The daemon's whole life, in order: load config, set up logging, remove stale segments, open
// datasets, read the crash journal (strikes, quarantine), start decode workers, start gRPC, wait
// for SIGTERM/SIGINT, then shut down in reverse order (segments unlinked, journal cleared).

#include <string>

namespace ringloader::server {

struct DaemonOptions {
  std::string config_path;
  std::string listen_override;  // --listen; empty = the config's server.listen
};

// Returns the process exit code: 0 after a clean shutdown, 1 when start-up failed (the reason is
// logged: bad config, socket in use, ...).
int RunDaemon(const DaemonOptions& options);

// main()'s first instruction, daemon and supervisor alike: SIGTERM, SIGINT and SIGHUP are
// blocked (and given a no-op handler, for pid 1 of a container), so one that comes before the
// process takes its signals waits, pending, instead of killing it. The mask survives fork and
// exec: a supervised child holds them from its first instruction too.
void HoldStopSignals();

}  // namespace ringloader::server
