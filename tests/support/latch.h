// SPDX-License-Identifier: Apache-2.0
#pragma once
// A gate for tests that force an interleaving: threads wait at it until the test opens it, and
// the test can wait until a number of them are waiting (never a sleep).

#include <condition_variable>
#include <mutex>

namespace ringloader::testing {

class Latch {
 public:
  // Blocks until Open().
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
    --waiting_;
  }
  // Lets every waiter (and every later Wait()) through.
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Blocks until `n` threads wait at the latch.
  void AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ >= n; });
  }
  int waiting() {
    std::lock_guard<std::mutex> lock(mu_);
    return waiting_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
};

}  // namespace ringloader::testing
