// SPDX-License-Identifier: Apache-2.0
#include "tests/support/test_support.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace ringloader::testing {
namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "test_support: %s: %s\n", what.c_str(), std::strerror(errno));
  std::abort();
}

std::atomic<int> g_counter{0};

}  // namespace

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/ringloader-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp " + tmpl);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string UniqueName(const std::string& tag) {
  return "rltest-" + std::to_string(getpid()) + "-" + std::to_string(g_counter++) + "-" + tag;
}

std::string BuiltBinary(const std::string& relative_to_build_dir) {
  return std::string(RINGLOADER_BINARY_DIR) + "/" + relative_to_build_dir;
}

void WriteFile(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) Die("open " + path);
  out << contents;
  if (!out) Die("write " + path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (pred()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Subprocess::Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env,
                       std::string output_path) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string entry(*e);
    std::string key = entry.substr(0, entry.find('='));
    if (!env.count(key)) env_strings.push_back(entry);
  }
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> cargv, cenv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  for (auto& e : env_strings) cenv.push_back(e.data());
  cenv.push_back(nullptr);

  pid_ = fork();
  if (pid_ < 0) Die("fork");
  if (pid_ == 0) {
    if (!output_path.empty()) {
      FILE* f = std::fopen(output_path.c_str(), "a");
      if (f != nullptr) {
        dup2(fileno(f), 1);
        dup2(fileno(f), 2);
      }
    }
    execve(cargv[0], cargv.data(), cenv.data());
    std::fprintf(stderr, "execve %s: %s\n", cargv[0], std::strerror(errno));
    _exit(127);
  }
}

Subprocess::~Subprocess() {
  if (Running()) {
    // SIGTERM first, so a supervisor can take its child down with it.
    Kill(SIGTERM);
    if (Wait(std::chrono::seconds(5)) == -1) {
      Kill(SIGKILL);
      Wait(std::chrono::seconds(10));
    }
  }
}

bool Subprocess::Running() {
  if (reaped_ || pid_ <= 0) return false;
  int status = 0;
  pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    reaped_ = true;
    status_ = status;
    return false;
  }
  return true;
}

void Subprocess::Kill(int signal) {
  if (!reaped_ && pid_ > 0) ::kill(pid_, signal);
}

int Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (WaitFor([&] { return !Running(); }, timeout)) return status_;
  return -1;
}

int Subprocess::WaitExitCode(std::chrono::milliseconds timeout) {
  int status = Wait(timeout);
  if (status == -1 && !reaped_) return -1;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::map<std::string, std::string> env,
                         std::chrono::milliseconds timeout) {
  TempDir dir;
  std::string out = dir.Join("output");
  Subprocess proc(argv, std::move(env), out);
  int code = proc.WaitExitCode(timeout);
  return {code, ReadFile(out)};
}

void ReportSkip(const std::string& reason) {
  std::printf("RINGLOADER_SKIP: %s\n", reason.c_str());
  std::fflush(stdout);
}

bool RunningAsRoot() { return ::geteuid() == 0; }

}  // namespace ringloader::testing
