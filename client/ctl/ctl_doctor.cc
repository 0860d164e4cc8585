// SPDX-License-Identifier: Apache-2.0
// ringloaderctl doctor: checks the host against a daemon config before anything breaks.
#include <grp.h>
#include <pwd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/channel.h"
#include "client/internal.h"
#include "client/ctl/ctl.h"
#include "shm/base/cgroup.h"
#include "proto/wire_text.h"
#include "server/daemon/config.h"
#include "server/image/transform.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"
#include "shm/base/text.h"
#include "shm/base/x509.h"

namespace ringloader::ctl {
namespace {

using base::FormatBytes;

// One line of the report.
struct Check {
  bool ok = true;
  std::string what;  // "shm_dir /dev/shm: 11.7 GiB free, ..."
  std::string fix;   // for a problem: what to do
};

Check Ok(std::string what) { return Check{true, std::move(what), ""}; }
Check Problem(std::string what, std::string fix) {
  return Check{false, std::move(what), std::move(fix)};
}

// What the daemon needs beyond memory_limit: code, heap and threads (config/ringloaderd.toml).
uint64_t FixedOverheadBytes(uint32_t threads) { return (30ull << 20) + (uint64_t{threads} << 20); }

// decode_threads = 0: one per core the daemon may use, as this process may (run where it runs).
uint32_t DecodeThreads(const server::ServerConfig& s) {
  return s.decode_threads != 0 ? s.decode_threads : base::UsableCores();
}

// The cores a live daemon may use: its own process's, when its pid names a ringloaderd here (not
// the machine's: under a CPU quota or an affinity, raising decode_threads past them only makes
// its threads take turns); else this process's.
uint32_t DaemonCores(uint64_t pid) {
  std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  if (pid != 0 && std::getline(comm, name) && name == "ringloaderd") {
    return base::UsableCores(std::to_string(pid));
  }
  return base::UsableCores();
}

// The ring of one stream shaped like `options` (uint8 NHWC, as consume's defaults).
struct RingShape {
  uint32_t slots = 0;
  uint64_t bytes = 0;
};
RingShape RingOf(const server::ServerConfig& s, const DoctorOptions& options) {
  image::TransformSpec spec;
  spec.image_size = options.image_size;
  const pipeline::BatchLayout layout = pipeline::ComputeBatchLayout(options.batch_size, spec);
  const uint32_t slots = s.DefaultRingSlots(layout.total_bytes);
  return {slots, uint64_t{slots} * layout.total_bytes};
}

Check ShmDir(const server::ServerConfig& s, const DoctorOptions& options) {
  struct statvfs vfs {};
  if (::statvfs(s.shm_dir.c_str(), &vfs) != 0) {
    return Problem(absl::StrCat("shm_dir ", s.shm_dir, ": ", std::strerror(errno)),
                   "create it (a tmpfs), or set server.shm_dir to one");
  }
  const uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  const RingShape ring = RingOf(s, options);
  const uint64_t all = ring.bytes * s.max_streams;
  // Rings are drawn from memory_limit: never more than that exists at once.
  const uint64_t need = std::min(all, s.memory_limit_bytes);
  const std::string what = absl::StrCat(
      "shm_dir ", s.shm_dir, ": ", FormatBytes(free_bytes), " free; rings need up to ",
      FormatBytes(need), " (", s.max_streams, " streams x ", ring.slots, " slots of batch ",
      options.batch_size, " at ", options.image_size, " px = ", FormatBytes(all),
      all > s.memory_limit_bytes ? ", capped by memory_limit" : "", ")");
  if (free_bytes < need) {
    return Problem(what, absl::StrCat("give the tmpfs at least ", FormatBytes(need),
                                      " (mount -o remount,size=... ", s.shm_dir,
                                      "), or lower server.max_streams or memory_limit"));
  }
  return Ok(what);
}

// The serving daemon, when one answers on the config's Unix socket and its process is visible
// here: the limits that matter are its own (a systemd unit's MemoryMax=, LimitNOFILE=), not this
// shell's.
std::optional<pid_t> ServingDaemon(const server::ServerConfig& s) {
  const std::optional<pid_t> pid = client::UnixSocketListenerPid(s.listen);
  if (!pid || !std::filesystem::exists("/proc/" + std::to_string(*pid) + "/limits")) {
    return std::nullopt;
  }
  return pid;
}

// Where the limits checked come from: the serving daemon, or this shell (the daemon is not
// running, or runs elsewhere).
struct LimitsOf {
  std::string pid = "self";
  std::string name = "this shell's";
};
LimitsOf LimitsSource(const server::ServerConfig& s) {
  if (std::optional<pid_t> pid = ServingDaemon(s)) {
    return {std::to_string(*pid), absl::StrCat("ringloaderd pid ", *pid, "'s")};
  }
  return {};
}

Check Memory(const server::ServerConfig& s, const DoctorOptions& options, const LimitsOf& of) {
  const uint64_t need = s.memory_limit_bytes + FixedOverheadBytes(DecodeThreads(s));
  const uint64_t host = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                        static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const std::optional<base::MemoryCgroup> cgroup =
      options.cgroup.empty() ? base::MemoryCgroupOf(of.pid)
                             : std::optional(base::MemoryCgroup::AtDirectory(options.cgroup));
  uint64_t limit = host;
  std::string source = "the host's memory";
  if (const std::optional<base::MemoryLimit> l = cgroup ? cgroup->Limit() : std::nullopt;
      l && l->bytes < host) {
    limit = l->bytes;
    source = options.cgroup.empty() ? absl::StrCat(of.name, " cgroup: ", l->path) : l->path;
  }
  const std::string what = absl::StrCat(
      "memory: memory_limit ", FormatBytes(s.memory_limit_bytes),
      " (rings, indexes and decodes) + about ", FormatBytes(need - s.memory_limit_bytes),
      " overhead vs ", FormatBytes(limit), " (", source, ")");
  if (need > limit) {
    return Problem(what, absl::StrCat("lower server.memory_limit to at most ",
                                      FormatBytes(limit > need - s.memory_limit_bytes
                                                      ? limit - (need - s.memory_limit_bytes)
                                                      : 0),
                                      ", or raise the limit (MemoryMax= in the unit): past it "
                                      "the OOM killer, not the budget, stops the daemon"));
  }
  return Ok(what);
}

// The soft "Max open files" of a process (/proc/PID/limits is readable by anyone).
std::optional<uint64_t> OpenFilesLimitOf(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/limits");
  for (std::string line; std::getline(in, line);) {
    if (!absl::StartsWith(line, "Max open files")) continue;
    std::istringstream fields(line.substr(std::strlen("Max open files")));
    std::string soft;
    fields >> soft;
    uint64_t value = 0;
    if (soft == "unlimited") return UINT64_MAX;
    if (absl::SimpleAtoi(soft, &value)) return value;
  }
  return std::nullopt;
}

Check OpenFiles(const server::ServerConfig& s, const LimitsOf& of) {
  // Per stream: its segment, the client's connection and session, and io_depth files read
  // ahead; per decode thread: a file being read; plus logs, caches, the journal and gRPC's own.
  // (The daemon raises its soft limit to the hard one itself: the hard one is what counts.)
  const uint64_t need =
      256 + (4ull + s.io_depth) * s.max_streams + 2ull * DecodeThreads(s);
  uint64_t soft = UINT64_MAX;
  if (std::optional<uint64_t> limit = OpenFilesLimitOf(of.pid)) {
    soft = *limit;
  } else {
    // The daemon started from here raises its soft limit to the hard one.
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    soft = rl.rlim_max == RLIM_INFINITY ? UINT64_MAX : rl.rlim_max;
  }
  const std::string what =
      absl::StrCat("open files: limit ", soft == UINT64_MAX ? std::string("unlimited")
                                                            : std::to_string(soft),
                   " (", of.name, " RLIMIT_NOFILE) vs about ", need, " for ", s.max_streams,
                   " streams");
  if (soft < need) {
    return Problem(what, absl::StrCat("raise it to at least ", need,
                                      " (LimitNOFILE= in the unit, ulimit -n), or lower "
                                      "server.max_streams"));
  }
  return Ok(what);
}

bool InGroup(gid_t gid) {
  if (getuid() == 0 || getgid() == gid || getegid() == gid) return true;
  std::vector<gid_t> groups(static_cast<size_t>(std::max(0, getgroups(0, nullptr))));
  const int n = getgroups(static_cast<int>(groups.size()), groups.data());
  return std::find(groups.begin(), groups.begin() + std::max(0, n), gid) != groups.begin() + std::max(0, n);
}

std::string UserName() {
  const passwd* pw = getpwuid(getuid());
  return pw != nullptr ? pw->pw_name : std::to_string(getuid());
}

Check Socket(const server::ServerConfig& s) {
  if (!absl::StartsWith(s.listen, "unix:")) {
    return Ok(absl::StrCat("listen ", s.listen, ": TCP (anyone who reaches it may connect)"));
  }
  std::string path = s.listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (!s.socket_group.empty() && getgrnam(s.socket_group.c_str()) == nullptr) {
    return Problem(absl::StrCat("socket ", path, ": socket_group \"", s.socket_group,
                                "\" does not exist"),
                   absl::StrCat("create it (groupadd ", s.socket_group,
                                ") or set server.socket_group = \"\""));
  }
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    struct stat dst {};
    if (::stat(dir.c_str(), &dst) != 0) {
      return Ok(absl::StrCat("socket ", path, ": not there yet (the daemon creates ", dir,
                             "; under systemd RuntimeDirectory= does)"));
    }
    return Ok(absl::StrCat("socket ", path, ": not there (the daemon is not running)"));
  }
  const group* g = getgrgid(st.st_gid);
  const std::string group = g != nullptr ? g->gr_name : std::to_string(st.st_gid);
  const bool may = ::access(path.c_str(), R_OK | W_OK) == 0;
  const std::string what = absl::StrCat("socket ", path, ": group ", group, ", mode ",
                                        absl::StrFormat("%04o", st.st_mode & 07777), "; ",
                                        UserName(), may ? " may connect" : " may not connect");
  if (!may) {
    return Problem(what, absl::StrCat(InGroup(st.st_gid) ? "check the directory's permissions"
                                                         : "join the group: sudo usermod -aG ",
                                      InGroup(st.st_gid) ? std::string() : group,
                                      InGroup(st.st_gid) ? "" : " $USER (then log in again)"));
  }
  return Ok(what);
}

// Where the running daemon's decode threads spend their time: reading (waiting for files on a
// slow mount) or decoding. Reads that dominate want more read-ahead. Nothing to say when the
// daemon does not answer or has decoded too little to tell.
std::optional<Check> Reads(const server::ServerConfig& s) {
  v1::GetStatsResponse stats;
  try {
    stats = client::FetchDaemonStats(s.listen, std::chrono::seconds(2));
  } catch (const client::Error&) {
    return std::nullopt;
  }
  if (stats.samples_read() < 100 || stats.samples_decoded() == 0) return std::nullopt;
  const double read_ms = 1000 * stats.read_wait_seconds() / stats.samples_read();
  const double decode_ms = 1000 * stats.decode_seconds() / stats.samples_decoded();
  const std::string what = absl::StrFormat(
      "reads: decode threads waited %.2f ms a sample for its read, and decoded for %.2f ms "
      "(io_depth %d)", read_ms, decode_ms, stats.io_depth());
  if (read_ms <= decode_ms) return Ok(what);
  return Problem(absl::StrCat(what, ": reads dominate (a slow filesystem: network mount?)"),
                 absl::StrCat("raise [server] io_depth (now ", stats.io_depth(),
                              "; about images/s x the storage's latency per file, e.g. 128), "
                              "and give memory_limit room for the bytes read ahead"));
}

Check StateDir(const server::ServerConfig& s) {
  std::filesystem::path dir = s.state_dir;
  std::error_code ec;
  while (!std::filesystem::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path()) {
    dir = dir.parent_path();  // the daemon creates the rest
  }
  if (::access(dir.c_str(), W_OK) != 0) {
    return Problem(absl::StrCat("state_dir ", s.state_dir, ": ", dir.string(),
                                " is not writable here"),
                   "run the daemon as a user who may write it (StateDirectory= under systemd)");
  }
  return Ok(absl::StrCat("state_dir ", s.state_dir, ": writable"));
}

// The daemon the config's socket belongs to, when its socket is there: it must answer. A daemon
// that does not (hung, or stopped with SIGSTOP) fails every trainer while its socket and pid
// look fine. Its datasets' storage must answer too (a mount gone: streams wait).
std::vector<Check> Daemon(const server::ServerConfig& s, const DoctorOptions& options) {
  if (!absl::StartsWith(s.listen, "unix:")) return {};
  std::string path = s.listen.substr(5);
  if (absl::StartsWith(path, "//")) path = path.substr(2);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || ::access(path.c_str(), R_OK | W_OK) != 0) return {};
  const std::optional<pid_t> pid = client::UnixSocketListenerPid(s.listen);
  const std::string who = pid ? absl::StrCat("ringloaderd pid ", *pid) : "the daemon";
  const double timeout_s = std::isfinite(options.daemon_timeout_s) && options.daemon_timeout_s > 0
                               ? options.daemon_timeout_s
                               : 5.0;
  v1::GetStatsResponse stats;
  try {
    stats = client::FetchDaemonStats(
        s.listen, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  } catch (const client::Error& e) {
    if (!pid) return {};  // a socket file nobody listens on: not running (Socket says so)
    return {Problem(absl::StrCat("daemon: ", who, " listens on ", path, " but does not answer in ",
                                 timeout_s, " s (", e.what(), ")"),
                    "look at its log (journalctl -u ringloaderd) and its state (grep State "
                    "/proc/PID/status: T = stopped); restart it (systemctl restart ringloaderd)")};
  }
  std::vector<Check> checks;
  checks.push_back(Ok(absl::StrCat("daemon: ", who, " answers: ",
                                   stats.starting() ? "starting (indexing)" : "serving", ", ",
                                   stats.streams_open(), " streams open")));
  for (const v1::DatasetStats& d : stats.datasets()) {
    if (!d.storage_stalled()) continue;
    checks.push_back(Problem(
        absl::StrFormat("dataset %s: its storage has not answered for %.0f s (%d reads waiting); "
                        "its streams wait, nothing is skipped",
                        d.name(), d.storage_stalled_ms() / 1000.0, d.reads_in_flight()),
        "bring the mount back (the NFS server, the network, the FUSE daemon): the streams go on "
        "by themselves when it answers"));
  }
  return checks;
}

Check Dataset(const server::DaemonConfig& config, const server::DatasetConfig& dc,
              const DoctorOptions& options) {
  // No state_dir: the doctor writes no index cache where the daemon keeps its own.
  pipeline::DatasetSpec spec = server::DatasetSpecOf(dc, /*state_dir=*/"");
  const std::string head =
      absl::StrCat("dataset ", dc.name, " (", pipeline::DatasetFormatName(dc.format), " ", dc.path, ")");
  // On a thread of its own, waited for at most the timeout: a dataset on a mount that does not
  // answer must not hang the doctor (the thread is left behind; the process exit ends it).
  struct Indexing {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<std::unique_ptr<pipeline::Dataset>>> result;
  };
  auto indexing = std::make_shared<Indexing>();
  std::thread([indexing, spec] {
    absl::StatusOr<std::unique_ptr<pipeline::Dataset>> opened = pipeline::Dataset::Open(spec);
    std::lock_guard<std::mutex> lock(indexing->mu);
    indexing->result.emplace(std::move(opened));
    indexing->cv.notify_all();
  }).detach();
  const double timeout_s =
      std::isfinite(options.dataset_timeout_s) && options.dataset_timeout_s > 0
          ? options.dataset_timeout_s
          : 30.0;
  std::unique_lock<std::mutex> lock(indexing->mu);
  if (!indexing->cv.wait_for(lock, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)),
                             [&] { return indexing->result.has_value(); })) {
    return Problem(absl::StrCat(head, ": indexing did not finish in ", timeout_s,
                                " s: its storage does not answer (a mount gone?) or is very slow"),
                   "check the mount (ls the path); a large dataset on a slow mount may need "
                   "--dataset-timeout-s");
  }
  absl::StatusOr<std::unique_ptr<pipeline::Dataset>> ds = *std::move(indexing->result);
  if (!ds.ok()) {
    return Problem(absl::StrCat(head, ": ", wire::EscapeBytes(std::string(ds.status().message()))),
                   absl::StrCat("fix the path or the files, or remove the dataset from ",
                                config.source));
  }
  if ((*ds)->size() == 0) {
    return Problem(absl::StrCat(head, ": no samples"), "point path at the data");
  }
  std::string what = absl::StrCat(head, ": readable, ", (*ds)->size(), " samples indexed");
  if (!(*ds)->class_names().empty()) absl::StrAppend(&what, ", ", (*ds)->class_names().size(), " classes");
  if (!(*ds)->index_problems().empty()) {
    absl::StrAppend(&what, "; ", (*ds)->index_problems().size(),
                    " damaged files (served up to the damage; see the daemon's log)");
  }
  return Ok(what);
}


