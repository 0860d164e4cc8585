// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/trainer_clock.h"

#include <algorithm>

namespace ringloader::server {
namespace {

constexpr int64_t kPointEveryNs = 1'000'000'000;
// A report may claim this much more than the daemon saw pass (the two clocks' reading moments).
constexpr uint64_t kReportSlackNs = 10'000'000;

double Seconds(uint64_t ns) { return static_cast<double>(ns) / 1e9; }

uint64_t Minus(uint64_t a, uint64_t b) { return a > b ? a - b : 0; }

}  // namespace

std::string_view InputBoundWords(const TrainerFigure& figure) {
  if (!figure.known) return "unknown";
  if (figure.input_bound < 0.05) return "not input-bound";
  if (figure.input_bound <= 0.20) return "moderately input-bound";
  return "highly input-bound";
}

TrainerClock::TrainerClock(std::chrono::nanoseconds window) : window_ns_(window.count()) {}

void TrainerClock::CallStarted(const TrainerReport* report, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (report != nullptr) {
    const TrainerReport& r = *report;
    const TrainerReport& last = last_report_;
    // The first report, or totals that went backwards (another process reports): a baseline.
    if (known_ && r.wait_ns >= last.wait_ns && r.step_ns >= last.step_ns && r.steps >= last.steps) {
      uint64_t wait = r.wait_ns - last.wait_ns;
      uint64_t step = r.step_ns - last.step_ns;
      const uint64_t passed = static_cast<uint64_t>(std::max<int64_t>(0, now_ns - last_report_ns_));
      // No more than the daemon saw pass: scaled down together, so the share stays the client's.
      // (Compared without adding: a lying client's two halves may not wrap round to a small sum.)
      const uint64_t allowed = passed + kReportSlackNs;
      if (wait > allowed || step > allowed - wait) {
        const double scale =
            static_cast<double>(passed) / (static_cast<double>(wait) + static_cast<double>(step));
        wait = std::min(passed, static_cast<uint64_t>(static_cast<double>(wait) * scale));
        step = std::min(passed - wait, static_cast<uint64_t>(static_cast<double>(step) * scale));
      }
      totals_.wait_ns += wait;
      totals_.step_ns += step;
      steps_ += std::min<uint64_t>(r.steps - last.steps, 1);  // a batch a call at most
    }
    known_ = true;
    last_report_ = r;
    last_report_ns_ = now_ns;
    unreported_wait_ns_ = 0;
  }
  in_call_ = true;
  since_ns_ = now_ns;
  Record(now_ns);
}

void TrainerClock::CallEnded(int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!in_call_) return;
  unreported_wait_ns_ += static_cast<uint64_t>(std::max<int64_t>(0, now_ns - since_ns_));
  in_call_ = false;
  since_ns_ = now_ns;
  Record(now_ns);
}

void TrainerClock::AddProducerTime(ProducerPhase phase, int64_t ns, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  totals_.phase_ns[static_cast<size_t>(phase)] += static_cast<uint64_t>(std::max<int64_t>(0, ns));
  Record(now_ns);
}

void TrainerClock::AddReadAheadTime(int64_t ns, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  totals_.read_ahead_ns += static_cast<uint64_t>(std::max<int64_t>(0, ns));
  Record(now_ns);
}

TrainerClock::Point TrainerClock::Now(int64_t now_ns) const {
  Point now = totals_;
  now.at_ns = now_ns;
  now.in_call = in_call_;
  if (!known_) return now;
  const uint64_t since = static_cast<uint64_t>(std::max<int64_t>(0, now_ns - since_ns_));
  if (in_call_) {
    now.wait_ns += unreported_wait_ns_ + since;
  } else {
    now.wait_ns += unreported_wait_ns_;
    if (since_ns_ != 0) now.step_ns += since;  // in its step (or paused) since the last answer
  }
  return now;
}

void TrainerClock::Record(int64_t now_ns) {
  // Callers read the clock before taking the lock: points stay in order all the same.
  if (!points_.empty()) now_ns = std::max(now_ns, points_.back().at_ns);
  const Point point = Now(now_ns);
  // The newest point of a second stands for the rest of it; the very first point stays (the
  // start of a young stream's window).
  if (points_.size() >= 2 && points_.back().at_ns / kPointEveryNs == now_ns / kPointEveryNs) {
    points_.back() = point;
  } else {
    points_.push_back(point);
  }
  // Keep one point at or before the window's start.
  while (points_.size() >= 2 && points_[1].at_ns <= now_ns - window_ns_) points_.pop_front();
}

TrainerFigure TrainerClock::Read(int64_t now_ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  TrainerFigure figure;
  figure.known = known_;
  figure.wait_seconds_total = Seconds(totals_.wait_ns);
  figure.step_seconds_total = Seconds(totals_.step_ns);
  figure.steps = steps_;
  if (points_.empty()) return figure;
  const Point now = Now(now_ns);
  // The totals at the window's start: from the latest point at or before it, the trainer went
  // on as it was then (in a call: waiting; else in its step) until the next point. Without one,
  // the oldest point: the window is as long as the history.
  const int64_t start_ns = now_ns - window_ns_;
  Point base = points_.front();
  for (const Point& p : points_) {
    if (p.at_ns > start_ns) break;
    base = p;
  }
  if (base.at_ns < start_ns) {
    const auto gap = static_cast<uint64_t>(start_ns - base.at_ns);
    (base.in_call ? base.wait_ns : base.step_ns) += gap;
    base.at_ns = start_ns;
  }
  const uint64_t wait = Minus(now.wait_ns, base.wait_ns);
  const uint64_t step = Minus(now.step_ns, base.step_ns);
  figure.window_seconds = Seconds(static_cast<uint64_t>(std::max<int64_t>(0, now_ns - base.at_ns)));
  figure.wait_seconds = Seconds(wait);
  figure.step_seconds = Seconds(step);
  if (wait + step > 0) {
    figure.input_bound = static_cast<double>(wait) / static_cast<double>(wait + step);
  }
  figure.read_ahead_seconds = Seconds(Minus(now.read_ahead_ns, base.read_ahead_ns));
  uint64_t busy = 0;
  std::array<uint64_t, kProducerPhases> phase{};
  for (size_t i = 0; i < kProducerPhases; ++i) {
    phase[i] = Minus(now.phase_ns[i], base.phase_ns[i]);
    busy += phase[i];
  }
  if (busy > 0) {
    for (size_t i = 0; i < kProducerPhases; ++i) {
      figure.wait_on_seconds[i] =
          figure.wait_seconds * static_cast<double>(phase[i]) / static_cast<double>(busy);
    }
  }
  return figure;
}

}  // namespace ringloader::server
