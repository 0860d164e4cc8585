// SPDX-License-Identifier: Apache-2.0
#pragma once
// ringloaderd's configuration: one typed struct, parsed and validated once at start-up from TOML
// (see config/ringloaderd.toml for every key with its comment), never changed afterwards.
//
// Every error names the file, the key path and the rule, e.g.
//   ringloaderd.toml: datasets[1].max_pixels: must be > 0 (got -5)
// Unknown keys are errors (a typo must not silently fall back to a default).

#include <sys/types.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"

namespace ringloader::server {

struct DatasetConfig {
  std::string name;
  pipeline::DatasetFormat format = pipeline::DatasetFormat::kImageFolder;
  std::string path;      // root of the images
  std::string manifest;  // manifest format only
  // webdataset (see pipeline::DatasetSpec): image member extensions, the label member.
  std::vector<std::string> image_key = {"jpg"};
  std::string label_key = "cls";
  // tfrecord: the Example features.
  std::string image_feature = "image/encoded";
  std::string label_feature = "image/class/label";
  int64_t label_offset = 0;
  std::string label;                 // arrays: the label column
  std::vector<std::string> ragged;   // webdataset: tensors padded per batch
  uint64_t ragged_max_rows = 0;      // webdataset: a ragged tensor's cap; 0 = the longest sample
  // cache = "memory": eval streams' decoded samples are kept (sample_cache.h) and served from
  // memory on later epochs and to other streams with the same options. false = "none".
  bool cache_memory = false;
  pipeline::OnError on_error = pipeline::OnError::kSkip;
  // The decode limits; defaults are image::DecodeLimits' (one set for the daemon and
  // `ringloaderctl validate`).
  uint64_t max_pixels = image::DecodeLimits{}.max_pixels;          // width*height above: an error
  uint64_t max_file_bytes = image::DecodeLimits{}.max_file_bytes;  // larger files: an error
  bool warnings_are_errors = image::DecodeLimits{}.warnings_are_errors;  // libjpeg warnings fail
  uint32_t max_scans = image::DecodeLimits{}.max_scans;  // progressive scans allowed per image
  bool operator==(const DatasetConfig&) const = default;
};

enum class LogFormat { kPlain, kTimestamped };

struct FailpointConfig {
  // kHang: the read of a matching sample blocks for good in a kernel read (a stuck network mount);
  // the decode deadline abandons it. kHangDecode: the decode of a matching sample blocks for good
  // after its read (a decoder caught in a loop), where no deadline reaches: the watchdog's case.
  enum class Action { kNone, kAbort, kSegfault, kOom, kHang, kHangDecode };
  Action action = Action::kNone;
  std::string crash_on_path;     // fnmatch pattern against the sample's relative path
  uint64_t after_batches = 0;    // act after this many batches published; 0 = off
  // Indexing each dataset at start-up first sleeps this long (a slow or cold network mount).
  // Independent of `action`.
  uint32_t index_delay_ms = 0;
  // The first `io_fault_times` reads of each sample file matching `io_fault_path` (fnmatch on the
  // absolute path) fail with `io_fault_errno` ("EIO", "EMFILE", "ENFILE", "ENOMEM", "EAGAIN",
  // "ESTALE", "ETIMEDOUT"), as a flaky mount would. Independent of `action`.
  std::string io_fault_path;
  std::string io_fault_errno = "EIO";
  uint32_t io_fault_times = 1;
  // The daemon acts on a client's death (its session's end) this much later: forces the order
  // "the restarted trainer asks before its predecessor's death is noticed". Independent of
  // `action`.
  uint32_t session_end_delay_ms = 0;
  // Every OpenStream waits this long after making its ring, before it answers: a slow open (a
  // ring of gigabytes) for the tests of clients that give up or reconnect meanwhile.
  // Independent of `action`.
  uint32_t open_delay_ms = 0;
  // A feeder (server.feeder_listen) lies in every answer: "checksum" (a payload byte flipped after
  // its checksum), "index" (its first sample's index is one not asked for), "label" (its first
  // sample's label is off by one, under a right checksum), "short" (a payload one byte shorter than
  // its header says), "slow" (each answer waits 3 s first). "" = honest.
  // Independent of `action`: the host must catch each and decode those samples itself.
  std::string feed_lie;
  // A host resolves its [[feeders]] names this often instead of every 30 s, forgets an address
  // gone from its name after 10 such periods (not 5 min) and asks a feeder that refused a dataset
  // again after 20 (not 10 min): tests of pods that come and go. 0 = those defaults. Independent
  // of `action`.
  uint32_t feeder_resolve_ms = 0;
  bool enabled() const { return action != Action::kNone; }
  bool operator==(const FailpointConfig&) const = default;
};

struct ServerConfig {
  std::string listen = "unix:/run/ringloader/ringloader.sock";  // "unix:PATH" or "HOST:PORT"
  // A second endpoint that serves only grpc.health.v1 (Kubernetes gRPC probes dial TCP); its
  // status follows the main one. Empty = none.
  std::string health_listen;
  mode_t socket_mode = 0660;
  std::string socket_group;     // empty = the daemon's group
  // Administrative calls (ClearQuarantine) are served only on their own Unix socket, created
  // 0600 (the daemon's user), or 0660 with this group. Empty admin_listen = derived from listen
  // (wire::AdminEndpointOf: "unix:/run/ringloader/ringloader-admin.sock"); a TCP listen has none.
  std::string admin_listen;
  std::string admin_group;
  std::string state_dir = "/var/lib/ringloader";
  std::string log_level = "info";
  LogFormat log_format = LogFormat::kPlain;
  uint32_t decode_threads = 0;  // 0 = the cores this process may use (base::UsableCores)
  // Reads (file opens and their bytes) in flight ahead of the decodes, shared by all streams,
  // and each stream's reads outstanding: hides a slow filesystem's latency (a network mount's ms
  // per open). Needed: images/s x latency per file; 256 hides 50 ms at ~3,300 images/s (2 cores,
  // 224 px). 0 = no read-ahead: each decode thread reads its own sample.
  uint32_t io_depth = 256;
  uint64_t memory_limit_bytes = 4ull << 30;
  std::string shm_dir = "/dev/shm";
  // Ring segments: read by trainers of the daemon's group (or segment_group); never writable by
  // anyone but the daemon (a mode with a group or other write bit is refused).
  mode_t segment_mode = 0640;
  std::string segment_group;    // empty = the daemon's primary group
  // Per stream unless the client asks; 0 = DefaultRingSlots (4, or 3 for batches over 8 MiB).
  uint32_t ring_slots = 0;
  uint32_t max_ring_slots = 32;
  // The slots of a stream whose client does not ask for a number. ring_slots = 0: four batches,
  // or three when one is over 8 MiB. A trainer spends longer on a big batch, so two ready ahead
  // hide as much decode jitter (measured: the same images/s at 64 x 224 px), and the ring, most
  // of what a stream costs in memory, is a quarter smaller.
  uint32_t DefaultRingSlots(uint64_t slot_bytes) const {
    if (ring_slots != 0) return ring_slots;
    return std::min<uint32_t>(slot_bytes > (8u << 20) ? 3 : 4, max_ring_slots);
  }
  uint32_t max_batch_size = 4096;
  uint32_t max_image_size = 1024;
  uint32_t max_streams = 64;            // open streams in total
  // Open streams per TCP client host (gRPC peer address without its port). Not applied to Unix
  // socket clients: gRPC 1.51 gives them all the same peer string, so for them only max_streams
  // bounds the count.
  uint32_t max_streams_per_client = 16;
  uint32_t stream_idle_timeout_ms = 30'000;  // no request for this long closes a stream
  uint32_t max_wait_ms = 2'000;         // longest NextBatch wait before answering `pending`
  // A sample whose read or decode takes longer than this is abandoned and reported
  // (reason "deadline_exceeded"); 0 = no deadline.
  uint32_t decode_deadline_ms = 30'000;
  // A read failing with an I/O error that may pass (EIO, EMFILE, ENFILE, ENOMEM, EAGAIN, ESTALE,
  // ETIMEDOUT) is retried with backoff before the sample fails as "io_error": one budget of this
  // long for all of a sample's reads, below decode_deadline_ms (checked at load). Unset in the
  // file: two thirds of decode_deadline_ms (20 s), or 20 s without a deadline.
  uint32_t io_retry_ms = 20'000;
  // Under --supervise: a daemon that sends no progress ping for this long after it serves is
  // killed with SIGABRT (its in-flight samples struck, as for a crash) and restarted. It stops
  // pinging while a decode has run for 2 x decode_deadline_ms (progress_watch.h). 0 = off. Under
  // systemd, the unit's WatchdogSec= plays this part.
  uint32_t watchdog_ms = 30'000;
  // "HOST:PORT" serving Prometheus' GET /metrics (metrics.h); empty = off.
  std::string metrics_listen;
  // A TCP `listen` without [tls] is refused unless this says the network is trusted (anyone
  // who reaches the port may read batches and call the daemon); it is then warned of at every
  // start. health_listen and metrics_listen are plaintext always: they say only how it runs.
  bool insecure_tcp = false;
  // "HOST:PORT" where this daemon serves as a feeder: it decodes samples other hosts' daemons
  // ask for (service Feeder). TCP; mutual TLS under [tls], else only with insecure_tcp. Empty =
  // not a feeder.
  std::string feeder_listen;
  // "HOST:PORT" of this feeder's data plane (feed_socket.h): the same calls as feeder_listen's,
  // over a TLS socket of ringloader's own, which costs both ends less CPU per sample than gRPC
  // (the host 0.15 ms a sample received, not 0.24). Hosts learn the port from an answer on
  // feeder_listen and dial it at the address they reached (ListensWhere: the same address, or
  // every one). Needs feeder_listen and [tls]. Empty = gRPC only.
  std::string feeder_data_listen;
  // With [[feeders]]: whether this host's decode threads take part (false keeps its cores for its
  // trainers: all decoding goes to feeders, and to the local threads only when none answers).
  bool local_decode = true;
  // How long a feeder has to answer a lease before its samples are decoded elsewhere.
  uint32_t feeder_lease_ms = 5'000;
  bool operator==(const ServerConfig&) const = default;
};

// [[feeders]]: a daemon on another machine that decodes for this host (its server.feeder_listen).
// `address` is "HOST:PORT"; a name with several addresses (a Kubernetes headless Service) means
// each of them, resolved again every 30 s. Under [tls] the connection is mutual TLS with this
// daemon's certificate, the feeder's checked against tls.ca for HOST; else insecure_tcp is needed.
struct FeederConfig {
  std::string address;
  bool operator==(const FeederConfig&) const = default;
};

// The "server.<key>" names of the fields that differ between `a` and `b`.
std::vector<std::string> ChangedServerKeys(const ServerConfig& a, const ServerConfig& b);

// "unix:PATH" (non-empty path) or "HOST:PORT" / "[V6]:PORT" with PORT in [1, 65535].
// InvalidArgument naming the rule otherwise.
absl::Status ValidateListen(std::string_view listen);
// Splits "HOST:PORT" / "[V6]:PORT" (brackets dropped); false without a host or a port.
bool SplitHostPort(const std::string& listen, std::string* host, std::string* port);
// Whether a listen on `data_host` is reached at every address one on `feeder_host` is (hosts
// without brackets, as SplitHostPort gives them): the same IP however written, "::" (every
// address, IPv4's too), or "0.0.0.0" beside an IPv4 one or a name. Otherwise a name matches
// only itself.
bool ListensWhere(const std::string& data_host, const std::string& feeder_host);

// [tls]: mutual TLS on the TCP gRPC endpoint (server.listen when it is TCP). Both sides'
// certificates are checked against `ca`; a client must also carry one of `allowed_clients`'
// names when that list is given (fnmatch patterns on subject alternative names: "DNS:trainer-*",
// "IP:10.0.0.5", "URI:spiffe://ml/*"; no "TYPE:" prefix means DNS). The files are re-read on
// SIGHUP (tls_server.h).
struct TlsConfig {
  std::string ca, cert, key;
  std::vector<std::string> allowed_clients;
  bool enabled() const { return !ca.empty(); }
  bool operator==(const TlsConfig&) const = default;
};

// Whether `listen` is a TCP endpoint (not "unix:...").
bool IsTcpListen(std::string_view listen);

struct DaemonConfig {
  std::string source;  // file it came from, for messages
  ServerConfig server;
  TlsConfig tls;
  std::vector<DatasetConfig> datasets;
  std::vector<FeederConfig> feeders;
  FailpointConfig failpoints;

