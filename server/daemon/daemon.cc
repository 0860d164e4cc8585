// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/daemon.h"

#include <grp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <memory>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/health.grpc.pb.h"
#include "proto/wire_text.h"
#include "server/daemon/config.h"
#include "proto/admin_endpoint.h"
#include "shm/base/cgroup.h"
#include "server/daemon/crash_journal.h"
#include "server/daemon/daemon_stats.h"
#include "server/daemon/host_notify.h"
#include "server/daemon/progress_watch.h"
#include "server/daemon/feeder_pool.h"
#include "server/daemon/feed_socket_server.h"
#include "server/daemon/feeder_service.h"
#include "server/daemon/tls_server.h"
#include "server/daemon/watchdog.h"
#include "server/daemon/dataset_registry.h"
#include "server/daemon/loader_service.h"
#include "server/daemon/logging.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/metrics.h"
#include "server/daemon/open_files.h"
#include "server/daemon/oom_kills.h"
#include "server/daemon/quarantine.h"
#include "server/daemon/request_guard.h"
#include "server/daemon/sample_cache.h"
#include "server/daemon/sample_gate.h"
#include "server/daemon/state_counter.h"
#include "server/daemon/stream_manager.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/file_budget.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/read_pool.h"
#include "server/pipeline/worker_pool.h"
#include "shm/ring.h"
#include "server/daemon/status_text.h"
#include "spdlog/spdlog.h"
#include "shm/base/text.h"

namespace ringloader::server {
namespace {

uint64_t NewIncarnation() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

// Unix socket paths: make the directory, and remove a socket file left by a dead daemon (but
// refuse to start beside a live one).
absl::Status PrepareUnixSocket(const std::string& path) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create socket directory ", parent.string(), ": ", ec.message()));
  }
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a socket; refusing to replace it"));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("socket path too long: ", path));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  bool live = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  if (live) {
    return absl::FailedPreconditionError(
        absl::StrCat("another ringloaderd is already serving on ", path));
  }
  ::unlink(path.c_str());
  return absl::OkStatus();
}

// The memory this process can really have: the host's RAM, or less under its memory cgroup's
// limit or an ancestor's (a systemd unit's MemoryMax=, a container's). `what` says which.
uint64_t AvailableMemoryBytes(std::string* what) {
  uint64_t bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                   static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  *what = "the host's memory";
  if (const std::optional<base::MemoryCgroup> cgroup = base::MemoryCgroupOf()) {
    if (const std::optional<base::MemoryLimit> limit = cgroup->Limit();
        limit && limit->bytes < bytes) {
      bytes = limit->bytes;
      *what = absl::StrCat("the memory cgroup's limit (", limit->path, ")");
    }
  }
  return bytes;
}

// grpc.health.v1 Check with the daemon's status, NOT_SERVING from its construction until the
// datasets are indexed: one on the main server, one on server.health_listen's. Not gRPC's default
// health service: that one answers SERVING from BuildAndStart until told otherwise, so a probe in
// between saw a daemon "serving" before it could (and, enabled globally, it was registered on the
// health_listen server too, beside this one: "duplicate registration" in every start's log).
class ProbeHealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_ = serving; }
  grpc::Status Check(grpc::ServerContext*, const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
    // "" is the whole server; the main service's name is accepted too.
    if (!request->service().empty() && request->service() != "ringloader.v1.Loader") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown service");
    }
    response->set_status(serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                                  : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }

 private:
  std::atomic<bool> serving_{false};
};

// Everything the daemon owns, declared in start-up order so destruction runs in reverse.
struct DaemonState {
  DaemonConfig config;  // as loaded at start-up; a reload changes only what it logs as applied
  std::string config_path;
  std::string listen_override;
  uint64_t incarnation = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  std::unique_ptr<shm::IncarnationLock> incarnation_lock;
  std::unique_ptr<MemoryBudget> budget;
  std::vector<Reservation> fixed_reservations;
  DatasetRegistry datasets;
  std::unique_ptr<CrashJournal> journal;
  std::unique_ptr<Quarantine> quarantine;
  std::unique_ptr<Failpoints> failpoints;
  DaemonStats stats;
  std::unique_ptr<HostNotifier> notifier;  // systemd and the supervisor (host_notify.h)
  std::unique_ptr<pipeline::WorkerPool> pool;
  std::unique_ptr<ProgressWatch> progress;
  std::unique_ptr<pipeline::BatchFiller> filler;
  std::unique_ptr<SampleGate> gate;
  std::unique_ptr<MemorySampleCache> cache;  // eval cache of datasets with cache = "memory"
  OpenFilesPlan open_files;                  // RLIMIT_NOFILE shared out (open_files.h)
  std::unique_ptr<pipeline::FileBudget> read_files;  // the reads ahead's share; null: io_depth 0
  std::unique_ptr<TlsServer> tls;  // [tls] for a TCP listen; null = none (Unix socket, insecure)
  std::unique_ptr<FeederPool> feeders;  // [[feeders]]; null = none
  std::unique_ptr<StreamManager> streams;
  std::unique_ptr<LoaderService> service;
  ProbeHealthService main_health;  // the main server's grpc.health.v1
  std::unique_ptr<grpc::Server> server;
  ProbeHealthService probe_health;
  std::unique_ptr<grpc::Server> health_server;  // server.health_listen: probe_health only
  std::unique_ptr<FeederService> feeder_service;
  std::unique_ptr<grpc::Server> feeder_server;  // server.feeder_listen: Feeder only
  std::unique_ptr<FeedSocketServer> feed_sockets;  // server.feeder_data_listen
  std::unique_ptr<AdminService> admin_service;
  std::unique_ptr<grpc::Server> admin_server;  // server.admin_listen: AdminService only
  std::string admin_socket_path;
  bool own_admin_socket = false;
  std::unique_ptr<Watchdog> watchdog;
  std::unique_ptr<MetricsEndpoint> metrics;  // server.metrics_listen
  std::string socket_path;
  bool own_socket = false;  // we created the socket file (a failed start must not remove another's)
  // Start-up indexing runs here while the server answers (health NOT_SERVING until it is done).
  std::thread indexer;
  std::atomic<bool> indexer_done{false};
  std::atomic<int> indexing_threads{0};  // OpenDatasets' threads still running (late ones too)
  std::mutex strikes_mu;
  std::vector<InFlightSample> owed_strikes ABSL_GUARDED_BY(strikes_mu);
  bool strikes_applied ABSL_GUARDED_BY(strikes_mu) = false;
  // A SIGHUP's reload runs here, not on the signal thread: indexing a new dataset on a mount
  // that does not answer must not keep SIGTERM from being taken.
  std::thread reloader;
  std::mutex reload_mu;
  std::atomic<bool> reloading{false};  // written under reload_mu; read without it to wait
  bool reload_again = false;           // under reload_mu: a SIGHUP came during the reload
  std::mutex start_mu;
  absl::Status start_failure ABSL_GUARDED_BY(start_mu);  // set, then SIGTERM to ourselves
  std::mutex reservations_mu;  // fixed_reservations, from parallel indexing threads
  std::atomic<bool> ready{false};
  std::atomic<bool> reload_pending{false};  // a SIGHUP before `ready`, applied once serving
  std::atomic<bool> stop_indexing{false};  // a stop signal during start-up indexing
};