// Prints one line per check; exit 0 when all passed, 1 otherwise.
int PrintChecks(const std::vector<Check>& checks, std::ostream& out) {
  size_t problems = 0;
  for (const Check& c : checks) {
    if (c.ok) {
      out << "ok: " << c.what << "\n";
    } else {
      ++problems;
      out << "problem: " << c.what << "; fix: " << c.fix << "\n";
    }
  }
  out << (problems == 0 ? std::string("all checks passed")
                        : absl::StrCat(problems, " problem", problems == 1 ? "" : "s", " found"))
      << "\n";
  return problems == 0 ? kExitOk : kExitFailure;
}

// What limits a stream whose trainer waits for batches: where its wait went over the last
// minute (TrainerClock's split), and the change to try.
Check InputBound(const v1::GetStatsResponse& stats, const v1::StreamStats& st) {
  const std::string who =
      absl::StrFormat("stream %d (client \"%s\", dataset %s, rank %d/%d)", st.stream_id(),
                      wire::EscapeBytes(st.client_name()), st.dataset(), st.rank(),
                      st.world_size());
  if (st.input_bound() < 0) {
    return Ok(absl::StrCat(who, ": input-bound not known (its client does not report its time: "
                                "an older client library)"));
  }
  const std::string figure = absl::StrFormat(
      "%s: %s, %.0f%% of the last %.0f s waiting for batches", who, st.input_bound_words(),
      100 * st.input_bound(), st.input_window_seconds());
  if (st.input_bound() < 0.05) return Ok(figure);
  struct Part {
    const char* name;
    double seconds;
  };
  const Part parts[] = {{"reads not done ahead", st.wait_on_read_seconds()},
                        {"decode and augmentation", st.wait_on_decode_seconds()},
                        {"waits for memory_limit", st.wait_on_memory_seconds()},
                        {"delivery (writing batches into the ring)",
                         st.wait_on_delivery_seconds()}};
  const Part* top = &parts[0];
  double waited = 0;
  for (const Part& p : parts) {
    waited += p.seconds;
    if (p.seconds > top->seconds) top = &p;
  }
  std::string spent = absl::StrFormat(
      "; its wait went on reads %.1f s (%.1f s more done ahead), decode %.1f s, memory %.1f s, "
      "delivery %.1f s",
      parts[0].seconds, st.read_ahead_seconds(), parts[1].seconds, parts[2].seconds,
      parts[3].seconds);
  if (waited <= 0) {
    return Problem(absl::StrCat(figure, " (the daemon was not busy for it: it is starting, or "
                                        "its ring is too small)"),
                   "give it more ring_slots (the stream option), or look again in a minute");
  }
  const std::string limit = absl::StrCat(figure, spent, ": limited by ", top->name);
  if (top == &parts[1]) {
    const unsigned cores = DaemonCores(stats.pid());
    return Problem(
        absl::StrFormat("%s (decode threads %d/%d busy, %d cores it may use)", limit,
                        stats.decode_threads_busy(), stats.decode_threads(), cores),
        stats.decode_threads() < cores
            ? absl::StrFormat("raise [server] decode_threads (now %d, up to %d cores); or a "
                              "smaller image_size or lighter augmentation",
                              stats.decode_threads(), cores)
            : "the host's cores are all decoding: a smaller image_size or lighter augmentation, "
              "fewer streams on this host, or feeders ([[feeders]]: the README's \"More decode "
              "than one host has\")");
  }
  if (top == &parts[0]) {
    return Problem(
        absl::StrFormat("%s (io_depth %d, %d reads in flight)", limit, stats.io_depth(),
                        stats.reads_in_flight()),
        absl::StrFormat("raise [server] io_depth (now %d; about images/s x the storage's "
                        "latency per file) and give memory_limit room for the bytes read ahead",
                        stats.io_depth()));
  }
  if (top == &parts[2]) {
    return Problem(
        absl::StrCat(limit, " (", base::FormatBytes(stats.memory_reserved_bytes()),
                     " reserved of memory_limit ", base::FormatBytes(stats.memory_limit_bytes()),
                     ")"),
        "raise [server] memory_limit (the host's memory allowing), or open fewer or smaller "
        "rings");
  }
  return Problem(limit, "a smaller batch or ring (ring_slots), dtype uint8 instead of float32, "
                        "or fewer streams on this host");
}

