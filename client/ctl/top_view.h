// SPDX-License-Identifier: Apache-2.0
#pragma once
// What `ringloaderctl top` draws: one daemon's streams and its own line, from successive
// GetStats answers (rates are differences between two of them). Pure text, no terminal: ctl_top
// draws it full-screen or prints it plain. Internal to ringloaderctl.

#include <cstdint>
#include <map>
#include <string>

#include "proto/ringloader.pb.h"

namespace ringloader::ctl {

// How the streams' rows are ordered.
enum class TopSort { kInputBound, kRate, kClient, kDataset, kId };

// A stream's input-bound as a table shows it: "83% highly", "12% moderately", "2% not", or "-"
// when its client does not report.
std::string InputBoundCell(const v1::StreamStats& stream);

// The key that selects `sort` ('i', 'r', 'c', 'd', 'n'), and back; false for any other key.
bool TopSortForKey(char key, TopSort* sort);
const char* TopSortName(TopSort sort);

class TopView {
 public:
  // A new answer, taken at `now_seconds` (any monotonic clock).
  void Update(const v1::GetStatsResponse& stats, double now_seconds);
  // The screen: at most `rows` lines (the daemon's lines first, then the streams' rows, as many
  // as fit), each cut to `columns` characters. `endpoint` is named in the first line.
  std::string Render(const std::string& endpoint, TopSort sort, int rows, int columns) const;

 private:
  v1::GetStatsResponse stats_;
  double at_ = 0;
  // Per stream id: samples served at the previous answer, and images/s since.
  std::map<uint64_t, uint64_t> served_before_;
  std::map<uint64_t, double> rate_;
};

}  // namespace ringloader::ctl
