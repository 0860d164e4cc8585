// SPDX-License-Identifier: Apache-2.0
#pragma once
// TrainerClock: is one stream's trainer input-bound, and on what does it wait?
//
// The client measures its trainer's time and reports it with every NextBatch call: the time
// spent waiting inside Next() and the time between calls (the trainer's step), as totals since
// it opened the stream. The stream's producer adds how its busy time went (reads the batch had to
// wait for, decode and augmentation, memory waits, delivery). Over the last minute:
//
//   input_bound = wait / (wait + step)          (0..1; TensorFlow's analyzer's input time share)
//
// and the trainer's wait is split as the producer's busy time was. A trainer that stops calling
// (paused, evaluating, holding its batches) is in its step: the time since its last answer counts
// as step, so it never reads as input-bound; one inside a call is waiting.
//
// Reports are untrusted: a report adds at most the time that passed on the daemon's clock since
// the one before (a client misstating its figures misstates its own stream's, bounded), and totals
// that go backwards (another client process took the stream over) start a new baseline.
//
// Memory: one point a second over the window, at most. Thread-safety: thread-safe.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>

#include "absl/base/thread_annotations.h"

namespace ringloader::server {

// What a client reports with a call: totals since it opened the stream, in nanoseconds.
struct TrainerReport {
  uint64_t wait_ns = 0;  // inside Next(), waiting for batches (and for a restarting daemon)
  uint64_t step_ns = 0;  // between Next() calls
  uint64_t steps = 0;    // Next() calls that returned a batch
};

// What the stream's producer spends its busy time on (not its waits for a free slot).
enum class ProducerPhase : uint8_t { kRead, kDecode, kMemory, kDelivery };
inline constexpr size_t kProducerPhases = 4;

// The figure over the window, and the totals.
struct TrainerFigure {
  bool known = false;         // the client reports (an old client, or none yet: not known)
  double input_bound = 0;     // wait / (wait + step) over the window, 0..1
  double window_seconds = 0;  // the span it covers: up to the window, less for a young stream
  double wait_seconds = 0;    // of the window
  double step_seconds = 0;
  // The window's wait, split as the producer's busy time was (ProducerPhase order); all 0 when
  // the producer was not busy at all in the window.
  std::array<double, kProducerPhases> wait_on_seconds{};
  // The window's time the stream's reads took on their lanes, done ahead (overlapping the
  // decodes): what read-ahead saved the trainer, beside the reads it waited for (kRead).
  double read_ahead_seconds = 0;
  // Totals since the stream opened, as reported (clamped as above).
  double wait_seconds_total = 0;
  double step_seconds_total = 0;
  uint64_t steps = 0;
};

// TensorFlow's analyzer's words: under 5% not input-bound, 5-20% moderately, over 20% highly.
std::string_view InputBoundWords(const TrainerFigure& figure);

class TrainerClock {
 public:
  explicit TrainerClock(std::chrono::nanoseconds window = std::chrono::minutes(1));

  // A NextBatch call arrived at `now_ns` (base::SteadyNowNs) with the client's report (`report`
  // null: the client reports nothing).
  void CallStarted(const TrainerReport* report, int64_t now_ns);
  // Its answer left at `now_ns`.
  void CallEnded(int64_t now_ns);
  // The producer spent `ns` in `phase`, ending at `now_ns`.
  void AddProducerTime(ProducerPhase phase, int64_t ns, int64_t now_ns);
  // The stream's reads ahead took `ns` more on their lanes, by `now_ns`.
  void AddReadAheadTime(int64_t ns, int64_t now_ns);

  TrainerFigure Read(int64_t now_ns) const;

 private:
  // Running totals at a moment: what the window's figures are differences of.
  struct Point {
    int64_t at_ns = 0;
    uint64_t wait_ns = 0;
    uint64_t step_ns = 0;
    std::array<uint64_t, kProducerPhases> phase_ns{};
    uint64_t read_ahead_ns = 0;
    bool in_call = false;  // what the trainer was doing from then until the next point
  };
  // The totals now, with the call in progress (wait) or the step in progress (step) counted.
  Point Now(int64_t now_ns) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Record(int64_t now_ns) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t window_ns_;
  mutable std::mutex mu_;
  bool known_ ABSL_GUARDED_BY(mu_) = false;
  TrainerReport last_report_ ABSL_GUARDED_BY(mu_);  // the client's last totals, as sent
  int64_t last_report_ns_ ABSL_GUARDED_BY(mu_) = 0;
  Point totals_ ABSL_GUARDED_BY(mu_);  // accepted totals (at_ns unused)
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  bool in_call_ ABSL_GUARDED_BY(mu_) = false;
  int64_t since_ns_ ABSL_GUARDED_BY(mu_) = 0;  // the call's start, or the last answer's
  // Calls answered since the last report: waiting, as far as the daemon saw, until the next
  // report says exactly.
  uint64_t unreported_wait_ns_ ABSL_GUARDED_BY(mu_) = 0;
  // One point a second at most, oldest first; the first is at or before the window's start.
  std::deque<Point> points_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
