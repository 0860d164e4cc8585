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
#include <deque>

#include "server/daemon/daemon.h"
#include "server/daemon/logging.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int ready_fd = -1;  // read end of the readiness pipe; -1 once read or closed
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
    sigprocmask(SIG_SETMASK, &original_mask, nullptr);
    // The write end survives exec (no CLOEXEC on the duplicate); the daemon writes READY=1.
    int ready = fcntl(pipe_fds[1], F_DUPFD, 3);
    setenv(kReadyFdEnv, std::to_string(ready).c_str(), 1);
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
  child.ready_fd = pipe_fds[0];
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
  while (true) {
    Child child = StartChild(options.child_argv, original);
    if (child.pid < 0) {
      SPDLOG_ERROR("cannot start ringloaderd: {}", std::strerror(errno));
      return 1;
    }
    SPDLOG_INFO("started ringloaderd pid={}", child.pid);
    bool ready = false;
    bool stopping = false;
    int status = 0;
    while (true) {
      pollfd fds[2] = {{signal_fd, POLLIN, 0}, {child.ready_fd, POLLIN, 0}};
      if (poll(fds, child.ready_fd >= 0 ? 2 : 1, -1) < 0) continue;
      if (child.ready_fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) {
        char buf[64];
        ssize_t n = read(child.ready_fd, buf, sizeof(buf));
        if (n > 0 && std::string(buf, n).find("READY=1") != std::string::npos) ready = true;
        ::close(child.ready_fd);
        child.ready_fd = -1;
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
        SPDLOG_INFO("SIGHUP: forwarded to ringloaderd pid={}", child.pid);
        kill(child.pid, SIGHUP);
        continue;
      }
      if (waitpid(child.pid, &status, WNOHANG) == child.pid) break;
    }
    if (child.ready_fd >= 0) ::close(child.ready_fd);

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
    // Died while serving: come back at once. Died before serving: back off, more each time.
    const auto delay = ready ? options.initial_backoff : backoff;
    backoff = ready ? options.initial_backoff : std::min(options.max_backoff, backoff * 2);
    SPDLOG_WARN("ringloaderd pid={} died {} ({}); restarting in {} ms", child.pid,
                ready ? "while serving" : "before it was ready", Describe(status), delay.count());
    if (!SleepUnlessStopped(signal_fd, delay)) {
      return 0;
    }
  }
}

}  // namespace ringloader::server
