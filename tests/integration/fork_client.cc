// SPDX-License-Identifier: Apache-2.0
// Test helper for trainer_correctness_test: a trainer that forks with a live Client and Stream,
// as PyTorch DataLoader workers and multiprocessing do.
//
//   fork_client ENDPOINT DATASET destroy|use|use-late
//
// destroy:  the child destroys the inherited Stream and Client at once and returns from main.
// use:      the child calls Next() on the inherited Stream (must throw kFailedPrecondition) and
//           Open() on the inherited Client (likewise), then returns from main.
// use-late: like destroy, but the child waits until the parent has read on for a while.
// The parent then reads the rest of the epoch and opens a second stream. Prints "child: ..." and
// "parent: consumed N samples, second stream ok"; exit code 0 only when both sides behaved.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <thread>

#include "client/client.h"

namespace {

using ringloader::client::Client;
using ringloader::client::Error;
using ringloader::client::ErrorCode;
using ringloader::client::StreamOptions;

int Child(const std::string& mode, std::unique_ptr<Client>& client,
          std::unique_ptr<ringloader::client::Stream>& stream, int ready_fd) {
  if (mode == "use-late") {
    char c;
    if (read(ready_fd, &c, 1) != 1) return 10;
  }
  if (mode == "use") {
    try {
      stream->Next();
      std::printf("child: Next() did not throw\n");
      return 11;
    } catch (const Error& e) {
      std::printf("child: Next(): %s\n", e.what());
      if (e.code() != ErrorCode::kFailedPrecondition ||
          std::strstr(e.what(), "open a new Client in the child") == nullptr) {
        return 12;
      }
    }
    try {
      client->Open(stream->options());
      return 13;
    } catch (const Error& e) {
      std::printf("child: Open(): %s\n", e.what());
      if (e.code() != ErrorCode::kFailedPrecondition) return 14;
    }
  }
  stream.reset();
  client.reset();
  std::printf("child: destroyed the inherited objects\n");
  std::fflush(stdout);
  return 0;  // and return from main: static destructors run
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fork_client ENDPOINT DATASET destroy|use|use-late\n");
    return 2;
  }
  const std::string mode = argv[3];
  signal(SIGPIPE, SIG_IGN);  // the child may be gone when the parent signals it
  auto client = std::make_unique<Client>(argv[1]);
  StreamOptions options;
  options.dataset = argv[2];
  options.batch_size = 8;
  options.image_size = 32;
  options.end_epoch = 1;
  options.shuffle = false;
  options.reconnect_deadline = std::chrono::seconds(10);
  auto stream = client->Open(options);
  uint64_t samples = 0;
  if (auto first = stream->Next()) samples += first->size();
  int ready[2];
  if (pipe(ready) != 0) return 3;
  std::fflush(stdout);
  const pid_t child = fork();
  if (child == 0) {
    close(ready[1]);
    const int code = Child(mode, client, stream, ready[0]);
    std::fflush(stdout);
    if (code != 0) _exit(code);
    return 0;
  }
  close(ready[0]);
  try {
    int reads = 0;
    while (auto batch = stream->Next()) {
      samples += batch->size();
      if (++reads == 3) (void)!write(ready[1], "x", 1);  // use-late: the child goes now
    }
    (void)!write(ready[1], "x", 1);
    // The child must exit promptly whatever it did.
    int status = 0;
    bool exited = false;
    for (int i = 0; i < 200 && !exited; ++i) {
      exited = waitpid(child, &status, WNOHANG) == child;
      if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!exited) {
      kill(child, SIGKILL);
      std::printf("parent: the child did not exit within 10 s\n");
      return 4;
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::printf("parent: the child failed (status %d)\n", status);
      return 5;
    }
    auto second = client->Open(options);
    if (!second->Next()) return 6;
    std::printf("parent: consumed %llu samples, second stream ok\n",
                static_cast<unsigned long long>(samples));
  } catch (const Error& e) {
    std::printf("parent: %s\n", e.what());
    return 7;
  }
  return 0;
}