// A certificate this close to its end is a problem to fix now (the alert rule says the same).
constexpr double kCertificateWarnDays = 14;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// The files of a TLS identity (the daemon's [tls], or this client's RINGLOADER_TLS_*): they load,
// match, chain to their CA and are valid for a while yet.
Check TlsFiles(const std::string& whose, base::TlsPaths paths) {
  paths.check_chain = true;
  const int64_t now = UnixNow();
  absl::StatusOr<base::TlsIdentity> id = base::LoadTlsIdentity(paths, now);
  if (!id.ok()) {
    return Problem(absl::StrCat(whose, ": ", id.status().message()),
                   "replace the file named (a certificate signed by the CA, its own key), then "
                   "SIGHUP the daemon (systemctl reload ringloaderd)");
  }
  const double cert_days = id->cert.DaysLeft(now);
  const double ca_days = id->ca.DaysLeft(now);
  const std::string what =
      absl::StrFormat("%s: certificate %s valid, %.0f days left (until %s); CA %s, %.0f days left",
                      whose, id->cert.subject, cert_days, base::FormatUtc(id->cert.not_after),
                      id->ca.subject, ca_days);
  if (std::min(cert_days, ca_days) < kCertificateWarnDays) {
    return Problem(what, "renew it before it expires, then SIGHUP the daemon (systemctl reload "
                         "ringloaderd): it is re-read without a restart");
  }
  return Ok(what);
}

