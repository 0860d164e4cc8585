// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/metrics.h"

#include <exception>
#include <limits>
#include <map>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "prometheus/text_serializer.h"
#include "proto/ringloader.pb.h"
#include "proto/wire_text.h"
#include "server/daemon/progress_watch.h"
#include "server/daemon/status_page.h"
#include "server/daemon/stream_manager.h"
#include "shm/base/clock.h"
#include "server/image/sample_decoder.h"

namespace ringloader::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr char kPrefix[] = "ringloader_";

MetricFamily Family(std::string_view name, std::string_view help, MetricType type) {
  MetricFamily f;
  f.name = absl::StrCat(kPrefix, std::string(name));
  f.help = std::string(help);
  f.type = type;
  return f;
}

ClientMetric Value(MetricType type, double value,
                   std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// A family with one unlabelled series.
MetricFamily Single(std::string_view name, std::string_view help, MetricType type, double value) {
  MetricFamily f = Family(name, help, type);
  f.metric.push_back(Value(type, value));
  return f;
}

MetricFamily Histogram(std::string_view name, std::string_view help,
                       const LatencySnapshot& latency) {
  MetricFamily f = Family(name, help, MetricType::Histogram);
  ClientMetric m;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < kDecodeLatencyBounds.size(); ++i) {
    cumulative += latency.counts[i];
    m.histogram.bucket.push_back({cumulative, kDecodeLatencyBounds[i]});
  }
  m.histogram.bucket.push_back({latency.count, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = latency.count;
  m.histogram.sample_sum = latency.sum_seconds;
  f.metric.push_back(std::move(m));
  return f;
}

}  // namespace

std::vector<MetricFamily> CollectMetrics(const MetricsSources& sources) {
  v1::GetStatsResponse s;
  sources.streams->Stats(&s);
  constexpr MetricType kCounter = MetricType::Counter;
  constexpr MetricType kGauge = MetricType::Gauge;
  std::vector<MetricFamily> out;
  out.push_back(Single("batches_served_total", "Batches handed to trainers", kCounter,
                       static_cast<double>(s.batches_served())));
  out.push_back(Single("images_decoded_total", "Samples decoded into ring slots", kCounter,
                       static_cast<double>(s.images_decoded())));
  out.push_back(Single("bytes_served_total", "Payload bytes of the batches handed to trainers",
                       kCounter, static_cast<double>(s.bytes_served())));
  MetricFamily errors =
      Family("decode_errors_total", "Samples that failed, by reason", kCounter);
  std::map<std::string, uint64_t> by_reason;
  for (std::string_view reason : image::kErrorReasons) by_reason[std::string(reason)] = 0;
  for (const auto& [reason, count] : s.decode_errors_by_reason()) by_reason[reason] = count;
  for (const auto& [reason, count] : by_reason) {
    errors.metric.push_back(Value(kCounter, static_cast<double>(count), {{"reason", reason}}));
  }
  out.push_back(std::move(errors));
  out.push_back(Single("quarantines_total", "Samples this daemon put into quarantine", kCounter,
                       static_cast<double>(s.quarantines())));
  out.push_back(Single("requests_rejected_total", "Invalid requests answered with an error",
                       kCounter, static_cast<double>(s.requests_rejected())));
  out.push_back(Single("opens_abandoned_total",
                       "Stream opens dropped because the client stopped waiting for them",
                       kCounter, static_cast<double>(s.opens_abandoned())));
  out.push_back(Single("daemon_restarts_total",
                       "Times the daemon started after its previous incarnation died without "
                       "shutting down cleanly (kept in state_dir)", kCounter,
                       static_cast<double>(s.daemon_restarts())));
  out.push_back(Single("batches_copied_out_total", "Held batches trainers copied out of rings",
                       kCounter, static_cast<double>(s.batches_copied_out())));
  out.push_back(Single("decode_threads_abandoned_total",
                       "Decode threads left stuck in a read past decode_deadline_ms", kCounter,
                       static_cast<double>(s.decode_threads_abandoned())));
  out.push_back(Single("decode_threads_stuck", "Of those, the threads still stuck now", kGauge,
                       static_cast<double>(s.decode_threads_stuck())));

  MetricFamily stalled = Family(
      "storage_stalled",
      "1 while a dataset's storage does not answer (reads overdue, no witness): nothing is "
      "skipped or struck, its streams wait", kGauge);
  MetricFamily stalls =
      Family("storage_stalls_total", "Times a dataset's storage stopped answering", kCounter);
  MetricFamily stuck = Family(
      "reads_stuck", "Reads given up as poison (past decode_deadline_ms) and still running now",
      kGauge);
  for (const v1::DatasetStats& d : s.datasets()) {
    stalled.metric.push_back(Value(kGauge, d.storage_stalled() ? 1 : 0, {{"dataset", d.name()}}));
    stalls.metric.push_back(
        Value(kCounter, static_cast<double>(d.storage_stalls()), {{"dataset", d.name()}}));
    stuck.metric.push_back(
        Value(kGauge, static_cast<double>(d.reads_stuck()), {{"dataset", d.name()}}));
  }
  out.push_back(std::move(stalled));
  out.push_back(std::move(stalls));
  out.push_back(std::move(stuck));
  out.push_back(Single("serving", "1 once the datasets are indexed and streams are served", kGauge,
                       s.starting() ? 0 : 1));
  out.push_back(Single("streams_open", "Open streams", kGauge,
                       static_cast<double>(s.streams_open())));
  uint64_t free = 0, filling = 0, ready = 0, leased = 0;
  for (const v1::StreamStats& st : s.streams()) {
    filling += st.slots_filling();
    ready += st.slots_ready();
    leased += st.slots_leased();
    const uint64_t busy = uint64_t{st.slots_filling()} + st.slots_ready() + st.slots_leased();
    free += st.slots_total() > busy ? st.slots_total() - busy : 0;
  }
  // Whether each stream's trainer is input-bound (TrainerClock), labelled by stream, its client's
  // name (escaped: it is the client's text) and dataset.
  MetricFamily wait = Family("trainer_wait_seconds_total",
                             "Time trainers waited inside Next() for batches, as their clients "
                             "report it (since the stream opened)",
                             kCounter);
  MetricFamily step = Family("trainer_step_seconds_total",
                             "Time trainers spent between Next() calls (their steps)", kCounter);
  MetricFamily bound = Family(
      "trainer_input_bound",
      "Share of the last minute a stream's trainer waited for batches, wait / (wait + step), "
      "0..1 (streams whose client reports it)",
      kGauge);
  for (const v1::StreamStats& st : s.streams()) {
    const std::vector<ClientMetric::Label> labels = {
        {"stream", std::to_string(st.stream_id())},
        {"client", wire::EscapeBytes(st.client_name())},
        {"dataset", st.dataset()}};
    wait.metric.push_back(Value(kCounter, st.trainer_wait_seconds(), labels));
    step.metric.push_back(Value(kCounter, st.trainer_step_seconds(), labels));
    if (st.input_bound() >= 0) bound.metric.push_back(Value(kGauge, st.input_bound(), labels));
  }
  out.push_back(std::move(wait));
  out.push_back(std::move(step));
  out.push_back(std::move(bound));
  MetricFamily slots = Family("ring_slots", "Ring slots of all streams, by state", kGauge);
  for (const auto& [state, count] : {std::pair<const char*, uint64_t>{"free", free},
                                     {"filling", filling},
                                     {"ready", ready},
                                     {"leased", leased}}) {
    slots.metric.push_back(Value(kGauge, static_cast<double>(count), {{"state", state}}));
  }
  out.push_back(std::move(slots));
  out.push_back(Single("cache_hits_total", "Eval samples copied from the cache, not decoded",
                       kCounter, static_cast<double>(s.cache().hits())));
  out.push_back(Single("cache_bytes", "Bytes the eval cache holds (reserved from memory_limit)",
                       kGauge, static_cast<double>(s.cache().bytes())));
  out.push_back(Single("quarantined_samples", "Samples in quarantine (skipped)", kGauge,
                       static_cast<double>(s.quarantined_size())));
  out.push_back(Single("memory_limit_bytes", "server.memory_limit", kGauge,
                       static_cast<double>(s.memory_limit_bytes())));
  out.push_back(Single("memory_reserved_bytes",
                       "Reserved from memory_limit: rings, indexes and decodes in flight", kGauge,
                       static_cast<double>(s.memory_reserved_bytes())));
  out.push_back(Single("memory_decoding_bytes", "The part of the reservation decodes hold now",
                       kGauge, static_cast<double>(s.memory_decoding_bytes())));
  out.push_back(Single("resident_memory_bytes", "Resident set size of the daemon", kGauge,
                       static_cast<double>(s.rss_bytes())));
  out.push_back(Single("heap_bytes", "Bytes malloc took from the system (arenas and mmapped blocks)",
                       kGauge, static_cast<double>(s.heap_bytes())));
  out.push_back(Single("heap_free_bytes",
                       "Of heap_bytes, free in malloc's arenas: kept for reuse, or fragmented",
                       kGauge, static_cast<double>(s.heap_free_bytes())));
  if (s.has_tls()) {
    MetricFamily days = Family("tls_certificate_days_left",
                               "Days until [tls]'s certificate and CA expire (as last loaded)",
                               kGauge);
    days.metric.push_back(Value(kGauge, s.tls().cert_days_left(), {{"certificate", "cert"}}));
    days.metric.push_back(Value(kGauge, s.tls().ca_days_left(), {{"certificate", "ca"}}));
    out.push_back(std::move(days));
    out.push_back(Single("tls_clients_refused_total",
                         "Calls refused for their client certificate (other CA, expired, a name "
                         "not allowed)",
                         kCounter, static_cast<double>(s.tls().clients_refused())));
    out.push_back(Single("tls_reload_failed",
                         "1 while the latest SIGHUP's certificate files were refused", kGauge,
                         s.tls().last_reload_error().empty() ? 0 : 1));
  }
  if (s.feeders_size() > 0) {
    MetricFamily samples = Family("feeder_samples_total",
                                  "Samples a feeder decoded that this host delivered", kCounter);
    MetricFamily failures = Family(
        "feeder_lease_failures_total",
        "Leases a feeder did not answer in time or in full: their samples were decoded elsewhere",
        kCounter);
    MetricFamily up = Family("feeder_up", "1 while a feeder is given leases (not paused, not gone)",
                             kGauge);
    MetricFamily round_trip = Family("feeder_round_trip_seconds",
                                     "A lease's time from sending to its last byte (moving average)",
                                     kGauge);
    MetricFamily cert_days = Family("feeder_cert_days_left",
                                    "Days to a feeder's certificate's notAfter, as its latest "
                                    "answered lease showed it",
                                    kGauge);
    for (const v1::FeederStatus& f : s.feeders()) {
      const std::string& a = f.address();
      samples.metric.push_back(Value(kCounter, static_cast<double>(f.samples()), {{"feeder", a}}));
      failures.metric.push_back(
          Value(kCounter, static_cast<double>(f.lease_failures()), {{"feeder", a}}));
      up.metric.push_back(Value(kGauge, f.state() == "up" ? 1 : 0, {{"feeder", a}}));
      round_trip.metric.push_back(Value(kGauge, f.round_trip_ms() / 1e3, {{"feeder", a}}));
      if (f.has_cert_days_left()) {
        cert_days.metric.push_back(Value(kGauge, f.cert_days_left(), {{"feeder", a}}));
      }
    }
    out.push_back(std::move(samples));
    out.push_back(std::move(failures));
    out.push_back(std::move(up));
    out.push_back(std::move(round_trip));
    if (!cert_days.metric.empty()) out.push_back(std::move(cert_days));
    out.push_back(Single("feeder_fallback_samples_total",
                         "Samples decoded on this host only because no feeder could take them "
                         "(server.local_decode = false)",
                         kCounter, static_cast<double>(s.feeder_fallback_samples())));
    out.push_back(Single("feeder_ahead_samples_total",
                         "Good samples this host decoded for rounds to come while its feeders' "
                         "answers were late",
                         kCounter, static_cast<double>(s.samples_decoded_ahead())));
  }
  if (sources.progress != nullptr) {
    out.push_back(Histogram("decode_duration_seconds",
                            "Time from a sample's committed read to its decoded pixels in the slot",
                            sources.progress->latency()));
    out.push_back(Histogram("read_seconds",
                            "Time a decode thread waited for a sample's read (its file opened and "
                            "read): near 0 while the read-ahead (server.io_depth) keeps up",
                            sources.progress->read_wait()));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, MetricsSources sources, unsigned max_connections) {
  auto endpoint = std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint());
  HttpEndpoint::Page metrics;
  metrics.path = "/metrics";
  metrics.content_type = "text/plain; version=0.0.4; charset=utf-8";
  metrics.respond = [sources] {
    return prometheus::TextSerializer().Serialize(CollectMetrics(sources));
  };
  HttpEndpoint::Page status;
  status.path = "/";
  status.content_type = "text/html; charset=utf-8";
  status.respond = [sources] {
    v1::GetStatsResponse stats;
    sources.streams->Stats(&stats);
    return StatusPage(stats, sources.streams->history().Read(), base::SteadyNowNs());
  };
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http =
      HttpEndpoint::Start(listen, {std::move(metrics), std::move(status)}, max_connections);
  if (!http.ok()) {
    return absl::UnavailableError(
        absl::StrCat("server.metrics_listen: ", http.status().message()));
  }
  endpoint->http_ = *std::move(http);
  return endpoint;
}

MetricsEndpoint::~MetricsEndpoint() {
  http_.reset();  // no scrape runs past here
}

int MetricsEndpoint::port() const { return http_->port(); }

}  // namespace ringloader::server
