// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/status_page.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/wire_text.h"
#include "shm/base/text.h"

namespace ringloader::server {
namespace {

constexpr int kWidth = 900;
constexpr int kHeight = 180;
constexpr const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                   "#9467bd", "#8c564b", "#e377c2", "#17becf"};

const char* ColorOf(size_t i) { return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))]; }

// A round top for an axis at or above `max`: 1, 2 or 5 times a power of ten.
double NiceTop(double max) {
  if (max <= 0) return 1;
  const double power = std::pow(10.0, std::floor(std::log10(max)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (m * power >= max) return m * power;
  }
  return 10 * power;
}

// One plot: a line per stream of `value(point)` (negative values are gaps), over the span.
template <typename Value>
std::string Plot(const std::string& id, const std::string& title,
                 const std::vector<StatusHistory::Series>& history, int64_t now_ns, double top,
                 const std::string& top_label, double mark, Value value) {
  std::string svg = absl::StrFormat(
      "<figure><figcaption>%s (top: %s)</figcaption>\n<svg id=\"%s\" "
      "xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\">"
      "<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"#fafafa\" stroke=\"#ccc\"/>",
      title, top_label, id, kWidth, kHeight, kWidth, kHeight, kWidth, kHeight);
  if (mark > 0 && mark < top) {
    const double y = kHeight * (1 - mark / top);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"0\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#b00\" "
                          "stroke-dasharray=\"4 4\"/>",
                          y, kWidth, y);
  }
  const double start = static_cast<double>(now_ns - StatusHistory::kSpanNs);
  for (size_t i = 0; i < history.size(); ++i) {
    std::string points;
    for (const StatusHistory::Point& p : history[i].points) {
      const double v = value(p);
      if (v < 0) continue;
      const double x = kWidth * (static_cast<double>(p.at_ns) - start) /
                       static_cast<double>(StatusHistory::kSpanNs);
      const double y = kHeight * (1 - std::min(v, top) / top);
      absl::StrAppendFormat(&points, "%s%.1f,%.1f", points.empty() ? "" : " ", x, y);
    }
    if (points.empty()) continue;
    absl::StrAppendFormat(&svg,
                          "<polyline class=\"series\" data-stream=\"%d\" fill=\"none\" "
                          "stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>",
                          history[i].stream_id, ColorOf(i), points);
  }
  svg += "</svg></figure>\n";
  return svg;
}

}  // namespace

std::string HtmlEscape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string StatusPage(const v1::GetStatsResponse& s,
                       const std::vector<StatusHistory::Series>& history, int64_t now_ns) {
  std::string page =
      "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
      "<meta http-equiv=\"refresh\" content=\"5\">";
  absl::StrAppendFormat(&page, "<title>ringloaderd %d</title>", s.pid());
  page +=
      "<style>body{font:14px sans-serif;margin:1.5em;color:#222}"
      "table{border-collapse:collapse}th,td{padding:.2em .8em;border-bottom:1px solid #ddd;"
      "text-align:left}td.n{text-align:right}.highly{color:#b00;font-weight:bold}"
      ".moderately{color:#b60}figure{margin:1em 0}</style></head><body>\n";
  absl::StrAppendFormat(
      &page,
      "<h1>ringloaderd</h1>\n<p id=\"daemon\">pid %d, up %d s, %d streams, %.0f images/s, "
      "decode threads %d/%d busy, memory %s of %s, %d quarantined, %d decode errors, "
      "%d restarts</p>\n",
      s.pid(), s.uptime_ms() / 1000, s.streams_open(), s.images_per_second(),
      s.decode_threads_busy(), s.decode_threads(),
      HtmlEscape(base::FormatBytes(s.memory_reserved_bytes())),
      HtmlEscape(base::FormatBytes(s.memory_limit_bytes())), s.quarantined_size(),
      s.decode_errors(), s.daemon_restarts());
  page +=
      "<h2>Streams</h2>\n<table id=\"streams\"><tr><th>stream</th><th>client</th>"
      "<th>dataset</th><th>rank</th><th>served</th><th>input-bound</th><th>ring ready</th>"
      "<th>skipped</th></tr>\n";
  for (const v1::StreamStats& st : s.streams()) {
    const std::string bound =
        st.input_bound() < 0
            ? std::string("-")
            : absl::StrFormat("%.0f%% (%s)", 100 * st.input_bound(), st.input_bound_words());
    const std::string words = st.input_bound_words();
    absl::StrAppendFormat(
        &page,
        "<tr><td class=\"n\">%d</td><td>%s</td><td>%s</td><td>%d/%d</td><td class=\"n\">%d</td>"
        "<td class=\"%s\">%s</td><td>%d/%d</td><td class=\"n\">%d</td></tr>\n",
        st.stream_id(), HtmlEscape(wire::EscapeBytes(st.client_name())), HtmlEscape(st.dataset()),
        st.rank(), st.world_size(), st.samples_served(),
        HtmlEscape(words.substr(0, std::min(words.find(' '), words.size()))), HtmlEscape(bound),
        st.slots_ready(), st.slots_total(), st.samples_skipped());
  }
  page += "</table>\n<h2>The last 15 minutes</h2>\n<ul id=\"legend\">";
  for (size_t i = 0; i < history.size(); ++i) {
    absl::StrAppendFormat(
        &page, "<li><span style=\"color:%s\">&#9632;</span> stream %d: %s (%s)</li>", ColorOf(i),
        history[i].stream_id, HtmlEscape(history[i].client), HtmlEscape(history[i].dataset));
  }
  page += "</ul>\n";
  double most = 0;
  for (const StatusHistory::Series& series : history) {
    for (const StatusHistory::Point& p : series.points) most = std::max(most, p.images_per_second);
  }
  const double top = NiceTop(most);
  page += Plot("images-per-second", "images/s per stream", history, now_ns, top,
               absl::StrFormat("%.0f", top), 0,
               [](const StatusHistory::Point& p) { return p.images_per_second; });
  page += Plot("input-bound", "input-bound per stream (dashed: 20%, highly)", history, now_ns, 1,
               "100%", 0.2, [](const StatusHistory::Point& p) { return p.input_bound; });
  page += "</body></html>\n";
  return page;
}

}  // namespace ringloader::server