// ", tensors depth float32 [8, 8], ..." for the start-up line; "" without extra tensors.
std::string TensorsText(const pipeline::Dataset& ds) {
  std::string text;
  for (const pipeline::TensorSchema& t : ds.tensors()) {
    absl::StrAppend(&text, text.empty() ? ", tensors " : ", ", t.name, " ", t.Describe(),
                    t.ragged ? " (ragged)" : "");
  }
  return text;
}

// Opens one configured dataset, reserves its index memory and adds it to the registry.
// A dataset path that cannot be right is a start-up error at once, before the slow part (the
// walk or the shard scan) runs in the background.
absl::Status CheckDatasetPath(const DatasetConfig& dc, const std::string& key) {
  std::error_code ec;
  const bool pattern = dc.format == pipeline::DatasetFormat::kWebDataset ||
                       dc.format == pipeline::DatasetFormat::kTfRecord;
  if (!pattern && !std::filesystem::is_directory(dc.path, ec)) {
    return absl::NotFoundError(absl::StrCat(key, ".path: \"", dc.path, "\" is not a directory"));
  }
  return absl::OkStatus();
}

// What a dataset's index holds while it is built, drawn from the budget as it grows (the built
// index then takes its own reservation): a dataset file claiming 10^9 samples fails its start
// with the numbers instead of allocating gigabytes.
class IndexingMemory {
 public:
  explicit IndexingMemory(MemoryBudget& budget) : budget_(budget) {}
  absl::Status Hold(uint64_t bytes) {
    if (bytes <= held_) return absl::OkStatus();
    absl::StatusOr<Reservation> more = budget_.Reserve(
        bytes - held_,
        absl::StrCat("indexing (its sample list growing to ", bytes, " bytes)"));
    if (!more.ok()) return more.status();
    held_ = bytes;
    parts_.push_back(std::move(*more));
    return absl::OkStatus();
  }

 private:
  MemoryBudget& budget_;
  uint64_t held_ = 0;
  std::vector<Reservation> parts_;
};

// Strikes what the previous incarnation owes for dataset `name` (indexed as `ds`, not served
// yet: a sample that crashed it is struck before any stream can read it again).
absl::Status ApplyStrikesTo(DaemonState& d, const std::string& name,
                            const pipeline::Dataset& ds) {
  std::lock_guard<std::mutex> lock(d.strikes_mu);
  for (auto it = d.owed_strikes.begin(); it != d.owed_strikes.end();) {
    if (DatasetHash(name) != it->dataset_hash || it->sample_index >= ds.size()) {
      ++it;
      continue;
    }
    const uint64_t index = it->sample_index;
    it = d.owed_strikes.erase(it);
    const std::string path = wire::EscapeBytes(ds.relative_path(index));
    absl::StatusOr<uint32_t> strikes = d.quarantine->Strike(name, index, path);
    if (!strikes.ok()) return strikes.status();
    if (*strikes >= Quarantine::kStrikesToQuarantine) {
      d.stats.quarantines.fetch_add(1, std::memory_order_relaxed);
      SPDLOG_WARN("dataset {}: sample {} ({}) quarantined: being decoded at {} crashes; it "
                  "will be skipped (`ringloaderctl quarantine clear` to retry it)",
                  name, index, path, *strikes);
    } else {
      SPDLOG_WARN("dataset {}: sample {} ({}) was being decoded when ringloaderd crashed "
                  "(strike {}/{})",
                  name, index, path, *strikes, Quarantine::kStrikesToQuarantine);
    }
  }
  return absl::OkStatus();
}

// Once every dataset is indexed or failed, the owed strikes are all in quarantine.tsv: the
// journal's pending list goes. (Failing that, the next start strikes them once more, which is
// no reason to fail this one.)
void StrikesSettled(DaemonState& d) {
  if (d.datasets.AnyIndexing()) return;
  std::lock_guard<std::mutex> lock(d.strikes_mu);
  if (d.strikes_applied) return;
  d.strikes_applied = true;
  if (absl::Status s = d.journal->StrikesApplied(); !s.ok()) {
    SPDLOG_WARN("crash journal: {}", Text(s));
  }
}

// A dataset's read lane (read_pool.h): server.io_depth threads of its own, which probe the
// storage by opening one of its samples when a read is overdue, and log when it stalls.
std::unique_ptr<pipeline::ReadPool> MakeLane(const DaemonState& d, const std::string& name,
                                             const pipeline::Dataset& dataset) {
  const ServerConfig& server = d.config.server;
  if (server.io_depth == 0) return nullptr;
  pipeline::LaneOptions options;
  options.probe = pipeline::SampleProbe(dataset);  // the dataset outlives its lane
  const uint32_t deadline_ms = server.decode_deadline_ms;
  const std::string root = wire::EscapeBytes(dataset.root());
  options.on_stall_change = [name, root, deadline_ms](bool stalled,
                                                      std::chrono::milliseconds stalled_for) {
    if (stalled) {
      SPDLOG_WARN("dataset {}: storage stalled: reads under {} have had no answer for {} ms "
                  "(server.decode_deadline_ms) and neither has a probe; nothing is skipped or "
                  "struck, its streams wait until it answers",
                  name, root, deadline_ms);
    } else {
      SPDLOG_WARN("dataset {}: storage answers again after {:.1f} s stalled; its streams go on",
                  name, stalled_for.count() / 1000.0);
    }
  };
  return std::make_unique<pipeline::ReadPool>(server.io_depth, std::move(options));
}

