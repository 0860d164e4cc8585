// SPDX-License-Identifier: Apache-2.0
#pragma once
// StatusHistory: the last 15 minutes of each stream's images/s and input-bound, a point every
// 5 s, for the status page's plots. Bounded: at most kMaxStreams streams (the newest), each with
// at most kPoints points; a stream gone for the whole span is forgotten.
//
// Thread-safety: thread-safe.

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "proto/ringloader.pb.h"

namespace ringloader::server {

class StatusHistory {
 public:
  static constexpr int64_t kEveryNs = 5'000'000'000;
  static constexpr int64_t kSpanNs = 15 * 60 * kEveryNs / 5;  // 15 minutes
  static constexpr size_t kPoints = kSpanNs / kEveryNs;
  static constexpr size_t kMaxStreams = 64;

  struct Point {
    int64_t at_ns = 0;
    double images_per_second = -1;  // -1: not known (a stream's first point)
    double input_bound = -1;        // -1: not known
  };
  struct Series {
    uint64_t stream_id = 0;
    std::string client;  // the client's name, escaped (wire::EscapeBytes)
    std::string dataset;
    std::vector<Point> points;  // oldest first
  };

  // Whether a point is due at `now_ns` (the caller then builds the stats and calls Record).
  bool Due(int64_t now_ns) const;
  // Adds a point per stream in `stats` at `now_ns`.
  void Record(const v1::GetStatsResponse& stats, int64_t now_ns);
  // Every stream's series, by stream id.
  std::vector<Series> Read() const;

 private:
  struct Stream {
    Series series;
    uint64_t served = 0;  // samples_served at the last point
    int64_t last_seen_ns = 0;
  };
  mutable std::mutex mu_;
  int64_t last_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<uint64_t, Stream> streams_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ringloader::server