  const DatasetConfig* FindDataset(std::string_view name) const;
};

// A TCP server.listen, and server.feeder_listen, need [tls] or server.insecure_tcp = true:
// InvalidArgument naming both otherwise. Checked at load and again after `ringloaderd --listen`.
absl::Status CheckTcpSecurity(const DaemonConfig& config);

// The decode limits a dataset's samples are held to.
// The pipeline's spec of a configured dataset (the daemon and `ringloaderctl validate` alike).
pipeline::DatasetSpec DatasetSpecOf(const DatasetConfig& dataset, const std::string& state_dir);

image::DecodeLimits DecodeLimitsOf(const DatasetConfig& dataset);

// Parses and validates. InvalidArgument/NotFound with "<file>: <key path>: <rule> (got ...)".
absl::StatusOr<DaemonConfig> LoadConfig(const std::string& path);
absl::StatusOr<DaemonConfig> ParseConfig(std::string_view toml_text, const std::string& source);

// "4GiB", "512 MiB", "100MB", "1000" (bytes). Units are exact and case-sensitive: B, kB/KB, MB, GB,
// TB (powers of 1000) and KiB, MiB, GiB, TiB (powers of 1024); "512Mb" (megabits?) or "4gib" are
// InvalidArgument, never a guess.
absl::StatusOr<uint64_t> ParseByteSize(std::string_view text);
// Parses "RINGLOADER_FAILPOINTS"-style text: "action=segv;crash_on_path=*bad*;after_batches=3".
absl::StatusOr<FailpointConfig> ParseFailpointSpec(std::string_view spec);

}  // namespace ringloader::server