absl::Status OpenDataset(DaemonState& d, const DatasetConfig& dc, const std::string& key) {
  if (absl::Status s = CheckDatasetPath(dc, key); !s.ok()) return s;
  pipeline::DatasetSpec spec = DatasetSpecOf(dc, d.config.server.state_dir);
  spec.progress = [&d](const std::string& line) {
    SPDLOG_INFO("{}", line);
    if (!d.ready && d.streams) d.streams->SetStarting(line);
  };
  spec.cancelled = [&d] { return d.stop_indexing.load(); };
  spec.io_retry = std::chrono::milliseconds(d.config.server.io_retry_ms);
  if (!d.ready && d.config.failpoints.index_delay_ms > 0) {
    // In small steps, so a stop signal ends the wait as it ends a real walk.
    const auto until = std::chrono::steady_clock::now() +
                       std::chrono::milliseconds(d.config.failpoints.index_delay_ms);
    while (std::chrono::steady_clock::now() < until && !d.stop_indexing) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> ds;
  {
    IndexingMemory indexing(*d.budget);
    spec.hold_memory = [&indexing](uint64_t bytes) { return indexing.Hold(bytes); };
    ds = pipeline::Dataset::Open(spec);
  }
  if (!ds.ok()) {
    return absl::Status(ds.status().code(), absl::StrCat(key, ": ", ds.status().message()));
  }
  absl::StatusOr<Reservation> r =
      d.budget->Reserve((*ds)->MemoryBytes(), absl::StrCat("the index of dataset ", dc.name));
  if (!r.ok()) return r.status();
  {
    std::lock_guard<std::mutex> lock(d.reservations_mu);
    d.fixed_reservations.push_back(std::move(*r));
  }
  const size_t classes = (*ds)->class_names().size();
  SPDLOG_INFO("dataset {}: {} {}, {} samples{}{}{}", dc.name,
              pipeline::DatasetFormatName(dc.format), (*ds)->root(), (*ds)->size(),
              classes > 0 ? absl::StrCat(", ", classes, " classes") : "",
              (*ds)->loaded_from_cache() ? " (index cache)" : "", TensorsText(**ds));
  if ((*ds)->ignored_count() > 0) {
    SPDLOG_WARN("dataset {}: {} (not served, as torchvision's ImageFolder does not list them)",
                dc.name, (*ds)->IgnoredText());
  }
  if (!(*ds)->cache_warning().empty()) {
    SPDLOG_WARN("dataset {}: {}", dc.name, wire::EscapeBytes((*ds)->cache_warning()));
  }
  for (const pipeline::IndexProblem& p : (*ds)->index_problems()) {
    SPDLOG_WARN("dataset {}: {} (reason {}{})", dc.name, wire::EscapeBytes(p.message), p.reason,
                p.rest_unread ? absl::StrCat("; the rest of ", wire::EscapeBytes(p.file),
                                             " is not read")
                              : "");
  }
  for (const std::string& note : (*ds)->index_notes()) {
    SPDLOG_WARN("dataset {}: {}", dc.name, wire::EscapeBytes(note));
  }
  if (absl::Status s = ApplyStrikesTo(d, dc.name, **ds); !s.ok()) return s;
  std::unique_ptr<pipeline::ReadPool> lane = MakeLane(d, dc.name, **ds);
  d.datasets.Add(dc, std::move(*ds), std::move(lane));
  return absl::OkStatus();
}

std::string DatasetKey(const DaemonState& d, size_t i) {
  return absl::StrCat(d.config.source, ": datasets[", i, "]");
}


// How long datasets still indexing may hold up the others once those are indexed: then the daemon
// serves without them (their storage is slow or does not answer) and each joins when indexed.
constexpr auto kServeWithoutAfter = std::chrono::seconds(10);

// Indexes every configured dataset, all at once (each walk or scan waits on its own storage).
// Returns once all are indexed, or once the rest have taken kServeWithoutAfter longer than the
// last that finished (those go on, counted in DaemonState::indexing_threads; each is served when
// indexed, or logged as not served). The first failure in config order among those done fails
// the start.
absl::Status OpenDatasets(DaemonState& d) {
  struct Indexing {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<std::optional<absl::Status>> results;
    bool started_serving = false;  // the rest are late: they report themselves
  };
  const size_t n = d.config.datasets.size();
  auto indexing = std::make_shared<Indexing>();
  indexing->results.resize(n);
  for (size_t i = 0; i < n; ++i) {
    d.datasets.SetIndexing(d.config.datasets[i].name, true);
    ++d.indexing_threads;  // until it reports (a thread left behind keeps `d` in use)
    std::thread([&d, indexing, i] {
      const DatasetConfig& dc = d.config.datasets[i];
      absl::Status s = OpenDataset(d, dc, DatasetKey(d, i));
      d.datasets.SetIndexing(dc.name, false);
      bool late = false;
      {
        std::lock_guard<std::mutex> lock(indexing->mu);
        indexing->results[i] = s;
        late = indexing->started_serving;
        indexing->cv.notify_all();
      }
      if (late) StrikesSettled(d);
      if (late && !d.stop_indexing) {
        if (s.ok()) {
          SPDLOG_INFO("dataset {}: indexed after the daemon started serving; served from now on",
                      dc.name);
        } else {
          SPDLOG_ERROR("dataset {}: not served: {}", dc.name, Text(s));
        }
      }
      --d.indexing_threads;
    }).detach();
  }
  std::unique_lock<std::mutex> lock(indexing->mu);
  auto last_done = std::chrono::steady_clock::now();
  size_t done = 0;
  while (true) {
    size_t now_done = 0;
    for (const auto& r : indexing->results) now_done += r.has_value() ? 1 : 0;
    if (now_done != done) last_done = std::chrono::steady_clock::now();
    done = now_done;
    for (const auto& r : indexing->results) {
      if (r.has_value() && !r->ok()) return *r;
    }
    if (done == n || d.stop_indexing) break;
    if (done > 0 && std::chrono::steady_clock::now() - last_done >= kServeWithoutAfter) {
      std::vector<std::string> late;
      for (size_t i = 0; i < n; ++i) {
        if (!indexing->results[i].has_value()) late.push_back(d.config.datasets[i].name);
      }
      SPDLOG_WARN("serving without dataset{} {}: still indexing {} s after the others were "
                  "(its storage is slow or does not answer); streams of it open once it is indexed",
                  late.size() == 1 ? "" : "s", absl::StrJoin(late, ", "),
                  std::chrono::duration_cast<std::chrono::seconds>(kServeWithoutAfter).count());
      indexing->started_serving = true;
      break;
    }
    indexing->cv.wait_for(lock, std::chrono::milliseconds(100));
  }
  return absl::OkStatus();
}

constexpr char kUncleanRestartsFile[] = "unclean_restarts";

// daemon_restarts: starts that followed an incarnation which died without shutting down cleanly
// (a crash, kill -9, the OOM killer, a watchdog's SIGABRT, the host going down), counted in
// state_dir so that restarts by systemd or Kubernetes count as well as the supervisor's.
void CountUncleanRestart(DaemonState& d) {
  const std::string& state_dir = d.config.server.state_dir;
  uint64_t restarts = LoadStateCounter(state_dir, kUncleanRestartsFile).value_or(0);
  if (d.journal->previous_exit_was_abnormal()) {
    ++restarts;
    if (absl::Status s = StoreStateCounter(state_dir, kUncleanRestartsFile, restarts); !s.ok()) {
      SPDLOG_WARN("cannot record the restart count: {}", Text(s));
    }
  }
  d.stats.daemon_restarts = restarts;
}

// The strikes the previous incarnation owes: samples being decoded when it crashed (said in the
// log), kept in DaemonState::owed_strikes until their datasets are indexed (ApplyStrikesTo).
void TakeOwedStrikes(DaemonState& d) {
  // A fatal signal marked the journal; the OOM killer's SIGKILL cannot, but the memory cgroup
  // counts it (oom_kills.h).
  std::vector<InFlightSample> struck = d.journal->crashed_in_flight();
  const char* cause = "a fatal signal";
  const std::optional<uint64_t> oom_now = CgroupOomKills();
  const std::optional<uint64_t> oom_before = LoadRecordedOomKills(d.config.server.state_dir);
  if (struck.empty() && !d.journal->killed_in_flight().empty() && oom_now && oom_before &&
      *oom_now > *oom_before) {
    struck = d.journal->killed_in_flight();
    cause = "the OOM killer";
    SPDLOG_WARN("the previous ringloaderd was killed by the OOM killer (cgroup oom_kill {} -> {}) "
                "while decoding {} samples",
                *oom_before, *oom_now, struck.size());
  }
  if (oom_now) {
    if (absl::Status s = RecordOomKills(d.config.server.state_dir, *oom_now); !s.ok()) {
      SPDLOG_WARN("cannot record the cgroup's OOM kill count: {}", Text(s));
    }
  }
  if (d.journal->previous_exit_was_abnormal()) {
    SPDLOG_WARN("the previous ringloaderd did not shut down cleanly; {} samples were in flight "
                "at {}",
                struck.size(), struck.empty() ? "an outside kill (no strikes)" : cause);
  }
  std::lock_guard<std::mutex> lock(d.strikes_mu);
  d.owed_strikes = std::move(struck);
}

// The slow half of the start, on DaemonState::indexer while the server already answers: index
// the datasets, apply the previous incarnation's strikes, then serve. A failure is a failed
// start: recorded, and SIGTERM ends the main thread's wait.
void FinishStartUp(DaemonState& d) {
  TakeOwedStrikes(d);
  absl::Status s = OpenDatasets(d);
  if (d.stop_indexing) return;  // told to stop: not a failed start
  if (s.ok()) StrikesSettled(d);  // (with datasets still indexing, the last of them does it)
  if (!s.ok()) {
    {
      std::lock_guard<std::mutex> lock(d.start_mu);
      d.start_failure = s;
    }
    ::kill(::getpid(), SIGTERM);
    return;
  }
  d.ready = true;
  d.streams->MarkReady();
  d.main_health.SetServing(true);
  d.probe_health.SetServing(true);
  d.notifier->Ready();
  SPDLOG_INFO("ringloaderd serving on {} pid={} incarnation={:016x} decode_threads={} "
              "memory_limit={}",
              d.config.server.listen, getpid(), d.incarnation, d.pool->size(),
              base::FormatBytes(d.config.server.memory_limit_bytes));
  if (d.config.datasets.empty()) {
    SPDLOG_WARN("no [[datasets]] in the config: clients can open nothing until some are added "
                "(then SIGHUP, or systemctl reload ringloaderd)");
  }
  if (d.reload_pending.exchange(false)) ::kill(::getpid(), SIGHUP);  // the main thread reloads
}

// The STATUS= line systemd and the supervisor show: what the daemon does, or what holds it.
std::string StatusText(DaemonState& d, const std::optional<StuckSample>& stuck) {
  if (!d.ready) return absl::StrCat("starting: ", d.streams->starting_progress());
  if (stuck) {
    std::string path;
    if (const ServedDataset* served = d.datasets.Find(stuck->dataset); served != nullptr &&
        stuck->sample_index < served->dataset->size()) {
      path = absl::StrCat(" (", wire::EscapeBytes(served->dataset->relative_path(stuck->sample_index)), ")");
    }
    return absl::StrCat("stalled: dataset ", stuck->dataset, " sample ", stuck->sample_index, path,
                        " has been decoding for ", stuck->running.count() / 1000,
                        " s (stuck after 2 x server.decode_deadline_ms = ",
                        d.progress->stuck_after().count() / 1000.0, " s)");
  }
  std::string stalled;
  for (const ServedDataset* served : d.datasets.All()) {
    if (served->lane == nullptr) continue;
    if (const pipeline::ReadPool::Health h = served->lane->health(); h.stalled) {
      absl::StrAppend(&stalled, stalled.empty() ? "; storage stalled: dataset " : ", ",
                      served->config.name, absl::StrFormat(" (%.0f s)", h.stalled_for.count() / 1000.0));
    }
  }
  return absl::StrFormat("serving: %d streams, %.0f images/s%s", d.streams->open_streams(),
                         d.stats.images_per_second(), stalled);
}

// The admin socket: created 0600 (umask), then given to server.admin_group (0660) if set.
absl::Status StartAdminServer(DaemonState& d, const std::string& admin_listen) {
  const ServerConfig& server = d.config.server;
  d.admin_socket_path = admin_listen.substr(5);
  if (absl::StartsWith(d.admin_socket_path, "//")) d.admin_socket_path = d.admin_socket_path.substr(2);
  if (absl::Status s = PrepareUnixSocket(d.admin_socket_path); !s.ok()) return s;
  d.admin_service = std::make_unique<AdminService>(*d.streams);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(admin_listen, grpc::InsecureServerCredentials());
  builder.RegisterService(d.admin_service.get());
  builder.SetMaxReceiveMessageSize(1 << 20);
  const mode_t old_umask = umask(0177);  // 0600 from the start: no moment anyone else may connect
  d.admin_server = builder.BuildAndStart();
  umask(old_umask);
  if (!d.admin_server) {
    return absl::UnavailableError(absl::StrCat(d.config.source,
                                               ": server.admin_listen: cannot listen on ",
                                               admin_listen));
  }
  d.own_admin_socket = true;
  if (!server.admin_group.empty()) {
    struct group* g = getgrnam(server.admin_group.c_str());
    if (g == nullptr ||
        chown(d.admin_socket_path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0 ||
        chmod(d.admin_socket_path.c_str(), 0660) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.config.source, ": server.admin_group: cannot use group \"", server.admin_group, "\""));
    }
  }
  return absl::OkStatus();
}

