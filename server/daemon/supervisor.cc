#include "server/daemon/supervisor.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

using Clock = std::chrono::steady_clock;

pid_t StartChild(const std::vector<std::string>& argv, const sigset_t& original_mask) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  sigprocmask(SIG_SETMASK, &original_mask, nullptr);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  execv(args[0], args.data());
  std::fprintf(stderr, "[error] supervisor: cannot exec %s: %s\n", args[0], std::strerror(errno));
  _exit(127);
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return std::string("signal ") + strsignal(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace

int RunSupervisor(const SupervisorOptions& options) {
  sigset_t handled, original;
  sigemptyset(&handled);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGCHLD);
  sigprocmask(SIG_BLOCK, &handled, &original);

  std::deque<Clock::time_point> restarts;
  auto backoff = options.initial_backoff;
  bool stopping = false;
  while (true) {
    const Clock::time_point started = Clock::now();
    pid_t child = StartChild(options.child_argv, original);
    if (child < 0) {
      SPDLOG_ERROR("supervisor: fork: {}", std::strerror(errno));
      return 1;
    }
    SPDLOG_INFO("supervisor: started ringloaderd pid={}", child);
    int status = 0;
    while (true) {
      siginfo_t info;
      if (sigwaitinfo(&handled, &info) < 0) continue;
      if (info.si_signo == SIGTERM || info.si_signo == SIGINT) {
        stopping = true;
        kill(child, info.si_signo);
        continue;
      }
      if (waitpid(child, &status, WNOHANG) == child) break;
    }
    if (stopping || (WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      SPDLOG_INFO("supervisor: ringloaderd exited ({}); stopping", Describe(status));
      return WIFEXITED(status) ? WEXITSTATUS(status) : 0;
    }
    if (WIFEXITED(status) && WEXITSTATUS(status) == 1 &&
        Clock::now() - started < options.healthy_uptime) {
      // Exit code 1 within moments of starting is a start-up failure (bad config, socket in use):
      // restarting would only repeat it.
      SPDLOG_ERROR("supervisor: ringloaderd failed to start ({}); not restarting",
                   Describe(status));
      return 1;
    }
    const Clock::time_point now = Clock::now();
    if (now - started >= options.healthy_uptime) backoff = options.initial_backoff;
    restarts.push_back(now);
    while (!restarts.empty() && now - restarts.front() > options.restart_window) {
      restarts.pop_front();
    }
    if (static_cast<int>(restarts.size()) > options.max_restarts) {
      SPDLOG_ERROR("supervisor: ringloaderd died {} times within {} s; giving up",
                   restarts.size(), options.restart_window.count());
      return 1;
    }
    SPDLOG_WARN("supervisor: ringloaderd pid={} died ({}); restarting in {} ms", child,
                Describe(status), backoff.count());
    // Sleep, but stay responsive to SIGTERM.
    timespec ts{static_cast<time_t>(backoff.count() / 1000),
                static_cast<long>((backoff.count() % 1000) * 1'000'000)};
    const Clock::time_point wake = Clock::now() + backoff;
    while (Clock::now() < wake) {
      siginfo_t info;
      int sig = sigtimedwait(&handled, &info, &ts);
      if (sig == SIGTERM || sig == SIGINT) {
        SPDLOG_INFO("supervisor: {} while restarting; stopping", strsignal(sig));
        return 0;
      }
      auto left = std::chrono::duration_cast<std::chrono::nanoseconds>(wake - Clock::now());
      if (left.count() <= 0) break;
      ts = {static_cast<time_t>(left.count() / 1'000'000'000),
            static_cast<long>(left.count() % 1'000'000'000)};
    }
    backoff = std::min(options.max_backoff, backoff * 2);
  }
}

}  // namespace ringloader::server
