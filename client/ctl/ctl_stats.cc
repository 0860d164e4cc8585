// SPDX-License-Identifier: Apache-2.0
// ringloaderctl stats: GetStats as a table or as JSON.
#include <unistd.h>

#include <chrono>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "proto/wire_text.h"
#include "absl/strings/str_join.h"
#include "client/channel.h"
#include "client/ctl/ctl.h"
#include "client/ctl/rpc.h"
#include "client/ctl/top_view.h"
#include "google/protobuf/util/json_util.h"
#include "proto/ringloader.grpc.pb.h"
#include "shm/base/text.h"

namespace ringloader::ctl {
namespace {

std::string Duration(uint64_t ms) {
  const uint64_t s = ms / 1000;
  return absl::StrFormat("%dh%02dm%02ds", s / 3600, (s / 60) % 60, s % 60);
}

void PrintTable(const v1::GetStatsResponse& s, const std::string& endpoint, std::ostream& out) {
  out << absl::StrFormat("ringloaderd %s  pid %d  incarnation %x  up %s\n", endpoint, s.pid(),
                         s.incarnation(), Duration(s.uptime_ms()));
  if (s.starting()) out << absl::StrFormat("%-20s %s\n", "starting", s.starting_progress());
  out << absl::StrFormat("%-20s %d\n", "streams open", s.streams_open());
  out << absl::StrFormat("%-20s %d\n", "batches served", s.batches_served());
  out << absl::StrFormat("%-20s %s\n", "bytes served", base::FormatBytes(s.bytes_served()));
  out << absl::StrFormat("%-20s %d\n", "batches copied out", s.batches_copied_out());
  out << absl::StrFormat("%-20s %d\n", "images decoded", s.images_decoded());
  out << absl::StrFormat("%-20s %.1f\n", "images/s", s.images_per_second());
  if (s.samples_read() > 0 && s.samples_decoded() > 0) {
    out << absl::StrFormat(
        "%-20s %.2f ms a sample (decode %.2f ms); io_depth %d, %d reads in flight, %s read ahead\n",
        "read wait", 1000 * s.read_wait_seconds() / s.samples_read(),
        1000 * s.decode_seconds() / s.samples_decoded(), s.io_depth(), s.reads_in_flight(),
        base::FormatBytes(s.read_ahead_bytes()));
  }
  if (s.read_files_limit() > 0) {
    out << absl::StrFormat("%-20s %d of %d for reads ahead (at most %d so far%s); limit %d\n",
                           "open files", s.read_files_held(), s.read_files_limit(),
                           s.read_files_peak(),
                           s.read_files_refused() > 0
                               ? absl::StrFormat(", %d reads waited for one",
                                                 s.read_files_refused())
                               : "",
                           s.open_files_limit());
  }
  std::vector<std::string> reasons;
  std::map<std::string, uint64_t> by_reason(s.decode_errors_by_reason().begin(),
                                            s.decode_errors_by_reason().end());
  for (const auto& [reason, count] : by_reason) reasons.push_back(absl::StrCat(reason, " ", count));
  out << absl::StrFormat("%-20s %d%s\n", "decode errors", s.decode_errors(),
                         reasons.empty() ? "" : "  (" + absl::StrJoin(reasons, ", ") + ")");
  out << absl::StrFormat("%-20s %d\n", "requests rejected", s.requests_rejected());
  if (s.opens_abandoned() != 0) {
    out << absl::StrFormat("%-20s %d\n", "opens abandoned", s.opens_abandoned());
  }
  out << absl::StrFormat("%-20s %s\n", "rss", base::FormatBytes(s.rss_bytes()));
  if (s.heap_bytes() > 0) {
    out << absl::StrFormat("%-20s %s from the system, %s of it free; %d arenas\n", "heap",
                           base::FormatBytes(s.heap_bytes()), base::FormatBytes(s.heap_free_bytes()),
                           s.heap_arenas());
  }
  out << absl::StrFormat("%-20s %s reserved of %s\n", "memory limit",
                         base::FormatBytes(s.memory_reserved_bytes()),
                         s.memory_limit_bytes() == 0 ? "unlimited" : base::FormatBytes(s.memory_limit_bytes()));
  out << absl::StrFormat("%-20s %d\n", "quarantined", s.quarantined_size());
  if (s.has_tls()) {
    const v1::TlsStatus& t = s.tls();
    out << absl::StrFormat("%-20s certificate %s, %.0f days left; CA %.0f days left; %d clients "
                           "refused%s%s\n",
                           "tls", t.cert_subject(), t.cert_days_left(), t.ca_days_left(),
                           t.clients_refused(),
                           t.last_refusal().empty() ? "" : " (latest: " + t.last_refusal() + ")",
                           t.last_reload_error().empty()
                               ? ""
                               : "; the latest SIGHUP's files were refused: " +
                                     t.last_reload_error());
  }
  for (const v1::FeederStatus& f : s.feeders()) {
    out << absl::StrFormat("%-20s %s (%s): %s; %d samples, %d leases, %d failed, %.1f ms round "
                           "trip, %.0f samples/s%s%s%s%s\n",
                           "feeder", f.address(), f.configured(), f.state(), f.samples(),
                           f.calls(), f.lease_failures(), f.round_trip_ms(),
                           f.samples_per_second(),
                           f.transport().empty() ? "" : " over " + f.transport(),
                           f.has_cert_days_left()
                               ? absl::StrFormat("; certificate %s, %.0f days left",
                                                 f.cert_subject(), f.cert_days_left())
                               : "",
                           f.last_error().empty() ? "" : "; latest failure: " + f.last_error(),
                           f.refused_datasets().empty()
                               ? ""
                               : "; refused: " + absl::StrJoin(f.refused_datasets(), "; "));
  }
  if (s.feeders_size() > 0) {
    out << absl::StrFormat(
        "%-20s %d samples/s here; %d decoded here for want of a feeder; %d ahead while feeders "
        "were late\n",
        "local decode", s.local_decode_rate(), s.feeder_fallback_samples(),
        s.samples_decoded_ahead());
  }
  if (s.daemon_restarts() > 0) {
    out << absl::StrFormat("%-20s %d (after an unclean exit)\n", "daemon restarts",
                           s.daemon_restarts());
  }

  if (s.has_cache() && (s.cache().entries() > 0 || s.cache().misses() > 0)) {
    const v1::CacheStats& c = s.cache();
    out << absl::StrFormat("%-20s %d samples, %s of %s, %d hits, %d misses%s\n", "eval cache",
                           c.entries(), base::FormatBytes(c.bytes()),
                           base::FormatBytes(c.cap_bytes()), c.hits(), c.misses(),
                           c.full() ? "; full: it holds what fits, the rest is decoded each time"
                                    : "");
  }
  for (const v1::DatasetStats& d : s.datasets()) {
    out << absl::StrFormat("dataset %s: %s, %d samples", d.name(), d.format(), d.samples());
    if (d.classes() > 0) out << absl::StrFormat(", %d classes", d.classes());
    if (d.ignored_files() > 0) {
      out << absl::StrFormat("; ignored %d file%s without an image extension", d.ignored_files(),
                             d.ignored_files() == 1 ? "" : "s");
      if (d.ignored_examples_size() > 0) out << ", e.g. " << d.ignored_examples(0);
    }
    if (d.storage_stalled()) {
      out << absl::StrFormat("; STORAGE STALLED for %.1f s (%d reads waiting; nothing skipped)",
                             d.storage_stalled_ms() / 1000.0, d.reads_in_flight());
    }
    if (d.storage_stalls() > 0) out << absl::StrFormat("; %d storage stalls", d.storage_stalls());
    if (d.reads_stuck() > 0) out << absl::StrFormat("; %d reads stuck", d.reads_stuck());
    out << "\n";
  }

  if (s.streams_size() > 0) {
    out << "\nstreams:\n";
    out << absl::StrFormat("  %-6s %-16s %-16s %-6s %-6s %-22s %-10s %-12s %-10s %-7s %s\n", "ID",
                           "DATASET", "CLIENT", "RANK", "BATCH", "SLOTS rdy/lsd/fil/tot",
                           "SERVED", "EPOCH:SEQ", "RING", "COPIED", "INPUT-BOUND");
    for (const v1::StreamStats& st : s.streams()) {
      out << absl::StrFormat(
          "  %-6d %-16s %-16s %-6s %-6d %-22s %-10d %-12s %-10s %-7d %s\n", st.stream_id(),
          st.dataset(), st.client_name().empty() ? "-" : wire::EscapeBytes(st.client_name()),
          absl::StrCat(st.rank(), "/", st.world_size()), st.batch_size(),
          absl::StrCat(st.slots_ready(), "/", st.slots_leased(), "/", st.slots_filling(), "/",
                       st.slots_total()),
          st.batches_served(), absl::StrCat(st.position().epoch(), ":", st.position().sequence()),
          base::FormatBytes(st.ring_bytes()), st.batches_copied_out(), InputBoundCell(st));
    }
    // Where the input-bound streams' waits went.
    for (const v1::StreamStats& st : s.streams()) {
      if (st.input_bound() < 0.05 || st.trainer_wait_seconds() <= 0) continue;
      out << absl::StrFormat(
          "  stream %d waited %.1f s of the last %.0f s: reads %.1f s (%.1f s more done ahead), "
          "decode %.1f s, memory %.1f s, delivery %.1f s\n",
          st.stream_id(), st.input_bound() * st.input_window_seconds(),
          st.input_window_seconds(), st.wait_on_read_seconds(), st.read_ahead_seconds(),
          st.wait_on_decode_seconds(), st.wait_on_memory_seconds(),
          st.wait_on_delivery_seconds());
    }
  }
  if (s.recent_bad_files_size() > 0) {
    out << "\nrecent bad files:\n";
    for (const v1::BadFile& f : s.recent_bad_files()) {
      out << "  " << f.dataset() << " " << f.path() << ": " << f.reason() << ": " << f.message()
          << "\n";
    }
  }
  if (s.damaged_files_size() > 0) {
    out << "\ndamaged files (the rest of each is not served):\n";
    for (const v1::BadFile& f : s.damaged_files()) {
      out << "  " << f.dataset() << " " << f.path() << ": " << f.reason() << ": " << f.message()
          << "\n";
    }
  }
  if (s.quarantined_size() > 0) {
    out << "\nquarantined samples:\n";
    for (const v1::QuarantinedSample& q : s.quarantined()) {
      out << "  " << q.dataset() << " #" << q.sample_index() << " " << q.path() << " ("
          << q.strikes() << " strikes)\n";
    }
  }
}


int RunStatsOnce(const StatsOptions& options, std::ostream& out, std::ostream& err) {
  auto channel = ChannelFor(options.endpoint);
  if (!channel.ok()) {
    err << "ringloaderctl stats: " << channel.status().message() << "\n";
    return kExitUsage;
  }
  auto stub = v1::Loader::NewStub(*channel);
  grpc::ClientContext context;
  SetTimeout(context, kRpcTimeout);
  v1::GetStatsResponse response;
  grpc::Status status = stub->GetStats(&context, v1::GetStatsRequest(), &response);
  if (!status.ok()) {
    err << "ringloaderctl stats: " << options.endpoint << ": " << Describe(status);
    if (ExitCodeFor(status) == kExitUnavailable) {
      err << "; " << client::DiagnoseNoConnection(options.endpoint);
    }
    err << "\n";
    return ExitCodeFor(status);
  }
  if (options.json) {
    google::protobuf::util::JsonPrintOptions print;
    print.add_whitespace = true;
    print.always_print_primitive_fields = true;
    print.preserve_proto_field_names = true;
    std::string json;
    auto converted = google::protobuf::util::MessageToJsonString(response, &json, print);
    if (!converted.ok()) {
      err << "ringloaderctl stats: " << converted.ToString() << "\n";
      return kExitFailure;
    }
    out << json;
    if (json.empty() || json.back() != '\n') out << "\n";
  } else {
    PrintTable(response, options.endpoint, out);
  }
  return kExitOk;
}

}  // namespace

int RunStats(const StatsOptions& options, std::ostream& out, std::ostream& err) {
  if (!options.watch) return RunStatsOnce(options, out, err);
  for (uint64_t i = 0; options.watch_count == 0 || i < options.watch_count; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::seconds(1));
    std::ostringstream frame;  // drawn at once, so the screen never shows half a table
    if (options.clear) frame << "\033[H\033[2J";
    const int code = RunStatsOnce(options, frame, err);
    if (code != kExitOk) return code;
    if (!options.clear && i > 0) out << "\n";
    out << frame.str() << std::flush;
  }
  return kExitOk;
}

}  // namespace ringloader::ctl