absl::Status StartUp(DaemonState& d) {
  const ServerConfig& server = d.config.server;
  // First of all, before anything is created or removed: is another daemon serving here?
  const std::string& listen = server.listen;
  if (absl::StartsWith(listen, "unix:")) {
    d.socket_path = listen.substr(5);
    if (absl::StartsWith(d.socket_path, "//")) d.socket_path = d.socket_path.substr(2);
    if (absl::Status s = PrepareUnixSocket(d.socket_path); !s.ok()) return s;
  }
  for (const auto& [key, group] : {std::pair<const char*, const std::string&>{
                                       "socket_group", server.socket_group},
                                   {"segment_group", server.segment_group},
                                   {"admin_group", server.admin_group}}) {
    if (!group.empty() && getgrnam(group.c_str()) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          d.config.source, ": server.", key, ": group \"", group,
          "\" does not exist (create it, or \"\" for the daemon's own group)"));
    }
  }
  std::error_code ec;
  std::filesystem::create_directories(server.state_dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(absl::StrCat(
        d.config.source, ": server.state_dir: cannot create \"", server.state_dir, "\": ",
        ec.message()));
  }
  absl::StatusOr<std::unique_ptr<shm::IncarnationLock>> lock =
      shm::IncarnationLock::Acquire(server.shm_dir, getpid(), d.incarnation);
  if (!lock.ok()) {
    return absl::Status(lock.status().code(), absl::StrCat(d.config.source, ": server.shm_dir: ",
                                                           lock.status().message()));
  }
  d.incarnation_lock = std::move(*lock);
  if (absl::StatusOr<int> removed = shm::RemoveStaleSegments(server.shm_dir); removed.ok()) {
    if (*removed > 0) SPDLOG_INFO("removed {} stale segments of dead daemons", *removed);
  } else {
    SPDLOG_WARN("stale segment scan: {}", Text(removed.status()));
  }
  std::string available_what;
  const uint64_t available = AvailableMemoryBytes(&available_what);
  if (server.memory_limit_bytes > available) {
    SPDLOG_WARN("server.memory_limit {} is more than {} ({}): the OOM killer, not the budget, "
                "would stop this daemon; lower memory_limit",
                base::FormatBytes(server.memory_limit_bytes), available_what, base::FormatBytes(available));
  }
  d.budget = std::make_unique<MemoryBudget>(server.memory_limit_bytes);
  for (size_t i = 0; i < d.config.datasets.size(); ++i) {
    if (absl::Status s = CheckDatasetPath(d.config.datasets[i], DatasetKey(d, i)); !s.ok()) {
      return s;
    }
  }

  uint32_t decode_threads = server.decode_threads;
  if (decode_threads == 0) {
    std::string why;
    decode_threads = base::UsableCores("self", &why);
    SPDLOG_INFO("decode_threads = 0: {} decode threads, as this process may use {}",
                decode_threads, why);
  }
  d.pool = std::make_unique<pipeline::WorkerPool>(decode_threads);
  absl::StatusOr<std::unique_ptr<CrashJournal>> journal =
      CrashJournal::Open(server.state_dir, d.pool->size());
  if (!journal.ok()) return journal.status();
  d.journal = std::move(*journal);
  CountUncleanRestart(d);
  absl::StatusOr<std::unique_ptr<Quarantine>> quarantine = Quarantine::Load(server.state_dir);
  if (!quarantine.ok()) return quarantine.status();
  d.quarantine = std::move(*quarantine);
  if (!d.quarantine->load_warning().empty()) {
    SPDLOG_WARN("{}", wire::EscapeBytes(d.quarantine->load_warning()));
  }
  d.journal->InstallCrashHandlers();
  d.failpoints = std::make_unique<Failpoints>(d.config.failpoints);
  if (d.failpoints->enabled()) SPDLOG_WARN("failpoints are enabled: this daemon will crash on purpose");
  if (!d.config.failpoints.io_fault_path.empty()) {
    SPDLOG_WARN("failpoints: the first {} reads of each file matching \"{}\" fail with {}",
                d.config.failpoints.io_fault_times, d.config.failpoints.io_fault_path,
                d.config.failpoints.io_fault_errno);
    d.failpoints->InstallIoFaults();
  }

  // Every stream passes its dataset's decode limits with each batch (FillRequest::limits).
  // Decode work space is drawn from the budget per sample, from its header (memory_budget.h).
  pipeline::FillerOptions filler_options;
  filler_options.memory = d.budget.get();
  filler_options.deadline = std::chrono::milliseconds(server.decode_deadline_ms);
  filler_options.io_retry = std::chrono::milliseconds(server.io_retry_ms);
  d.filler =
      std::make_unique<pipeline::BatchFiller>(*d.pool, image::DecodeLimits{}, filler_options);
  // A decode running twice its deadline is stuck: the deadline did not stop it (watchdog.h).
  d.progress = std::make_unique<ProgressWatch>(
      d.pool->size(), std::chrono::milliseconds(2 * uint64_t{server.decode_deadline_ms}));
  d.gate = std::make_unique<SampleGate>(*d.journal, *d.progress, *d.quarantine, *d.failpoints,
                                        d.pool->size(), d.stats.quarantines);
  // The eval cache may take up to half of memory_limit, never by waiting (sample_cache.h).
  d.cache = std::make_unique<MemorySampleCache>(*d.budget, server.memory_limit_bytes / 2);
  // The open-file limit shared out, said once: past it reads would fail with EMFILE.
  rlimit files{};
  const bool known = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY;
  d.open_files = PlanOpenFiles(known ? files.rlim_cur : (1u << 20), d.config);
  if (d.open_files.short_of_wanted()) {
    SPDLOG_WARN("{}", d.open_files.Describe());
  } else {
    SPDLOG_INFO("{}", d.open_files.Describe());
  }
  if (server.io_depth > 0) {
    d.read_files = std::make_unique<pipeline::FileBudget>(d.open_files.read_files);
  }
  const bool tcp = IsTcpListen(listen) || !server.feeder_listen.empty();
  if (tcp && d.config.tls.enabled()) {
    absl::StatusOr<std::unique_ptr<TlsServer>> tls =
        TlsServer::Start(d.config.tls, server.state_dir + "/tls");
    if (!tls.ok()) {
      return absl::Status(tls.status().code(),
                          absl::StrCat(d.config.source, ": ", tls.status().message()));
    }
    d.tls = std::move(*tls);
  } else if (tcp) {
    SPDLOG_WARN("{} is TCP without TLS (server.insecure_tcp = true): anyone who reaches it can "
                "call this daemon; configure [tls]",
                IsTcpListen(listen) ? absl::StrCat("server.listen ", listen)
                                    : absl::StrCat("server.feeder_listen ", server.feeder_listen));
  } else if (d.config.tls.enabled() && d.config.feeders.empty()) {
    SPDLOG_INFO("[tls] is configured, but nothing listens on TCP: it is not used");
  }
  if (!d.config.feeders.empty()) {
    if (!d.config.tls.enabled()) {
      SPDLOG_WARN("[[feeders]] are dialled without TLS (server.insecure_tcp = true): anyone on "
                  "the path can feed this host's trainers; configure [tls]");
    }
    absl::StatusOr<std::unique_ptr<FeederPool>> feeders = FeederPool::Start(d.config, *d.budget);
    if (!feeders.ok()) {
      return absl::Status(feeders.status().code(),
                          absl::StrCat(d.config.source, ": ", feeders.status().message()));
    }
    d.feeders = std::move(*feeders);
    SPDLOG_INFO("drawing decoded samples from {} feeder address(es){}", d.config.feeders.size(),
                server.local_decode ? "" : "; this host's decode threads only stand in for them");
  }
  StreamManagerDeps deps{&d.config,     &d.datasets, d.filler.get(), d.gate.get(), &d.stats,
                         d.budget.get(), d.quarantine.get(), d.failpoints.get(), d.incarnation,
                         d.started,      d.pool.get(), d.cache.get(),
                         d.progress.get()};
  deps.read_files = d.read_files.get();
  deps.read_window = d.open_files.window;
  deps.read_stream_files = d.open_files.stream_files;
  deps.tls = d.tls.get();
  deps.feeders = d.feeders.get();
  d.streams = std::make_unique<StreamManager>(deps);
  d.streams->SetStarting("indexing datasets");
  const std::string admin_listen =
      server.admin_listen.empty() ? wire::AdminEndpointOf(listen) : server.admin_listen;
  d.service = std::make_unique<LoaderService>(*d.streams, d.incarnation, admin_listen);

  // gRPC.
  grpc::ServerBuilder builder;
  int port = 0;
  // A Unix socket is plaintext (the kernel checks who connects); TCP is TLS under [tls].
  builder.AddListeningPort(listen,
                           d.tls && IsTcpListen(listen) ? d.tls->Credentials()
                                                        : grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(d.service.get());
  builder.RegisterService(&d.main_health);  // NOT_SERVING until the datasets are indexed
  builder.SetMaxReceiveMessageSize(1 << 20);  // requests are small; a huge one is hostile
  // Unparseable request bytes are INVALID_ARGUMENT with a message, not gRPC's bare INTERNAL.
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> guards;
  guards.push_back(std::make_unique<MalformedRequestInterceptorFactory>());
  builder.experimental().SetInterceptorCreators(std::move(guards));
  // Clients ping every 10 s during long NextBatch waits; accept that instead of answering
  // "too_many_pings" and dropping them.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  // A TCP port another process listens on is an error, not shared (gRPC's SO_REUSEPORT: a second
  // daemon with the same config took half the connections, and TLS refused them if its
  // certificates were older).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("ringloaderd");
  // Each stream may have a NextBatch waiting and each client an Attach call open.
  quota.SetMaxThreads(std::max<int>(16, 3 * server.max_streams + 8));
  builder.SetResourceQuota(quota);
  mode_t old_umask = umask(0117);  // the socket is created 0660 from the start
  d.server = builder.BuildAndStart();
  umask(old_umask);
  if (d.server && !server.health_listen.empty()) {
    grpc::ServerBuilder health_builder;
    int health_port = 0;
    health_builder.AddListeningPort(server.health_listen, grpc::InsecureServerCredentials(),
                                    &health_port);
    health_builder.RegisterService(&d.probe_health);
    health_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // as the main listen's
    d.health_server = health_builder.BuildAndStart();
    if (!d.health_server || (!absl::StartsWith(server.health_listen, "unix:") && health_port == 0)) {
      return absl::UnavailableError(absl::StrCat(d.config.source,
                                                 ": server.health_listen: cannot listen on ",
                                                 server.health_listen));
    }
  }
  if (d.server && !admin_listen.empty()) {
    if (absl::Status s = StartAdminServer(d, admin_listen); !s.ok()) return s;
  }
  if (d.server && !server.feeder_listen.empty()) {
    d.feeder_service = std::make_unique<FeederService>(server, d.datasets, *d.filler, *d.budget,
                                                       d.gate.get(), d.config.failpoints.feed_lie);
    grpc::ServerBuilder feeder_builder;
    int feeder_port = 0;
    feeder_builder.AddListeningPort(
        server.feeder_listen, d.tls ? d.tls->Credentials() : grpc::InsecureServerCredentials(),
        &feeder_port);
    feeder_builder.RegisterService(d.feeder_service.get());
    feeder_builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);  // as the main listen's
    // An answer's frames are slices of its buffer (feed_frames.h): a connection that stopped
    // draining holds them, and the buffer's memory, until it is closed. gRPC keeps a server's
    // connection 2 h by default; pings close one whose host is gone sooner (within minutes: gRPC
    // spaces pings on a connection sending no data, up to 5 min apart; not measured).
    feeder_builder.AddChannelArgument(
        GRPC_ARG_KEEPALIVE_TIME_MS,
        static_cast<int>(std::chrono::milliseconds(kFeedKeepalive).count()));
    feeder_builder.AddChannelArgument(
        GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
        static_cast<int>(std::chrono::milliseconds(kFeedKeepaliveTimeout).count()));
    feeder_builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    feeder_builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
    feeder_builder.SetMaxReceiveMessageSize(1 << 20);
    d.feeder_server = feeder_builder.BuildAndStart();
    if (!d.feeder_server || feeder_port == 0) {
      return absl::UnavailableError(absl::StrCat(d.config.source,
                                                 ": server.feeder_listen: cannot listen on ",
                                                 server.feeder_listen));
    }
    SPDLOG_INFO("feeding other hosts on {} ({})", server.feeder_listen,
                d.tls ? "mutual TLS" : "plaintext: server.insecure_tcp");
    if (!server.feeder_data_listen.empty() && d.tls) {
      absl::StatusOr<std::unique_ptr<FeedSocketServer>> sockets =
          FeedSocketServer::Start(server.feeder_data_listen, *d.tls, *d.feeder_service);
      if (!sockets.ok()) {
        return absl::Status(sockets.status().code(),
                            absl::StrCat(d.config.source, ": server.feeder_data_listen: ",
                                         sockets.status().message()));
      }
      d.feed_sockets = *std::move(sockets);
      d.feeder_service->SetDataPort(d.feed_sockets->port());
      SPDLOG_INFO("feeding other hosts' data plane on {} (mutual TLS)",
                  server.feeder_data_listen);
    }
  }
  if (d.server && !server.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsEndpoint>> metrics =
        MetricsEndpoint::Start(server.metrics_listen,
                               MetricsSources{d.streams.get(), d.progress.get()},
                               static_cast<unsigned>(d.open_files.metrics_connections));
    if (!metrics.ok()) {
      return absl::Status(metrics.status().code(),
                          absl::StrCat(d.config.source, ": ", metrics.status().message()));
    }
    d.metrics = std::move(*metrics);
    SPDLOG_INFO("metrics on http://{}/metrics", server.metrics_listen);
  }
  if (!d.server || (!absl::StartsWith(listen, "unix:") && port == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", listen,
                                               " (address in use, or not permitted?)"));
  }
  d.own_socket = !d.socket_path.empty();
  if (!d.socket_path.empty()) {
    if (chmod(d.socket_path.c_str(), server.socket_mode) != 0) {
      return absl::InternalError(absl::StrCat("chmod ", d.socket_path, ": ", std::strerror(errno)));
    }
    if (!server.socket_group.empty()) {
      struct group* g = getgrnam(server.socket_group.c_str());
      if (g == nullptr || chown(d.socket_path.c_str(), static_cast<uid_t>(-1), g->gr_gid) != 0) {
        return absl::InvalidArgumentError(absl::StrCat(d.config.source,
                                                       ": server.socket_group: cannot use group \"",
                                                       server.socket_group, "\""));
      }
    }
  }
  d.streams->StartReaper();
  d.watchdog = std::make_unique<Watchdog>(
      *d.notifier, *d.progress,
      WatchdogHooks{[&d] { return d.ready.load(); },
                    [&d](const std::optional<StuckSample>& stuck) { return StatusText(d, stuck); }});
  d.watchdog->Start();
  SPDLOG_INFO("ringloaderd listening on {} pid={} incarnation={:016x}: indexing {} datasets",
              listen, getpid(), d.incarnation, d.config.datasets.size());
  d.indexer = std::thread([&d] {
    FinishStartUp(d);
    d.indexer_done = true;
  });
  return absl::OkStatus();
}

