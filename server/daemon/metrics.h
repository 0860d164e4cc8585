// SPDX-License-Identifier: Apache-2.0
#pragma once
// server.metrics_listen: Prometheus' GET /metrics over HTTP, in the text exposition format
// (prometheus-cpp's serializer), served by an HttpEndpoint: one epoll thread for every
// connection, so idle or trickling clients never hold up a scrape. Nothing is counted twice: every scrape reads
// the counters the daemon keeps anyway (StreamManager::Stats, as `ringloaderctl stats` shows
// them, and the progress watch's decode-latency histogram), so every series exists from the
// first scrape, at 0, and agrees with `stats`.
//
// Series, each prefixed "ringloader_":
//   counters   batches_served_total, images_decoded_total, bytes_served_total,
//              decode_errors_total{reason} (every reason image::kErrorReasons lists, and any other
//              seen), quarantines_total, requests_rejected_total, daemon_restarts_total (starts
//              after an unclean exit, kept in state_dir), batches_copied_out_total,
//              decode_threads_abandoned_total, opens_abandoned_total,
//              cache_hits_total
//   gauges     serving (1 once the datasets are indexed), streams_open, ring_slots{state =
//              free|filling|ready|leased}, quarantined_samples, memory_limit_bytes,
//              memory_reserved_bytes, memory_decoding_bytes, resident_memory_bytes, cache_bytes
//   histogram  decode_duration_seconds (after the read: label, tensors and decode)
//
// Thread-safety: the endpoint's thread collects; StreamManager and ProgressWatch are thread-safe.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/metric_family.h"
#include "server/daemon/http_endpoint.h"

namespace ringloader::server {

class StreamManager;
class ProgressWatch;

struct MetricsSources {
  StreamManager* streams = nullptr;
  const ProgressWatch* progress = nullptr;
};

// The families one scrape serves.
std::vector<prometheus::MetricFamily> CollectMetrics(const MetricsSources& sources);

class MetricsEndpoint {
 public:
  // Listens on `listen` ("HOST:PORT"). Unavailable naming the address when it cannot.
  // `max_connections`: scrapers' connections at once (each an open file; open_files.h).
  static absl::StatusOr<std::unique_ptr<MetricsEndpoint>> Start(
      const std::string& listen, MetricsSources sources,
      unsigned max_connections = HttpEndpoint::kMaxConnections);
  ~MetricsEndpoint();  // stops serving before the sources go
  int port() const;

 private:
  MetricsEndpoint() = default;
  std::unique_ptr<HttpEndpoint> http_;
};

}  // namespace ringloader::server