// [tls] in the config, or why a TCP listen has none.
std::optional<Check> Tls(const server::DaemonConfig& config) {
  if (config.tls.enabled()) {
    return TlsFiles("[tls]", base::TlsPaths{config.tls.ca, config.tls.cert, config.tls.key});
  }
  if (server::IsTcpListen(config.server.listen)) {
    return Problem(absl::StrCat("server.listen ", config.server.listen,
                                " is TCP without TLS (server.insecure_tcp): anyone who reaches "
                                "it can read batches and call the daemon"),
                   "add [tls] ca, cert and key (mutual TLS), or listen on a Unix socket");
  }
  return std::nullopt;
}

// The running daemon's TLS as its stats say.
Check LiveTls(const v1::TlsStatus& tls) {
  std::string what = absl::StrFormat(
      "daemon TLS: certificate %s, %.0f days left; CA %s, %.0f days left; %d clients refused",
      tls.cert_subject(), tls.cert_days_left(), tls.ca_subject(), tls.ca_days_left(),
      tls.clients_refused());
  if (tls.clients_refused() > 0) absl::StrAppend(&what, " (latest: ", tls.last_refusal(), ")");
  if (!tls.last_reload_error().empty()) {
    return Problem(absl::StrCat(what, "; the latest SIGHUP's files were refused: ",
                                tls.last_reload_error()),
                   "fix the files named, then SIGHUP again (the old certificates still serve)");
  }
  if (std::min(tls.cert_days_left(), tls.ca_days_left()) < kCertificateWarnDays) {
    return Problem(what, "renew the certificate, then SIGHUP the daemon (no restart needed)");
  }
  return Ok(what);
}