void ShutDown(DaemonState& d) {
  if (d.watchdog) d.watchdog->Stop();
  d.metrics.reset();
  if (d.notifier) d.notifier->Stopping();
  // A read stuck in the kernel must not hold up the exit: producers stop waiting for it.
  if (d.pool) d.pool->AbandonUncommitted();
  for (const ServedDataset* served : d.datasets.All()) {
    if (served->lane) served->lane->Shutdown();
  }
  d.main_health.SetServing(false);
  d.probe_health.SetServing(false);
  // Streams first: producers stop, segments are unlinked, and the clients' Attach calls end, so
  // the server's grace period below does not wait for them.
  if (d.streams) d.streams->Shutdown();
  d.feed_sockets.reset();  // its connections end; a fill in progress stops
  if (d.feeder_server) {  // a feed whose samples the pool abandoned above answers UNAVAILABLE
    d.feeder_server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    d.feeder_server->Wait();
  }
  if (d.server) {
    d.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    d.server->Wait();
  }
  if (d.health_server) {
    d.health_server->Shutdown(std::chrono::system_clock::now());
    d.health_server->Wait();
  }
  if (d.admin_server) {
    d.admin_server->Shutdown(std::chrono::system_clock::now());
    d.admin_server->Wait();
  }
  if (d.own_socket) ::unlink(d.socket_path.c_str());
  if (d.own_admin_socket) ::unlink(d.admin_socket_path.c_str());
  if (d.journal) d.journal->MarkCleanExit();
}

