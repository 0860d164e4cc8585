// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <algorithm>
#include <cstdlib>
#include <deque>
#include <optional>
#include <string>

#include <systemd/sd-daemon.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/daemon/host_notify.h"
#include "server/daemon/logging.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int notify_fd = -1;  // read end of the notification pipe; -1 once the child closed it
  std::string pending;  // a notification line not yet complete
};

// What the child tells us on its notification pipe, and its watchdog: once it has announced
// WATCHDOG_USEC, a child that sends no WATCHDOG=1 for that long is stuck (it stops pinging while a
// decode runs past its deadline: watchdog.h). It gets SIGABRT, which its crash handler turns into
// a strike for the samples in flight, and SIGKILL if it is still there kAbortGrace later.
class ChildProgress {
 public:
  static constexpr std::chrono::seconds kAbortGrace{5};

  void OnMessage(const std::string& line, Clock::time_point now) {
    if (line == "READY=1") {
      ready_ = true;
    } else if (line == "WATCHDOG=1") {
      last_ping_ = now;
    } else if (line == "STOPPING=1") {
      stopping_ = true;  // shutting down on its own: no more pings, and none owed
    } else if (absl::StartsWith(line, "WATCHDOG_USEC=")) {
      uint64_t usec = 0;
      if (absl::SimpleAtoi(line.substr(14), &usec)) {
        watchdog_ = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::microseconds(usec));
        last_ping_ = now;
      }
    }
  }
  bool ready() const { return ready_; }

  // Milliseconds until Act() is due, for poll(); -1 when nothing is due.
  int MillisecondsToAct(Clock::time_point now) const {
    if (watchdog_.count() == 0 || killed_ || stopping_) return -1;
    const Clock::time_point due = aborted_ ? *aborted_ + kAbortGrace : last_ping_ + watchdog_;
    return static_cast<int>(std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(due - now).count() + 1));
  }

  // The watchdog expired: SIGABRT first, SIGKILL after the grace.
  void Act(pid_t pid, Clock::time_point now) {
    if (MillisecondsToAct(now) != 0) return;
    if (!aborted_) {
      SPDLOG_ERROR("ringloaderd pid={} sent no progress ping for {} ms (server.watchdog_ms): a "
                   "decode is stuck. Killing it with SIGABRT (the samples it had in flight get a "
                   "strike) and restarting it",
                   pid, watchdog_.count());
      kill(pid, SIGABRT);
      aborted_ = now;
    } else {
      SPDLOG_ERROR("ringloaderd pid={} is still there {} s after SIGABRT: SIGKILL", pid,
                   kAbortGrace.count());
      kill(pid, SIGKILL);
      killed_ = true;
    }
  }

 private:
  bool ready_ = false;
  std::chrono::milliseconds watchdog_{0};  // 0 until the child announces it
  Clock::time_point last_ping_;
  std::optional<Clock::time_point> aborted_;
  bool killed_ = false;
  bool stopping_ = false;
};

Child StartChild(const std::vector<std::string>& argv, const sigset_t& original_mask) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) return {};
  Child child;
  const pid_t supervisor = getpid();
  child.pid = fork();
  if (child.pid == 0) {
    // If the supervisor itself is killed, its daemon must not live on unsupervised.
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != supervisor) _exit(1);  // it died before prctl took effect
    // SIGCHLD back as it was; SIGTERM, SIGINT and SIGHUP stay blocked across exec (main() held
    // them): one sent now waits for the daemon's sigwait instead of killing it unready.
    sigset_t mask = original_mask;
    for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaddset(&mask, s);
    sigprocmask(SIG_SETMASK, &mask, nullptr);
    // The write end survives exec (no CLOEXEC on the duplicate): the daemon writes READY=1,
    // WATCHDOG=1, STATUS=... there, one per line (host_notify.h). It talks to us, not to systemd:
    // we forward what systemd should hear.
    int ready = fcntl(pipe_fds[1], F_DUPFD, 3);
    setenv(kReadyFdEnv, std::to_string(ready).c_str(), 1);
    for (const char* name : {"NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"}) unsetenv(name);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    // argv[0] is the binary's real path (ps, systemctl status); /proc/self/exe is the same binary
    // even if the file was replaced since we started.
    execv("/proc/self/exe", args.data());
    std::fprintf(stderr, "[error] supervisor: cannot exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  ::close(pipe_fds[1]);
  child.notify_fd = pipe_fds[0];
  return child;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

// Sleeps `delay` unless SIGTERM/SIGINT arrives first (returns false then).
bool SleepUnlessStopped(int signal_fd, std::chrono::milliseconds delay) {
  const Clock::time_point wake = Clock::now() + delay;
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now());
    if (left.count() <= 0) return true;
    pollfd p{signal_fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) > 0) {
      signalfd_siginfo info;
      if (read(signal_fd, &info, sizeof(info)) == sizeof(info) &&
          (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT)) {
        SPDLOG_INFO("{} while waiting to restart: stopping", strsignal(info.ssi_signo));
        return false;
      }
    }
  }
}

}  // namespace

