// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/top_view.h"

#include <algorithm>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/wire_text.h"
#include "shm/base/text.h"

namespace ringloader::ctl {
namespace {

// The first `n` characters of UTF-8 `text` (never half of one; EscapeBytes made it valid).
std::string Cut(std::string_view text, size_t n) {
  size_t end = 0;
  for (size_t chars = 0; end < text.size() && chars < n; ++chars) {
    ++end;
    while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
  }
  return std::string(text.substr(0, end));
}

}  // namespace

std::string InputBoundCell(const v1::StreamStats& st) {
  if (st.input_bound() < 0) return "-";
  const std::string& words = st.input_bound_words();
  return absl::StrFormat("%.0f%% %s", 100 * st.input_bound(),
                         words.substr(0, std::min(words.find(' '), words.size())));
}

bool TopSortForKey(char key, TopSort* sort) {
  switch (key) {
    case 'i':
      *sort = TopSort::kInputBound;
      return true;
    case 'r':
      *sort = TopSort::kRate;
      return true;
    case 'c':
      *sort = TopSort::kClient;
      return true;
    case 'd':
      *sort = TopSort::kDataset;
      return true;
    case 'n':
      *sort = TopSort::kId;
      return true;
    default:
      return false;
  }
}

const char* TopSortName(TopSort sort) {
  switch (sort) {
    case TopSort::kInputBound:
      return "input-bound";
    case TopSort::kRate:
      return "images/s";
    case TopSort::kClient:
      return "client";
    case TopSort::kDataset:
      return "dataset";
    case TopSort::kId:
      return "id";
  }
  return "?";
}

void TopView::Update(const v1::GetStatsResponse& stats, double now_seconds) {
  const double dt = now_seconds - at_;
  std::map<uint64_t, uint64_t> served;
  std::map<uint64_t, double> rate;
  for (const v1::StreamStats& st : stats.streams()) {
    served[st.stream_id()] = st.samples_served();
    auto before = served_before_.find(st.stream_id());
    if (before != served_before_.end() && dt > 0 && st.samples_served() >= before->second) {
      rate[st.stream_id()] = static_cast<double>(st.samples_served() - before->second) / dt;
    }
  }
  served_before_ = std::move(served);
  rate_ = std::move(rate);
  stats_ = stats;
  at_ = now_seconds;
}

std::string TopView::Render(const std::string& endpoint, TopSort sort, int rows,
                            int columns) const {
  const v1::GetStatsResponse& s = stats_;
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat(
      "ringloaderd %s  pid %d  up %ds  %d streams  %.0f images/s  %d restarts", endpoint, s.pid(),
      s.uptime_ms() / 1000, s.streams_open(), s.images_per_second(), s.daemon_restarts()));
  const double read_ms = s.samples_read() > 0
                             ? 1000 * s.read_wait_seconds() / static_cast<double>(s.samples_read())
                             : 0;
  const double decode_ms =
      s.samples_decoded() > 0 ? 1000 * s.decode_seconds() / static_cast<double>(s.samples_decoded())
                              : 0;
  lines.push_back(absl::StrFormat(
      "decode threads %d/%d busy  read wait %.1f ms/sample (decode %.1f)  memory %s of %s  "
      "quarantined %d  errors %d",
      s.decode_threads_busy(), s.decode_threads(), read_ms, decode_ms,
      base::FormatBytes(s.memory_reserved_bytes()), base::FormatBytes(s.memory_limit_bytes()),
      s.quarantined_size(), s.decode_errors()));
  lines.push_back(
      absl::StrFormat("sort: %s (i input-bound, r images/s, c client, d dataset, n id; q quits)",
                      TopSortName(sort)));
  lines.push_back("");
  lines.push_back(absl::StrFormat("%-6s %-20s %-14s %-6s %9s %-17s %-7s %s", "ID", "CLIENT",
                                  "DATASET", "RANK", "IMAGES/S", "INPUT-BOUND", "READY", "ERRORS"));
  std::vector<const v1::StreamStats*> streams;
  for (const v1::StreamStats& st : s.streams()) streams.push_back(&st);
  const auto rate = [&](const v1::StreamStats* st) {
    auto it = rate_.find(st->stream_id());
    return it == rate_.end() ? 0.0 : it->second;
  };
  std::stable_sort(streams.begin(), streams.end(),
                   [&](const v1::StreamStats* a, const v1::StreamStats* b) {
                     switch (sort) {
                       case TopSort::kInputBound:
                         return a->input_bound() > b->input_bound();
                       case TopSort::kRate:
                         return rate(a) > rate(b);
                       case TopSort::kClient:
                         return a->client_name() < b->client_name();
                       case TopSort::kDataset:
                         return a->dataset() < b->dataset();
                       case TopSort::kId:
                         return a->stream_id() < b->stream_id();
                     }
                     return false;
                   });
  for (const v1::StreamStats* st : streams) {
    lines.push_back(absl::StrFormat(
        "%-6d %-20s %-14s %-6s %9.0f %-17s %-7s %d", st->stream_id(),
        st->client_name().empty() ? "-" : Cut(wire::EscapeBytes(st->client_name()), 20),
        Cut(st->dataset(), 14), absl::StrCat(st->rank(), "/", st->world_size()), rate(st),
        InputBoundCell(*st), absl::StrCat(st->slots_ready(), "/", st->slots_total()),
        st->samples_skipped()));
  }
  std::ostringstream out;
  for (int i = 0; i < static_cast<int>(lines.size()) && i < rows; ++i) {
    out << Cut(lines[i], static_cast<size_t>(std::max(columns, 0))) << "\n";
  }
  return out.str();
}

}  // namespace ringloader::ctl