// SIGHUP: re-reads the config file and applies what can change while serving (log_level and new
// [[datasets]]); every other difference is logged as needing a restart. A config that does not
// load changes nothing.
void Reload(DaemonState& d) {
  SPDLOG_INFO("SIGHUP received: reloading {}", d.config_path);
  absl::StatusOr<DaemonConfig> fresh = LoadConfig(d.config_path);
  if (!fresh.ok()) {
    SPDLOG_ERROR("reload: the config does not load, keeping the running one: {}",
                 Text(fresh.status()));
    return;
  }
  if (!d.listen_override.empty()) fresh->server.listen = d.listen_override;
  std::vector<std::string> applied, restart;
  if (fresh->server.log_level != d.config.server.log_level) {
    spdlog::default_logger()->set_level(spdlog::level::from_str(fresh->server.log_level));
    applied.push_back(absl::StrCat("server.log_level = \"", fresh->server.log_level, "\""));
    d.config.server.log_level = fresh->server.log_level;  // only InitLogging reads it
  }
  for (const std::string& key : ChangedServerKeys(d.config.server, fresh->server)) {
    if (key != "server.log_level") restart.push_back(key);
  }
  if (d.tls && fresh->tls.enabled()) {
    // The files are read again even when their names did not change: that is the rotation.
    // Before the datasets: a new dataset's indexing on a slow mount must not hold it up.
    if (absl::Status s = d.tls->Reload(fresh->tls); s.ok()) {
      applied.push_back("[tls] certificates");
    } else {
      SPDLOG_ERROR("reload: [tls]: keeping the running certificates: {}", Text(s));
    }
  } else if (fresh->tls.enabled() != d.config.tls.enabled() &&
             (IsTcpListen(fresh->server.listen) || !fresh->server.feeder_listen.empty())) {
    restart.push_back(fresh->tls.enabled() ? "[tls] added" : "[tls] removed");
  }
  if (d.feeders && d.config.tls.enabled() && fresh->tls.enabled()) {
    // This host's client certificate to its feeders: the same files, read again.
    if (absl::Status s = d.feeders->ReloadTls(fresh->tls); s.ok()) {
      applied.push_back("[tls] certificate for [[feeders]]");
    } else {
      SPDLOG_ERROR("reload: [[feeders]] keep dialling with the running certificate: {}", Text(s));
    }
  }
  for (size_t i = 0; i < fresh->datasets.size(); ++i) {
    const DatasetConfig& dc = fresh->datasets[i];
    const ServedDataset* served = d.datasets.Find(dc.name);
    if (served == nullptr && d.datasets.Indexing(dc.name)) {
      restart.push_back(absl::StrCat("datasets[", i, "] (", dc.name,
                                     ") is still being indexed since the start: unchanged"));
      continue;
    }
    if (served == nullptr) {
      const std::string key = absl::StrCat(fresh->source, ": datasets[", i, "]");
      if (absl::Status s = OpenDataset(d, dc, key); !s.ok()) {
        SPDLOG_ERROR("reload: new dataset {} not added: {}", dc.name, Text(s));
        continue;
      }
      applied.push_back(absl::StrCat("new dataset ", dc.name));
    } else if (!(served->config == dc)) {
      restart.push_back(absl::StrCat("datasets[", i, "] (", dc.name, ") changed"));
    }
  }
  for (const ServedDataset* served : d.datasets.All()) {
    if (fresh->FindDataset(served->config.name) == nullptr) {
      restart.push_back(absl::StrCat("dataset ", served->config.name,
                                     " removed (still served until a restart)"));
    }
  }
  if (!(fresh->failpoints == d.config.failpoints)) restart.push_back("failpoints");
  if (fresh->feeders != d.config.feeders) restart.push_back("[[feeders]]");
  SPDLOG_INFO("reload: applied: {}", applied.empty() ? "nothing" : absl::StrJoin(applied, ", "));
  if (!restart.empty()) {
    SPDLOG_WARN("reload: these changes need a restart to apply: {}", absl::StrJoin(restart, ", "));
  }
}