int RunSupervisor(const SupervisorOptions& options) {
  InitLogging(nullptr, "supervisor: ");
  sigset_t handled, original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGCHLD);
  sigaddset(&handled, SIGHUP);
  // A handler, though signalfd reads them: as pid 1 of a pid namespace (a container) the kernel
  // drops signals whose action is the default. The child gets default actions back at exec.
  for (int s : {SIGTERM, SIGINT, SIGHUP}) signal(s, [](int) {});
  sigprocmask(SIG_BLOCK, &handled, &original);
  const int signal_fd = signalfd(-1, &handled, SFD_CLOEXEC);
  if (signal_fd < 0) {
    SPDLOG_ERROR("signalfd: {}", std::strerror(errno));
    return 1;
  }

  std::deque<Clock::time_point> restarts;
  auto backoff = options.initial_backoff;
  const bool under_systemd = std::getenv("NOTIFY_SOCKET") != nullptr;
  bool told_systemd_ready = false;
  while (true) {
    Child child = StartChild(options.child_argv, original);
    if (child.pid < 0) {
      SPDLOG_ERROR("cannot start ringloaderd: {}", std::strerror(errno));
      return 1;
    }
    SPDLOG_INFO("started ringloaderd pid={}", child.pid);
    ChildProgress progress;
    bool stopping = false;
    bool hup_held = false;  // a SIGHUP for a child not yet ready: forwarded when it is
    int status = 0;
    while (true) {
      const int timeout_ms = stopping ? -1 : progress.MillisecondsToAct(Clock::now());
      pollfd fds[2] = {{signal_fd, POLLIN, 0}, {child.notify_fd, POLLIN, 0}};
      const int polled = poll(fds, child.notify_fd >= 0 ? 2 : 1, timeout_ms);
      if (polled < 0) continue;
      if (polled == 0) {
        progress.Act(child.pid, Clock::now());
        continue;
      }
      if (child.notify_fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) {
        char buf[1024];
        const ssize_t n = read(child.notify_fd, buf, sizeof(buf));
        if (n <= 0) {
          ::close(child.notify_fd);
          child.notify_fd = -1;
        } else {
          child.pending.append(buf, static_cast<size_t>(n));
          for (size_t eol; (eol = child.pending.find('\n')) != std::string::npos;) {
            const std::string line = child.pending.substr(0, eol);
            child.pending.erase(0, eol + 1);
            progress.OnMessage(line, Clock::now());
            if (line == "READY=1" && hup_held) {
              hup_held = false;
              SPDLOG_INFO("SIGHUP: forwarded to ringloaderd pid={}, now ready", child.pid);
              kill(child.pid, SIGHUP);
            }
            // systemd hears about the service as a whole: ready once, then status and pings.
            const bool is_ready = line == "READY=1";
            if (under_systemd && (!is_ready || !told_systemd_ready) &&
                (is_ready || absl::StartsWith(line, "STATUS=") || line == "WATCHDOG=1")) {
              sd_notify(0, line.c_str());
              told_systemd_ready = told_systemd_ready || is_ready;
            }
          }
          if (child.pending.size() > 4096) child.pending.clear();  // not our protocol
        }
      }
      if (!(fds[0].revents & POLLIN)) continue;
      signalfd_siginfo info;
      if (read(signal_fd, &info, sizeof(info)) != sizeof(info)) continue;
      if (info.ssi_signo == SIGTERM || info.ssi_signo == SIGINT) {
        stopping = true;
        kill(child.pid, static_cast<int>(info.ssi_signo));
        continue;
      }
      if (info.ssi_signo == SIGHUP) {  // the daemon reloads its config; we have none to reload
        if (!progress.ready()) {
          if (!hup_held) SPDLOG_INFO("SIGHUP: held until ringloaderd pid={} is ready", child.pid);
          hup_held = true;
          continue;
        }
        SPDLOG_INFO("SIGHUP: forwarded to ringloaderd pid={}", child.pid);
        kill(child.pid, SIGHUP);
        continue;
      }
      if (waitpid(child.pid, &status, WNOHANG) == child.pid) break;
    }
    if (child.notify_fd >= 0) ::close(child.notify_fd);
    const bool ready = progress.ready();

    if (stopping || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      SPDLOG_INFO("ringloaderd exited ({}); stopping", Describe(status));
      return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    }
    if (!ready && WIFEXITED(status) && WEXITSTATUS(status) == 1) {
      // A start-up failure (bad config, socket in use): restarting would only repeat it.
      SPDLOG_ERROR("ringloaderd failed to start ({}); not restarting", Describe(status));
      return 1;
    }
    const Clock::time_point now = Clock::now();
    restarts.push_back(now);
    while (!restarts.empty() && now - restarts.front() > options.restart_window) {
      restarts.pop_front();
    }
    if (static_cast<int>(restarts.size()) > options.max_restarts) {
      SPDLOG_ERROR("ringloaderd died {} times within {} s; giving up", restarts.size(),
                   options.restart_window.count());
      return 1;
    }
    // Died while serving: come back at once (trainers wait for us; the rate limit above stops a
    // loop). Died before serving: back off, more each time.
    const auto delay = ready ? std::chrono::milliseconds(0) : backoff;
    backoff = ready ? options.initial_backoff : std::min(options.max_backoff, backoff * 2);
    SPDLOG_WARN("ringloaderd pid={} died {} ({}); restarting {}", child.pid,
                ready ? "while serving" : "before it was ready", Describe(status),
                delay.count() == 0 ? std::string("now") : absl::StrCat("in ", delay.count(), " ms"));
    if (!SleepUnlessStopped(signal_fd, delay)) {
      return 0;
    }
  }
}

}  // namespace ringloader::server
