// SPDX-License-Identifier: Apache-2.0
#pragma once
// The status page metrics_listen serves at "/": one self-contained HTML page (no scripts, fonts
// or anything fetched from elsewhere: training hosts are often offline) with the daemon's line,
// a row per stream as `ringloaderctl top` shows them, and plots of each stream's images/s and
// input-bound over the last 15 minutes (StatusHistory), drawn as inline SVG. It reloads itself
// every 5 s. Every text that came from a client (its name) is escaped.

#include <cstdint>
#include <string>
#include <vector>

#include "proto/ringloader.pb.h"
#include "server/daemon/status_history.h"

namespace ringloader::server {

std::string StatusPage(const v1::GetStatsResponse& stats,
                       const std::vector<StatusHistory::Series>& history, int64_t now_ns);

// `text` safe inside HTML text and attribute values.
std::string HtmlEscape(std::string_view text);

}  // namespace ringloader::server