// Reloads on DaemonState::reloader. A SIGHUP while one runs (indexing a new dataset on a slow
// mount) is not lost: the file is read again once that reload is done, as many SIGHUPs as came
// meanwhile making one more reload (a certificate rotation must not wait for a third SIGHUP).
void StartReload(DaemonState& d) {
  {
    std::lock_guard<std::mutex> lock(d.reload_mu);
    if (d.reloading) {
      if (!d.reload_again) {
        SPDLOG_INFO("SIGHUP while the previous reload still runs (indexing a new dataset): the "
                    "config is read again once it is done");
      }
      d.reload_again = true;
      return;
    }
    d.reloading = true;
  }
  if (d.reloader.joinable()) d.reloader.join();
  d.reloader = std::thread([&d] {
    for (;;) {
      Reload(d);
      std::lock_guard<std::mutex> lock(d.reload_mu);
      if (!d.reload_again) {
        d.reloading = false;
        return;
      }
      d.reload_again = false;
    }
  });
}

// Polls `done` every 20 ms for up to `timeout`.
bool WaitUntil(const std::function<bool()>& done, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

sigset_t StopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGHUP);
  return stop_signals;
}

}  // namespace

void HoldStopSignals() {
  const sigset_t stop_signals = StopSignals();
  // A handler, though sigwait takes them: as pid 1 of a pid namespace (a container) the kernel
  // drops signals whose action is the default, so SIGTERM would never reach sigwait.
  for (int s : {SIGTERM, SIGINT, SIGHUP}) signal(s, [](int) {});
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
}