// A feeder the daemon draws from ([[feeders]]): a problem when it is not given leases (failing
// lately, or gone from its name's addresses) or refuses a dataset.
Check LiveFeeder(const v1::FeederStatus& f) {
  std::string what = absl::StrFormat(
      "feeder %s (%s): %s; %d samples, %d leases failed, %.1f ms round trip", f.address(),
      f.configured(), f.state(), f.samples(), f.lease_failures(), f.round_trip_ms());
  if (f.has_cert_days_left()) {
    absl::StrAppend(&what, absl::StrFormat("; certificate %s, %.0f days left", f.cert_subject(),
                                           f.cert_days_left()));
  }
  if (!f.refused_datasets().empty()) {
    return Problem(absl::StrCat(what, "; refused: ", absl::StrJoin(f.refused_datasets(), "; ")),
                   "give the feeder the host's files and decode limits (the same mount and "
                   "[[datasets]] settings), then restart it");
  }
  if (f.state() != "up") {
    return Problem(absl::StrCat(what, f.last_error().empty() ? "" : "; latest: ", f.last_error()),
                   f.state() == "gone" ? "the name no longer resolves to it: nothing to do if "
                                         "it was scaled down"
                                       : "check the feeder is running and reachable, and that "
                                         "each side's certificate is valid for the other");
  }
  if (f.has_cert_days_left() && f.cert_days_left() < kCertificateWarnDays) {
    return Problem(what, "renew the feeder's certificate, then SIGHUP the feeder (no restart "
                         "needed)");
  }
  return Ok(what);
}

