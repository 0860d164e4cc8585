// SPDX-License-Identifier: Apache-2.0
#pragma once
// `ringloaderd --supervise`: for hosts without systemd (containers, notebooks, CI). Runs the
// serving daemon as its direct child and restarts it when it dies. SIGTERM/SIGINT are forwarded
// to the child; the supervisor exits when the child exits after one. It decodes nothing and holds
// no big memory, so it is not what the OOM killer picks.
//
// The child reports on a pipe named by RINGLOADER_READY_FD, one sd_notify(3) message per line
// (host_notify.h): READY=1 once it serves, then WATCHDOG_USEC=N (server.watchdog_ms) and a
// WATCHDOG=1 ping about every N/2 while it makes progress. A child that stops pinging for N (a
// decode stuck past its deadline) is killed with SIGABRT, so its crash journal strikes the samples
// it had in flight, and restarted like any child that died while serving (a child that said
// STOPPING=1 is shutting down and owes no pings). Under systemd
// (NOTIFY_SOCKET) the supervisor passes READY=1, STATUS= and WATCHDOG=1 on to systemd.
//
// Restart policy.
//   - died before it was ready (a start-up crash loop): capped exponential backoff;
//   - died while serving (killed, or a crash on some sample): restart at once, so trainers wait
//     as little as possible; poison samples stop crashing it after two strikes (quarantine), and
//     the rate limit below catches anything else;
//   - exit code 1 before ready is a start-up error (bad config, socket in use): no restart;
//   - more than max_restarts within restart_window: give up with exit code 1.

#include <chrono>
#include <string>
#include <vector>

namespace ringloader::server {

struct SupervisorOptions {
  // The daemon's argv; argv[0] is only its name (the supervisor execs /proc/self/exe).
  std::vector<std::string> child_argv;
  // Backoff before restarting a child that died before it was ready, doubled each time.
  std::chrono::milliseconds initial_backoff{50};
  std::chrono::milliseconds max_backoff{5000};
  // More restarts than this within `restart_window` and the supervisor gives up (exit 1).
  int max_restarts = 60;
  std::chrono::seconds restart_window{60};
};

// Returns the exit code: the child's when it exited by itself with 0 or after SIGTERM, 1 when
// the restart rate limit was hit or the child could not be started.
int RunSupervisor(const SupervisorOptions& options);

}  // namespace ringloader::server
