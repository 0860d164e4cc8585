// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/status_history.h"

#include "proto/wire_text.h"

namespace ringloader::server {

bool StatusHistory::Due(int64_t now_ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_ns_ == 0 || now_ns - last_ns_ >= kEveryNs;
}

void StatusHistory::Record(const v1::GetStatsResponse& stats, int64_t now_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const v1::StreamStats& st : stats.streams()) {
    auto [it, added] = streams_.try_emplace(st.stream_id());
    Stream& s = it->second;
    Point point;
    point.at_ns = now_ns;
    point.input_bound = st.input_bound();
    if (added) {
      s.series.stream_id = st.stream_id();
      s.series.client = wire::EscapeBytes(st.client_name());
      s.series.dataset = st.dataset();
    } else if (now_ns > s.last_seen_ns && st.samples_served() >= s.served) {
      point.images_per_second = static_cast<double>(st.samples_served() - s.served) * 1e9 /
                                static_cast<double>(now_ns - s.last_seen_ns);
    }
    s.served = st.samples_served();
    s.last_seen_ns = now_ns;
    s.series.points.push_back(point);
    if (s.series.points.size() > kPoints) s.series.points.erase(s.series.points.begin());
  }
  // Forget streams gone for the whole span, then the oldest beyond kMaxStreams.
  for (auto it = streams_.begin(); it != streams_.end();) {
    it = now_ns - it->second.last_seen_ns > kSpanNs ? streams_.erase(it) : std::next(it);
  }
  while (streams_.size() > kMaxStreams) streams_.erase(streams_.begin());
  last_ns_ = now_ns;
}

std::vector<StatusHistory::Series> StatusHistory::Read() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Series> out;
  for (const auto& [id, s] : streams_) out.push_back(s.series);
  return out;
}

}  // namespace ringloader::server