// doctor --live: the running daemon's streams, each judged as above.
int RunLive(const DoctorOptions& options, std::ostream& out) {
  std::vector<Check> checks;
  v1::GetStatsResponse stats;
  try {
    stats = client::FetchDaemonStats(
        options.endpoint,
        std::chrono::milliseconds(static_cast<int64_t>(
            (std::isfinite(options.daemon_timeout_s) && options.daemon_timeout_s > 0
                 ? options.daemon_timeout_s
                 : 5.0) *
            1000)));
  } catch (const client::Error& e) {
    checks.push_back(Problem(absl::StrCat("daemon at ", options.endpoint, ": ", e.what()),
                             "start it, or name it with --endpoint"));
  }
  if (checks.empty()) {
    checks.push_back(Ok(absl::StrFormat(
        "daemon at %s: %d streams, %.0f images/s, decode threads %d/%d busy", options.endpoint,
        stats.streams_open(), stats.images_per_second(), stats.decode_threads_busy(),
        stats.decode_threads())));
    if (stats.has_tls()) checks.push_back(LiveTls(stats.tls()));
    for (const v1::FeederStatus& f : stats.feeders()) checks.push_back(LiveFeeder(f));
    for (const v1::StreamStats& st : stats.streams()) checks.push_back(InputBound(stats, st));
  }
  if (absl::StatusOr<std::optional<base::TlsPaths>> ours = client::TlsPathsFromEnvironment();
      !ours.ok()) {
    checks.push_back(Problem(std::string(ours.status().message()), "set all three, or none"));
  } else if (ours->has_value()) {
    checks.push_back(TlsFiles("this client (RINGLOADER_TLS_*)", **ours));
  }
  return PrintChecks(checks, out);
}

}  // namespace