int RunDaemon(const DaemonOptions& options) {
  // Signals are taken synchronously by this thread; every thread started later inherits the mask
  // (main() held them from its first instruction; again here for callers that did not).
  HoldStopSignals();
  const sigset_t stop_signals = StopSignals();
  // Under --supervise the child is exec'ed as /proc/self/exe: name the process for ps and pgrep.
  prctl(PR_SET_NAME, "ringloaderd");
  signal(SIGPIPE, SIG_IGN);
  // Each read in flight (server.io_depth per stream) holds a file open: the soft limit on open
  // files (often 1024) goes up to the hard one, as the host allows.
  if (rlimit files{}; getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    setrlimit(RLIMIT_NOFILE, &files);
  }

  InitLogging(nullptr);
  DaemonState d;
  absl::StatusOr<DaemonConfig> config = LoadConfig(options.config_path);
  if (!config.ok()) {
    SPDLOG_ERROR("{}", Text(config.status()));
    return 1;
  }
  d.config = std::move(*config);
  d.config_path = options.config_path;
  d.listen_override = options.listen_override;
  if (!options.listen_override.empty()) {
    if (absl::Status s = ValidateListen(options.listen_override); !s.ok()) {
      SPDLOG_ERROR("--listen: {}", Text(s));
      return 1;
    }
    d.config.server.listen = options.listen_override;
    if (absl::Status s = CheckTcpSecurity(d.config); !s.ok()) {
      SPDLOG_ERROR("--listen: {}", Text(s));
      return 1;
    }
  }
  if (const char* env = std::getenv("RINGLOADER_FAILPOINTS"); env != nullptr && *env != '\0') {
    absl::StatusOr<FailpointConfig> fp = ParseFailpointSpec(env);
    if (!fp.ok()) {
      SPDLOG_ERROR("{}", Text(fp.status()));
      return 1;
    }
    d.config.failpoints = *fp;
  }
  InitLogging(&d.config.server);
  d.incarnation = NewIncarnation();
  d.notifier = std::make_unique<HostNotifier>(std::chrono::milliseconds(d.config.server.watchdog_ms));

  if (absl::Status s = StartUp(d); !s.ok()) {
    SPDLOG_ERROR("start-up failed: {}", Text(s));
    ShutDown(d);
    return 1;
  }
  int sig = 0;
  while (sigwait(&stop_signals, &sig) == 0 && sig == SIGHUP) {
    if (d.ready) {
      StartReload(d);
      continue;
    }
    // Remembered, and applied once serving: FinishStartUp raises it again when it sees the
    // flag after marking ready; if it marked ready before we set the flag, we apply it here.
    SPDLOG_INFO("SIGHUP while the datasets are still being indexed: the reload follows once "
                "serving");
    d.reload_pending = true;
    if (d.ready && d.reload_pending.exchange(false)) StartReload(d);
  }
  // Indexing still running (at start-up, or a reload's new dataset): it stops between class
  // folders and files; one stuck in a directory read on a mount that does not answer is left
  // behind, and the process ends without it.
  if (!d.ready && !d.indexer_done) SPDLOG_INFO("stopping start-up indexing");
  d.stop_indexing = true;
  const auto indexing_over = [&d] {
    return d.indexer_done.load() && d.indexing_threads.load() == 0 && !d.reloading.load();
  };
  if (!WaitUntil(indexing_over, std::chrono::seconds(2))) {
    absl::Status failure;
    {
      std::lock_guard<std::mutex> lock(d.start_mu);
      failure = d.start_failure;
    }
    if (!failure.ok()) SPDLOG_ERROR("start-up failed: {}", Text(failure));
    SPDLOG_WARN("{} while indexing a dataset whose storage does not answer: shutting down "
                "without waiting for it", failure.ok() ? strsignal(sig) : "stopping");
    ShutDown(d);
    spdlog::shutdown();
    std::_Exit(failure.ok() ? 0 : 1);
  }
  if (d.indexer.joinable()) d.indexer.join();
  if (d.reloader.joinable()) d.reloader.join();
  absl::Status failure;
  {
    std::lock_guard<std::mutex> lock(d.start_mu);
    failure = d.start_failure;
  }
  if (!failure.ok()) {
    SPDLOG_ERROR("start-up failed: {}", Text(failure));
    ShutDown(d);
    return 1;
  }
  SPDLOG_INFO("{} received: shutting down", strsignal(sig));
  ShutDown(d);
  // Reads still in flight use the datasets and the memory budget `d` is about to free: waited
  // for briefly; one stuck on a dead mount is left behind by ending the process here.
  const auto give_up_at = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  uint64_t still_reading = 0;
  bool idle = true;  // no read or probe runs (one would use what `d` is about to free)
  for (const ServedDataset* served : d.datasets.All()) {
    if (served->lane == nullptr) continue;
    const auto left = std::max(std::chrono::steady_clock::duration::zero(),
                               give_up_at - std::chrono::steady_clock::now());
    if (!served->lane->WaitIdle(std::chrono::duration_cast<std::chrono::milliseconds>(left))) {
      idle = false;
      still_reading += served->lane->running();
    }
  }
  if (!idle) {
    SPDLOG_WARN("ringloaderd stopped; {} reads (and probes of the storage) still in flight (a "
                "stuck mount?) are abandoned",
                still_reading);
    spdlog::shutdown();
    std::_Exit(0);
  }
  SPDLOG_INFO("ringloaderd stopped cleanly");
  return 0;
}

}  // namespace ringloader::server