int RunDoctor(const DoctorOptions& options, std::ostream& out, std::ostream& err) {
  if (options.batch_size == 0 || options.image_size == 0) {
    err << "ringloaderctl doctor: --batch-size and --image-size must be > 0\n";
    return kExitUsage;
  }
  if (options.live) return RunLive(options, out);
  std::vector<Check> checks;
  absl::StatusOr<server::DaemonConfig> config = server::LoadConfig(options.config);
  if (!config.ok()) {
    checks.push_back(Problem(absl::StrCat("config: ", config.status().message()),
                             "correct the file (ringloaderd --check-config FILE says the same)"));
  } else {
    const server::ServerConfig& s = config->server;
    checks.push_back(Ok(absl::StrCat("config ", options.config, ": loads (",
                                     config->datasets.size(), " datasets)")));
    checks.push_back(ShmDir(s, options));
    const LimitsOf limits = LimitsSource(s);
    checks.push_back(Memory(s, options, limits));
    checks.push_back(OpenFiles(s, limits));
    checks.push_back(Socket(s));
    checks.push_back(StateDir(s));
    for (Check& c : Daemon(s, options)) checks.push_back(std::move(c));
    for (const server::DatasetConfig& dc : config->datasets) {
      checks.push_back(Dataset(*config, dc, options));
    }
    if (std::optional<Check> reads = Reads(s)) checks.push_back(*std::move(reads));
    if (std::optional<Check> tls = Tls(*config)) checks.push_back(*std::move(tls));
  }
  return PrintChecks(checks, out);
}


}  // namespace ringloader::ctl
